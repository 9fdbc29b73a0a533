"""Rollout driver: run token-level tool episodes with a :class:`~toolgym.rollout.types.Policy`, lock-step or
continuous.

:class:`RolloutDriver` runs episodes on a :class:`toolgym.envs.vector.ToolVectorEnv` with one of two schedules:

* ``"lockstep"``: generate one turn for every running episode in one policy call, step them all concurrently
  (all tool calls of the step run at once), repeat until every episode has ended. The number of policy calls
  per wave is the same on every rank when ``sync_fn`` is given, which distributed generation needs (vLLM server
  mode, ZeRO-3).
* ``"continuous"``: one coroutine per env slot; an episode asks for its next turn as soon as its tools answered,
  a finished slot immediately starts the next task, and concurrent requests are micro-batched
  (:class:`toolgym.batching.MicroBatcher`) for a batched policy. A finished or tool-waiting episode never holds a
  generation slot.

Trajectories are written as JSONL (one :meth:`Trajectory.to_dict` per line). This module never imports
``trainers/``, TRL or vLLM.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from toolgym.batching import MicroBatcher
from toolgym.rollout.types import EpisodeState, Generation, GenerationRequest, Policy, RolloutStats
from toolgym.trajectory import Trajectory, write_trajectories

__all__ = ["RolloutDriver", "Schedule", "attach_logprobs"]

Schedule = Literal["lockstep", "continuous"]


def attach_logprobs(traj: Trajectory, turn_logprobs: Sequence[Sequence[float] | None]) -> None:
    """Fill ``traj.logprobs`` (one float per completion token, ``0.0`` on env tokens) from the per-turn sampled
    logprobs, walking ``loss_mask``: mask-1 tokens are exactly the sampled ones, in order (DESIGN invariant 1).
    Leaves ``None`` when any turn has no logprobs or the counts disagree."""
    if any(lp is None for lp in turn_logprobs):
        traj.logprobs = None
        return
    flat = [float(x) for lp in turn_logprobs for x in lp]  # type: ignore[union-attr]
    if sum(traj.loss_mask) != len(flat):
        traj.logprobs = None
        return
    it = iter(flat)
    traj.logprobs = [next(it) if m else 0.0 for m in traj.loss_mask]


class RolloutDriver:
    """Run episodes of a toolgym env with a :class:`Policy`.

    Args:
        env: a :class:`~toolgym.envs.vector.ToolVectorEnv`, or an env id for ``gym.make_vec`` (then ``num_envs`` and
            ``env_kwargs`` build it; autoreset is disabled).
        policy: the policy.
        schedule: ``"lockstep"`` or ``"continuous"`` (see the module docstring).
        max_turn_tokens: the most tokens sampled per assistant turn.
        max_completion_tokens: the most completion tokens per episode (actions + observations); a turn never
            asks for more than what is left, and trainers can rely on ``len(completion_ids) <= this`` once
            :meth:`clip` has been applied (observations can overshoot; the env truncates the episode).
        sync_fn: lock-step only: ``fn(local_active_count) -> global_max_active_count``. With it the driver calls
            the policy once per turn until **every rank** is done (even with no local request), so collective
            generation backends see the same number of calls on each rank.
        num_envs, env_kwargs: used when ``env`` is an id.
    """

    def __init__(
        self,
        env: Any,
        policy: Policy,
        *,
        schedule: Schedule = "lockstep",
        max_turn_tokens: int = 256,
        max_completion_tokens: int | None = None,
        sync_fn: Callable[[int], int] | None = None,
        num_envs: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(env, str):
            from toolgym.envs.registration import make_vector_env

            env = make_vector_env(env, num_envs or 1, env_kwargs)
        if schedule not in ("lockstep", "continuous"):
            raise ValueError(f"schedule must be 'lockstep' or 'continuous', got {schedule!r}")
        if max_turn_tokens < 1:
            raise ValueError("max_turn_tokens must be >= 1")
        self.venv = env
        self.policy = policy
        self.schedule: Schedule = schedule
        self.max_turn_tokens = max_turn_tokens
        self.max_completion_tokens = max_completion_tokens
        self.sync_fn = sync_fn
        self.stats = RolloutStats()
        self._bar: Any = None
        self._on_episode: Callable[[int, Trajectory], None] | None = None
        self._t0 = self._refreshed = time.perf_counter()

    @property
    def num_envs(self) -> int:
        return int(self.venv.num_envs)

    def _sub(self, i: int) -> Any:
        return self.venv.envs[i].unwrapped

    def _budget(self, env: Any) -> int:
        traj: Trajectory = env.trajectory
        used = len(traj.completion_ids)
        left = self.max_turn_tokens
        if self.max_completion_tokens is not None:
            left = min(left, self.max_completion_tokens - used)
        left = min(left, int(env.max_episode_tokens) - len(traj.prompt_ids) - used)
        return max(0, left)  # 0: budget spent; the driver sends an empty action and the env closes the turn

    def _request(self, i: int, index: int, task: dict[str, Any]) -> GenerationRequest:
        env = self._sub(i)
        traj: Trajectory = env.trajectory
        return GenerationRequest(
            prompt_ids=list(traj.prompt_ids) + list(traj.completion_ids),
            max_new_tokens=self._budget(env),
            stop_ids=tuple(sorted(env.format.stop_ids)),
            episode=EpisodeState(index=index, task=task, turn=len(traj.turns), env=env),
            images=list(getattr(getattr(env, "conversation", None), "images", None) or ()),
        )

    async def _call_policy(self, reqs: list[GenerationRequest]) -> list[Generation]:
        """One policy call for ``reqs`` (requests with no budget left get an empty action without the policy;
        with ``sync_fn`` the call is made even when nothing is left to generate locally)."""
        todo = [r for r in reqs if r.max_new_tokens > 0]
        if not todo and reqs and self.sync_fn is None:
            return [Generation([], [], "length") for _ in reqs]
        t0 = time.perf_counter()
        got = await self.policy.agenerate(todo)
        self.stats.gen_s += time.perf_counter() - t0
        self.stats.policy_calls += 1
        self.stats.batch_sizes.append(len(todo))
        if len(got) != len(todo):
            raise RuntimeError(f"policy returned {len(got)} generations for {len(todo)} requests")
        it = iter(got)
        gens = [next(it) if r.max_new_tokens > 0 else Generation([], [], "length") for r in reqs]
        for k, (r, g) in enumerate(zip(reqs, gens, strict=True)):
            if len(g.token_ids) > r.max_new_tokens:  # enforce the budget whatever the policy did
                gens[k] = g = Generation.from_sampled(
                    g.token_ids, g.logprobs, (), r.max_new_tokens, finish_reason=g.finish_reason
                )
            self.stats.generated_tokens += len(g.token_ids)
        return gens

    # -- public API -------------------------------------------------------------------------------
    def run(
        self, tasks: Sequence[Mapping[str, Any] | None], *, seeds: Sequence[int | None] | int | None = None,
        trajectory_path: str | Path | None = None, progress: bool = False,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Blocking :meth:`arun` (must not be called from a running event loop: ``await arun`` there)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(tasks, seeds=seeds, trajectory_path=trajectory_path, progress=progress,
                                         on_episode=on_episode))
        raise RuntimeError("RolloutDriver.run() called inside a running event loop; use `await driver.arun(...)`")

    async def arun(
        self, tasks: Sequence[Mapping[str, Any] | None], *, seeds: Sequence[int | None] | int | None = None,
        trajectory_path: str | Path | None = None, progress: bool = False,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run one episode per task row (``None``: a task drawn from the seed) and return the trajectories in
        task order, each with ``logprobs`` filled when the policy gave them.

        Args:
            tasks: task rows (any number; more than ``num_envs`` run in waves or through the slots).
            seeds: one seed per task, or an int (task ``k`` gets ``seed + k``), or ``None``.
            trajectory_path: append the trajectories as JSONL to this file.
            progress: show a tqdm bar over episodes, with live turns, tool calls and generated tokens/s.
            on_episode: ``fn(task_index, trajectory)`` called as each episode ends (in completion order), e.g.
                to stream it to a file (``toolgym eval``).
        """
        rows = [None if t is None else dict(t) for t in tasks]
        if seeds is None or isinstance(seeds, int | np.integer):
            seed_list: list[int | None] = [None if seeds is None else int(seeds) + k for k in range(len(rows))]
        else:
            seed_list = list(seeds)
            if len(seed_list) != len(rows):
                raise ValueError(f"expected {len(rows)} seeds, got {len(seed_list)}")
        self.stats = RolloutStats()
        self._on_episode = on_episode
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(rows), desc=f"rollout ({self.schedule})", unit="ep")
        self._bar = bar
        t0 = self._t0 = time.perf_counter()
        done: list[Trajectory | None] = [None] * len(rows)  # filled as episodes finish
        try:
            if self.schedule == "lockstep":
                out = await self._lockstep(rows, seed_list, done)
            else:
                out = await self._continuous(rows, seed_list, done)
        except BaseException:
            # a failure of the run itself (the policy, a reset) still keeps the episodes that finished: they are
            # written before the error propagates (tool and env faults never get here: they end only their episode)
            if trajectory_path is not None:
                finished = [t for t in done if t is not None]
                if finished:
                    write_trajectories(trajectory_path, finished, append=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        self.stats.wall_s = time.perf_counter() - t0
        self.stats.episodes = len(out)
        self.stats.turns = sum(len(t.turns) for t in out)
        if trajectory_path is not None:
            write_trajectories(trajectory_path, out, append=True)
        return out

    # -- lock-step --------------------------------------------------------------------------------
    async def _lockstep(
        self, rows: list[dict[str, Any] | None], seeds: list[int | None], out: list[Trajectory | None]
    ) -> list[Trajectory]:
        n = self.num_envs
        waves = max(1, math.ceil(len(rows) / n)) if rows else 0
        if self.sync_fn is not None:  # every rank runs the same number of waves
            waves = self.sync_fn(waves)
        for w in range(waves):
            idx = list(range(w * n, min((w + 1) * n, len(rows))))
            mask = np.zeros(n, dtype=bool)
            mask[: len(idx)] = True
            wave_tasks = [rows[k] for k in idx] + [None] * (n - len(idx))
            wave_seeds = [seeds[k] for k in idx] + [None] * (n - len(idx))
            if idx:
                self.venv.reset(seed=wave_seeds, options={"tasks": wave_tasks, "reset_mask": mask})
            active = {j: idx[j] for j in range(len(idx))}  # sub-env -> episode index
            lps: dict[int, list[list[float] | None]] = {j: [] for j in active}
            while True:
                local = len(active)
                if self.sync_fn is not None:
                    if self.sync_fn(local) == 0:
                        break
                elif local == 0:
                    break
                order = sorted(active)
                reqs = [self._request(j, active[j], rows[active[j]] or self._sub(j).task) for j in order]
                gens = await self._call_policy(reqs)
                if not order:
                    continue
                actions: list[np.ndarray | None] = [None] * n
                for j, g in zip(order, gens, strict=True):
                    actions[j] = np.asarray(g.token_ids, dtype=np.int64)
                    lps[j].append(g.logprobs)
                _, _, terms, truncs, _ = await self.venv.astep(actions)
                for j in order:
                    self._stepped(self._sub(j).trajectory)
                    if terms[j] or truncs[j]:
                        traj = self._sub(j).trajectory
                        attach_logprobs(traj, lps[j])
                        k = active.pop(j)
                        out[k] = traj
                        self._finished(k, traj)
        return [t for t in out if t is not None]

    # -- continuous -------------------------------------------------------------------------------
    async def _continuous(
        self, rows: list[dict[str, Any] | None], seeds: list[int | None], out: list[Trajectory | None]
    ) -> list[Trajectory]:
        if self.sync_fn is not None:
            raise ValueError("the continuous schedule cannot agree on call counts across ranks: use 'lockstep'")
        n = self.num_envs
        queue: asyncio.Queue[int] = asyncio.Queue()
        for k in range(len(rows)):
            queue.put_nowait(k)
        # a policy that runs one batch at a time gets the requests that are ready together, in one call
        batcher: MicroBatcher[GenerationRequest, Generation] | None = (
            None if getattr(self.policy, "concurrent", False) else MicroBatcher(self._call_policy)
        )

        async def generate(req: GenerationRequest) -> Generation:
            if batcher is None:
                return (await self._call_policy([req]))[0]
            return await batcher.submit(req)

        async def slot(j: int) -> None:
            env = self._sub(j)
            while True:
                try:
                    k = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                mask = np.zeros(n, dtype=bool)
                mask[j] = True
                tasks = [None] * n
                tasks[j] = rows[k]
                sd: list[int | None] = [None] * n
                sd[j] = seeds[k]
                self.venv.reset(seed=sd, options={"tasks": tasks, "reset_mask": mask})
                lps: list[list[float] | None] = []
                while True:
                    g = await generate(self._request(j, k, rows[k] or env.task))
                    lps.append(g.logprobs)
                    # through the sub-env's wrappers, like the lock-step path's venv.step
                    _, _, te, tr, _ = await self.venv.astep_env(j, np.asarray(g.token_ids, dtype=np.int64))
                    self._stepped(env.trajectory)
                    if te or tr:
                        break
                traj = env.trajectory
                attach_logprobs(traj, lps)
                out[k] = traj
                self._finished(k, traj)

        workers = [asyncio.create_task(slot(j)) for j in range(min(n, len(rows)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            if batcher is not None:
                await batcher.aclose()
        return [t for t in out if t is not None]

    # -- progress and per-episode hooks ----------------------------------------------------------
    def _stepped(self, traj: Trajectory | None) -> None:
        """Live counters after one turn of one episode was stepped (the bar shows them before episodes end)."""
        self.stats.live_turns += 1
        if traj is not None and traj.turns:
            self.stats.tool_calls += len(traj.turns[-1].calls)
        bar = self._bar
        if bar is not None:
            now = time.perf_counter()
            bar.set_postfix(turns=self.stats.live_turns, calls=self.stats.tool_calls,
                            tok_s=f"{self.stats.generated_tokens / max(now - self._t0, 1e-9):.1f}", refresh=False)
            if now - self._refreshed >= 0.5:  # at most twice a second, even while no episode finishes
                self._refreshed = now
                bar.refresh()

    def _finished(self, k: int, traj: Trajectory) -> None:
        bar = self._bar
        if bar is not None:
            bar.update(1)
        cb = self._on_episode
        if cb is not None:
            cb(k, traj)

    # -- helpers for trainers ---------------------------------------------------------------------
    def clip(self, traj: Trajectory) -> Trajectory:
        """:meth:`Trajectory.clip` to ``max_completion_tokens``, never inside an image block of a vision-language
        env (the cut moves to the block's start). Returns ``traj`` (mutated)."""
        vision = getattr(self._sub(0), "vision", None) if self.num_envs else None
        if vision is None:
            return traj.clip(self.max_completion_tokens)
        from toolgym.format.vision import image_blocks

        return traj.clip(self.max_completion_tokens, blocks=image_blocks(traj.completion_ids, vision))
