"""The TRL ``GRPOTrainer`` adapter: a ``rollout_func`` that plays toolgym episodes with TRL's own generation.

What TRL 1.16 does with it (read from ``trl/trainer/grpo_trainer.py``, pinned in ``pyproject.toml``):

* ``GRPOTrainer._generate`` calls ``rollout_func(prompts, trainer)`` with **this process's** prompts, already
  repeated ``num_generations`` times (adjacent copies; a group may span ranks). It requires the keys
  ``prompt_ids``, ``completion_ids`` and ``logprobs`` (one row per prompt, in order; ``logprobs`` may be ``None``);
  every other key is an "extra field". ``env_mask`` is popped from the extra fields and used as the tool mask
  (loss mask = completion mask x env mask) **only when the trainer has no ``tools``/``environment_factory``**:
  with those, TRL runs its own tool loop and ignores it. So the adapter must be passed alone.
* The remaining extra fields are merged into each input row and reach every reward function as per-row keyword
  lists. The ``completions`` TRL gives reward functions are decoded from the whole completion (env text
  included), so the env's reward travels as the ``env_reward`` field and :func:`env_reward` passes it through.
  Reward functions also receive ``log_metric(name, value)``; :func:`env_reward` logs tool-call rate, success,
  turns and error kinds with it (they appear in ``trainer.state.log_history`` next to ``rewards/env_reward/mean``).
* Generation goes through ``trainer._generate_single_turn(prompt_ids, None, {}, 1)`` (private: a test covers it),
  which dispatches to vLLM (server or colocate; logprobs reduced to the sampled token's) or ``model.generate``
  (logprobs ``None``). Its token budget is ``max_completion_length``; the adapter sets it per turn.
  vLLM server mode gathers prompts from every rank and slices the answers by ``process_index * len(prompts)``,
  so every rank must make the same number of calls **with the same number of prompts**: the adapter runs the
  lock-step schedule, agrees on the number of turns across ranks, and pads short ranks with a filler prompt.
* With ``rollout_func`` TRL passes no images to its loss forward (``images=None``): for episodes with images
  (``env_kwargs={"processor": ...}``) :class:`trainers.grpo.trainer.TurnCreditGRPOTrainer` gives each forward its
  rows' images itself (:meth:`ToolgymRollout.row_images`, :mod:`trainers.vision`), and :class:`TRLPolicy`
  generates with them.
* TRL does not check returned lengths: the adapter keeps each completion within ``max_completion_length`` and
  prompt + completion within the model's context (an overlong tail, always env tokens or a cut turn, is clipped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.format.vision import episode_images
from toolgym.images import Image
from toolgym.resources import trim_heap
from toolgym.rollout import RolloutDriver
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import Trajectory
from trainers.credit import anchor_key
from trainers.grpo.generation import TRLPolicy

__all__ = ["TRLPolicy", "ToolgymRollout", "env_reward", "guard_empty_completions", "make_dataset", "prompt_key"]


# ---------------------------------------------------------------------------------------------------------------
# Datasets and task lookup
# ---------------------------------------------------------------------------------------------------------------


def prompt_key(prompt: Any) -> str:
    """The lookup key of a TRL prompt: a string as is; a chat prompt's last user message content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        users = [m for m in prompt if m.get("role") == "user"] or prompt
        content = users[-1].get("content")
        if isinstance(content, list):  # typed content blocks
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        return str(content)
    raise TypeError(f"unsupported prompt type for the toolgym adapter: {type(prompt).__name__}")


def make_dataset(tasks: Sequence[Mapping[str, Any]], *, repeat: int = 1) -> Any:
    """A ``datasets.Dataset`` for GRPOTrainer: ``prompt`` = the task id (the adapter looks the task up by it;
    the env renders the real prompt), ``task_id`` = the same id (reaches reward functions). ``repeat`` repeats
    the task list (TRL's sampler shuffles)."""
    from datasets import Dataset

    ids = [str(t["id"]) for t in tasks] * repeat
    return Dataset.from_dict({"prompt": ids, "task_id": ids})


# ---------------------------------------------------------------------------------------------------------------
# The rollout_func
# ---------------------------------------------------------------------------------------------------------------


class ToolgymRollout:
    """``rollout_func`` for TRL's ``GRPOTrainer``: one toolgym episode per prompt, generated by the trainer.

    Args:
        env_id: a registered toolgym env id (``"toolgym/Calculator-v0"``), or a callable
            ``fn(num_envs=n, **env_kwargs) -> ToolVectorEnv`` for unregistered envs.
        tasks: the task rows the prompts refer to (looked up by ``id``, then by prompt text). Prompts not found
            raise a clear ``KeyError``.
        env_kwargs: forwarded to the env (the trainer's tokenizer is passed as ``tokenizer`` unless given). A
            ``processor`` (a vision-language model's) makes the episodes' images image tokens: the policy generates
            with them and :class:`~trainers.grpo.trainer.TurnCreditGRPOTrainer` trains with them.
        max_turn_tokens: tokens sampled per assistant turn.
        max_completion_length: completion budget (default: ``trainer.max_completion_length``).
        trajectory_dir: if set, each call appends its trajectories to ``trajectory_dir/rank{r}.jsonl``.
        schedule: ``"lockstep"`` (required on several processes) or ``"continuous"`` (one process only).
        trim_heap: hand the C heap's free pages back to the OS after each call's episodes are generated
            (:func:`toolgym.resources.trim_heap`): generation's freed KV caches and activations otherwise stay
            resident and the training forward that follows grows on top of them (measured in ``make demo``: the
            first backward of each step peaked ~300 MiB above the others).
        shared_prefix: transformers generation prefills a prompt shared by several episodes of a call (a GRPO
            group's samples on this process) once (:class:`TRLPolicy`); ``None``: the trainer's ``shared_prefix``
            attribute, else on.
        dynamic_sampling: a :class:`trainers.grpo.dynamic_sampling.DynamicSampler`: a training call keeps the
            groups whose rewards differ, drawing replacement tasks from ``tasks`` for the others, and returns as
            many rows as TRL handed prompts (with a ``prompt`` field naming each row's task); ``None``: off.

    Returns from ``__call__`` (one entry per prompt, in order): ``prompt_ids``, ``completion_ids``, ``logprobs``
    (flat floats, 0.0 on env tokens; ``None`` when the backend gave none), ``env_mask`` (1 = model token),
    ``env_reward`` (the episode reward), ``env_outcome``, ``env_tool_calls``, ``env_turns``, ``env_truncated``,
    ``env_errors`` (list of error kinds), ``task_id``; for turn-level credit (:mod:`trainers.grpo.trainer`):
    ``env_turn_rewards`` (per-turn process rewards), ``env_turn_spans`` (each turn's ``[action_start, action_end)``
    in the completion) and ``env_anchors`` (per turn, :func:`trainers.credit.anchor_key` of the tokens before it).

    Attributes:
        last_trajectories: the trajectories of the last call; ``policy``: the :class:`TRLPolicy` in use.
    """

    def __init__(
        self,
        env_id: str | Any,
        tasks: Sequence[Mapping[str, Any]],
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turn_tokens: int = 128,
        max_completion_length: int | None = None,
        trajectory_dir: str | Path | None = None,
        schedule: str = "lockstep",
        trim_heap: bool = False,
        shared_prefix: bool | None = None,
        dynamic_sampling: Any = None,
    ) -> None:
        self.env_id = env_id
        self.dynamic_sampling = dynamic_sampling
        self.shared_prefix = shared_prefix
        self.tasks = [dict(t) for t in tasks]
        self.by_id = {str(t["id"]): t for t in self.tasks}
        self.by_prompt = {str(t["prompt"]): t for t in self.tasks if "prompt" in t}
        self.env_kwargs = dict(env_kwargs or {})
        #: the vision-language model's processor (``env_kwargs["processor"]``), ``None`` for text episodes
        self.processor = self.env_kwargs.get("processor")
        self.max_turn_tokens = max_turn_tokens
        self.max_completion_length = max_completion_length
        self.trajectory_dir = Path(trajectory_dir) if trajectory_dir is not None else None
        self.schedule = schedule
        self.trim_heap = trim_heap
        self.venv: Any = None
        self.policy: TRLPolicy | None = None
        self.last_trajectories: list[Trajectory] = []
        #: set by :class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`: trajectories wait for :meth:`write_pending`
        #: (which adds each turn's advantage) instead of being written at once
        self.defer_write = False
        self.pending: tuple[Path, list[Trajectory]] | None = None
        self.__name__ = "toolgym_rollout"

    def close(self) -> None:
        """Close the vector env (its tool executor and servers); the next call builds a new one."""
        if self.venv is not None:
            self.venv.close()
            self.venv = None

    def task_for(self, prompt: Any) -> dict[str, Any]:
        key = prompt_key(prompt)
        task = self.by_id.get(key) or self.by_prompt.get(key)
        if task is None:
            raise KeyError(
                f"prompt {key[:80]!r} matches no task id or prompt given to ToolgymRollout "
                "(build the dataset with trainers.grpo.rollout_adapter.make_dataset(tasks))"
            )
        return task

    def _env(self, trainer: Any, n: int) -> Any:
        if self.venv is None or self.venv.num_envs != n:
            from toolgym.envs.registration import make_vector_env

            if self.venv is not None:
                self.venv.close()
            kwargs = dict(self.env_kwargs)
            kwargs.setdefault("tokenizer", trainer.processing_class)
            if callable(self.env_id):
                self.venv = self.env_id(num_envs=n, **kwargs)
            else:
                self.venv = make_vector_env(self.env_id, n, kwargs)
        return self.venv

    def _context_limit(self, trainer: Any) -> int | None:
        cfg = getattr(getattr(trainer, "model", None), "config", None)
        cfg = getattr(cfg, "text_config", None) or cfg
        return getattr(cfg, "max_position_embeddings", None)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tasks = [self.task_for(p) for p in prompts]
        if self.dynamic_sampling is not None and getattr(getattr(trainer, "model", None), "training", False):
            trajs, kept_prompts = self.dynamic_sampling.sample(self, prompts, tasks, trainer)
            rows = self.rows(trajs, trainer)
            rows["prompt"] = kept_prompts  # TRL merges it into its inputs (trainers.grpo.dynamic_sampling)
            return rows
        return self.rows(self.play(tasks, trainer), trainer)

    def row_images(self) -> list[list[Image]]:
        """Per row of the last call's output (in order), the images its ids hold as image tokens (``[]`` each for
        text episodes): what the loss forward of that row needs (:mod:`trainers.vision`)."""
        return [episode_images(t) for t in self.last_trajectories]

    def play(self, tasks: Sequence[Mapping[str, Any]], trainer: Any, *, num_envs: int | None = None,
             seed_offset: int = 0) -> list[Trajectory]:
        """Roll out one episode per task (in order) with the trainer's model; returns the clipped trajectories.
        ``num_envs``: the vector env's size (default ``len(tasks)``; fewer tasks than envs leave envs idle, no
        task at all still takes part in the collective generation calls of several processes). ``seed_offset``
        shifts the episodes' seeds (another draw of the same step)."""
        if self.policy is None or self.policy.trainer is not trainer:
            self.policy = TRLPolicy(trainer, self.shared_prefix)
        policy = self.policy
        policy.processor = self.processor
        if policy.world_size > 1 and self.schedule != "lockstep":
            raise ValueError("several processes need the lock-step schedule (collective generation)")
        budget = int(self.max_completion_length or trainer.max_completion_length)
        venv = self._env(trainer, num_envs or len(tasks))
        driver = RolloutDriver(
            venv, policy, schedule=self.schedule,  # type: ignore[arg-type]
            max_turn_tokens=min(self.max_turn_tokens, budget), max_completion_tokens=budget,
            sync_fn=policy.sync_count if policy.world_size > 1 else None,
        )
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        rank = int(trainer.accelerator.process_index)
        seeds = [int(getattr(trainer.args, "seed", 0)) * 1_000_003 + step * 10_007 + rank * 1009 + seed_offset + i
                 for i in range(len(tasks))]
        try:
            trajs = driver.run(list(tasks), seeds=seeds)
        finally:
            turns = getattr(policy, "turns", None)
            if turns is not None:  # the episodes are over: their keys and values are not kept into training
                turns.clear()
        if self.trim_heap:
            trim_heap()
        ctx = self._context_limit(trainer)
        for t in trajs:
            driver.clip(t)
            if ctx is not None:
                t.clip(max(0, ctx - len(t.prompt_ids)))
        self.last_stats = driver.stats
        return trajs

    def rows(self, trajs: Sequence[Trajectory], trainer: Any) -> dict[str, Any]:
        """TRL's rollout output for ``trajs`` (one row each, in order; keys in the class docstring); saves them
        when ``trajectory_dir`` is set."""
        trajs = list(trajs)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        rank = int(trainer.accelerator.process_index)
        ctx = self._context_limit(trainer)
        self.last_trajectories = trajs
        if self.trajectory_dir is not None:
            from toolgym.rollout import write_trajectories

            for t in trajs:
                t.task = {**t.task, "_step": step}
            if self.defer_write:
                self.pending = (self.trajectory_dir / f"rank{rank}.jsonl", trajs)
            else:
                write_trajectories(self.trajectory_dir / f"rank{rank}.jsonl", trajs, append=True)
        logprobs = [t.logprobs for t in trajs]
        rows = {
            "prompt_ids": [list(t.prompt_ids) for t in trajs],
            "completion_ids": [list(t.completion_ids) for t in trajs],
            "logprobs": None if any(lp is None for lp in logprobs) else [list(lp) for lp in logprobs],
            "env_mask": [list(t.loss_mask) for t in trajs],
            "env_reward": [float(t.reward) for t in trajs],
            "env_outcome": [float(t.outcome_reward) for t in trajs],
            "env_tool_calls": [int(t.num_tool_calls) for t in trajs],
            "env_turns": [len(t.turns) for t in trajs],
            "env_truncated": [bool(t.truncated) for t in trajs],
            "env_errors": [list(t.error_kinds) for t in trajs],
            "env_reward_components": [{k: float(v) for k, v in t.reward_components.items()} for t in trajs],
            "task_id": [str(t.task.get("id", "")) for t in trajs],
            "env_turn_rewards": [[float(x) for x in t.turn_rewards] for t in trajs],
            "env_turn_spans": [[[u.action_start, u.action_end] for u in t.turns] for t in trajs],
            "env_anchors": [[anchor_key(list(t.prompt_ids) + list(t.completion_ids[: u.action_start]))
                             for u in t.turns] for t in trajs],
        }
        rows["env_empty"] = guard_empty_completions(rows, _end_id(trainer), ctx)
        return rows

    def write_pending(self, turn_advantages: Sequence[Sequence[float]] | None = None) -> None:
        """Write the trajectories held back by ``defer_write``, each row with ``turn_advantages`` (one float per
        turn, what the trainer gave that turn's policy tokens) when given; no-op when nothing is pending."""
        if self.pending is None:
            return
        from toolgym.rollout import write_trajectories

        path, trajs = self.pending
        self.pending = None
        rows = []
        for i, t in enumerate(trajs):
            row = t.to_dict()
            if turn_advantages is not None:
                row["turn_advantages"] = [float(a) for a in turn_advantages[i]]
            rows.append(row)
        write_trajectories(path, rows, append=True)


def _end_id(trainer: Any) -> int:
    eos = list(getattr(trainer, "eos_token_ids", None) or [])
    tok = getattr(trainer, "processing_class", None)
    return int(eos[0] if eos else getattr(tok, "eos_token_id", None) or 0)


def guard_empty_completions(rows: dict[str, Any], end_id: int, context: int | None = None) -> list[bool]:
    """Give every empty completion one masked ``end_id`` token (TRL 1.16 indexes ``completion_ids[i][-1]`` and
    would crash on an empty row): ``env_mask`` 0, logprob 0.0, so nothing of it is trained on. An empty completion
    means the prompt reached the context (or the budget was 0); such a prompt is left-truncated to
    ``context - 1`` tokens so prompt + completion fit. Edits ``rows`` in place; returns which rows were empty."""
    empty = [len(c) == 0 for c in rows["completion_ids"]]
    for i, e in enumerate(empty):
        if not e:
            continue
        rows["completion_ids"][i] = [end_id]
        rows["env_mask"][i] = [0]
        if rows.get("logprobs") is not None:
            rows["logprobs"][i] = [0.0]
        if context is not None and len(rows["prompt_ids"][i]) >= context:
            rows["prompt_ids"][i] = rows["prompt_ids"][i][len(rows["prompt_ids"][i]) - (context - 1):]
    return empty


def env_reward(
    prompts: list[Any] | None = None,
    completions: list[Any] | None = None,
    env_reward: list[float] | None = None,
    env_outcome: list[float] | None = None,
    env_tool_calls: list[int] | None = None,
    env_turns: list[int] | None = None,
    env_truncated: list[bool] | None = None,
    env_errors: list[list[str]] | None = None,
    env_empty: list[bool] | None = None,
    env_reward_components: list[dict[str, float]] | None = None,
    task_id: list[str] | None = None,
    log_metric: Any = None,
    **_: Any,
) -> list[float]:
    """TRL reward function: pass the env's episode reward through (``rewards/env_reward/mean`` in TRL's logs)
    and log ``toolgym/*`` metrics: success (outcome >= 1), tool-call rate (episodes with a call), calls per
    episode, turns, truncated fraction, ``toolgym/groups_with_success`` (the share of this rank's tasks with at
    least one successful sample: the groups that give an outcome reward anything to learn from) and
    ``toolgym/errors/<kind>`` (errors per episode) for every :class:`~toolgym.tools.base.ToolErrorKind` (always all
    kinds, so every rank logs the same names) and ``toolgym/reward_components/<name>``: each component of the env's
    reward (``Trajectory.reward_components``, e.g. BFCL's verdict and partial-credit terms), averaged over the
    episodes whose reward has it."""
    if env_reward is None:
        raise ValueError("env_reward needs the `env_reward` field: use it with trainers.grpo.rollout_adapter.ToolgymRollout")
    n = len(env_reward)
    if log_metric is not None and n:
        if env_outcome is not None:
            log_metric("toolgym/success", float(np.mean([o >= 1.0 for o in env_outcome])))
            if task_id is not None:
                solved: dict[str, bool] = {}
                for tid, o in zip(task_id, env_outcome, strict=True):
                    solved[tid] = solved.get(tid, False) or o >= 1.0
                log_metric("toolgym/groups_with_success", sum(solved.values()) / len(solved))
        if env_tool_calls is not None:
            log_metric("toolgym/tool_call_rate", float(np.mean([c > 0 for c in env_tool_calls])))
            log_metric("toolgym/calls_per_episode", float(np.mean(env_tool_calls)))
        if env_turns is not None:
            log_metric("toolgym/turns", float(np.mean(env_turns)))
        if env_truncated is not None:
            log_metric("toolgym/truncated", float(np.mean(env_truncated)))
        if env_empty is not None:  # prompts at/over the context: one masked filler token, reward as the env gave
            log_metric("toolgym/empty_completions", float(np.mean(env_empty)))
        if env_errors is not None:
            for kind in ToolErrorKind:
                log_metric(f"toolgym/errors/{kind.value}", sum(e.count(kind.value) for e in env_errors) / n)
        if env_reward_components is not None:
            for name in sorted({k for c in env_reward_components for k in c}):
                xs = [c[name] for c in env_reward_components if name in c]
                log_metric(f"toolgym/reward_components/{name}", float(np.mean(xs)))
    return [float(r) for r in env_reward]
