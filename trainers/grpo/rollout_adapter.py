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
* TRL does not check returned lengths: the adapter keeps each completion within ``max_completion_length`` and
  prompt + completion within the model's context (an overlong tail, always env tokens or a cut turn, is clipped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.checkpoint import autocast_context
from toolgym.resources import trim_heap
from toolgym.rollout import Generation, GenerationRequest, RolloutDriver, TurnCache
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import Trajectory
from trainers.credit import anchor_key
from trainers.grpo.sampling import inverse_cdf_sampling

__all__ = ["TRLPolicy", "ToolgymRollout", "env_reward", "guard_empty_completions", "make_dataset", "prompt_key"]


# ---------------------------------------------------------------------------------------------------------------
# Generation through the trainer
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _turn_budget(trainer: Any, max_new_tokens: int, stop_ids: Sequence[int] = ()) -> Iterator[None]:
    """Temporarily set the trainer's generation budget (transformers and vLLM paths) to ``max_new_tokens`` and
    make generation stop on ``stop_ids`` too (the env's end-of-turn ids: GLM's ``<|observation|>``, GPT-OSS's
    ``<|call|>``, ... are not the tokenizer's EOS): vLLM gets them as ``stop_token_ids`` (server and colocate:
    ``vllm_generation.generation_kwargs``), transformers as extra ``eos_token_id`` values."""
    saved: list[tuple[Any, str, Any]] = []
    gc = getattr(trainer, "generation_config", None)
    if gc is not None:
        saved.append((gc, "max_new_tokens", gc.max_new_tokens))
        gc.max_new_tokens = max_new_tokens
    vg = getattr(trainer, "vllm_generation", None)
    if vg is not None and hasattr(vg, "max_completion_length"):
        saved.append((vg, "max_completion_length", vg.max_completion_length))
        vg.max_completion_length = max_new_tokens
    if stop_ids:
        eos = list(getattr(trainer, "eos_token_ids", None) or [])
        extra = [int(t) for t in dict.fromkeys(stop_ids) if int(t) not in eos]
        if extra and gc is not None and not getattr(trainer, "use_vllm", False):
            saved.append((gc, "eos_token_id", gc.eos_token_id))
            saved.append((trainer, "eos_token_ids", trainer.eos_token_ids))
            gc.eos_token_id = [*eos, *extra]
            trainer.eos_token_ids = [*eos, *extra]
        if extra and vg is not None and isinstance(getattr(vg, "generation_kwargs", None), dict):
            saved.append((vg, "generation_kwargs", vg.generation_kwargs))
            prev = list(vg.generation_kwargs.get("stop_token_ids") or [])
            vg.generation_kwargs = {**vg.generation_kwargs, "stop_token_ids": [*prev, *(t for t in extra if t not in prev)]}
    gk = getattr(trainer, "generation_kwargs", None)
    gk_saved = dict(gk) if isinstance(gk, dict) else None
    if isinstance(gk, dict) and "max_new_tokens" in gk:
        gk["max_new_tokens"] = max_new_tokens
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        if gk_saved is not None:
            gk.clear()
            gk.update(gk_saved)


def _unwrapped_model(trainer: Any) -> Any:
    """The trainer's model without Accelerate's distributed wrapper (``None`` when the trainer has no model)."""
    model, accelerator = getattr(trainer, "model", None), getattr(trainer, "accelerator", None)
    return accelerator.unwrap_model(model) if model is not None and accelerator is not None else model


def _sharded(trainer: Any) -> bool:
    """Whether DeepSpeed or FSDP shards the trainer's weights (generation-time model changes leave those alone)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False))


@contextlib.contextmanager
def _generation_autocast(trainer: Any) -> Iterator[None]:
    """One ``torch.autocast`` context around one transformers ``generate()`` call when the trainer trains in mixed
    precision (``bf16`` / ``fp16``), else nothing. vLLM generates on its own and is left alone. Autocast is per
    thread: this runs in the generating one.

    Accelerate runs each *forward* under an autocast context of its own whose weight cache ends with the forward, so
    each decoding step would cast all weights again (then bfloat16 is no faster than float32 on a CPU); one context around the
    call casts them once. The call also runs the forward Accelerate wrapped (:func:`_without_amp_wrapper`): that
    wrapper's context has its weight cache off (:func:`trainers.grpo.no_autocast_weight_cache`), and an inner
    context with the cache off turns it off for the outer one too. The numbers are the same: the same ops in the
    same dtypes (``generate`` reads the logits as float32 either way). Frozen weights (a frozen tied embedding / LM
    head) are cast once per call too (:func:`toolgym.checkpoint.autocast_context` with the model)."""
    args = getattr(trainer, "args", None)
    dtype = "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else None
    if dtype is None or getattr(trainer, "use_vllm", False):
        yield
        return
    device = getattr(getattr(trainer, "accelerator", None), "device", None)
    model = _unwrapped_model(trainer)
    import torch

    # under no_grad (as TRL's generate runs anyway), so that frozen weights join the weight cache
    # (toolgym.checkpoint.autocast_context); sharded parameters are left as they are
    with (torch.no_grad(), autocast_context(getattr(device, "type", "cpu"), dtype, None if _sharded(trainer) else model),
          _without_amp_wrapper(model)):
        yield


@contextlib.contextmanager
def _without_amp_wrapper(model: Any) -> Iterator[None]:
    """``model.forward`` set back to the forward Accelerate wrapped in mixed precision (``model._original_forward``)
    for the duration; nothing when it is not wrapped."""
    attrs = vars(model) if model is not None else {}
    original, wrapped = attrs.get("_original_forward"), attrs.get("forward")
    if original is None or wrapped is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


@contextlib.contextmanager
def _reserved_generation_cache(trainer: Any, turns: TurnCache | None = None,
                               stop_ids: Sequence[int] = ()) -> Iterator[None]:
    """TRL's transformers ``generate()`` call gets a key/value cache allocated once, before its prefill
    (:func:`toolgym.rollout.kvcache.reserved_cache`, as :class:`toolgym.rollout.TransformersPolicy` has), instead of
    transformers' cache that grows by ``torch.cat`` in between the prefill's transients and leaves the heap
    fragmented under the training step that follows. The tokens are the same (bit-identical attention inputs; the
    probe forward draws no random numbers). vLLM, continuous batching and sharded models (DeepSpeed, FSDP) are
    left alone, as is a call that brings its own cache.

    ``turns``: the episodes' kept keys and values (:class:`toolgym.rollout.turn_cache.TurnCache`): a later turn
    prefills only the tokens the env appended, and every call's rows are kept for the next turn (rows' sampled
    tokens end at the first of ``stop_ids``). TRL gets its prompt back in front of the completion, as without."""
    model = _unwrapped_model(trainer)
    if (model is None or _sharded(trainer) or getattr(trainer, "use_vllm", False)
            or getattr(trainer, "use_transformers_continuous_batching", False) or "generate" in vars(model)):
        yield
        return
    import torch

    from toolgym.rollout.kvcache import cache_kwarg
    from toolgym.rollout.turn_cache import generation_cache

    bound = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, attn = kwargs.get("input_ids"), kwargs.get("attention_mask")
        config = kwargs.get("generation_config")
        max_new = getattr(config, "max_new_tokens", None)
        if ids is None or not max_new or {"cache", "past_key_values"} & set(kwargs):
            return bound(*args, **kwargs)
        call = None
        if turns is not None and attn is not None and not getattr(config, "return_dict_in_generate", False):
            call = turns.prepare(model, ids, attn, int(getattr(config, "pad_token_id", None) or 0))
        if call is not None:
            kwargs["input_ids"], kwargs["attention_mask"] = call.input_ids, call.attention_mask
        width = int(kwargs["input_ids"].shape[1])
        cache = generation_cache(model, int(ids.shape[0]), width + int(max_new), call, keep=turns is not None)
        if cache is None:
            return bound(*args, **kwargs)
        kwargs[cache_kwarg()] = cache
        out = bound(*args, **kwargs)
        if turns is None or attn is None or not isinstance(out, torch.Tensor):
            return out
        turns.keep(model, cache, kwargs["input_ids"], kwargs["attention_mask"], out, stop_ids)
        return out if call is None else torch.cat([ids, out[:, width:]], dim=1)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate


def _cpu_sampling(trainer: Any) -> contextlib.AbstractContextManager[Any]:
    """TRL's transformers ``generate()`` samples by inverse CDF on a CPU (:func:`trainers.grpo.sampling.inverse_cdf_sampling`:
    the same distribution without ``torch.multinomial``'s exponential variate per vocabulary entry). vLLM,
    continuous batching and sharded models are left alone."""
    model = _unwrapped_model(trainer)
    plain = (model is None or _sharded(trainer) or getattr(trainer, "use_vllm", False)
             or getattr(trainer, "use_transformers_continuous_batching", False))
    return contextlib.nullcontext() if plain else inverse_cdf_sampling(model)


@contextlib.contextmanager
def _merged_adapters(trainer: Any) -> Iterator[None]:
    """LoRA adapters merged into the base weights for one transformers ``generate()`` call, unmerged after it.

    Unmerged, every decoding step runs each adapted linear layer as three matrix products (on 2 CPU threads with
    rank 16 on every linear layer of SmolLM2-135M, 3 GRPO steps generated in 79 s against 40 s for full
    fine-tuning; the episodes were the same only in step 1); merged, it is one, and the tokens are those of the
    same function. vLLM generates from weights TRL merges and syncs itself;
    DeepSpeed / FSDP shard the weights, so they are left alone too. A model without adapters: nothing happens."""
    from accelerate.utils import is_peft_model

    model = _unwrapped_model(trainer)
    if model is None or not is_peft_model(model) or getattr(trainer, "use_vllm", False) or _sharded(trainer):
        yield
        return
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()


class TRLPolicy:
    """A :class:`toolgym.rollout.Policy` that generates with ``trainer._generate_single_turn`` (vLLM or
    transformers, whatever the trainer is configured with), so weights stay in sync and logprobs come for free.

    On several processes every call is collective: the call's prompt count and token budget are agreed across
    ranks (one all-gather) and a rank with fewer requests pads with a filler prompt whose output is dropped.

    Attributes:
        calls: number of ``_generate_single_turn`` calls made by this process.
    """

    concurrent = False

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.calls = 0
        self._filler: list[int] | None = None
        self._stops: set[int] = set()
        self._pool: Any = None
        #: each episode's keys and values between its turns (transformers generation; cleared when the weights change)
        self.turns = TurnCache()

    @property
    def world_size(self) -> int:
        return int(self.trainer.accelerator.num_processes)

    def _agree(self, values: Sequence[int]) -> list[int]:
        """Element-wise max of ``values`` over ranks (identity on one process)."""
        if self.world_size == 1:
            return list(values)
        import torch

        acc = self.trainer.accelerator
        t = torch.tensor([list(values)], dtype=torch.long, device=acc.device)
        return [int(x) for x in acc.gather(t).max(dim=0).values.tolist()]

    def sync_count(self, local: int) -> int:
        """The driver's ``sync_fn``: the largest local count over ranks."""
        return self._agree([local])[0]

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        colocate = getattr(self.trainer, "use_vllm", False) and getattr(self.trainer, "vllm_mode", "") == "colocate"
        if self.world_size == 1 and not colocate:
            return await asyncio.to_thread(self.generate, requests)
        # Several processes: generation is collective (gather, vLLM server, ZeRO-3), so every call runs on the same
        # dedicated thread, one at a time, in program order; the event loop stays free for tool I/O meanwhile.
        # An in-process (colocated) vLLM engine is likewise always called from that one thread (not tried on a GPU).
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolgym-collective-generate")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._generate_on_device, requests)

    def _generate_on_device(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        device = self.trainer.accelerator.device
        if getattr(device, "type", "cpu") == "cuda":  # the current CUDA device is per thread
            import torch

            torch.cuda.set_device(device)
        return self.generate(requests)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if requests and self._filler is None:
            self._filler = list(requests[0].prompt_ids)
        local_budget = max((r.max_new_tokens for r in requests), default=1)
        count, budget = self._agree([len(requests), local_budget])
        if count == 0:
            return []
        prompts = [list(r.prompt_ids) for r in requests]
        if len(prompts) < count:
            if self._filler is None:
                raise RuntimeError("TRLPolicy: no filler prompt for a rank without episodes")
            prompts += [self._filler] * (count - len(prompts))
        for r in requests:  # every stop id seen so far: a rank with no requests still sends them (vLLM server)
            self._stops.update(int(t) for t in (r.stop_ids or ()))
        ends = self._stops | {int(t) for t in (getattr(self.trainer, "eos_token_ids", ()) or ())}
        with (_turn_budget(self.trainer, budget, sorted(self._stops)), _generation_autocast(self.trainer),
              _merged_adapters(self.trainer), _reserved_generation_cache(self.trainer, self.turns, sorted(ends)),
              _cpu_sampling(self.trainer)):
            completion_ids, logprobs = self.trainer._generate_single_turn(prompts, None, {}, 1)
        self.calls += 1
        eos = tuple(getattr(self.trainer, "eos_token_ids", ()) or ())
        # TRL reads a NaN sampling logprob as "unavailable" (importance ratio 1): keep NaN, not 0.0
        return [
            Generation.from_sampled(
                completion_ids[i], None if logprobs is None else logprobs[i], r.stop_ids or eos, r.max_new_tokens,
                non_finite=float("nan"),
            )
            for i, r in enumerate(requests)
        ]


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
        env_kwargs: forwarded to the env (the trainer's tokenizer is passed as ``tokenizer`` unless given).
        max_turn_tokens: tokens sampled per assistant turn.
        max_completion_length: completion budget (default: ``trainer.max_completion_length``).
        trajectory_dir: if set, each call appends its trajectories to ``trajectory_dir/rank{r}.jsonl``.
        schedule: ``"lockstep"`` (required on several processes) or ``"continuous"`` (one process only).
        trim_heap: hand the C heap's free pages back to the OS after each call's episodes are generated
            (:func:`toolgym.resources.trim_heap`): generation's freed KV caches and activations otherwise stay
            resident and the training forward that follows grows on top of them (``docs/training.md``).

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
    ) -> None:
        self.env_id = env_id
        self.tasks = [dict(t) for t in tasks]
        self.by_id = {str(t["id"]): t for t in self.tasks}
        self.by_prompt = {str(t["prompt"]): t for t in self.tasks if "prompt" in t}
        self.env_kwargs = dict(env_kwargs or {})
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
        if self.policy is None or self.policy.trainer is not trainer:
            self.policy = TRLPolicy(trainer)
        policy = self.policy
        if policy.world_size > 1 and self.schedule != "lockstep":
            raise ValueError("several processes need the lock-step schedule (collective generation)")
        budget = int(self.max_completion_length or trainer.max_completion_length)
        tasks = [self.task_for(p) for p in prompts]
        venv = self._env(trainer, len(prompts))
        driver = RolloutDriver(
            venv, policy, schedule=self.schedule,  # type: ignore[arg-type]
            max_turn_tokens=min(self.max_turn_tokens, budget), max_completion_tokens=budget,
            sync_fn=policy.sync_count if policy.world_size > 1 else None,
        )
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        rank = int(trainer.accelerator.process_index)
        seeds = [int(getattr(trainer.args, "seed", 0)) * 1_000_003 + step * 10_007 + rank * 1009 + i
                 for i in range(len(tasks))]
        try:
            trajs = driver.run(tasks, seeds=seeds)
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
        self.last_trajectories = trajs
        self.last_stats = driver.stats
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
    log_metric: Any = None,
    **_: Any,
) -> list[float]:
    """TRL reward function: pass the env's episode reward through (``rewards/env_reward/mean`` in TRL's logs)
    and log ``toolgym/*`` metrics: success (outcome >= 1), tool-call rate (episodes with a call), calls per
    episode, turns, truncated fraction, and ``toolgym/errors/<kind>`` (errors per episode) for every
    :class:`~toolgym.tools.base.ToolErrorKind` (always all kinds, so every rank logs the same names)."""
    if env_reward is None:
        raise ValueError("env_reward needs the `env_reward` field: use it with trainers.grpo.rollout_adapter.ToolgymRollout")
    n = len(env_reward)
    if log_metric is not None and n:
        if env_outcome is not None:
            log_metric("toolgym/success", float(np.mean([o >= 1.0 for o in env_outcome])))
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
    return [float(r) for r in env_reward]
