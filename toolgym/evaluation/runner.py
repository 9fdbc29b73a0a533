"""Evaluation: each task of a split exactly once (x k samples), with confidence intervals and pass@k.

``toolgym eval`` and :func:`evaluate` run every selected task exactly once per sample through
:class:`toolgym.rollout.RolloutDriver` (no drawing with replacement), stream the trajectories to a JSONL file as
episodes finish, and return an :class:`EvalReport`:

* ``success`` with a 95% **Wilson** score interval (:func:`wilson_interval`);
* ``pass_at_k`` (the unbiased estimator of Chen et al. 2021, :func:`pass_at_k`) and ``mean_at_k`` (the mean
  success over the k samples, averaged over tasks) when ``k > 1``;
* reward, tool-call rate, tool calls per episode, turns, error kinds, drift count;
* ``task_ids`` and ``per_task_success`` (aligned lists) for paired before/after comparisons
  (:func:`paired_difference_ci`).

Task selection (:func:`toolgym.evaluation.tasks.select_tasks`, re-exported here): ``"all"`` = the whole finite split; ``N`` =
N distinct tasks chosen reproducibly from the seed (a seeded permutation of a finite split, or distinct tasks drawn
from a seeded generator on a procedural split such as Calculator-v0's, where ``"all"`` is an error); a ``.jsonl``
path = those rows. Task ids (``row["id"]``, else a hash of the row) must be unique: a task is never run twice per
sample. Trainers draw their tasks the same way (:func:`toolgym.evaluation.tasks.draw_tasks`).

Streaming output (``out=``): the file is **not touched until the first episode has finished**. That episode is
written to a temporary file in the same directory, which then atomically replaces ``out``; every later episode is
appended and flushed as it finishes. So an interrupted or crashed run keeps every finished episode, and a
pre-existing file is never emptied before new results exist. Rows are ``Trajectory.to_dict()`` plus
``"eval": {"task_index", "task_id", "sample"}``, in completion order.

This module never imports ``trainers/``, TRL or training code.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolgym.envs.registration import import_env_id, make_vector_env
from toolgym.evaluation.tasks import (
    TaskFileError,
    TaskSelectionError,
    base_env,
    check_unique,
    select_tasks,
    task_id,
)
from toolgym.jsonl import JSONLStream
from toolgym.trajectory import Trajectory, summarize

__all__ = [
    "EvalReport",
    "TaskFileError",
    "TaskSelectionError",
    "evaluate",
    "has_oracle",
    "import_env_id",
    "make_vector_env",
    "mean_at_k",
    "oracle_policy",
    "paired_difference_ci",
    "pass_at_k",
    "select_tasks",
    "task_id",
    "wilson_interval",
]


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion ``successes / n`` (``z = 1.96``: 95%).

    ``(lo, hi)`` within ``[0, 1]``; ``(0.0, 1.0)`` when ``n == 0``. Unlike the normal (Wald) interval it stays
    inside ``[0, 1]`` and is not degenerate at 0% or 100% success. ``successes`` may be fractional (a sum of
    per-task success rates; :func:`evaluate` does this for ``k > 1``).
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the probability
    that at least one of ``k`` samples drawn without replacement from ``n`` samples, ``c`` of them correct, is
    correct: ``1 - C(n-c, k) / C(n, k)`` (computed as a stable product)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_at_k(successes: Sequence[float]) -> float:
    """mean@k of one task: the mean success over its ``k`` samples (averaged over tasks by :func:`evaluate`)."""
    if not successes:
        raise ValueError("mean_at_k needs at least one sample")
    return float(sum(successes) / len(successes))


def _t_quantile(p: float, df: int) -> float:
    """Student-t quantile: scipy when installed, else the Cornish-Fisher expansion around the normal quantile
    (Abramowitz & Stegun 26.7.5; error < 1e-3 for df >= 4 at 95%)."""
    try:
        from scipy.stats import t as student_t

        return float(student_t.ppf(p, df))
    except ImportError:
        z = statistics.NormalDist().inv_cdf(p)
        v = float(df)
        return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
                + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def paired_difference_ci(
    before: Sequence[float], after: Sequence[float], confidence: float = 0.95
) -> dict[str, float]:
    """Confidence interval for the mean per-task difference ``after - before`` (paired: the same tasks, same
    order, e.g. :attr:`EvalReport.per_task_success` of two evaluations with the same seed).

    Method: the paired t-interval on the per-task differences ``d_i = after_i - before_i``:
    ``mean(d) ± t_{(1+confidence)/2, n-1} · sd(d) / sqrt(n)`` (sample sd, ``n - 1`` degrees of freedom). For
    binary outcomes this is the standard large-sample interval for a difference of paired proportions (it uses
    only discordant pairs through ``sd(d)``); with ``n >= 30`` tasks it is accurate, and it works unchanged for
    fractional per-task success (``k > 1``). When every difference is equal the interval is that single value.

    Returns ``{"mean", "lo", "hi", "n"}`` (``n`` = number of tasks).
    """
    if len(before) != len(after):
        raise ValueError(f"paired samples differ in length: {len(before)} vs {len(after)}")
    n = len(before)
    if n == 0:
        raise ValueError("paired_difference_ci needs at least one task")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    d = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    mean = float(d.mean())
    if n == 1:
        return {"mean": mean, "lo": -math.inf, "hi": math.inf, "n": 1}
    sd = float(d.std(ddof=1))
    half = _t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


# ---------------------------------------------------------------------------------------------------------------
# Policies and envs
# ---------------------------------------------------------------------------------------------------------------


def has_oracle(env: Any) -> bool:
    """Whether ``env`` (a ToolEnv, a wrapped env or a vector env) defines an ``oracle`` method: a callable one
    other than :meth:`ToolEnv.oracle`, the default that only raises ``NotImplementedError``."""
    from toolgym.envs.base import ToolEnv

    base = base_env(env)
    return callable(getattr(base, "oracle", None)) and getattr(type(base), "oracle", None) is not ToolEnv.oracle


def oracle_policy(env: Any = None) -> Any:
    """A :class:`~toolgym.rollout.ScriptedPolicy` that asks each episode's env for its text:
    ``env.oracle(state) -> str`` (``state.env`` is the unwrapped sub-env running the episode).

    Raises:
        ValueError: ``env`` (a ToolEnv or vector env, when given) has no ``oracle`` method.
    """
    from toolgym.rollout import EpisodeState, ScriptedPolicy

    if env is not None and not has_oracle(env):
        raise ValueError(f"env {type(base_env(env)).__name__} has no oracle: define `oracle(self, state) -> str` "
                         "on the env class to use --policy oracle")

    def script(state: EpisodeState) -> str:
        fn = getattr(state.env, "oracle", None)
        if not callable(fn):
            raise ValueError(f"env {type(state.env).__name__} has no oracle(state) method")
        return fn(state)

    return ScriptedPolicy(script)


# ---------------------------------------------------------------------------------------------------------------
# The report and evaluate()
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EvalReport:
    """The result of :func:`evaluate`. ``to_dict()`` is the JSON that ``toolgym eval --json`` prints.

    Rates are fractions in ``[0, 1]``; ``turns`` and ``calls_per_episode`` are means per episode; ``wall_s`` is
    seconds. ``task_ids`` and ``per_task_success`` are aligned (task order of the selection); each
    ``per_task_success`` entry is the mean success over that task's ``k`` samples. ``episode_errors`` counts episodes
    by the faults that are not the model's (``Trajectory.errors``: ``prompt_too_long``, ``reward_timeout``, ...); such
    an episode scores 0 and also counts as a failure in ``success``.
    """

    env_id: str
    split: str | None
    n_tasks: int
    k: int
    seed: int
    policy: str
    success: float
    success_ci95: tuple[float, float]
    pass_at_k: float | None
    mean_at_k: float | None
    reward: float
    tool_call_rate: float
    calls_per_episode: float
    turns: float
    errors: dict[str, int]
    drift: int
    task_ids: list[str]
    per_task_success: list[float]
    wall_s: float
    episodes: int = 0
    truncated: float = 0.0
    generated_tokens: int = 0
    out: str | None = None
    episode_errors: dict[str, int] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (no trajectories)."""
        return {
            "env_id": self.env_id,
            "split": self.split,
            "n_tasks": self.n_tasks,
            "k": self.k,
            "seed": self.seed,
            "policy": self.policy,
            "episodes": self.episodes,
            "success": self.success,
            "success_ci95": [self.success_ci95[0], self.success_ci95[1]],
            "pass_at_k": self.pass_at_k,
            "mean_at_k": self.mean_at_k,
            "reward": self.reward,
            "tool_call_rate": self.tool_call_rate,
            "calls_per_episode": self.calls_per_episode,
            "turns": self.turns,
            "truncated": self.truncated,
            "errors": dict(self.errors),
            "episode_errors": dict(self.episode_errors),
            "drift": self.drift,
            "generated_tokens": self.generated_tokens,
            "wall_s": self.wall_s,
            "out": self.out,
            "task_ids": list(self.task_ids),
            "per_task_success": list(self.per_task_success),
        }

    def format_table(self) -> str:
        """A human-readable two-column table."""
        lo, hi = self.success_ci95
        rows = [
            ("env", f"{self.env_id} (split {self.split})"),
            ("policy", self.policy),
            ("tasks x samples", f"{self.n_tasks} x {self.k} = {self.episodes} episodes (seed {self.seed})"),
            ("success", f"{self.success:.1%}  (95% Wilson CI {lo:.1%} - {hi:.1%})"),
        ]
        if self.k > 1:
            rows += [(f"pass@{self.k}", f"{self.pass_at_k:.1%}"), (f"mean@{self.k}", f"{self.mean_at_k:.1%}")]
        rows += [
            ("mean reward", f"{self.reward:.3f}"),
            ("tool-call rate", f"{self.tool_call_rate:.1%}  ({self.calls_per_episode:.2f} calls/episode)"),
            ("mean turns", f"{self.turns:.2f}"),
            ("truncated", f"{self.truncated:.1%}"),
            ("errors", ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"),
            ("episode errors", ", ".join(f"{k}={v}" for k, v in sorted(self.episode_errors.items())) or "none"),
            ("drift", f"{self.drift} episodes"),
            ("wall time", f"{self.wall_s:.1f} s ({self.generated_tokens} generated tokens)"),
        ]
        if self.out:
            rows.append(("trajectories", self.out))
        width = max(len(k) for k, _ in rows)
        line = "-" * (width + 2 + max(len(v) for _, v in rows))
        return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])


def evaluate(
    env_id_or_vector_env: Any,
    policy: Any,
    tasks: str | int | os.PathLike[str] | Sequence[Mapping[str, Any]] = "all",
    *,
    k: int = 1,
    seed: int = 0,
    split: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int = 8,
    max_turn_tokens: int = 128,
    schedule: str = "lockstep",
    out: str | os.PathLike[str] | None = None,
    progress: bool = False,
    policy_name: str | None = None,
    success_threshold: float = 1.0,
) -> EvalReport:
    """Run each task exactly once per sample (``k`` samples per task) and summarise.

    Args:
        env_id_or_vector_env: an env id (built with ``split``/``env_kwargs``/``num_envs``, closed at the end) or a
            :class:`~toolgym.envs.vector.ToolVectorEnv` (left open).
        policy: a :class:`~toolgym.rollout.Policy`, or ``"oracle"`` (the env's ``oracle(state)``).
        tasks: a selection for :func:`select_tasks` (``"all"``, N, a ``.jsonl`` path) or the task rows.
        k: samples per task (episodes = tasks x k; the samples of one task are adjacent).
        seed: task-selection seed; episode ``i`` is reset with seed ``seed + i``.
        num_envs, max_turn_tokens, schedule: parallel sub-envs, tokens per turn, driver schedule.
        out: stream trajectories to this JSONL file (see the module docstring for the guarantees).
        policy_name: what the report calls the policy (default: its class name).
        success_threshold: an episode succeeds when ``outcome_reward >= success_threshold``.
    """
    from toolgym.rollout import RolloutDriver

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    owned = None
    venv = env_id_or_vector_env
    if isinstance(venv, str):
        kw = dict(env_kwargs or {})
        if split is not None:
            kw["split"] = split
        owned = venv = make_vector_env(venv, num_envs, kw)
    base = base_env(venv)
    env_id = _env_id(venv, env_id_or_vector_env)
    try:
        rows = _task_rows(venv, tasks, seed, split)
        if isinstance(policy, str):
            if policy != "oracle":
                raise ValueError(f"policy must be a Policy or 'oracle', got {policy!r}")
            policy_name = policy_name or "oracle"
            policy = oracle_policy(venv)
        ids = [task_id(r) for r in rows]
        episodes = [r for r in rows for _ in range(k)]
        writer = JSONLStream(out) if out is not None else None

        def on_episode(i: int, traj: Trajectory) -> None:
            if writer is not None:
                row = traj.to_dict()
                row["eval"] = {"task_index": i // k, "task_id": ids[i // k], "sample": i % k}
                writer.write(row)

        driver = RolloutDriver(venv, policy, schedule=schedule, max_turn_tokens=max_turn_tokens)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        try:
            trajs = driver.run(episodes, seeds=seed, progress=progress, on_episode=on_episode)
        finally:
            if writer is not None:
                writer.close()
        wall = time.perf_counter() - t0
    finally:
        if owned is not None:
            owned.close()
    return _report(
        trajs, ids, k, env_id=env_id, split=split or getattr(base, "split", None), seed=seed,
        policy=policy_name or type(policy).__name__, wall_s=wall, out=None if out is None else str(out),
        generated_tokens=driver.stats.generated_tokens, success_threshold=success_threshold,
    )


def _env_id(venv: Any, given: Any) -> str:
    """The id of the env evaluated: the vector env's spec, its first sub-env's, the id given, or the class name."""
    base = base_env(venv)
    env_id = getattr(getattr(venv, "spec", None), "id", None) or getattr(getattr(base, "spec", None), "id", None)
    return str(env_id or (given if isinstance(given, str) else type(base).__name__))


def _task_rows(venv: Any, tasks: Any, seed: int, split: str | None) -> list[dict[str, Any]]:
    """The task rows of ``tasks``: a selection for :func:`select_tasks`, or the rows themselves (ids unique)."""
    if isinstance(tasks, str | int | os.PathLike):
        return select_tasks(venv, tasks=tasks, seed=seed, split=split)
    rows = [dict(r) for r in tasks]
    check_unique(rows, "tasks")
    return rows


def _report(
    trajs: Sequence[Trajectory], ids: Sequence[str], k: int, *, env_id: str, split: str | None, seed: int,
    policy: str, wall_s: float, out: str | None, generated_tokens: int, success_threshold: float,
) -> EvalReport:
    n = len(ids)
    if len(trajs) != n * k:
        raise RuntimeError(f"expected {n * k} episodes, got {len(trajs)}")
    ok = [float(t.outcome_reward >= success_threshold) for t in trajs]
    per_task = [ok[i * k:(i + 1) * k] for i in range(n)]
    per_task_success = [mean_at_k(s) for s in per_task]
    if k == 1:
        ci = wilson_interval(sum(ok), n)
    else:  # samples of one task are correlated: count each task once (conservative)
        ci = wilson_interval(sum(per_task_success), n)
    summary = summarize(trajs, success_threshold=success_threshold)  # {"episodes": 0} alone when there are none

    def mean(xs: Sequence[float]) -> float:
        return float(np.mean(xs)) if len(xs) else 0.0

    return EvalReport(
        env_id=env_id, split=split, n_tasks=n, k=k, seed=seed, policy=policy,
        success=summary.get("success", 0.0),
        success_ci95=ci,
        pass_at_k=mean([pass_at_k(k, int(sum(s)), k) for s in per_task]) if k > 1 else None,
        mean_at_k=mean(per_task_success) if k > 1 else None,
        reward=summary.get("reward", 0.0),
        tool_call_rate=summary.get("tool_call_rate", 0.0),
        calls_per_episode=summary.get("calls_per_episode", 0.0),
        turns=summary.get("turns", 0.0),
        errors=summary.get("errors", {}),
        episode_errors=summary.get("episode_errors", {}),
        drift=sum(1 for t in trajs if t.drift),
        task_ids=list(ids),
        per_task_success=per_task_success,
        wall_s=round(wall_s, 3),
        episodes=len(trajs),
        truncated=summary.get("truncated", 0.0),
        generated_tokens=generated_tokens,
        out=out,
        trajectories=list(trajs),
    )
