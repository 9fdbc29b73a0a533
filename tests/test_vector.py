"""ToolVectorEnv: one event loop, one executor, concurrent tool calls, subset stepping, autoreset modes."""

from __future__ import annotations

import asyncio
import functools
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import toolgym
from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.format.parsers import get_parser
from toolgym.tools.function import FunctionTool, tool

CALLS = {"n": 0, "running": 0, "max_running": 0}


@tool
async def slow(x: int) -> str:
    """Wait 50 ms, then echo x.

    Args:
        x: a number
    """
    CALLS["n"] += 1
    CALLS["running"] += 1
    CALLS["max_running"] = max(CALLS["max_running"], CALLS["running"])
    try:
        await asyncio.sleep(0.05)
    finally:
        CALLS["running"] -= 1
    return f"got {x}"


TASKS = [{"id": f"t{i}", "prompt": f"task {i}", "answer": str(i)} for i in range(300)]


def reward(traj, task):
    return float(traj.answer == task["answer"])


def make_vec(n: int, **kw) -> ToolVectorEnv:
    return ToolVectorEnv(functools.partial(ToolEnv, TASKS, [slow], reward=reward, max_turns=3), num_envs=n, **kw)


def call_text(x: int) -> str:
    return get_parser("hermes").format_calls([("slow", {"x": x})])


def test_make_vec_returns_our_vector_env():
    envs = gym.make_vec("toolgym/Calculator-v0", num_envs=3)
    assert isinstance(envs, ToolVectorEnv) and envs.num_envs == 3
    # one executor shared by every sub-env
    assert len({id(e.unwrapped.executor) for e in envs.envs}) == 1
    obs, info = envs.reset(seed=0)
    assert len(obs) == 3 and all(o.dtype == np.int64 and len(o) > 0 for o in obs)
    assert len(set(info["task"]["id"])) == 3
    envs.close()


def test_256_concurrent_50ms_calls_in_one_step_overlap():
    envs = make_vec(256)
    envs.reset(seed=0)
    tok_env = envs.envs[0]
    actions = [tok_env.encode_action(call_text(i)) for i in range(256)]
    CALLS.update(n=0, max_running=0)
    t0 = time.perf_counter()
    obs, rewards, te, tr, infos = envs.step(actions)
    elapsed = time.perf_counter() - t0
    assert CALLS["n"] == 256 and CALLS["max_running"] == 256
    assert elapsed < 256 * 0.05 / 8, elapsed  # far below the 12.8 s of a sequential loop
    for i in (0, 17, 255):
        assert f"got {i}" in tok_env.format.decode(obs[i].tolist())
    assert not te.any() and not tr.any() and infos["stepped"].all()


def test_subset_stepping_leaves_other_episodes_untouched():
    envs = make_vec(4, autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=1)
    e = envs.envs
    before = [list(x.conversation.completion_ids) for x in e]
    obs, rew, te, tr, infos = envs.step([e[0].encode_action(call_text(1)), None, e[2].encode_action("<answer>x</answer>"), None])
    assert infos["stepped"].tolist() == [True, False, True, False]
    assert len(obs[1]) == 0 and len(obs[3]) == 0
    assert [x.conversation.completion_ids for x in (e[1], e[3])] == [before[1], before[3]]
    assert te.tolist() == [False, False, True, False]
    assert envs.active.tolist() == [True, True, False, True]
    # stepping a finished sub-env without a reset is an error in DISABLED mode, not a silent reset
    with pytest.raises(RuntimeError, match="no running episode"):
        envs.step([None, None, e[2].encode_action("again"), None])
    # partial reset of just that sub-env
    obs, info = envs.reset(options={"reset_mask": np.array([False, False, True, False])})
    assert len(obs[2]) > 0 and len(obs[0]) == 0 and envs.active.all()
    assert e[0].conversation.completion_ids != []  # episode 0 kept its history


def test_next_step_autoreset_follows_gymnasium_semantics():
    envs = make_vec(2)  # NEXT_STEP is the default
    obs, _ = envs.reset(seed=0, options={"tasks": [TASKS[5], TASKS[6]]})
    e = envs.envs
    _, rew, te, _, infos = envs.step([e[0].encode_action("<answer>5</answer>"), e[1].encode_action(call_text(3))])
    assert te.tolist() == [True, False] and rew[0] == 1.0
    assert infos["trajectory"][0] is not None and infos["_trajectory"].tolist() == [True, False]
    # next step: sub-env 0 is reset (its action ignored) and returns a fresh prompt
    obs, rew, te, tr, infos = envs.step([e[0].encode_action("ignored"), e[1].encode_action("<answer>6</answer>")])
    assert len(obs[0]) > 0 and rew[0] == 0.0 and not te[0] and "task" in infos
    assert te[1] and rew[1] == 1.0


def test_same_step_autoreset_returns_final_obs_and_new_prompt():
    envs = make_vec(1, autoreset_mode=AutoresetMode.SAME_STEP)
    envs.reset(seed=0, options={"tasks": [TASKS[7]]})
    obs, rew, te, tr, infos = envs.step([envs.envs[0].encode_action("<answer>7</answer>")])
    assert te[0] and rew[0] == 1.0 and len(obs[0]) > 0
    assert infos["final_info"]["trajectory"][0].answer == "7"
    assert envs.active[0]


async def test_astep_from_a_foreign_event_loop():
    envs = make_vec(8)
    envs.reset(seed=0)
    acts = [envs.envs[i].encode_action(call_text(i)) for i in range(8)]
    obs, *_ = await envs.astep(acts)
    assert all(len(o) > 0 for o in obs)
    # single-env astep too
    env = envs.envs[0]
    o, r, te, tr, info = await env.astep(env.encode_action("<answer>0</answer>"))
    assert te


def test_vector_env_rejects_wrong_action_count():
    envs = make_vec(2)
    envs.reset()
    with pytest.raises(ValueError, match="expected 2 actions"):
        envs.step([None])


def test_toolgym_registers_all_envs():
    for env_id in toolgym.envs.registration.ENVS:
        assert env_id in gym.registry
        assert gym.registry[env_id].vector_entry_point is not None


def test_batched_infos_equal_gymnasiums_add_info():
    # ToolVectorEnv merges the sub-env infos in one pass per key; the result must be what calling gymnasium's
    # VectorEnv._add_info once per sub-env gives: same keys, masks, dtypes and values
    venv = make_vec(4)
    venv.reset(seed=0)
    pairs = [(i, venv.envs[i].step(venv.envs[i].encode_action(call_text(i)))[4]) for i in (0, 2, 3)]
    pairs.append((1, {"final_obs": np.arange(3), "final_info": {"turn": 1, "nested": {"x": 1.5}}, "turn": 7}))
    ours = venv._merge_infos({}, pairs)
    theirs: dict = {}
    for i, info in pairs:
        theirs = venv._add_info(theirs, info, i)

    def same(a, b) -> None:
        assert set(a) == set(b)
        for k in a:
            if isinstance(a[k], dict):
                same(a[k], b[k])
            else:
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
                for x, y in zip(a[k], b[k], strict=True):
                    assert x is y or np.array_equal(x, y), (k, x, y)

    same(ours, theirs)
    assert ours["_turn"].tolist() == [True, True, True, True] and ours["_final_obs"].tolist() == [False, True, False, False]
    venv.close()


# ------------------------------------------------------------------------------------ the executor and wrappers
class Bonus(gym.Wrapper):
    """A plain (synchronous) reward-shaping wrapper: +10 on every step, and marks reset's info."""

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        return obs, {**info, "wrapped": True}

    def step(self, action):
        obs, reward, te, tr, info = self.env.step(action)
        return obs, reward + 10.0, te, tr, {**info, "bonus": 10.0}


class AsyncBonus(Bonus):
    """The same wrapper with an ``astep``: the vector env awaits it instead of using a thread."""

    asteps = 0

    async def astep(self, action):
        AsyncBonus.asteps += 1
        obs, reward, te, tr, info = await self.env.astep(action)
        return obs, reward + 10.0, te, tr, {**info, "bonus": 10.0}


def _wrapped(wrapper, **kw):
    return wrapper(ToolEnv(TASKS, [slow], reward=reward, max_turns=3, **kw))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrapper", [Bonus, AsyncBonus, lambda e: Bonus(gym.wrappers.OrderEnforcing(e))])
def test_a_wrapper_in_env_fn_applies_to_reset_and_step_concurrently(wrapper):
    n = 16
    envs = ToolVectorEnv(functools.partial(_wrapped, wrapper), num_envs=n)
    _, info = envs.reset(seed=0, options={"tasks": TASKS[:n]})
    assert info["wrapped"].all()
    e = [env.unwrapped for env in envs.envs]
    AsyncBonus.asteps = 0
    CALLS.update(n=0, max_running=0)
    t0 = time.perf_counter()
    obs, rew, te, _, infos = envs.step([e[i].encode_action(call_text(i)) for i in range(n)])
    elapsed = time.perf_counter() - t0
    assert rew.tolist() == [10.0] * n and infos["bonus"].tolist() == [10.0] * n and not te.any()
    assert CALLS["n"] == n and CALLS["max_running"] == n, CALLS  # the wrapped steps overlap, none blocks the loop
    assert elapsed < n * 0.05 / 2, elapsed
    assert AsyncBonus.asteps == (n if wrapper is AsyncBonus else 0)
    # the final step: outcome reward 1 (right answer) + the wrapper's 10; sub-env 0 alone, as a per-episode driver does
    _, r0, te0, _, info0 = runtime.run_sync(envs.astep_env(0, e[0].encode_action("<answer>0</answer>")))
    assert te0 and r0 == 11.0 and info0["bonus"] == 10.0
    _, rew, te, _, infos = envs.step([None] + [e[i].encode_action(f"<answer>{i}</answer>") for i in range(1, n)])
    assert te[1:].all() and rew[1:].tolist() == [11.0] * (n - 1)
    assert [t.outcome_reward for t in infos["trajectory"][1:]] == [1.0] * (n - 1)
    envs.close()


class ClosingEcho(FunctionTool):
    """An echo tool that counts how often its executor closed it."""

    closes = 0

    async def aclose(self) -> None:
        ClosingEcho.closes += 1


def test_every_sub_env_gets_the_shared_executor_explicitly():
    from toolgym.tools.executor import ToolExecutor

    def echo_fn(x: str) -> str:
        """Echo x.

        Args:
            x: any text
        """
        return x

    echo = ClosingEcho(echo_fn, name="echo")
    one = functools.partial(ToolEnv, TASKS, [echo], max_turns=2)
    ClosingEcho.closes = 0
    envs = ToolVectorEnv(one, num_envs=3)
    ex = envs.executor
    assert all(env.unwrapped.executor is ex and not env.unwrapped.owns_executor for env in envs.envs)
    envs.close()  # the vector env took the first sub-env's executor over: it closes it, once
    assert ClosingEcho.closes == 1
    # an executor passed in stays its owner's: the vector env passes it to every sub-env and does not close it
    mine = ToolExecutor([echo])
    envs = ToolVectorEnv(one, num_envs=2, executor=mine)
    assert [env.unwrapped.executor for env in envs.envs] == [mine, mine]
    envs.close()
    assert ClosingEcho.closes == 1
    alone = one()  # a ToolEnv that built its executor owns it, unless told otherwise
    assert alone.owns_executor and not one(owns_executor=False).owns_executor
    assert alone.share_executor() is alone.executor and not alone.owns_executor
    with pytest.raises(ValueError, match="does not use the executor"):
        ToolVectorEnv(lambda **kw: ToolEnv(TASKS, [slow]), num_envs=2)  # env_fn drops executor=
    with pytest.raises(TypeError, match="must build a ToolEnv"):
        ToolVectorEnv(lambda **kw: gym.make("CartPole-v1"), num_envs=1)


class CountingBonus(Bonus):
    """:class:`Bonus` that counts the steps that went through it (shared across sub-envs)."""

    steps = 0

    def step(self, action):
        CountingBonus.steps += 1
        return super().step(action)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_both_driver_schedules_step_through_the_wrappers(schedule):
    """The rollout driver's per-episode (continuous) path steps each sub-env through its wrappers, as lock-step
    ``venv.step`` does: every turn of every episode reaches the wrapper."""
    from toolgym.rollout import RolloutDriver, ScriptedPolicy

    def script(state):
        return call_text(state.index) if state.turn == 0 else f"<answer>{state.index}</answer>"

    n = 4
    envs = ToolVectorEnv(functools.partial(_wrapped, CountingBonus), num_envs=n, autoreset_mode=AutoresetMode.DISABLED)
    CountingBonus.steps = 0
    trajs = RolloutDriver(envs, ScriptedPolicy(script), schedule=schedule, max_turn_tokens=64).run(TASKS[:6], seeds=0)
    assert len(trajs) == 6 and all(len(t.turns) == 2 for t in trajs)
    assert CountingBonus.steps == sum(len(t.turns) for t in trajs) == 12
    envs.close()
