"""Generation with the trainer's own model for the rollout adapter: :class:`TRLPolicy`, a toolgym ``Policy`` that
sends each turn's prompts through TRL's ``_generate_single_turn`` (vLLM server or colocated, or
``model.generate``), and the context it runs in for the length of one ``generate()`` call: the turn's token
budget and stop tokens, the model unwrapped from the training wrappers, autocast without Accelerate's forward
wrapper, the reserved key/value cache, inverse-CDF sampling on the CPU (:mod:`trainers.grpo.sampling`), and LoRA
adapters merged while generating. Each of these restores what it changed on exit.

Requests with images (a vision-language env's, :mod:`toolgym.format.vision`) are generated with them: through
``model.generate`` with the rows' pixel tensors, grid sizes and image type ids (the rows' whole prompts prefilled:
the turn cache and the shared-prefix prefill take no images and are skipped for such a call, logged once), image
and wrapper tokens never sampled; through vLLM with each prompt's images as ``multi_modal_data`` (colocated: each
image's run of tokens collapsed to one placeholder, which vLLM expands itself,
:func:`toolgym.format.vision.vllm_prompt`; server: the expanded ids, on whose runs TRL places the image features).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from transformers.utils import logging as hf_logging

from toolgym.precision import autocast_context
from toolgym.rollout import Generation, GenerationRequest, TurnCache
from toolgym.rollout.turn_cache import TurnCall
from trainers.grpo.sampling import inverse_cdf_sampling

__all__ = ["SharedPrefixCount", "TRLPolicy"]

logger = hf_logging.get_logger(__name__)


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
    each decoding step cast all weights again (measured: no faster than float32 on a CPU); one context around the
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
def _reserved_generation_cache(trainer: Any, turns: TurnCache | None = None, stop_ids: Sequence[int] = (),
                               shared: SharedPrefixCount | None = None) -> Iterator[None]:
    """TRL's transformers ``generate()`` call gets a key/value cache allocated once, before its prefill
    (:func:`toolgym.rollout.kvcache.reserved_cache`, as :class:`toolgym.rollout.TransformersPolicy` has), instead of
    transformers' cache that grows by ``torch.cat`` in between the prefill's transients and leaves the heap
    fragmented under the training step that follows. The tokens are the same (bit-identical attention inputs; the
    probe forward draws no random numbers). vLLM, continuous batching and sharded models (DeepSpeed, FSDP) are
    left alone, as is a call that brings its own cache.

    ``turns``: the episodes' kept keys and values (:class:`toolgym.rollout.turn_cache.TurnCache`): a later turn
    prefills only the tokens the env appended, and every call's rows are kept for the next turn (rows' sampled
    tokens end at the first of ``stop_ids``). TRL gets its prompt back in front of the completion, as without.

    ``shared``: a call that does not run on kept rows prefills each distinct prompt once and its rows share the keys
    and values (:func:`toolgym.rollout.shared_prefix.shared_prefill`: a GRPO group's samples), counted there."""
    model = _unwrapped_model(trainer)
    if (model is None or _sharded(trainer) or getattr(trainer, "use_vllm", False)
            or getattr(trainer, "use_transformers_continuous_batching", False) or "generate" in vars(model)):
        yield
        return
    import torch

    from toolgym.rollout.kvcache import cache_kwarg
    from toolgym.rollout.shared_prefix import shared_prefill
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
        if call is None and shared is not None and attn is not None:
            call = shared_prefill(model, ids, attn)
            shared.add(call)
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


@contextlib.contextmanager
def _suppressed(trainer: Any, token_ids: Sequence[int]) -> Iterator[None]:
    """``token_ids`` never sampled by transformers generation for the duration (the generation config's
    ``suppress_tokens``); vLLM is left alone (its prompts hold one placeholder per image, never sampled back)."""
    gc = getattr(trainer, "generation_config", None)
    if gc is None or getattr(trainer, "use_vllm", False):
        yield
        return
    saved = gc.suppress_tokens
    gc.suppress_tokens = sorted({*(saved or ()), *(int(t) for t in token_ids)})
    try:
        yield
    finally:
        gc.suppress_tokens = saved


class SharedPrefixCount:
    """What shared prompts saved in GRPO's transformers generation: ``calls`` = ``generate()`` calls that prefilled
    each distinct prompt once, ``tokens`` = prompt tokens they did not prefill."""

    def __init__(self) -> None:
        self.calls = 0
        self.tokens = 0

    def add(self, call: TurnCall | None) -> None:
        if call is not None:
            self.calls += 1
            self.tokens += int(call.saved_tokens)


class TRLPolicy:
    """A :class:`toolgym.rollout.Policy` that generates with ``trainer._generate_single_turn`` (vLLM or
    transformers, whatever the trainer is configured with), so weights stay in sync and logprobs come for free.

    On several processes every call is collective: the call's prompt count and token budget are agreed across
    ranks (one all-gather) and a rank with fewer requests pads with a filler prompt whose output is dropped.

    Args:
        trainer: the ``GRPOTrainer``.
        shared_prefix: transformers generation prefills a prompt that several rows of a call have (a GRPO group's
            samples on this process) once and shares its keys and values (:mod:`toolgym.rollout.shared_prefix`);
            ``None``: the trainer's ``shared_prefix`` attribute, else on. vLLM (its own prefix caching shares the
            prompt), continuous batching and sharded models (DeepSpeed, FSDP) generate as TRL does.

    Attributes:
        calls: number of ``_generate_single_turn`` calls made by this process.
        shared: a :class:`SharedPrefixCount` (``None`` with ``shared_prefix`` off).
        processor: the vision-language model's processor (set by the rollout adapter), needed by requests with
            images (module docstring); ``None`` refuses them.
    """

    concurrent = False

    def __init__(self, trainer: Any, shared_prefix: bool | None = None) -> None:
        self.trainer = trainer
        if shared_prefix is None:
            shared_prefix = bool(getattr(trainer, "shared_prefix", True))
        self.shared = SharedPrefixCount() if shared_prefix else None
        self.calls = 0
        self._filler: list[int] | None = None
        self._filler_images: list[Any] = []
        self.processor: Any = None
        self._warned_images = False
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

    def _generations(self, requests: Sequence[GenerationRequest], completion_ids: Any, logprobs: Any
                     ) -> list[Generation]:
        eos = tuple(getattr(self.trainer, "eos_token_ids", ()) or ())
        # TRL reads a NaN sampling logprob as "unavailable" (importance ratio 1): keep NaN, not 0.0
        return [
            Generation.from_sampled(
                completion_ids[i], None if logprobs is None else logprobs[i], r.stop_ids or eos, r.max_new_tokens,
                non_finite=float("nan"),
            )
            for i, r in enumerate(requests)
        ]

    def _generate_with_images(self, requests: Sequence[GenerationRequest], prompts: list[list[int]],
                              images: list[list[Any]], budget: int) -> list[Generation]:
        """One call whose prompts hold images (module docstring)."""
        from toolgym.format.vision import vision_format, vllm_prompt
        from trainers.vision import check_counts, check_vision_model, image_tensors

        check_vision_model(_unwrapped_model(self.trainer), self.processor, "GRPO generation (TRLPolicy)")
        check_counts(list(zip(prompts, images, strict=True)), self.processor)
        vf = vision_format(self.processor)
        trainer = self.trainer
        fields: dict[str, Any] = {}
        pil: list[Any] | None = None
        if getattr(trainer, "use_vllm", False):
            pil = [[img.to_pil().convert("RGB") for img in row] or None for row in images]
            if getattr(trainer, "vllm_mode", "") == "colocate":  # vLLM expands each placeholder itself
                prompts = [vllm_prompt(ids, row, vf)["prompt_token_ids"] for ids, row in zip(prompts, images,
                                                                                              strict=True)]
        else:
            if not self._warned_images:
                logger.warning("GRPO generation with images: the turn cache and the shared-prefix prefill take no "
                               "images; calls with images prefill every row's whole prompt")
                self._warned_images = True
            # the images' tensors in row order, the type ids as per-row lists (TRL left-pads them as the ids)
            fields = image_tensors(images, vf)
            fields[vf.family.type_ids_key] = [[int(t == vf.image_token_id) for t in ids] for ids in prompts]
        for r in requests:
            self._stops.update(int(t) for t in (r.stop_ids or ()))
        with (_turn_budget(trainer, budget, sorted(self._stops)), _generation_autocast(trainer),
              _merged_adapters(trainer), _suppressed(trainer, sorted(vf.block_ids)), _cpu_sampling(trainer)):
            completion_ids, logprobs = trainer._generate_single_turn(prompts, pil, fields, 1)
        self.calls += 1
        return self._generations(requests, completion_ids, logprobs)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if requests and self._filler is None:
            self._filler = list(requests[0].prompt_ids)
            self._filler_images = list(requests[0].images or ())
        local_budget = max((r.max_new_tokens for r in requests), default=1)
        count, budget = self._agree([len(requests), local_budget])
        if count == 0:
            return []
        prompts = [list(r.prompt_ids) for r in requests]
        images = [list(r.images or ()) for r in requests]
        if len(prompts) < count:
            if self._filler is None:
                raise RuntimeError("TRLPolicy: no filler prompt for a rank without episodes")
            prompts += [self._filler] * (count - len(prompts))
            images += [self._filler_images] * (count - len(images))
        if any(images):
            return self._generate_with_images(requests, prompts, images, budget)
        for r in requests:  # every stop id seen so far: a rank with no requests still sends them (vLLM server)
            self._stops.update(int(t) for t in (r.stop_ids or ()))
        ends = self._stops | {int(t) for t in (getattr(self.trainer, "eos_token_ids", ()) or ())}
        with (_turn_budget(self.trainer, budget, sorted(self._stops)), _generation_autocast(self.trainer),
              _merged_adapters(self.trainer), _reserved_generation_cache(self.trainer, self.turns, sorted(ends), self.shared),
              _cpu_sampling(self.trainer)):
            completion_ids, logprobs = self.trainer._generate_single_turn(prompts, None, {}, 1)
        self.calls += 1
        return self._generations(requests, completion_ids, logprobs)
