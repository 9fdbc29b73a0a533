"""ToolVectorEnv: many token-level episodes stepped in one event loop with one shared ToolExecutor.

All tool calls of one vector step run concurrently under the executor's caps: a step of many episodes that each
call a slow tool takes about one tool latency, not their sum (``docs/benchmarks.md``). Episodes end at different turns, so sub-envs can be stepped as a
subset (``None`` actions), and Gymnasium's autoreset modes hold where used.

**Wrappers.** ``env_fn`` may return a wrapped env (``gym.Wrapper``): :meth:`ToolVectorEnv.reset` and
:meth:`ToolVectorEnv.step` both go through the wrappers, so a wrapper that changes the reward applies to every
step. Chosen over rejecting wrappers because ``gym.make`` adds wrappers of its own (``OrderEnforcing``) and users
shape rewards with wrappers; honouring them costs nothing for the bare envs toolgym registers. How a sub-env is
stepped, without blocking the event loop the others share:

* a bare :class:`~toolgym.envs.base.ToolEnv`: its ``astep`` coroutine (the fast path; all sub-envs of
  ``gym.make_vec("toolgym/...")`` are bare);
* wrappers that each either leave ``step`` alone or define an ``async def astep(action)`` next to their ``step``
  (calling ``await self.env.astep(action)``): the outermost such ``astep``, a coroutine like the bare env's;
* any other wrapper (a plain synchronous ``step``): the wrapper chain's ``step`` in a worker thread of a pool with
  one thread per such sub-env (the env's own ``step`` hops back to toolgym's runtime loop for the tools, so these
  episodes still overlap). Slower per step than a coroutine and not cancellable mid-step; give hot wrappers an
  ``astep``.

**Garbage collection.** Python's cyclic collector runs a generation-0 collection every 700 net allocations, a
generation-1 one every 10 of those and a full one every 10 of those (when enough objects have been promoted). A step
of N episodes allocates in proportion to N (its tasks and in-flight calls live long enough to be promoted), and a
full collection walks every long-lived object (per sub-env its spaces, chat format, random generators and episode;
plus everything imported before), also in proportion to N: the collector's share of a step grew like N^2. At 4,096
episodes 2 full collections landed in every step, at 1,024 one in every second step (each several times the tool's
latency), and whether one landed decided the median. By default (``manage_gc=True``) a vector env therefore pauses
the collector (:func:`gc.disable`) while :meth:`ToolVectorEnv.step`, :meth:`~ToolVectorEnv.astep` and
:meth:`~ToolVectorEnv.reset` run, and re-enables it when the last of them running ends, unless it was already
disabled. The young objects of a step are then collected in one generation-0 collection at the first allocation
after it, instead of hundreds inside it; memory grows by at most the cyclic garbage of one step (reference counting
frees the rest at once). The pause is process-wide (other threads' allocations are not collected during it either)
and lasts only as long as those calls; :meth:`~ToolVectorEnv.astep_env` (one episode, for per-episode schedulers)
does not pause. Opt out with ``manage_gc=False`` (also ``gym.make_vec(..., manage_gc=False)``): then the collector
is left alone. Results are the same either way; only when the collector runs changes
(``python -m benchmarks.vector_step --scale`` measures both).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.tools.executor import ToolExecutor

__all__ = ["ToolVectorEnv"]

_EMPTY = np.zeros(0, dtype=np.int64)

# the collector's pause, shared by every ToolVectorEnv of the process (see the module docstring)
_gc_lock = threading.Lock()
_pausers = 0  # steps/resets running with the collector paused
_reenable = False  # whether the collector was enabled when the first of them paused it


@contextlib.contextmanager
def _gc_paused(active: bool) -> Iterator[None]:
    """The collector paused while the block runs (``active``; else a no-op). Nested and concurrent pauses share
    one count: the last to leave re-enables it, unless it was disabled when the first one entered."""
    global _pausers, _reenable
    if not active:
        yield
        return
    with _gc_lock:
        if _pausers == 0:
            _reenable = gc.isenabled()
            gc.disable()
        _pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _pausers = max(0, _pausers - 1)
            if _pausers == 0 and _reenable:
                gc.enable()


class ToolVectorEnv(VectorEnv):
    """``num_envs`` copies of a :class:`ToolEnv` sharing one executor (and so one set of tool sessions).

    Args:
        env_fn: builds one sub-env (a :class:`ToolEnv`, possibly wrapped: see the module docstring); called as
            ``env_fn(executor=shared, **env_kwargs)`` for every sub-env when ``executor`` is given, else as
            ``env_fn(**env_kwargs)`` for the first, whose executor is then taken over
            (:meth:`ToolEnv.share_executor`) and passed as ``executor=`` to the others. A sub-env that does not
            use the executor it was passed is a ``ValueError``.
        num_envs: number of sub-envs.
        autoreset_mode: Gymnasium's ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (rollout drivers).
        executor: a shared executor to use for every sub-env, closed by its owner (else the first sub-env's is
            shared, and closed by :meth:`close`).
        manage_gc: keep Python's garbage collector out of the steps: pause it (process-wide) while :meth:`step`,
            :meth:`astep` and :meth:`reset` run; see "Garbage collection" in the module docstring. ``False``: the
            collector is left alone.
        **env_kwargs: forwarded to ``env_fn``.

    Observations are a tuple of ``num_envs`` 1-D ``np.int64`` arrays (each sub-env's prompt or observation ids;
    empty when the sub-env was not stepped or its episode ended). ``actions`` for :meth:`step` is a sequence of
    ``num_envs`` 1-D int arrays, where ``None`` means "do not step this sub-env" (subset stepping).
    ``infos["stepped"]`` (bool array) says which sub-envs were stepped.
    """

    def __init__(
        self,
        env_fn: Callable[..., ToolEnv],
        num_envs: int = 1,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        executor: ToolExecutor | None = None,
        manage_gc: bool = True,
        **env_kwargs: Any,
    ) -> None:
        self.manage_gc = bool(manage_gc)
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self._owns_executor = executor is None
        if executor is None:
            first = env_fn(**env_kwargs)
            executor = _tool_env(first).share_executor()
        else:
            first = env_fn(executor=executor, **env_kwargs)
        self.executor: ToolExecutor = executor
        self.envs: list[ToolEnv] = [first] + [env_fn(executor=executor, **env_kwargs) for _ in range(num_envs - 1)]
        stray = next((i for i, env in enumerate(self.envs) if _tool_env(env).executor is not executor), None)
        if stray is not None:
            for env in self.envs:
                env.close()
            if self._owns_executor:
                runtime.run_sync(executor.aclose())
            raise ValueError(f"sub-env {stray} does not use the executor passed to env_fn as executor=: the sub-envs "
                             "must share one (pass **kwargs on to ToolEnv)")
        self._steppers: list[Callable[[Any], Awaitable[Any]] | None] = [_async_step(env) for env in self.envs]
        threaded = sum(s is None for s in self._steppers)
        self._wrapper_pool = (
            ThreadPoolExecutor(max_workers=threaded, thread_name_prefix="toolgym-wrapped-step") if threaded else None
        )
        self.num_envs = num_envs
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.metadata = {**getattr(first, "metadata", {}), "autoreset_mode": self.autoreset_mode}
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.spec = getattr(first, "spec", None)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._active = np.zeros(num_envs, dtype=bool)

    @property
    def tokenizer(self) -> Any:
        return self.envs[0].unwrapped.tokenizer

    @property
    def active(self) -> np.ndarray:
        """Bool array: sub-envs whose episode is running (reset and not yet ended)."""
        return self._active.copy()

    # -- reset ------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
        """Reset all sub-envs, or those in ``options["reset_mask"]``.

        ``seed``: an int (sub-env ``i`` gets ``seed + i``) or one seed per sub-env. ``options["tasks"]``: one task
        row per sub-env (``None`` entries draw from the seed). Other options are passed to every sub-env.
        Sub-envs not reset get an empty observation.
        """
        with _gc_paused(self.manage_gc):
            return self._reset(seed, options)

    def _reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
        options = dict(options or {})
        mask = np.asarray(options.pop("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        tasks = options.pop("tasks", None)
        if seed is None or isinstance(seed, int | np.integer):
            seeds: list[int | None] = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        if tasks is not None and len(tasks) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} tasks, got {len(tasks)}")
        obs: list[np.ndarray] = []
        pairs: list[tuple[int, dict[str, Any]]] = []
        for i, env in enumerate(self.envs):
            if not mask[i]:
                obs.append(_EMPTY)
                continue
            opts = dict(options)
            if tasks is not None and tasks[i] is not None:
                opts["task"] = tasks[i]
            o, info = env.reset(seed=seeds[i], options=opts or None)
            obs.append(o)
            pairs.append((i, info))
            self._autoreset[i] = False
            self._active[i] = True
        return tuple(obs), self._merge_infos({}, pairs)

    # -- step -------------------------------------------------------------------------------------
    def step(
        self, actions: Sequence[np.ndarray | None]
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env with a non-``None`` action, all tool calls concurrently. See :meth:`astep`."""
        return runtime.run_sync(self.astep(actions))

    async def astep(
        self, actions: Sequence[np.ndarray | None]
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the sub-envs concurrently.

        Returns ``(obs, rewards, terminations, truncations, infos)``: ``obs`` a tuple of ``num_envs`` id arrays,
        ``rewards`` float64 ``(num_envs,)``, the flags bool ``(num_envs,)``, ``infos`` Gymnasium-style batched
        dicts (``infos["trajectory"]`` holds finished episodes' trajectories) plus ``infos["stepped"]``.
        """
        with _gc_paused(self.manage_gc):
            return await self._astep(actions)

    async def _astep(
        self, actions: Sequence[np.ndarray | None]
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions (None to skip a sub-env), got {len(actions)}")
        n = self.num_envs
        obs: list[np.ndarray] = [_EMPTY] * n
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=bool)
        truncs = np.zeros(n, dtype=bool)
        stepped = np.zeros(n, dtype=bool)
        pairs: list[tuple[int, dict[str, Any]]] = []  # (sub-env, info): merged into batched arrays at the end
        todo: list[int] = []
        for i, a in enumerate(actions):
            if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._autoreset[i]:
                obs[i], info = self.envs[i].reset()
                pairs.append((i, info))
                self._autoreset[i] = False
                self._active[i] = True
            elif a is not None:
                if not self._active[i]:
                    raise RuntimeError(f"sub-env {i} has no running episode: reset it (reset_mask) or pass None")
                todo.append(i)
        results = await asyncio.gather(*(self.astep_env(i, actions[i]) for i in todo), return_exceptions=True)
        # ToolEnv.astep answers its own faults; anything still raised ends only that sub-env's episode (truncated,
        # infos["error"]), never the step of the others
        results = [
            self.envs[i].unwrapped.fail_episode(r) if isinstance(r, BaseException) else r
            for i, r in zip(todo, results, strict=True)
        ]
        final: list[tuple[int, dict[str, Any]]] = []
        for i, (o, r, te, tr, info) in zip(todo, results, strict=True):  # type: ignore[misc]
            stepped[i] = True
            obs[i], rewards[i], terms[i], truncs[i] = o, r, te, tr
            if te or tr:
                self._active[i] = False
                if self.autoreset_mode == AutoresetMode.NEXT_STEP:
                    self._autoreset[i] = True
                elif self.autoreset_mode == AutoresetMode.SAME_STEP:
                    new_obs, reset_info = self.envs[i].reset()
                    self._active[i] = True
                    final.append((i, {"final_obs": o, "final_info": info}))
                    info = reset_info
                    obs[i] = new_obs
            pairs.append((i, info))
        infos = self._merge_infos(self._merge_infos({}, final), pairs)
        infos["stepped"] = stepped
        return tuple(obs), rewards, terms, truncs, infos

    async def astep_env(self, i: int, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step sub-env ``i`` alone, through its wrappers (for per-episode scheduling: one coroutine per episode).

        Returns that sub-env's ``(obs, reward, terminated, truncated, info)``. Runs its ``astep`` coroutine on the
        runtime loop, or a sync-only wrapper chain's ``step`` in a worker thread (see the module docstring). Does
        not touch the vector env's autoreset or ``active`` bookkeeping.
        """
        stepper = self._steppers[i]
        if stepper is not None:
            return await runtime.run_async(stepper(action))
        return await asyncio.get_running_loop().run_in_executor(self._wrapper_pool, self.envs[i].step, action)

    def _merge_infos(self, infos: dict[str, Any], pairs: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """Gymnasium's ``VectorEnv._add_info`` applied to many ``(sub-env index, info)`` pairs at once: the same
        arrays, dtypes and ``_key`` masks, built with one pass per key instead of one call per sub-env and key."""
        if not pairs:
            return infos
        n = self.num_envs
        by_key: dict[str, list[tuple[int, Any]]] = {}
        for i, info in pairs:
            for k, v in info.items():
                by_key.setdefault(k, []).append((i, v))
        for key, items in by_key.items():
            first = items[0][1]
            if key != "final_obs" and isinstance(first, dict):
                array = self._merge_infos(infos.get(key, {}), items)
            else:
                array = infos.get(key)
                if array is None:
                    if key != "final_obs" and (type(first) in (int, float, bool) or isinstance(first, np.number)):
                        array = np.zeros(n, dtype=type(first))
                    elif key != "final_obs" and isinstance(first, np.ndarray):
                        array = np.zeros((n, *first.shape), dtype=first.dtype)
                    else:
                        array = np.full(n, fill_value=None, dtype=object)
                for i, v in items:
                    array[i] = v
            mask = infos.get(f"_{key}")
            if mask is None:
                mask = np.zeros(n, dtype=np.bool_)
            mask[[i for i, _ in items]] = True
            infos[key], infos[f"_{key}"] = array, mask
        return infos

    # -- misc -------------------------------------------------------------------------------------
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        out = []
        for env in self.envs:
            fn = getattr(env, name)
            out.append(fn(*args, **kwargs) if callable(fn) else fn)
        return tuple(out)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return tuple(getattr(env, name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        for env, v in zip(self.envs, values, strict=True):
            setattr(env, name, v)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        if self._wrapper_pool is not None:
            self._wrapper_pool.shutdown(wait=False)
        if self._owns_executor:
            try:
                runtime.run_sync(self.executor.aclose())
            except Exception:  # noqa: BLE001
                pass


def _tool_env(env: Any) -> ToolEnv:
    """The :class:`ToolEnv` under ``env``'s wrappers; a ``TypeError`` when there is none."""
    base = getattr(env, "unwrapped", env)
    if not isinstance(base, ToolEnv):
        raise TypeError(f"env_fn must build a ToolEnv (possibly wrapped), got {type(base).__name__}")
    return base


def _defines(cls: type, name: str) -> int | None:
    """Position in ``cls.__mro__`` of the class that defines ``name`` (``None``: none does)."""
    return next((k for k, c in enumerate(cls.__mro__) if name in vars(c)), None)


def _async_step(env: Any) -> Callable[[Any], Awaitable[Any]] | None:
    """The coroutine function that steps ``env`` through all its wrappers, or ``None`` when there is none.

    From the outside in, wrappers that leave ``step`` alone and define no ``astep`` are skipped (they change
    nothing in a step); from the first wrapper that defines ``astep`` on, each must define it, no less derived than
    its ``step`` (its ``astep`` awaits the next one's). A wrapper overriding only ``step`` means ``None``.
    """
    outer: Any = None
    e = env
    while isinstance(e, gym.Wrapper):
        mro = type(e).__mro__
        at_step, at_astep = _defines(type(e), "step"), _defines(type(e), "astep")
        overrides_step = at_step is not None and mro[at_step] is not gym.Wrapper
        if at_astep is None:
            if overrides_step or outer is not None:
                return None
        elif overrides_step and at_step is not None and at_astep > at_step:
            return None
        else:
            outer = outer or e
        e = e.env
    return (outer or e).astep


def _autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    """``AutoresetMode`` from an enum or a name/value in any case (``"disabled"``, ``"NEXT_STEP"``, ``"SameStep"``)."""
    if isinstance(mode, AutoresetMode):
        return mode
    key = str(mode).replace("_", "").replace("-", "").lower()
    for m in AutoresetMode:
        if key in (m.name.replace("_", "").lower(), m.value.lower()):
            return m
    raise ValueError(f"unknown autoreset mode {mode!r}; use one of {[m.value for m in AutoresetMode]}")
