"""toolgym/CalculatorChain-v0: tasks, splits, the oracle, and a process reward that only verified steps earn."""

from __future__ import annotations

import numpy as np
import pytest

import toolgym  # noqa: F401 - registers the envs
from toolgym.envs.calculator_chain import chain_progress, generate_chain
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy
from toolgym.tools.calculator import evaluate

ENV = "toolgym/CalculatorChain-v0"


def _run(script, n: int = 8, **env_kwargs):
    driver = RolloutDriver(ENV, ScriptedPolicy(script), max_turn_tokens=128, num_envs=4,
                           env_kwargs={"split": "test", **env_kwargs})
    try:
        return driver.run([None] * n, seeds=list(range(n)))
    finally:
        driver.venv.close()


def _call(state: EpisodeState, expr: str) -> str:
    return state.env.format.parser.format_calls([("calculator", {"expression": expr})])


def test_tasks_are_dependent_chains_with_exact_intermediate_values():
    rng = np.random.default_rng(0)
    for _ in range(200):
        t = generate_chain(rng, "train")
        assert 2 <= t["steps"] == len(t["ops"]) == len(t["values"]) <= 4
        cur = t["start"]
        for (op, x), v in zip(t["ops"], t["values"], strict=True):
            cur = int(evaluate(f"{cur} {op} {x}"))
            assert str(cur) == v
            assert v not in t["prompt"].replace(",", " ").split()  # never shown
        assert t["answer"] == t["values"][-1] and int(t["answer"]) > 0
        assert sum(op == "*" for op, _ in t["ops"]) <= 1


def test_splits_are_disjoint():
    rng = np.random.default_rng(1)
    train = {generate_chain(rng, "train")["prompt"] for _ in range(400)}
    test = {generate_chain(rng, "test")["prompt"] for _ in range(100)}
    assert len(test) > 90 and not train & test


@pytest.mark.timeout(300)
def test_oracle_solves_test_tasks_step_by_step_with_full_process_reward():
    trajs = _run(lambda s: s.env.oracle(s), n=12)
    for t in trajs:
        n = t.task["steps"]
        assert t.task["split"] == "test" and t.terminated and t.drift == {}
        assert t.outcome_reward == 1.0
        assert len(t.tool_calls) == n  # one dependent call per step
        assert t.turn_rewards == pytest.approx([0.5 / n] * n + [0.0])  # each step's value verified on its turn
        assert t.reward == pytest.approx(1.5)
        assert t.answer == t.tool_results[-1].content.strip()


@pytest.mark.timeout(300)
def test_process_reward_is_not_a_format_bonus_and_cannot_be_farmed():
    def wrong_then_repeat(s: EpisodeState) -> str:
        t = s.task
        first = f"{t['start']} {t['ops'][0][0]} {t['ops'][0][1]}"
        if s.turn == 0:  # a well-formed call with a wrong step: no credit
            return _call(s, f"{t['start']} + 1")
        if s.turn in (1, 2):  # the right first step, twice: credited once
            return _call(s, first)
        return "<answer>0</answer>"

    for t in _run(wrong_then_repeat, n=4, max_turns=4):
        n = t.task["steps"]
        assert t.turn_rewards == pytest.approx([0.0, 0.5 / n, 0.0, 0.0])
        assert t.outcome_reward == 0.0

    def shortcut(s: EpisodeState) -> str:  # the whole chain in one call: the outcome, not the skipped steps
        t = s.task
        if s.turn == 0:
            expr = str(t["start"])
            for op, x in t["ops"]:
                expr = f"({expr} {op} {x})"
            return _call(s, expr)
        return f"<answer>{t['answer']}</answer>"

    for t in _run(shortcut, n=4):
        assert t.outcome_reward == 1.0 and sum(t.turn_rewards) == 0.0
        assert chain_progress(t.turns, t.task) == 0


def test_registered_and_answers_default_turn_budget():
    import gymnasium as gym

    env = gym.make(ENV, split="test", steps=(2, 3))
    try:
        obs, info = env.reset(seed=3)
        assert info["task"]["split"] == "test" and 2 <= info["task"]["steps"] <= 3
        assert env.unwrapped.max_turns == 5 and len(obs) > 0
    finally:
        env.close()


@pytest.mark.timeout(300)
def test_the_answer_step_rewards_stopping_at_the_right_value_and_nothing_else():
    """``answer_step=True``: the answer is a step of its own, earned only by answering the final value with no call
    after a verified chain; calls after the chain is complete lose a share; a right outcome still dominates."""
    trajs = _run(lambda s: s.env.oracle(s), n=8, answer_step=True)
    for t in trajs:
        n = t.task["steps"]
        assert t.outcome_reward == 1.0
        assert t.turn_rewards == pytest.approx([0.5 / (n + 1)] * (n + 1))  # n verified steps + the answer
        assert t.reward == pytest.approx(1.5)

    def keeps_calling(s: EpisodeState) -> str:  # the whole chain, then two more calls, then the right answer
        reached = chain_progress(s.trajectory.turns if s.trajectory else [], s.task)
        if reached < s.task["steps"]:
            return s.env.oracle(s)
        calls_after = sum(1 for t in s.trajectory.turns if t.calls) - s.task["steps"]
        if calls_after < 2:
            return _call(s, f"{s.task['answer']} + 0")
        return f"<answer>{s.task['answer']}</answer>"

    for t in _run(keeps_calling, n=4, answer_step=True, max_turns=8):
        n = t.task["steps"]
        share = 0.5 / (n + 1)
        assert t.turn_rewards == pytest.approx([share] * n + [-share, -share, share])
        assert t.outcome_reward == 1.0 and t.reward > 1.0

    def answers_early(s: EpisodeState) -> str:  # the right number without doing the chain: the outcome only
        return f"<answer>{s.task['answer']}</answer>"

    for t in _run(answers_early, n=4, answer_step=True):
        assert t.turn_rewards == pytest.approx([0.0]) and t.outcome_reward == 1.0

    def wrong_answer(s: EpisodeState) -> str:  # the whole chain, then a wrong number: no answer share
        if chain_progress(s.trajectory.turns if s.trajectory else [], s.task) < s.task["steps"]:
            return s.env.oracle(s)
        return f"<answer>{int(s.task['answer']) + 1}</answer>"

    for t in _run(wrong_answer, n=4, answer_step=True):
        n = t.task["steps"]
        assert t.turn_rewards == pytest.approx([0.5 / (n + 1)] * n + [0.0]) and t.outcome_reward == 0.0
