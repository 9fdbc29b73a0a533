"""ToolVectorEnv's garbage-collector handling (``manage_gc``): the collector is paused inside steps and resets by
default and back on after them, left alone with ``manage_gc=False``, and the results are the same either way.
Not timed: ``python -m benchmarks.vector_step --scale`` measures what it buys."""

from __future__ import annotations

import asyncio
import functools
import gc

import gymnasium as gym
import numpy as np
import pytest

from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.format.parsers import get_parser
from toolgym.tools.function import tool

SEEN: list[bool] = []
TASKS = [{"id": f"t{i}", "prompt": f"task {i}", "answer": str(i)} for i in range(16)]


@tool
async def probe(x: int) -> str:
    """Record whether the garbage collector is enabled while the tool runs.

    Args:
        x: a number
    """
    SEEN.append(gc.isenabled())
    return f"got {x}"


def reward(traj, task):
    return float(traj.answer == task["answer"])


def make(n: int, **kw) -> ToolVectorEnv:
    return ToolVectorEnv(functools.partial(ToolEnv, TASKS, [probe], reward=reward, max_turns=3), num_envs=n, **kw)


def actions(envs: ToolVectorEnv, k: int) -> list[np.ndarray]:
    text = [get_parser("hermes").format_calls([("probe", {"x": i + k})]) for i in range(envs.num_envs)]
    if k == 2:  # the last turn answers, so episodes end and trajectories come back
        text = [f"<answer>{i}</answer>" for i in range(envs.num_envs)]
    return [envs.envs[0].encode_action(t) for t in text]


def test_collector_paused_inside_steps_and_left_alone_when_opted_out():
    assert gc.isenabled()
    envs = make(3)
    assert envs.manage_gc
    envs.reset(seed=0)
    assert gc.isenabled()
    SEEN.clear()
    envs.step(actions(envs, 0))
    assert SEEN == [False] * 3  # paused while the step ran
    assert gc.isenabled()  # and back on after it
    with pytest.raises(ValueError, match="expected 3 actions"):
        envs.step(actions(envs, 0)[:1])
    assert gc.isenabled()  # also after a step that raised
    envs.close()

    off = make(3, manage_gc=False)
    off.reset(seed=0)
    SEEN.clear()
    off.step(actions(off, 0))
    assert SEEN == [True] * 3
    off.close()

    # also through gym.make_vec (the registered vector entry point forwards it)
    vec = gym.make_vec("toolgym/Calculator-v0", num_envs=2, manage_gc=False)
    assert isinstance(vec, ToolVectorEnv) and not vec.manage_gc
    vec.close()


def test_two_vector_envs_stepping_at_once_resume_the_collector_after_the_last():
    a, b = make(2), make(2)
    a.reset(seed=0)
    b.reset(seed=1)

    async def both():
        return await asyncio.gather(a.astep(actions(a, 0)), b.astep(actions(b, 0)))

    SEEN.clear()
    runtime.run_sync(both())
    assert SEEN == [False] * 4 and gc.isenabled()
    a.close()
    b.close()


def test_a_collector_disabled_by_the_user_stays_disabled():
    envs = make(2)
    envs.reset(seed=0)
    gc.disable()
    try:
        envs.step(actions(envs, 0))
        assert not gc.isenabled()
    finally:
        gc.enable()
        envs.close()


def _run(manage_gc: bool) -> list:
    envs = make(4, manage_gc=manage_gc)
    out = [envs.reset(seed=3)[0]]
    for k in range(3):
        obs, rew, te, tr, infos = envs.step(actions(envs, k))
        out += [obs, rew, te, tr, infos["stepped"]]
    trajs = [t.to_dict() if hasattr(t, "to_dict") else vars(t) for t in infos["trajectory"]]
    envs.close()
    return [*out, trajs]


def test_results_are_the_same_with_and_without_gc_handling():
    a, b = _run(True), _run(False)
    assert len(a) == len(b)
    for x, y in zip(a[:-1], b[:-1], strict=True):
        if isinstance(x, tuple):
            assert all(np.array_equal(p, q) for p, q in zip(x, y, strict=True))
        else:
            assert np.array_equal(x, y)
    assert a[-2].all()  # every episode stepped in the last step
    ta, tb = a[-1], b[-1]
    for t in (*ta, *tb):  # wall-clock fields differ between runs
        for key in [k for k in t if "latenc" in k or k.endswith("_s") or "time" in k]:
            t.pop(key)
    assert ta == tb and len(ta) == 4
