"""Calculator-v0: the safe evaluator, procedural tasks, the exact-number reward, and Gymnasium's env checker."""

from __future__ import annotations

from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import toolgym  # noqa: F401 - registers the envs
from toolgym.envs.calculator import generate_task
from toolgym.format.parsers import get_parser
from toolgym.rewards.rules import exact_number, parse_exact_number
from toolgym.tools.calculator import CalculatorError, evaluate


@pytest.mark.parametrize(
    ("expr", "value"),
    [("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("2 ^ 10", 1024), ("7 / 2", Fraction(7, 2)), ("-3 ** 2", -9),
     ("10 // 3", 3), ("10 % 3", 1), ("1.5 * 2", 3), ("12345678 * 87654321", 12345678 * 87654321)],
)
def test_evaluate(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    ("expr", "msg"),
    [("__import__('os').system('x')", "unsupported syntax"), ("1 / 0", "division by zero"),
     ("2 ** 100000", "exponent larger"), ("9 ** 999 ** 2", "exponent larger"), ("", "empty"),
     ("1 +", "invalid expression"), ("x + 1", "unsupported syntax"), ("(" * 300 + "1" + ")" * 300, "nested too deeply|invalid expression")],
)
def test_evaluate_refuses_unsafe_or_invalid(expr, msg):
    with pytest.raises(CalculatorError, match=msg):
        evaluate(expr)


def test_tasks_are_deterministic_large_multistep_and_split_disjoint():
    a = [generate_task(np.random.default_rng(s)) for s in range(50)]
    b = [generate_task(np.random.default_rng(s)) for s in range(50)]
    assert a == b
    test = [generate_task(np.random.default_rng(s), "test") for s in range(50)]
    assert not {t["id"] for t in a} & {t["id"] for t in test}
    for t in a + test:
        assert t["expression"].count(" ") >= 4  # at least two operations
        assert max(int(x) for x in t["expression"].replace("(", "").replace(")", "").split() if x.isdigit()) >= 100
        assert evaluate(t["expression"]) == int(t["answer"])


def test_the_reward_is_the_one_exact_number_check():
    """Calculator-v0's reward is ``NumericMatch(exact=True)``: the whole answer one number, equal exactly."""
    from toolgym.rewards.rules import NumericMatch

    pe = parse_exact_number
    assert pe(" 12,345 ") == 12345 and pe("-7.") == -7 and pe("abc") is None and pe("3.50") == pe("7/2")
    assert pe("the answer is 5") is None and pe(None) is None and pe(True) is None
    assert exact_number("12,345", "12345") == 1.0 and exact_number("12345.0001", ["12345"]) == 0.0
    assert exact_number("so 12345", "12345") == 0.0  # numeric_match would read the last number; this does not
    reward = gym.make("toolgym/Calculator-v0").unwrapped.reward
    assert isinstance(reward, NumericMatch) and reward.exact and reward.name == "exact_number"


def test_check_env_passes():
    env = gym.make("toolgym/Calculator-v0")
    check_env(env.unwrapped, skip_render_check=True)


def test_oracle_scores_one_and_guessing_scores_zero():
    env = gym.make("toolgym/Calculator-v0", split="test")
    u = env.unwrapped
    wins = 0
    for seed in range(10):
        _, info = env.reset(seed=seed)
        task = info["task"]
        obs, r, te, tr, inf = env.step(u.encode_action(get_parser("hermes").format_calls(
            [("calculator", {"expression": task["expression"]})])))
        assert not te and inf["results"][0]["content"] == task["answer"]
        _, r, te, _, inf = env.step(u.encode_action(f"<answer>{task['answer']}</answer>"))
        wins += r
        assert te and inf["drift"] == {}
    assert wins == 10
    env.reset(seed=0)
    _, r, te, _, _ = env.step(u.encode_action("<answer>42</answer>"))
    assert te and r == 0.0
