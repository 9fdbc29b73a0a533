"""The verl adapter's verl-free parts (run everywhere): per-token reward placement on real and hand-made episodes,
turns read back from a loss mask, batch advantages through trainers.credit, the dataset rows, the .venv-verl
requirements, and that importing the adapter's verl-free modules never imports verl."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import toolgym  # noqa: F401
from toolgym.envs.calculator import CalculatorEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.rewards import Combine, NumericMatch, ToolCallFormat
from toolgym.rollout import RolloutDriver, ScriptedPolicy
from toolgym.trajectory import Trajectory, Turn
from trainers.credit import token_advantages, turn_advantages
from trainers.verl.launch import make_rows, ppo_overrides
from trainers.verl.requirements import verl_env_requirements
from trainers.verl.rewards import (
    token_level_advantages,
    token_rewards,
    turn_ends,
    turn_rewards_from_tokens,
    turn_runs,
)


class _TurnRewardCalculator(CalculatorEnv):
    def __init__(self, **kwargs):
        kwargs.setdefault("reward", Combine({NumericMatch("answer", exact=True): 1.0, ToolCallFormat(ok=0.25, no_call=-0.5): 1.0}))
        super().__init__(**kwargs)


def _oracle_episodes(n: int) -> list[Trajectory]:
    venv = ToolVectorEnv(_TurnRewardCalculator, num_envs=n)
    try:
        return RolloutDriver(venv, ScriptedPolicy(lambda s: s.env.oracle(s)), max_turn_tokens=128).run(
            [None] * n, seeds=list(range(n)))
    finally:
        venv.close()


def test_real_episode_rewards_sit_on_each_turns_last_policy_token():
    for traj in _oracle_episodes(2):
        r = token_rewards(traj)
        assert len(r) == len(traj.completion_ids) and sum(r) == pytest.approx(traj.reward) == 0.25 + 0.5
        ends = turn_ends(traj.loss_mask)
        assert len(ends) == len(traj.turns) == 2
        for k, (turn, end) in enumerate(zip(traj.turns, ends, strict=True)):
            assert turn.action_start <= end < turn.action_end and traj.loss_mask[end] == 1
            assert r[end] == pytest.approx(turn.reward + (traj.outcome_reward if k == 1 else 0.0))
        assert [j for j, x in enumerate(r) if x] == ends  # nothing anywhere else: env tokens get 0
        assert turn_rewards_from_tokens(r, traj.loss_mask) == pytest.approx([0.25, 0.5])


def _hand(mask, turns, outcome=0.0) -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2], completion_ids=list(range(10, 10 + len(mask))), loss_mask=list(mask))
    t.turns = [Turn(index=k, action_start=a, action_end=b, reward=r) for k, (a, b, r) in enumerate(turns)]
    t.outcome_reward = outcome
    return t


def test_cut_turn_clipped_turn_and_empty_turn_keep_their_rewards_on_policy_tokens():
    # turn 0 cut by its budget: 3 sampled tokens + the env's mask-0 end-of-turn; then obs; turn 1 answers
    t = _hand([1, 1, 1, 0, 0, 0, 1, 1], [(0, 4, 0.3), (6, 8, -0.1)], outcome=1.0)
    assert token_rewards(t) == pytest.approx([0, 0, 0.3, 0, 0, 0, 0, 0.9])
    # clipped to 5 tokens: turn 1 is gone, its reward (and the outcome) move to the last policy token kept
    assert token_rewards(t, length=5) == pytest.approx([0, 0, 1.2, 0, 0])
    # a turn with no policy token (empty action) gives its reward to the policy token before it
    t2 = _hand([1, 1, 0, 0, 0], [(0, 2, 0.5), (4, 4, 0.2)])
    assert token_rewards(t2) == pytest.approx([0, 0.7, 0, 0, 0])
    # ... or, first in the episode, to the one after it
    t3 = _hand([0, 0, 1, 1], [(0, 0, 0.5), (2, 4, 0.0)])
    assert token_rewards(t3) == pytest.approx([0, 0, 0.5, 0])


def test_turns_read_back_from_the_mask_own_the_env_tokens_after_them():
    mask = [1, 1, 0, 0, 1, 0, 1, 1, 0]
    assert turn_runs(mask) == [(0, 2), (4, 5), (6, 8)] and turn_ends(mask) == [1, 4, 7]
    # verl's default placement (last token, env output here) still counts for the last turn
    assert turn_rewards_from_tokens([0, 0.2, 0, 0, 0.3, 0, 0, 0, 1.0], mask) == pytest.approx([0.2, 0.3, 1.0])
    assert turn_rewards_from_tokens([0.0] * 3, [0, 0, 0]) == []


def test_batch_advantages_equal_trainers_credit_and_leave_env_tokens_zero():
    masks = np.array([[1, 1, 0, 1, 0, 1, 1], [1, 0, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0, 1]])
    turn_r = [[0.2, 0.0, 1.0], [0.5, 0.0], [1.0], [0.0, 0.2, 0.2, 0.0]]
    rewards = np.zeros(masks.shape)
    for i, m in enumerate(masks):
        for (_, end), r in zip(turn_runs(m), turn_r[i], strict=True):
            rewards[i, end - 1] = r
    groups = ["a", "a", "b", "b"]
    got = token_level_advantages(rewards, masks, groups, gamma=0.9)
    want = turn_advantages(turn_r, [0.0] * 4, groups, estimator="turn_return", gamma=0.9)
    for i, m in enumerate(masks):
        assert got[i] == pytest.approx(token_advantages(want[i], turn_runs(m), m), abs=1e-6)
    assert np.all(got[masks == 0] == 0) and np.abs(got).sum() > 0
    # a reward moved to an env token of the same turn changes nothing
    moved = rewards.copy()
    moved[0, 2], moved[0, 1] = moved[0, 1], 0.0
    assert token_level_advantages(moved, masks, groups, gamma=0.9) == pytest.approx(got)
    with pytest.raises(ValueError, match="must be equal"):
        token_level_advantages(rewards[:, :3], masks, groups)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        token_level_advantages(rewards, masks, groups, estimator="nope")


def test_rows_and_overrides_select_the_toolgym_loop():
    rows = make_rows("toolgym/Calculator-v0", [{"id": "t1", "prompt": "What is 2?"}, None], env_kwargs={"split": "test"})
    assert [r["agent_name"] for r in rows] == ["toolgym"] * 2
    info = rows[0]["extra_info"]
    assert json.loads(info["toolgym_task"])["id"] == "t1" and rows[1]["extra_info"]["toolgym_task"] == ""
    assert json.loads(info["toolgym_env_kwargs"]) == {"split": "test"} and info["toolgym_seed"] == 0
    ov = ppo_overrides(train_files="a", val_files="b", model_path="m")
    assert "algorithm.adv_estimator=gae" in ov and "critic.model.path=m" in ov
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=toolgym" in ov
    assert not any(o.startswith("critic.") for o in ppo_overrides(train_files="a", val_files="b", model_path="m",
                                                                  estimator="toolgym_turn_return"))


def test_verl_env_requirements_leave_transformers_to_verl():
    reqs = verl_env_requirements()
    assert not any(r.startswith("transformers") for r in reqs)
    assert "verl==0.9.1" in reqs and any(r.startswith("gymnasium") for r in reqs)


def test_importing_the_verl_free_modules_imports_no_verl():
    code = ("import sys, trainers, trainers.verl, trainers.verl.rewards, trainers.verl.launch, "
            "trainers.verl.requirements; print('verl' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"
