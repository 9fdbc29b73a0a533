"""toolgym/BFCL-v0: BFCL's categories as envs whose reward is BFCL's own checker verdict (bfcl-eval's data,
``ast_checker``, ``multi_turn_checker`` and API simulators; nothing here re-implements a check)."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by make install (docs/bfcl.md)")

import toolgym  # noqa: E402,F401 - registers the envs
from toolgym.envs.bfcl.data import CATEGORIES, load_category  # noqa: E402
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy  # noqa: E402
from toolgym.trajectory import Trajectory  # noqa: E402

ENV = "toolgym/BFCL-v0"
PER_CATEGORY = 12  # ground truth is checked on a spread sample of every category (all entries: docs/bfcl.md)


def _oracle(state: EpisodeState) -> str:
    return state.env.oracle(state)


def _run(category: str, rows: list[dict[str, Any]], policy: Any = None, num_envs: int = 4) -> list[Trajectory]:
    driver = RolloutDriver(ENV, policy or ScriptedPolicy(_oracle), max_turn_tokens=2048, num_envs=num_envs,
                           env_kwargs={"category": category})
    try:
        return driver.run(rows, seeds=list(range(len(rows))))
    finally:
        driver.venv.close()


def _answerable(row: dict[str, Any]) -> bool:
    """Entries whose ground truth BFCL's checker can accept: a few possible answers omit a required parameter
    (e.g. live_simple_106-63-0) and the oracle writes Java / JavaScript literals for scalars only."""
    if row["kind"] != "ast":
        return True
    docs = {f["name"]: f for f in row["functions"]}
    for item in row["ground_truth"]:
        (name, params), = item.items()
        required = docs[name]["parameters"].get("required", [])
        if any(p not in params or all(o == "" for o in params[p]) for p in required):
            return False
        if row["category"] in ("simple_java", "simple_javascript") and any(
                isinstance(o[0], list | dict) for o in params.values() if o):
            return False
    return True


def _sample(category: str, n: int = PER_CATEGORY) -> list[dict[str, Any]]:
    rows = [r for r in load_category(category) if _answerable(r)]
    idx = np.random.default_rng(0).permutation(len(rows))[:n]
    return [rows[int(i)] for i in sorted(idx)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("category", CATEGORIES)
def test_ground_truth_scores_one_in_every_category(category):
    rows = _sample(category, 6 if category == "multi_turn_long_context" else PER_CATEGORY)
    trajs = _run(category, rows)
    verdicts = [t.task["bfcl"] for t in trajs]
    assert [v["valid"] for v in verdicts] == [True] * len(rows), [v for v in verdicts if not v["valid"]][:2]
    assert all(t.outcome_reward == 1.0 for t in trajs)
    if category.startswith("multi_turn"):
        # every checked turn passed BFCL's state and response checks: the process reward sums to 1 (+ outcome 1)
        assert all(all(v["turn_passes"]) for v in verdicts)
        assert all(sum(t.turn_rewards) == pytest.approx(1.0) for t in trajs)
        assert all(t.tool_calls for t in trajs)
    if "irrelevance" in category:
        assert not any(t.tool_calls for t in trajs)


def test_splits_are_disjoint_deterministic_and_at_least_half_test():
    for category in ("simple_python", "live_parallel", "multi_turn_base"):
        every = {r["id"] for r in load_category(category)}
        train = {r["id"] for r in load_category(category, "train")}
        test = {r["id"] for r in load_category(category, "test")}
        assert train.isdisjoint(test) and train | test == every
        assert len(test) >= len(every) / 2 and len(train) >= len(every) / 2 - 1
    with pytest.raises(ValueError, match="not served"):
        gym.make(ENV, category="web_search")


def _single_turn(category: str, entry_id: str, text: str) -> dict[str, Any]:
    env = gym.make(ENV, category=category, disable_env_checker=True).unwrapped
    row = next(r for r in load_category(category) if r["id"] == entry_id)
    env.reset(options={"task": row})
    _, reward, terminated, _, info = env.step(env.encode_action(text))
    assert terminated and reward == (1.0 if info["trajectory"].task["bfcl"]["valid"] else 0.0)
    env.close()
    return info["trajectory"].task["bfcl"]


def _bfcl_ast(category: str, entry_id: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    """BFCL's own checker on an answer, called directly (the expected verdict)."""
    from toolgym.envs.bfcl.checkers import install_model_config_standin

    install_model_config_standin()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    row = next(r for r in load_category(category) if r["id"] == entry_id)
    return ast_checker(row["functions"], output, row["ground_truth"], Language.PYTHON, category, "any_model")


@pytest.mark.parametrize("mutation", ["none", "wrong_value", "missing_required", "extra_call", "wrong_name"])
def test_single_turn_mutations_score_bfcls_verdict(mutation):
    # simple_python_0: calculate_triangle_area(base=10, height=5[, unit='units'])
    env = gym.make(ENV, category="simple_python", disable_env_checker=True).unwrapped
    fmt = env.format.parser
    args = {"base": 10, "height": 5}
    calls = [("calculate_triangle_area", args)]
    if mutation == "wrong_value":
        calls = [("calculate_triangle_area", {"base": 11, "height": 5})]
    elif mutation == "missing_required":
        calls = [("calculate_triangle_area", {"base": 10})]
    elif mutation == "extra_call":
        calls = calls + calls
    elif mutation == "wrong_name":
        calls = [("calculate_circle_area", args)]
    env.close()
    got = _single_turn("simple_python", "simple_python_0", fmt.format_calls(calls))
    want = _bfcl_ast("simple_python", "simple_python_0", [{n: a} for n, a in calls])
    assert got["valid"] is want["valid"] is (mutation == "none")
    assert got["error_type"] == (None if want["valid"] else want["error_type"])
    expected = {"wrong_value": "value_error:others", "missing_required": "simple_function_checker:missing_required",
                "extra_call": "simple_function_checker:wrong_count",
                "wrong_name": "simple_function_checker:wrong_func_name"}
    assert got["error_type"] == expected.get(mutation)


def test_dotted_names_are_shown_with_underscores_and_checked_under_bfcls_names():
    row = next(r for r in load_category("parallel_multiple") if r["id"] == "parallel_multiple_0")
    env = gym.make(ENV, category="parallel_multiple", disable_env_checker=True).unwrapped
    _, info = env.reset(options={"task": row})
    shown = [t["function"]["name"] for t in env.tool_schemas]
    assert "math_toolkit_sum_of_multiples" in shown and not any("." in n for n in shown)
    assert all(t["function"]["parameters"]["type"] == "object" for t in env.tool_schemas)
    assert "math_toolkit_sum_of_multiples" in info["prompt_text"]
    text = env.format.parser.format_calls([("math_toolkit_sum_of_multiples", {"lower_limit": 1, "upper_limit": 1000,
                                            "multiples": [3, 5]}), ("math_toolkit_product_of_primes", {"count": 5})])
    _, reward, *_ , info = env.step(env.encode_action(text))
    assert reward == 1.0 and info["trajectory"].task["bfcl"]["valid"]
    env.close()


@pytest.mark.parametrize("category", ["irrelevance", "live_irrelevance"])
def test_irrelevance_rewards_no_call(category):
    row = load_category(category)[0]
    env = gym.make(ENV, category=category, disable_env_checker=True).unwrapped
    name = row["tools"][0]["function"]["name"]
    env.reset(options={"task": row})
    _, r_call, *_, info = env.step(env.encode_action(env.format.parser.format_calls([(name, {})])))
    assert r_call == 0.0 and info["trajectory"].task["bfcl"]["error_type"] == "irrelevance_error:decoder_success"
    env.reset(options={"task": row})
    _, r_text, *_, info = env.step(env.encode_action("I cannot help with that using these functions."))
    assert r_text == 1.0 and info["trajectory"].task["bfcl"]["valid"]
    env.close()


def _multi_turn_row(category: str = "multi_turn_base", min_calls: int = 2) -> dict[str, Any]:
    """The first entry with a turn of at least ``min_calls`` ground-truth calls that change the file system."""
    for r in load_category(category):
        if "GorillaFileSystem" in r["involved_classes"] and any(
                len(t) >= min_calls and any(s.startswith(("mkdir", "mv", "touch")) for s in t)
                for t in r["ground_truth"]):
            return r
    raise AssertionError("no such entry")


def test_multi_turn_skipped_step_scores_bfcls_verdict():
    row = _multi_turn_row()
    k = next(i for i, t in enumerate(row["ground_truth"]) if len(t) >= 2 and any(
        s.startswith(("mkdir", "mv", "touch")) for s in t))
    skip = next(j for j, s in enumerate(row["ground_truth"][k]) if s.startswith(("mkdir", "mv", "touch")))

    def skipping(state: EpisodeState) -> str:
        env = state.env
        truth = state.task["ground_truth"][env.user_turn] if env.user_turn < len(state.task["ground_truth"]) else []
        if env.steps_in_turn == 0 and truth:
            calls = [env.session.keyword_form(s) for s in truth]
            if env.user_turn == k:
                del calls[skip]
            return env.format.parser.format_calls(calls)
        return "Done."

    traj, = _run("multi_turn_base", [row], ScriptedPolicy(skipping), num_envs=1)
    got = traj.task["bfcl"]
    assert not got["valid"] and traj.outcome_reward == 0.0
    assert got["turn_passes"][k] is False and all(got["turn_passes"][:k])
    # BFCL's multi-turn checker on the same calls (its own executor, its own instance key) says the same
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    decoded = [[list(t)] if t else [] for t in row["ground_truth"]]
    del decoded[k][0][skip]
    want = multi_turn_checker(decoded, row["ground_truth"], row, row["category"], "test_skipped_step")
    assert want["valid"] is False and got["error_type"] == want["error_type"]


def test_concurrent_episodes_of_one_entry_do_not_share_state():
    row = _multi_turn_row()

    def policy(state: EpisodeState) -> str:
        env = state.env
        text = env.oracle(state)
        if state.index % 2 and env.user_turn == 0 and env.steps_in_turn == 0:  # odd episodes also make a directory
            calls = [("mkdir", {"dir_name": "intruder"})] + [env.session.keyword_form(s) for s in
                                                             state.task["ground_truth"][0]]
            return env.format.parser.format_calls(calls)
        return text

    trajs = _run("multi_turn_base", [row] * 8, ScriptedPolicy(policy), num_envs=8)
    valid = [t.task["bfcl"]["valid"] for t in trajs]
    assert valid == [True, False] * 4, [t.task["bfcl"]["error_type"] for t in trajs]
    assert all(t.task["bfcl"]["error_type"] == "multi_turn:instance_state_mismatch" for t in trajs[1::2])


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    row = _multi_turn_row()
    env = gym.make(ENV, category="multi_turn_base", disable_env_checker=True).unwrapped
    env.reset(options={"task": row})
    text = env.format.parser.format_calls([(payload, {}), ("cd", {"folder": payload}),
                                           ("ls", {"a": True, "__import__('os')": 1})])
    obs, _, terminated, _, info = env.step(env.encode_action(text))
    kinds = [r["error_kind"] for r in info["results"]]
    assert kinds[0] == "unknown_tool" and kinds[2] == "invalid_arguments" and not terminated
    assert payload in info["results"][1]["content"]  # the simulator got the payload as a plain string
    # the call strings handed to BFCL's checker quote the payload as a string literal
    assert env._steps == [[f"cd(folder={payload!r})"]]
    while True:  # finish every turn without further calls: the checker runs on the payload string
        _, _, terminated, truncated, info = env.step(env.encode_action("Done."))
        if terminated or truncated:
            break
    assert info["trajectory"].task["bfcl"]["valid"] is False
    assert not marker.exists()
    env.close()


def test_vector_env_and_info_carry_the_verdict():
    rows = _sample("live_simple", 4)
    trajs = _run("live_simple", rows)
    for t in trajs:
        v = t.task["bfcl"]
        assert set(v) >= {"valid", "error_type", "error", "truncated", "category", "id"}
        assert json.loads(json.dumps(v)) == v


def test_summary_columns_follow_the_leaderboards_groups():
    from toolgym.evaluation.bfcl import parse_categories, summary_columns

    assert parse_categories("non_live,simple_python") == ["simple_python", "multiple", "parallel",
                                                           "parallel_multiple", "irrelevance"]
    with pytest.raises(ValueError, match="unknown BFCL category"):
        parse_categories("simple_rust")
    rows = {
        "simple_python": {"n": 10, "correct": 6, "accuracy": 0.6}, "simple_java": {"n": 10, "correct": 2, "accuracy": 0.2},
        "multiple": {"n": 10, "correct": 8, "accuracy": 0.8}, "parallel": {"n": 10, "correct": 5, "accuracy": 0.5},
        "parallel_multiple": {"n": 10, "correct": 3, "accuracy": 0.3},
        "live_simple": {"n": 10, "correct": 5, "accuracy": 0.5}, "live_multiple": {"n": 30, "correct": 3, "accuracy": 0.1},
        "irrelevance": {"n": 10, "correct": 9, "accuracy": 0.9},
    }
    s = summary_columns(rows)
    assert s["non_live_ast"] == pytest.approx((0.4 + 0.8 + 0.5 + 0.3) / 4)  # simple = mean(python, java)
    assert s["live_ast"] == pytest.approx(8 / 40)  # pooled by entry
    assert s["irrelevance"] == pytest.approx(0.9) and s["multi_turn"] is None


def test_eval_command_prints_the_table_and_writes_every_verdict(tmp_path, capsys):
    from toolgym.cli import main

    out = tmp_path / "bfcl.json"
    rc = main(["eval", "bfcl", "--categories", "simple_python,irrelevance,multi_turn_base", "--policy", "oracle",
               "--tasks", "3", "--no-progress", "--max-new-tokens", "1024", "--bfcl-out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "simple_python" in text and "non_live_ast" in text and "100.0%" in text
    data = json.loads(out.read_text())
    assert [e["category"] for e in data["entries"]] == ["simple_python"] * 3 + ["irrelevance"] * 3 + ["multi_turn_base"] * 3
    assert all(e["valid"] for e in data["entries"]) and data["summary"]["multi_turn"] == 1.0
    assert {e["id"] for e in data["entries"]} <= {r["id"] for c in ("simple_python", "irrelevance", "multi_turn_base")
                                                  for r in load_category(c, "test")}


def test_a_category_mixture_scores_each_episode_as_its_own_category():
    rows = _sample("irrelevance", 2) + _sample("parallel", 2) + _sample("multi_turn_base", 2)
    driver = RolloutDriver(ENV, ScriptedPolicy(_oracle), max_turn_tokens=2048, num_envs=3,
                           env_kwargs={"category": "irrelevance,parallel,multi_turn_base"})
    try:
        trajs = driver.run(rows, seeds=list(range(len(rows))))
    finally:
        driver.venv.close()
    assert [t.task["bfcl"]["category"] for t in trajs] == [r["category"] for r in rows]
    assert all(t.outcome_reward == 1.0 for t in trajs)
    assert [bool(t.tool_calls) for t in trajs] == [False, False, True, True, True, True]


def _oracle_episode_to_end(env: Any) -> dict[str, Any]:
    """Step ``env`` with its oracle until the episode ends; the last step's info."""
    from types import SimpleNamespace

    while True:
        text = env.oracle(SimpleNamespace(task=env.task, turn=0, trajectory=env.trajectory))
        _, _, terminated, truncated, info = env.step(env.encode_action(text))
        if terminated or truncated:
            return info


def test_a_slow_simulator_call_times_out_while_other_episodes_keep_stepping():
    import asyncio
    from types import SimpleNamespace

    from toolgym import runtime

    # a huge exponent: minutes of one C call that holds the GIL (docs/bfcl.md), after the turn's ground-truth calls
    slow_row = next(r for r in load_category("multi_turn_base") if "MathAPI" in r["involved_classes"] and any(
        s.startswith(("mkdir", "mv", "touch")) for s in r["ground_truth"][0]))
    kw = {"category": "multi_turn_base", "disable_env_checker": True, "executor_kwargs": {"default_timeout_s": 15}}
    slow, fast = gym.make(ENV, **kw).unwrapped, gym.make(ENV, **kw).unwrapped
    slow.reset(options={"task": slow_row})
    fast.reset(options={"task": _multi_turn_row()})
    calls = [slow.session.keyword_form(s) for s in slow_row["ground_truth"][0]]
    huge = slow.format.parser.format_calls([*calls, ("power", {"base": 7, "exponent": 100_000_000})])

    async def fast_episode() -> dict[str, Any]:
        while True:
            text = fast.oracle(SimpleNamespace(task=fast.task, turn=0, trajectory=fast.trajectory))
            _, _, terminated, truncated, info = await fast.astep(fast.encode_action(text))
            if terminated or truncated:
                return info

    async def both() -> tuple[bool, dict[str, Any], dict[str, Any]]:
        slow_step = asyncio.ensure_future(slow.astep(slow.encode_action(huge)))
        fast_info = await fast_episode()
        still_running = not slow_step.done()
        return still_running, fast_info, (await slow_step)[-1]

    still_running, fast_info, slow_info = runtime.run_sync(both())
    assert still_running  # the other episode stepped to its end while the slow call ran
    assert fast_info["trajectory"].task["bfcl"]["valid"]
    kinds = [r["error_kind"] for r in slow_info["results"]]
    assert kinds == [None] * len(calls) + ["timeout"], kinds
    assert slow.executor.metrics.errors["timeout"] == 1
    # the episode goes on in a fresh process that replayed its completed calls: the turn's state check passes
    info = _oracle_episode_to_end(slow)
    assert slow.worker.starts == 2
    assert info["trajectory"].task["bfcl"]["valid"] and all(info["trajectory"].task["bfcl"]["turn_passes"]), info["trajectory"].task["bfcl"]
    slow.close()
    fast.close()


def test_a_reward_given_to_the_env_is_the_one_it_uses():
    from toolgym.envs.bfcl import BFCLReward
    from toolgym.rewards.combine import Combine

    row = _multi_turn_row()
    seen: list[str] = []

    def calls_made(trajectory: Trajectory, task: dict[str, Any]) -> float:
        seen.append(task["id"])
        return float(len(trajectory.tool_calls))

    env = gym.make(ENV, category="multi_turn_base", reward=calls_made, disable_env_checker=True).unwrapped
    env.reset(options={"task": row})
    info = _oracle_episode_to_end(env)
    assert seen == [row["id"]] and info["outcome_reward"] == float(len(info["trajectory"].tool_calls)) > 0
    assert "bfcl" not in info["trajectory"].task  # this reward does not ask for BFCL's verdict
    env.close()
    env = gym.make(ENV, category="multi_turn_base", reward=Combine({BFCLReward(): 1.0, calls_made: 0.0}),
                   disable_env_checker=True).unwrapped
    env.reset(options={"task": row})
    info = _oracle_episode_to_end(env)
    assert info["trajectory"].task["bfcl"]["valid"] and info["outcome_reward"] == 1.0
    env.close()
    with pytest.raises(TypeError, match="not a reward"):
        gym.make(ENV, category="simple_python", reward="bfcl", disable_env_checker=True)


def test_the_verdict_is_a_function_of_the_trajectory_and_the_task():
    from toolgym import runtime
    from toolgym.envs.bfcl import BFCLReward
    from toolgym.tools.base import ToolErrorKind

    row = _multi_turn_row()
    traj, = _run("multi_turn_base", [row], num_envs=1)
    assert traj.task["bfcl"]["valid"]
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))  # the trajectory as a file holds it
    del again.task["bfcl"]
    score = runtime.run_sync(BFCLReward().outcome(again, again.task))
    assert score.value == 1.0 and again.task["bfcl"] == traj.task["bfcl"]
    # the same trajectory, its last action's calls undone: BFCL's checker says the state differs
    last = max(i for i, t in enumerate(again.turns) if t.calls)
    again.turns[last].results = [type(r)(r.call, r.content, ToolErrorKind.TIMEOUT) for r in again.turns[last].results]
    score = runtime.run_sync(BFCLReward().outcome(again, again.task))
    assert score.value == 0.0 and again.task["bfcl"]["error_type"].startswith("multi_turn:")


def test_simulator_calls_run_through_the_executor():
    from toolgym.envs.base import TRUNCATED_MARK

    row = _multi_turn_row()
    env = gym.make(ENV, category="multi_turn_base", max_obs_chars=20, disable_env_checker=True).unwrapped
    env.reset(options={"task": row})
    truth = [env.session.keyword_form(s) for s in row["ground_truth"][0]]
    text = env.format.parser.format_calls([("ls", {"a": True}), ("no_such_function", {}), *truth])
    _, _, terminated, _, info = env.step(env.encode_action(text))
    assert not terminated
    m = env.executor.metrics
    assert m.calls["ls"] == 1 and m.calls["no_such_function"] == 1 and m.errors["unknown_tool"] == 1
    assert len(m.latencies_s["ls"]) == 1 and "no_such_function" not in m.latencies_s
    # the executor's bound on what the model is shown; BFCL's response check reads the whole result
    ls = info["results"][0]["content"]
    assert ls.endswith(TRUNCATED_MARK) and len(ls) == 20 + len(TRUNCATED_MARK)
    assert len(env.session.results[0]) > 20 and env.session.results[0].startswith(ls[:20])
    info = _oracle_episode_to_end(env)
    closing = [t for t in info["trajectory"].turns if t.env_checks]
    assert [t.env_checks["bfcl"]["user_turn"] for t in closing] == [i for i, g in enumerate(row["ground_truth"]) if g]
    env.close()


def test_the_per_turn_checks_reach_the_reward_on_the_turns_and_nowhere_else():
    import copy

    from toolgym import runtime
    from toolgym.envs.bfcl import BFCLReward

    row = _multi_turn_row()
    traj, = _run("multi_turn_base", [row], num_envs=1)
    assert not any(k.startswith("bfcl_turn") for k in traj.task)  # nothing is written into the task row
    closing = next(t for t in traj.turns if t.env_checks)
    reward = BFCLReward()
    score = runtime.run_sync(reward.turn(closing, traj, traj.task))
    assert score.components == {"bfcl_turn_pass": 1.0} and score.value > 0
    bare = copy.deepcopy(closing)
    bare.env_checks.clear()  # a closing turn without BFCL's check: an error, never a silent 0
    with pytest.raises(ValueError, match="env_checks"):
        runtime.run_sync(reward.turn(bare, traj, traj.task))
    with pytest.raises(ValueError, match="BFCL entries"):  # another env's task
        runtime.run_sync(reward.outcome(traj, {"id": "calc-1", "prompt": "1+1"}))
    reward.close()


def _worker_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)
            if "toolgym.envs.bfcl.worker" in " ".join(p.cmdline())}


def test_closing_the_env_leaves_no_child_process():
    import psutil

    from toolgym import runtime
    from toolgym.envs.bfcl import BFCLReward

    before = _worker_pids()
    env = gym.make(ENV, category="multi_turn_base", disable_env_checker=True).unwrapped
    env.reset(options={"task": _multi_turn_row()})
    info = _oracle_episode_to_end(env)  # simulator calls, turn checks and the verdict: all in the env's worker
    assert info["trajectory"].task["bfcl"]["valid"]
    pid = env.worker.pid
    assert pid is not None and _worker_pids() - before == {pid} and env.reward.checker is env.worker
    env.close()
    assert not psutil.pid_exists(pid) and _worker_pids() == before
    # a reward made by the caller owns its own checker process and stops it on close()
    reward = BFCLReward()
    again = info["trajectory"]
    score = runtime.run_sync(reward.outcome(again, again.task))
    assert score.value == 1.0 and reward.checker.pid in _worker_pids()
    reward.close()
    assert _worker_pids() == before
