"""The rollout driver (toolgym/rollout.py): schedules, policies, budgets, logprob alignment, JSONL output."""

from __future__ import annotations

import asyncio
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import toolgym  # noqa: F401
from toolgym.envs.calculator import generate_task
from toolgym.rollout import (
    EpisodeState,
    Generation,
    GenerationRequest,
    OpenAIPolicy,
    Policy,
    RolloutDriver,
    ScriptedPolicy,
    TransformersPolicy,
    attach_logprobs,
    flatten_logprobs,
    read_trajectories,
    summarize,
)
from toolgym.trajectory import Trajectory

ENV = "toolgym/Calculator-v0"


def oracle(state: EpisodeState) -> str:
    if state.turn == 0:
        return state.env.format.parser.format_calls([("calculator", {"expression": state.task["expression"]})])
    return f"<answer>{state.trajectory.turns[-1].results[0].content}</answer>"


def wrong(state: EpisodeState) -> str:
    return "<answer>0</answer>" if state.index % 2 else oracle(state)


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(123)
    return [generate_task(rng, "test") for _ in range(7)]


@pytest.fixture(scope="module")
def venv():
    v = gym.make_vec(ENV, num_envs=3, autoreset_mode=AutoresetMode.DISABLED)
    yield v
    v.close()


@pytest.fixture(scope="module")
def tiny():
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    return tiny_random_model(tok, seed=1), tok


def _check_alignment(t: Trajectory) -> None:
    assert len(t.completion_ids) == len(t.loss_mask)
    assert t.logprobs is not None and len(t.logprobs) == len(t.completion_ids)
    for lp, m in zip(t.logprobs, t.loss_mask, strict=True):
        if not m:
            assert lp == 0.0


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_scripted_oracle_solves_every_task_in_order(venv, tasks, schedule, tmp_path):
    path = tmp_path / "t.jsonl"
    driver = RolloutDriver(venv, ScriptedPolicy(oracle), schedule=schedule, max_turn_tokens=96)
    trajs = driver.run(tasks, seeds=0, trajectory_path=path)
    # more tasks (7) than sub-envs (3): waves / slot reuse, results still in task order
    assert [t.task["id"] for t in trajs] == [t["id"] for t in tasks]
    assert all(t.outcome_reward == 1.0 and t.terminated and len(t.turns) == 2 for t in trajs)
    assert all(t.num_tool_calls == 1 for t in trajs)
    for t in trajs:
        _check_alignment(t)
        assert 0 < sum(t.loss_mask) < len(t.loss_mask)  # the tool response is env text (mask 0)
    s = summarize(trajs)
    assert s["success"] == 1.0 and s["tool_call_rate"] == 1.0 and s["errors"] == {}
    rows = read_trajectories(path)
    assert [r["task"]["id"] for r in rows] == [t["id"] for t in tasks]
    assert rows[0]["completion_ids"] == trajs[0].completion_ids and rows[0]["loss_mask"] == trajs[0].loss_mask
    assert driver.stats.episodes == len(tasks) and driver.stats.turns == 2 * len(tasks)
    if schedule == "lockstep":
        assert driver.stats.policy_calls == 2 * math.ceil(len(tasks) / venv.num_envs)


def test_rewards_reflect_wrong_answers(venv, tasks):
    trajs = RolloutDriver(venv, ScriptedPolicy(wrong)).run(tasks, seeds=0)
    assert [t.outcome_reward for t in trajs] == [0.0 if k % 2 else 1.0 for k in range(len(tasks))]
    assert summarize(trajs)["tool_call_rate"] == pytest.approx(4 / 7)


def test_turn_budget_is_enforced_and_cut_turns_are_closed_by_the_env(venv, tasks):
    trajs = RolloutDriver(venv, ScriptedPolicy(oracle), max_turn_tokens=5).run(tasks[:3])
    for t in trajs:
        for turn in t.turns:  # 5 sampled tokens per turn, then the env's closing token at mask 0
            assert turn.cut
            assert t.loss_mask[turn.action_start : turn.action_end] == [1] * 5 + [0]
        assert "parse_error" in t.error_kinds  # the cut call is answered with a classified error
        _check_alignment(t)


def test_max_completion_tokens_and_clip(venv, tasks):
    driver = RolloutDriver(venv, ScriptedPolicy(oracle), max_turn_tokens=96, max_completion_tokens=40)
    for t in driver.run(tasks[:3]):
        assert sum(t.loss_mask) <= 40
        driver.clip(t)
        assert len(t.completion_ids) <= 40 and len(t.loss_mask) == len(t.logprobs) == len(t.completion_ids)


class _CountingPolicy:
    """Wraps a policy and records the size of each call (for the collective-call check)."""

    concurrent = False

    def __init__(self, inner: Policy) -> None:
        self.inner, self.sizes = inner, []

    async def agenerate(self, requests):
        self.sizes.append(len(requests))
        return await self.inner.agenerate(requests)


def test_lockstep_sync_fn_keeps_calling_until_every_rank_is_done(venv, tasks):
    # Pretend another rank needs 4 turns in one wave: this rank (2 turns) must still make 4 calls, 2 empty.
    pol = _CountingPolicy(ScriptedPolicy(oracle))
    remote = iter([1, 4, 3, 2, 1, 0])  # first value: number of waves; then the remote active counts

    def sync_fn(local: int) -> int:
        return max(local, next(remote))

    trajs = RolloutDriver(venv, pol, sync_fn=sync_fn).run(tasks[:3])
    assert len(trajs) == 3 and all(t.outcome_reward == 1.0 for t in trajs)
    assert pol.sizes == [3, 3, 0, 0]


def test_continuous_refuses_collective_sync(venv, tasks):
    with pytest.raises(ValueError, match="lockstep"):
        RolloutDriver(venv, ScriptedPolicy(oracle), schedule="continuous", sync_fn=lambda n: n).run(tasks[:1])
    with pytest.raises(ValueError, match="schedule"):
        RolloutDriver(venv, ScriptedPolicy(oracle), schedule="fast")  # type: ignore[arg-type]


def test_policy_returning_wrong_count_is_a_clear_error(venv, tasks):
    class Broken:
        concurrent = True

        async def agenerate(self, requests):
            return []

    with pytest.raises(RuntimeError, match="generations for"):
        RolloutDriver(venv, Broken()).run(tasks[:2])


async def test_run_inside_a_loop_points_to_arun(venv, tasks):
    driver = RolloutDriver(venv, ScriptedPolicy(oracle))
    with pytest.raises(RuntimeError, match="arun"):
        driver.run(tasks[:1])
    trajs = await driver.arun(tasks[:2])
    assert [t.outcome_reward for t in trajs] == [1.0, 1.0]


def test_flatten_logprobs_handles_vllm_nested_topk():
    assert flatten_logprobs([[-0.5, -1.0], [-0.25], -2.0, [None]])[:3] == [-0.5, -0.25, -2.0]
    assert math.isnan(flatten_logprobs([[None]])[0])
    assert flatten_logprobs(None) is None


def test_attach_logprobs_walks_the_mask():
    t = Trajectory(prompt_ids=[1], completion_ids=[5, 6, 7, 8, 9], loss_mask=[1, 1, 0, 0, 1])
    attach_logprobs(t, [[-1.0, -2.0], [-3.0]])
    assert t.logprobs == [-1.0, -2.0, 0.0, 0.0, -3.0]
    attach_logprobs(t, [[-1.0], None])
    assert t.logprobs is None
    attach_logprobs(t, [[-1.0]])  # count mismatch -> refuse rather than misalign
    assert t.logprobs is None


# -- real models -------------------------------------------------------------------------------------------------


def test_transformers_policy_budget_stop_and_logprobs(tiny):
    model, tok = tiny
    pol = TransformersPolicy(model, tok, temperature=1.0, seed=0)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    reqs = [GenerationRequest(prompt, 7, (2,)), GenerationRequest(prompt[:5], 3, (2,))]
    gens = pol.generate(reqs)
    assert [len(g.token_ids) <= r.max_new_tokens for g, r in zip(gens, reqs, strict=True)] == [True, True]
    for g in gens:
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == 2)
    # the stop id ends a turn: a stop-only vocabulary forces an immediate 1-token turn
    forced = pol.generate([GenerationRequest(prompt, 8, tuple(range(len(tok))))])[0]
    assert len(forced.token_ids) == 1 and forced.finish_reason == "stop"
    greedy = TransformersPolicy(model, tok, do_sample=False)
    assert greedy.generate(reqs[:1])[0].token_ids == greedy.generate(reqs[:1])[0].token_ids


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_driver_with_a_real_model(tiny, tasks, schedule):
    model, tok = tiny
    venv = gym.make_vec(ENV, num_envs=4, autoreset_mode=AutoresetMode.DISABLED, tokenizer=tok)
    pol = TransformersPolicy(model, tok, seed=0)
    driver = RolloutDriver(venv, pol, schedule=schedule, max_turn_tokens=12)
    trajs = driver.run(tasks[:6], seeds=1)
    assert len(trajs) == 6
    for t in trajs:
        _check_alignment(t)
        sampled = [c for c, m in zip(t.completion_ids, t.loss_mask, strict=True) if m]
        assert 0 < len(sampled) <= 12 * len(t.turns)
    if schedule == "continuous":  # a non-concurrent policy gets micro-batched requests
        assert max(driver.stats.batch_sizes) > 1
    venv.close()


async def test_openai_policy_against_a_real_server(tiny, tasks, unused_tcp_port):
    from aiohttp import web

    from toolgym.serve.model import build_app

    model, tok = tiny
    runner = web.AppRunner(build_app(model, tok, served_model_name="tiny", max_batch_size=8))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", unused_tcp_port)
    await site.start()
    try:
        pol = OpenAIPolicy(f"http://127.0.0.1:{unused_tcp_port}", temperature=1.0)
        prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        gens = await pol.agenerate([GenerationRequest(prompt, 6, (2,)), GenerationRequest(prompt, 1, (2,))])
        assert pol.model == "tiny"
        assert len(gens[1].token_ids) == 1 and 1 <= len(gens[0].token_ids) <= 6
        for g in gens:
            assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
            assert all(isinstance(x, float) and x <= 0.0 for x in g.logprobs)
        venv = gym.make_vec(ENV, num_envs=3, autoreset_mode=AutoresetMode.DISABLED, tokenizer=tok)
        for schedule in ("lockstep", "continuous"):
            trajs = await RolloutDriver(venv, pol, schedule=schedule, max_turn_tokens=8).arun(tasks[:4], seeds=0)
            assert len(trajs) == 4
            for t in trajs:
                _check_alignment(t)
        venv.close()
    finally:
        await runner.cleanup()


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_policies_satisfy_the_protocol(tiny):
    model, tok = tiny
    for p in (TransformersPolicy(model, tok), OpenAIPolicy("http://127.0.0.1:1"), ScriptedPolicy(oracle)):
        assert isinstance(p, Policy)


def test_scripted_policy_needs_a_driver():
    with pytest.raises(ValueError, match="RolloutDriver"):
        asyncio.run(ScriptedPolicy(oracle).agenerate([GenerationRequest([1, 2], 4)]))


def test_generation_dataclass_defaults():
    g = Generation([1, 2])
    assert g.logprobs is None and g.finish_reason == "stop"
