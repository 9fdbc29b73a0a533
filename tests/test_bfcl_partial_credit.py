"""BFCL partial credit (``toolgym/BFCL-v0``'s ``partial_credit``): small terms for single-turn answers whose calls
parse, name the entry's functions and use its parameters, beside BFCL's exact verdict, which dominates. Real BFCL
entries and BFCL's own checker (the ``bfcl-eval`` package); the two collapses seen in GRPO on BFCL (docs/bfcl.md)
earn nothing for what they broke."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by make install (docs/bfcl.md)")

import toolgym  # noqa: E402,F401 - registers the envs
from toolgym.envs.bfcl.data import load_category  # noqa: E402
from toolgym.envs.bfcl.verdict import DEFAULT_PARTIAL, partial_weights  # noqa: E402
from toolgym.rollout import RolloutDriver, ScriptedPolicy  # noqa: E402

ENV = "toolgym/BFCL-v0"
ALL = sum(DEFAULT_PARTIAL.values())  # 0.3: what every partial term together earns


def _row(category: str, entry_id: str) -> dict[str, Any]:
    return next(r for r in load_category(category) if r["id"] == entry_id)


def _score(text: str, category: str = "simple_python", entry_id: str = "simple_python_0",
           partial_credit: Any = True) -> tuple[float, dict[str, float], dict[str, Any]]:
    """The episode's reward, its reward components and BFCL's verdict for one answer ``text`` (a format-string
    with ``{good}``: the correct call of simple_python_0 in the env's own format)."""
    env = gym.make(ENV, category=category, partial_credit=partial_credit, disable_env_checker=True).unwrapped
    try:
        env.reset(options={"task": _row(category, entry_id)})
        _, reward, terminated, _, info = env.step(env.encode_action(text))
        traj = info["trajectory"]
        assert terminated and reward == traj.reward
        return reward, dict(traj.reward_components), traj.task["bfcl"]
    finally:
        env.close()


def _calls(*calls: tuple[str, dict[str, Any]]) -> str:
    env = gym.make(ENV, category="simple_python", disable_env_checker=True).unwrapped
    text = env.format.parser.format_calls(list(calls))
    env.close()
    return text


GOOD = ("calculate_triangle_area", {"base": 10, "height": 5})  # simple_python_0's answer


def test_a_correct_answer_earns_one_plus_every_term():
    reward, comps, verdict = _score(_calls(GOOD))
    assert verdict["valid"]
    assert reward == pytest.approx(1.0 + ALL)
    assert comps == {"bfcl_valid": 1.0, "bfcl_parse": 1.0, "bfcl_names": 1.0, "bfcl_keys": 1.0}


def test_an_unclosed_call_earns_no_parse_credit():
    # the first collapse: every call's JSON written without its closing braces (with and without the closing tag)
    good = _calls(GOOD)
    assert good.count("}}") == 1
    for text in (good.replace("}}", ""), good.split("}}")[0]):
        reward, comps, verdict = _score(text)
        assert not verdict["valid"]
        assert comps["bfcl_parse"] == 0.0 and comps["bfcl_names"] == 0.0 and comps["bfcl_keys"] == 0.0
        assert reward == 0.0


def test_a_call_named_function_earns_no_name_credit():
    # the second collapse: every function called "function"
    reward, comps, verdict = _score(_calls(("function", GOOD[1])))
    assert verdict["error_type"] == "simple_function_checker:wrong_func_name"
    assert comps == {"bfcl_valid": 0.0, "bfcl_parse": 1.0, "bfcl_names": 0.0, "bfcl_keys": 0.0}
    assert reward == pytest.approx(DEFAULT_PARTIAL["parse"])


@pytest.mark.parametrize(("arguments", "error_type", "keys"), [
    ({"base": 11, "height": 5}, "value_error:others", 1.0),  # wrong value, right keys
    ({"base": 10}, "simple_function_checker:missing_required", 0.0),
    ({"base": 10, "height": 5, "colour": "red"}, "simple_function_checker:unexpected_param", 0.0),
])
def test_key_credit_needs_the_functions_parameters_and_every_required_one(arguments, error_type, keys):
    reward, comps, verdict = _score(_calls(("calculate_triangle_area", arguments)))
    assert verdict["valid"] is False and verdict["error_type"] == error_type
    assert comps["bfcl_parse"] == comps["bfcl_names"] == 1.0 and comps["bfcl_keys"] == keys
    assert reward == pytest.approx(DEFAULT_PARTIAL["parse"] + DEFAULT_PARTIAL["names"] + keys * DEFAULT_PARTIAL["keys"])
    assert reward < 1.0  # every wrong answer earns less than a correct one


def test_one_bad_call_among_several_takes_the_name_credit():
    row = _row("parallel_multiple", "parallel_multiple_0")
    good = ("math_toolkit_sum_of_multiples", {"lower_limit": 1, "upper_limit": 1000, "multiples": [3, 5]})
    other = ("math_toolkit_product_of_primes", {"count": 5})
    r_good, c_good, v_good = _score(_calls(good, other), "parallel_multiple", row["id"])
    assert v_good["valid"] and r_good == pytest.approx(1.0 + ALL)
    r_bad, c_bad, _ = _score(_calls(good, ("function", other[1])), "parallel_multiple", row["id"])
    assert c_bad["bfcl_parse"] == 1.0 and c_bad["bfcl_names"] == 0.0 and c_bad["bfcl_keys"] == 0.0


def test_off_by_default_the_reward_is_bfcls_binary_verdict():
    for text, want in ((_calls(GOOD), 1.0), (_calls(("function", GOOD[1])), 0.0), (_calls(("calculate_triangle_area",
                                                                                          {"base": 11, "height": 5})), 0.0)):
        reward, comps, _ = _score(text, partial_credit=False)
        assert reward == want and comps == {"bfcl_valid": want}


def test_weights_are_an_env_option_and_must_stay_below_one_answer():
    reward, comps, _ = _score(_calls(("function", GOOD[1])), partial_credit={"parse": 0.25})
    assert reward == pytest.approx(0.25) and comps["bfcl_parse"] == 1.0
    reward, _, _ = _score(_calls(GOOD), partial_credit={"names": 0.2, "keys": 0.5})
    assert reward == pytest.approx(1.7)
    assert partial_weights(False) == {} and partial_weights(True) == DEFAULT_PARTIAL
    with pytest.raises(ValueError, match="add up to 1"):
        partial_weights({"parse": 0.5, "names": 0.5})
    with pytest.raises(ValueError, match="unknown term"):
        partial_weights({"values": 0.1})
    with pytest.raises(ValueError, match=">= 0"):
        partial_weights({"keys": -0.1})
    with pytest.raises(ValueError, match="default reward"):
        gym.make(ENV, category="simple_python", partial_credit=True, reward=lambda t, k: 0.0)


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance"])
def test_irrelevance_keeps_its_rule_without_partial_credit(category):
    row = load_category(category)[0]
    name = row["tools"][0]["function"]["name"]
    env = gym.make(ENV, category=category, disable_env_checker=True).unwrapped
    call = env.format.parser.format_calls([(name, {})])
    env.close()
    r_call, c_call, _ = _score(call, category, row["id"])
    assert r_call == 0.0 and c_call == {"bfcl_valid": 0.0}
    r_text, c_text, _ = _score("None of these functions fit.", category, row["id"])
    assert r_text == 1.0 and c_text == {"bfcl_valid": 1.0}


def _oracle_run(category: str, rows: list[dict[str, Any]], partial_credit: Any) -> list[Any]:
    driver = RolloutDriver(ENV, ScriptedPolicy(lambda s: s.env.oracle(s)), max_turn_tokens=2048, num_envs=2,
                           env_kwargs={"category": category, "partial_credit": partial_credit})
    try:
        return driver.run(rows, seeds=list(range(len(rows))))
    finally:
        driver.venv.close()


@pytest.mark.timeout(600)
def test_ground_truth_earns_every_term_in_every_single_turn_kind():
    # BFCL-valid answers (the ground truth) of each single-turn AST category earn all three terms: no correct answer
    # is docked by a partial term
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "simple_java"):
        rows = load_category(category)
        rows = [rows[int(i)] for i in np.random.default_rng(1).permutation(len(rows))[:4]]
        valid = [t for t in _oracle_run(category, rows, True) if t.task["bfcl"]["valid"]]
        assert len(valid) >= 3, category
        for t in valid:
            assert t.reward == pytest.approx(1.0 + ALL), (category, t.task["id"], t.reward_components)


def test_multi_turn_keeps_its_rewards_with_partial_credit_on():
    row = next(r for r in load_category("multi_turn_base") if len(r["ground_truth"]) >= 2)
    on, = _oracle_run("multi_turn_base", [row], True)
    off, = _oracle_run("multi_turn_base", [row], False)
    assert on.task["bfcl"]["valid"] and on.reward == off.reward == pytest.approx(2.0)  # outcome 1 + process 1
    assert on.reward_components == off.reward_components == {"bfcl_valid": 1.0}
