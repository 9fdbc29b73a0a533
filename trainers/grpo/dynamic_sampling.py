"""Dynamic sampling for GRPO (DAPO, arXiv 2503.14476): a step trains only on groups whose rewards differ.

A GRPO group whose samples all earn the same reward has advantage 0 on every token: it teaches nothing, yet it
fills the step's batch (early in tool-calling training most groups do). With dynamic sampling a training step
draws more prompts than it trains on and keeps the groups with spread until the step's quota is filled:

* :class:`DynamicSampler` runs inside the rollout function (:class:`trainers.grpo.rollout_adapter.ToolgymRollout`),
  where the env's rewards are known. TRL hands the rollout this process's prompts, ``num_generations`` adjacent
  copies of each (the step's quota of ``Q`` groups). Draw 1 rolls those groups out; a group **has spread** when the
  trainer's advantage estimator gives one of its episodes a non-zero advantage (:func:`has_spread`: for
  ``outcome``, rewards that differ; for ``turn_return``/``gigpo``, per-turn returns that differ). Each further
  draw takes replacement tasks from the rollout's task pool (tasks not yet used in the step first; as many as the
  share with spread so far predicts are missing, at most ``Q``) and rolls them out concurrently through the
  same vector env. It stops when ``Q`` groups with spread are kept or after ``max_draws`` draws; then (the
  bound) the step trains on what it kept, the rest of the quota filled with zero-spread groups it rolled out
  (zero advantage: no gradient), and a warning says so, with a running count of such steps.
* It returns exactly as many rows as TRL handed prompts, groups adjacent, so TRL's tensors, the reward function
  (which reads the env reward from the rows), the shared-prefix layout and the turn-level estimators see an
  ordinary batch. The rows carry a ``prompt`` field (each row's task id); TRL merges it into its inputs, and
  :class:`DynamicSamplingGRPOTrainer` writes it into the prompt list TRL gives reward functions (``prompts``) and
  logs in its completions table, so that every consumer names the task that was rolled out.
* **History** (GRESO, arXiv 2506.02177; ``history=True``): prompts with no spread tend to stay so. The sampler
  counts, per task, its consecutive zero-spread rollouts ``k`` and, before rolling a task out (one of TRL's or a
  replacement), skips it with probability :func:`skip_probability` ``= min(MAX_SKIP, 1 - (1 - skip)^k)``; a
  skipped prompt of TRL's is replaced by a draw from the pool. A rollout with spread resets ``k`` to 0. The
  history is saved in every checkpoint (``dynamic_sampling_rank{r}.json``) and read back on resume.
* **Determinism**: every random choice comes from a generator seeded with ``(trainer seed, global step,
  process index)``; the same seed gives the same draws for the same rollouts, and a resumed run draws what the
  uninterrupted one would have.
* **Several processes**: TRL splits the generation batch across processes in order, so a group stays on one
  process only when each process's share (``per_device_train_batch_size * steps_per_generation``) is a multiple
  of ``num_generations``; dynamic sampling requires that layout (:func:`check_layout`, a ``ValueError`` at build
  time and in the rollout). Each process fills its own quota; the processes agree on the number of draws (every
  process takes part in every draw's collective generation, one with a full quota with no episodes).

Logged per step (TRL's metrics, averaged over processes): ``toolgym/dynamic_sampling/groups_drawn`` (groups
rolled out, the first draw's included), ``groups_kept`` (groups with spread trained on), ``kept_share``
(kept / drawn), ``draws``, ``bound_hit`` (1 when the quota was not filled) and, with the history,
``groups_skipped`` (prompts skipped before rollout). Cost: up to ``max_draws`` times a step's rollouts.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainers.credit import anchor_key, turn_advantages
from trainers.grpo.trainer import TurnCreditGRPOTrainer

__all__ = ["MAX_SKIP", "DynamicSampler", "DynamicSamplingGRPOTrainer", "SpreadHistory", "check_layout",
           "has_spread", "replacement_prompt", "skip_probability"]

logger = logging.getLogger(__name__)

#: the highest probability with which the history skips a prompt: every prompt keeps being tried now and then
MAX_SKIP = 0.9
#: advantages with an absolute value at most this are "zero" (rounding of equal rewards' mean)
TOL = 1e-9
#: prompts a replacement draw tries before taking one the history would skip
DRAW_TRIES = 8
#: the metrics' name prefix
PREFIX = "toolgym/dynamic_sampling/"


def skip_probability(zero_streak: int, skip: float) -> float:
    """The probability of skipping a prompt whose last ``zero_streak`` rollouts all had no reward spread:
    ``min(MAX_SKIP, 1 - (1 - skip) ** zero_streak)`` (0 for a streak of 0)."""
    if zero_streak <= 0:
        return 0.0
    return min(MAX_SKIP, 1.0 - (1.0 - float(skip)) ** int(zero_streak))


def has_spread(group: Sequence[Any], estimator: str = "outcome", gamma: float = 1.0) -> bool:
    """Whether the GRPO group ``group`` (trajectories of one prompt: ``reward``, ``turn_rewards``,
    ``outcome_reward``, ``prompt_ids``/``completion_ids``/``turns`` for ``gigpo``'s anchors) gets a non-zero
    advantage from ``estimator`` (:data:`trainers.credit.ESTIMATORS`): ``outcome``, episode rewards that
    differ; ``turn_return``/``gigpo``, any turn's advantage non-zero (:func:`trainers.credit.turn_advantages`)."""
    if len(group) < 2:
        return False
    if estimator == "outcome":
        rewards = [float(t.reward) for t in group]
        return max(rewards) - min(rewards) > TOL
    anchors = None
    if estimator == "gigpo":
        anchors = [[anchor_key(list(t.prompt_ids) + list(t.completion_ids[: u.action_start])) for u in t.turns]
                   for t in group]
    advs = turn_advantages([list(t.turn_rewards) for t in group], [float(t.outcome_reward) for t in group],
                           [0] * len(group), estimator=estimator, gamma=gamma, anchors=anchors, scale="none")
    return any(abs(a) > TOL for row in advs for a in row)


def replacement_prompt(original: Any, task: Mapping[str, Any]) -> Any:
    """The prompt TRL is told for a row whose task replaced ``original``: the task id (what
    :func:`~trainers.grpo.rollout_adapter.make_dataset` uses), as a user message when ``original`` is a chat."""
    if isinstance(original, str):
        return str(task["id"])
    return [{"role": "user", "content": str(task["id"])}]


def check_layout(per_process_prompts: int, num_generations: int, num_processes: int) -> None:
    """``ValueError`` unless each process's prompts hold whole GRPO groups (``per_process_prompts``: TRL's
    ``per_device_train_batch_size * steps_per_generation``)."""
    if per_process_prompts % num_generations:
        raise ValueError(
            f"dynamic_sampling keeps or replaces whole GRPO groups on each process, but each of the {num_processes} "
            f"process(es) gets {per_process_prompts} rows (per_device_train_batch_size * steps_per_generation) for "
            f"groups of num_generations={num_generations}: a group would span processes. Make "
            "per_device_train_batch_size * steps_per_generation a multiple of num_generations")


class SpreadHistory:
    """Per task id, how many of its latest rollouts in a row had no reward spread (GRESO's zero-variance
    history). ``streaks``: ``{task_id: k}`` (tasks with ``k = 0`` are not stored)."""

    def __init__(self, streaks: Mapping[str, int] | None = None) -> None:
        self.streaks: dict[str, int] = {str(k): int(v) for k, v in (streaks or {}).items() if int(v) > 0}

    def observe(self, task_id: str, spread: bool) -> None:
        """Record one rollout of ``task_id``'s group."""
        if spread:
            self.streaks.pop(str(task_id), None)
        else:
            self.streaks[str(task_id)] = self.streaks.get(str(task_id), 0) + 1

    def streak(self, task_id: str) -> int:
        return self.streaks.get(str(task_id), 0)


class DynamicSampler:
    """Keeps a step's groups with reward spread (module docstring); used by ``ToolgymRollout(dynamic_sampling=...)``.

    Args:
        max_draws: rollout draws per step at most, the first (TRL's own prompts) included; ``>= 1``.
        history: skip prompts by their zero-spread history (GRESO).
        skip: the history's per-observation skip probability, in ``[0, 1)`` (:func:`skip_probability`).

    Attributes:
        bound_hits: steps so far whose quota was not filled within ``max_draws`` draws.
        history: the :class:`SpreadHistory` (``None`` without ``history``).
        last: the last step's report (``groups_drawn``, ``groups_kept``, ``kept_share``, ``draws``, ``bound_hit``,
            ``groups_skipped``, ``drawn_ids``: task ids in rollout order, ``kept_ids``: the trained groups' ids).
    """

    def __init__(self, max_draws: int = 4, *, history: bool = False, skip: float = 0.5) -> None:
        if int(max_draws) < 1:
            raise ValueError(f"dynamic_sampling_max_draws must be >= 1, got {max_draws}")
        if not 0.0 <= float(skip) < 1.0:
            raise ValueError(f"dynamic_sampling_skip must be in [0, 1), got {skip}")
        self.max_draws = int(max_draws)
        self.skip = float(skip)
        self.history: SpreadHistory | None = SpreadHistory() if history else None
        self.bound_hits = 0
        self.last: dict[str, Any] = {}

    # -- draws ------------------------------------------------------------------------------------
    def _skipped(self, rng: np.random.Generator, task_id: str) -> bool:
        if self.history is None:
            return False
        p = skip_probability(self.history.streak(task_id), self.skip)
        return p > 0.0 and float(rng.random()) < p

    def _draw(self, rng: np.random.Generator, pool: Sequence[Mapping[str, Any]], used: set[str]) -> tuple[Any, int]:
        """One replacement task from ``pool`` (not yet ``used`` in the step when any is left) and how many
        candidates the history skipped before it."""
        fresh = [t for t in pool if str(t["id"]) not in used] or list(pool)
        skipped = 0
        for _ in range(DRAW_TRIES):
            task = fresh[int(rng.integers(len(fresh)))]
            if not self._skipped(rng, str(task["id"])):
                break
            skipped += 1
        used.add(str(task["id"]))
        return task, skipped

    # -- one step ---------------------------------------------------------------------------------
    def sample(self, rollout: Any, prompts: Sequence[Any], tasks: Sequence[Mapping[str, Any]],
               trainer: Any) -> tuple[list[Any], list[Any]]:
        """Roll out the step's groups with spread: returns ``(trajectories, prompts)``, ``len(prompts)`` of
        each, ``num_generations`` adjacent rows per group; ``prompts`` names each row's task for TRL
        (:func:`replacement_prompt` where a task was replaced). ``rollout``: the
        :class:`~trainers.grpo.rollout_adapter.ToolgymRollout` (its ``play`` and task pool ``tasks``)."""
        g = int(trainer.num_generations)
        n = len(prompts)
        rank = int(trainer.accelerator.process_index)
        world = int(trainer.accelerator.num_processes)
        check_layout(n, g, world)
        starts = range(0, n, g)
        for s in starts:
            if any(str(tasks[s + j]["id"]) != str(tasks[s]["id"]) for j in range(g)):
                raise ValueError(f"dynamic_sampling: rows {s}..{s + g - 1} of this process are not one group's "
                                 "copies of a prompt (TRL's RepeatSampler lays a group out as adjacent copies)")
        quota = n // g
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        seed = int(getattr(trainer.args, "seed", 0))
        rng = np.random.default_rng([abs(seed), step, rank])
        estimator = str(getattr(trainer, "advantage", "outcome"))
        gamma = float(getattr(trainer, "gamma", 1.0))
        pool = rollout.tasks
        used = {str(tasks[s]["id"]) for s in starts}
        first: list[tuple[Any, Any]] = []  # (task, the prompt TRL is told)
        skipped = 0
        for s in starts:
            task, prompt = tasks[s], prompts[s]
            if self._skipped(rng, str(task["id"])):
                skipped += 1
                task, extra = self._draw(rng, pool, used)
                skipped += extra
                prompt = replacement_prompt(prompts[s], task)
            first.append((task, prompt))
        kept: list[tuple[list[Any], Any]] = []
        spare: list[tuple[list[Any], Any]] = []
        drawn, with_spread, draws = 0, 0, 0
        drawn_ids: list[str] = []
        candidates = first
        while True:
            draws += 1
            trajs = rollout.play([t for t, _ in candidates for _ in range(g)], trainer, num_envs=n,
                                 seed_offset=(draws - 1) * n)
            for k, (task, prompt) in enumerate(candidates):
                group = trajs[k * g:(k + 1) * g]
                spread = has_spread(group, estimator, gamma)
                if self.history is not None:
                    self.history.observe(str(task["id"]), spread)
                drawn += 1
                drawn_ids.append(str(task["id"]))
                with_spread += int(spread)
                if spread and len(kept) < quota:
                    kept.append((group, prompt))
                elif not spread:
                    spare.append((group, prompt))
            missing = quota - len(kept)
            more = int(missing > 0 and draws < self.max_draws)
            if world > 1:  # every process takes part in every draw's collective generation calls
                more = rollout.policy.sync_count(more)
            if not more:
                break
            if missing > 0:
                rate = with_spread / drawn
                size = quota if rate <= 0 else min(quota, math.ceil(missing / rate))
            else:
                size = 0
            candidates = []
            for _ in range(size):
                task, extra = self._draw(rng, pool, used)
                skipped += extra
                candidates.append((task, replacement_prompt(prompts[0], task)))
        bound_hit = len(kept) < quota
        chosen = kept + spare[: quota - len(kept)]
        if bound_hit:
            self.bound_hits += 1
            logger.warning(
                "dynamic sampling (step %d, process %d): %d of %d groups with reward spread after %d draws "
                "(dynamic_sampling_max_draws=%d); the other %d groups train with zero advantage "
                "(steps with a short quota so far: %d)", step, rank, len(kept), quota, draws, self.max_draws,
                quota - len(kept), self.bound_hits)
        self.last = {"groups_drawn": drawn, "groups_kept": len(kept), "kept_share": len(kept) / drawn,
                     "draws": draws, "bound_hit": bool(bound_hit), "groups_skipped": skipped,
                     "drawn_ids": drawn_ids, "kept_ids": [str(grp[0].task.get("id", "")) for grp, _ in kept]}
        self._log(trainer)
        out_trajs = [t for grp, _ in chosen for t in grp]
        out_prompts = [p for _, p in chosen for _ in range(g)]
        return out_trajs, out_prompts

    def _log(self, trainer: Any) -> None:
        values = {"groups_drawn": self.last["groups_drawn"], "groups_kept": self.last["groups_kept"],
                  "kept_share": self.last["kept_share"], "draws": self.last["draws"],
                  "bound_hit": float(self.last["bound_hit"])}
        if self.history is not None:
            values["groups_skipped"] = self.last["groups_skipped"]
        for name, value in values.items():  # TRL averages them over processes with the step's other metrics
            trainer._log_metric(PREFIX + name, float(value))

    # -- checkpoints ------------------------------------------------------------------------------
    @staticmethod
    def state_file(directory: str | os.PathLike[str], rank: int) -> Path:
        return Path(directory) / f"dynamic_sampling_rank{int(rank)}.json"

    def save(self, directory: str | os.PathLike[str], rank: int = 0) -> Path | None:
        """Write the history and the bound counter to ``directory`` (a checkpoint); ``None`` without history."""
        if self.history is None:
            return None
        path = self.state_file(directory, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"streaks": self.history.streaks, "bound_hits": self.bound_hits}, sort_keys=True))
        return path

    def load(self, directory: str | os.PathLike[str], rank: int = 0) -> bool:
        """Read what :meth:`save` wrote to ``directory``; returns whether there was a file."""
        path = self.state_file(directory, rank)
        if self.history is None or not path.is_file():
            return False
        data = json.loads(path.read_text())
        self.history = SpreadHistory(data.get("streaks"))
        self.bound_hits = int(data.get("bound_hits", 0))
        return True


class DynamicSamplingGRPOTrainer(TurnCreditGRPOTrainer):
    """:class:`~trainers.grpo.trainer.TurnCreditGRPOTrainer` for a rollout with dynamic sampling: the prompts TRL
    passes to reward functions and logs are those of the rows' tasks, and the sampler's history travels with
    checkpoints (module docstring)."""

    def _sampler(self) -> DynamicSampler | None:
        sampler = getattr(self.rollout_func, "dynamic_sampling", None)
        return sampler if isinstance(sampler, DynamicSampler) else None

    def _generate(self, prompts: list[Any]) -> Any:
        out = super()._generate(prompts)
        extra = out[5] if isinstance(out, tuple) and len(out) > 5 else None  # TRL 1.16: (..., extra_fields, ...)
        named = extra.get("prompt") if isinstance(extra, dict) else None
        if isinstance(named, list) and len(named) == len(prompts):
            prompts[:] = named  # the caller's list: reward functions' ``prompts`` and the completions table
        return out

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        sampler = self._sampler()
        if sampler is not None:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            sampler.save(folder, self.accelerator.process_index)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        sampler = self._sampler()
        path = resume_from_checkpoint
        if path is True:
            from transformers.trainer_utils import get_last_checkpoint

            path = get_last_checkpoint(self.args.output_dir)
        if sampler is not None and isinstance(path, str) and not sampler.load(path, self.accelerator.process_index):
            if sampler.history is not None:
                logger.warning("dynamic sampling: %s holds no history for process %d; it starts empty", path,
                               self.accelerator.process_index)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
