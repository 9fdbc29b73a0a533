"""The provided policies: a local transformers model, an OpenAI-compatible server, and a scripted policy.

* :class:`TransformersPolicy`: a Hugging Face causal LM, generating in a worker thread (so tool I/O keeps running);
* :class:`OpenAIPolicy`: an OpenAI-compatible ``/v1/completions`` server that accepts token-id prompts and returns
  token ids + logprobs (what ``vllm serve`` exposes; also ``toolgym serve model``);
* :class:`ScriptedPolicy`: a function of the episode (task, turn, history) that writes the text of each turn,
  e.g. an oracle that solves the task by calling the tools (for RFT/SFT warm starts and benchmarks).

Every backend turns what it sampled into a :class:`~toolgym.rollout.types.Generation` with
:meth:`Generation.from_sampled`, and reports logprobs in the same :data:`~toolgym.rollout.types.LogprobsMode`
(default ``"processed_logprobs"``). torch and transformers are imported lazily, aiohttp inside
:class:`OpenAIPolicy`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from toolgym.checkpoint import autocast_context, check_autocast
from toolgym.resources import trim_heap
from toolgym.rollout.kvcache import cache_kwarg
from toolgym.rollout.padding import left_pad
from toolgym.rollout.shared_prefix import shared_prefill
from toolgym.rollout.turn_cache import TurnCache, generation_cache
from toolgym.rollout.types import (
    DEFAULT_LOGPROBS_MODE,
    BlockingPolicy,
    EpisodeState,
    Generation,
    GenerationRequest,
    LogprobsMode,
    check_logprobs_mode,
)

__all__ = ["OpenAIPolicy", "ScriptedPolicy", "TransformersPolicy"]


class TransformersPolicy(BlockingPolicy):
    """A Hugging Face causal LM as a batched policy.

    Generation runs in a worker thread (one batch at a time, ``concurrent = False``) so tool calls of other
    episodes keep running on the event loop. Prompts are left-padded; each row is cut after its first stop id.

    Args:
        model: a ``PreTrainedModel`` (causal LM) on any device.
        tokenizer: gives ``pad_token_id`` (else ``eos``); optional when the model config has a pad id.
        temperature: sampling temperature; ``0`` (or ``do_sample=False``) = greedy.
        top_p, top_k: nucleus / top-k sampling (``top_k=0`` disables it).
        do_sample: sample (default when ``temperature > 0``) or decode greedily.
        max_batch_size: split larger batches into chunks of this many rows (``None``: one call).
        return_logprobs: report each sampled token's log-probability.
        logprobs_mode: what those logprobs mean (vLLM's names, the same default in every toolgym backend):
            ``"processed_logprobs"`` = under the distribution sampled from (temperature / top-k / top-p applied),
            what TRL's importance-sampling correction compares against; ``"raw_logprobs"`` = the model's own
            ``log_softmax(logits)``. See :mod:`toolgym.rollout.types`.
        seed: reproducible sampling. Requests that come from a driver (with their episode) are sampled
            **per episode**: each row draws from its own generator seeded with ``(seed, episode index, turn)``, so
            an episode's tokens do not depend on which other episodes share its batch (``--num-envs``,
            schedule); other requests seed torch's RNG before each call (``seed + call index``). ``None``: torch's
            global RNG, untouched.
        autocast: a dtype name (``"bfloat16"``, ``"float16"``) to generate under ``torch.autocast`` on the model's
            device: matrix products in that dtype, weights cast once per ``generate()`` call and kept float32
            (on a CPU with AMX or AVX512-BF16, ``bfloat16`` decodes faster than float32: ``docs/training.md``).
            Greedy results then differ from float32 ones: evaluate a checkpoint with the setting it was evaluated
            with (``toolgym_run.json`` carries it). ``None``: the model's own dtype.
        reserve_cache: allocate each ``generate()`` call's key/value cache up front, for the whole call, and
            write it in place (:mod:`toolgym.rollout.kvcache`; same tokens, less heap fragmentation).
        trim_heap: hand the C heap's free pages back to the OS after each batch (glibc ``malloc_trim``,
            :func:`toolgym.resources.trim_heap`): a batch's freed KV cache and prefill activations otherwise stay
            resident, and the next batch (or a training step) grows on top of them. Milliseconds per batch; the
            tokens do not change. ``None`` (default): on when the model's weights are on the CPU.
        turn_cache_mb: keep each row's keys and values, up to this many MiB in all, so that an episode's next turn
            prefills only what the env appended (:class:`toolgym.rollout.turn_cache.TurnCache`; a batch runs on kept
            rows only when all of its rows have one). ``0``: prefill every turn's whole prompt.
        shared_prefix: rows of a batch with the same prompt (a GRPO group's samples) prefill it once and share its
            keys and values (:mod:`toolgym.rollout.shared_prefix`; the same logits up to float rounding). Applies
            to a batch that does not run on kept rows (an episode's first turn).
        processor: a vision-language model's processor (:mod:`toolgym.format.vision`): a batch whose requests carry
            ``images`` is generated with their pixel tensors, grid sizes and image type ids
            (:func:`toolgym.format.vision.forward_inputs`, rows left-padded), its whole prompts prefilled (no turn
            cache, no shared prefix), and image and wrapper tokens never sampled. ``None``: a request with images
            is refused.

    Attributes:
        shared_tokens: prompt tokens not prefilled because their row shared another row's prompt.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        do_sample: bool | None = None,
        max_batch_size: int | None = None,
        return_logprobs: bool = True,
        seed: int | None = None,
        logprobs_mode: LogprobsMode = DEFAULT_LOGPROBS_MODE,
        autocast: str | None = None,
        reserve_cache: bool = True,
        trim_heap: bool | None = None,
        turn_cache_mb: float = 192,
        shared_prefix: bool = True,
        processor: Any = None,
    ) -> None:
        self.model = model
        self.processor = processor
        self.shared_prefix = shared_prefix
        self.shared_tokens = 0
        self.reserve_cache = reserve_cache
        self.turn_cache = TurnCache(int(turn_cache_mb * 2**20)) if turn_cache_mb > 0 else None
        if trim_heap is None:
            param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
            trim_heap = param is not None and param.device.type == "cpu"
        self.trim_heap = trim_heap
        self.autocast = check_autocast(autocast)
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.do_sample = (temperature > 0) if do_sample is None else do_sample
        self.max_batch_size = max_batch_size
        self.return_logprobs = return_logprobs
        self.logprobs_mode: LogprobsMode = check_logprobs_mode(logprobs_mode)
        self.seed = seed
        self.calls = 0
        self._lock = threading.Lock()
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None:
            pad = getattr(model.config, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else model.config.eos_token_id
        if isinstance(pad, list):
            pad = pad[0]
        self.pad_token_id = int(pad if pad is not None else 0)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Blocking :meth:`agenerate`."""
        if not requests:
            return []
        with self._lock:
            step = self.max_batch_size or len(requests)
            first: list[int] = []
            if self.turn_cache is not None and len(requests) > step:
                # rows that continue a kept row are batched together, and first: their batches run on kept keys and
                # values before the other rows' new ones push them out of the cache (whole batches only: a part
                # batch of them would be one more call, for less than its prefill)
                first = [i for i, r in enumerate(requests) if self.turn_cache.extends_a_kept_row(r.prompt_ids)]
                first = first[: len(first) // step * step]
            rest = sorted(set(range(len(requests))) - set(first))
            chunks = [g[k : k + step] for g in (first, rest) for k in range(0, len(g), step)]
            out: list[Generation | None] = [None] * len(requests)
            for chunk in chunks:
                for i, g in zip(chunk, self._generate_batch([requests[i] for i in chunk]), strict=True):
                    out[i] = g
                if self.trim_heap:
                    trim_heap()
            return out  # type: ignore[return-value]

    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        self.calls += 1
        device = next(self.model.parameters()).device
        mm = self._image_inputs(requests)
        if mm is not None:
            ids, attn = mm.pop("input_ids"), mm.pop("attention_mask")
        else:
            ids, attn = left_pad([r.prompt_ids for r in requests], self.pad_token_id)
        # a later turn of the same episodes: only the new tokens are prefilled, over the rows' kept keys and values
        call = (self.turn_cache.prepare(self.model, ids, attn, self.pad_token_id)
                if self.turn_cache is not None and mm is None else None)
        if call is not None:
            ids, attn = call.input_ids, call.attention_mask
        width = ids.shape[1]
        raw = self.logprobs_mode == "raw_logprobs"
        stop_ids = sorted({s for r in requests for s in r.stop_ids})
        max_new = max(1, max(r.max_new_tokens for r in requests))
        cfg: dict[str, Any] = {
            "max_new_tokens": max_new,
            "do_sample": self.do_sample,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": stop_ids or None,
            "return_dict_in_generate": True,
            "output_scores": self.return_logprobs and not raw,
            "output_logits": self.return_logprobs and raw,
        }
        sampler = None
        if self.do_sample and self.seed is not None and all(r.episode is not None for r in requests):
            # sample each row from its own seeded generator (inside a logits processor that also applies the
            # temperature / top-k / top-p warpers, which generate() would otherwise run after it); generate()
            # then "samples" the one token left
            sampler = _PerEpisodeSampler(self, requests, device)
            # the sampler records the log-probabilities itself: generate() need not keep a (B, V) copy per step
            cfg.update(temperature=1.0, top_p=1.0, top_k=0, output_scores=False, output_logits=False)
        elif self.do_sample:
            cfg.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        greedy_lps = None
        if not self.do_sample and self.return_logprobs and not raw:
            # greedy, processed: the chosen token is the argmax of the scores the last processor sees, so its
            # log-probability is max - logsumexp, a (B,) per step (not a (B, V) copy of the scores kept per step)
            greedy_lps = _GreedyLogprobs()
            cfg.update(output_scores=False)
        if self.processor is not None:  # image and wrapper tokens are the env's, never sampled
            from toolgym.format.vision import vision_format

            cfg["suppress_tokens"] = sorted(vision_format(self.processor).block_ids)
        gen_config = GenerationConfig(**cfg)
        if self.seed is not None and sampler is None:
            torch.manual_seed(self.seed + self.calls)
        was_training = self.model.training
        self.model.eval()
        try:
            # autocast is per thread: entered here, in the thread that generates, around the whole call (its weight
            # cache then lasts for every decoding step)
            with torch.no_grad(), autocast_context(device.type, self.autocast, self.model):
                recorder = sampler if sampler is not None else greedy_lps
                extra: dict[str, Any] = {"logits_processor": [recorder]} if recorder is not None else {}
                if call is None and self.shared_prefix and mm is None:  # a group's prompt prefilled once, its keys and values shared
                    call = shared_prefill(self.model, ids, attn)
                    self.shared_tokens += call.saved_tokens if call is not None else 0
                cache = None if mm is not None else generation_cache(
                    self.model, ids.shape[0], width + max_new, call, reserve=self.reserve_cache,
                    keep=self.turn_cache is not None)
                if cache is not None:
                    extra[cache_kwarg()] = cache
                for k, v in (mm or {}).items():
                    extra[k] = v.to(device)
                out = self.model.generate(
                    input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=gen_config, **extra,
                )
                if self.turn_cache is not None and mm is None:
                    self.turn_cache.keep(self.model, cache, ids, attn, out.sequences, stop_ids or [self.pad_token_id])
        finally:
            if was_training:
                self.model.train()
        seqs = out.sequences[:, width:].cpu()
        lps = None
        steps = (out.logits if raw else out.scores) if self.return_logprobs else None
        if sampler is not None and self.return_logprobs and sampler.logprobs:
            lps = torch.stack(sampler.logprobs, dim=1).cpu()  # (B, T), in the policy's logprobs_mode
        elif greedy_lps is not None and greedy_lps.logprobs:
            lps = torch.stack(greedy_lps.logprobs, dim=1).cpu()  # (B, T), processed
        elif steps:
            # scores: after generate's processors and warpers (processed); logits: the model's own (raw)
            scores = torch.stack([s.float().cpu() for s in steps], dim=1)  # (B, T, V)
            logp = torch.log_softmax(scores, dim=-1)
            lps = logp.gather(-1, seqs[:, : scores.size(1)].unsqueeze(-1)).squeeze(-1)  # (B, T)
        return [
            Generation.from_sampled(
                seqs[i].tolist(), None if lps is None else lps[i].tolist(), r.stop_ids or stop_ids, r.max_new_tokens
            )
            for i, r in enumerate(requests)
        ]


    def _image_inputs(self, requests: Sequence[GenerationRequest]) -> dict[str, Any] | None:
        """The forward inputs of a batch with images (left-padded ids, attention mask, image tensors and type ids),
        or ``None`` when no request carries images."""
        if not any(r.images for r in requests):
            return None
        if self.processor is None:
            raise ValueError("a generation request carries images: build TransformersPolicy(..., processor=...) "
                             "with the vision-language model's processor")
        from toolgym.format.vision import forward_inputs

        return forward_inputs([(r.prompt_ids, r.images) for r in requests], self.processor,
                              pad_id=self.pad_token_id, padding_side="left")


class _GreedyLogprobs:
    """A logits processor, last in greedy generation's list, that records the log-probability of each row's
    argmax under the scores it sees (the ones greedy decoding picks from): ``(B,)`` float32 per step, on the
    scores' device, in :attr:`logprobs`. It leaves the scores unchanged."""

    def __init__(self) -> None:
        self.logprobs: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        x = scores.float()
        self.logprobs.append(x.amax(dim=-1) - torch.logsumexp(x, dim=-1))
        return scores


class _PerEpisodeSampler:
    """A logits processor that samples row ``i`` with a generator seeded by ``(seed, episode index, turn)`` of its
    request, after the policy's temperature / top-k / top-p, records the sampled token's log-probability (in the
    policy's ``logprobs_mode``) and leaves only that token possible (so generate's own sampling step returns it)."""

    def __init__(self, policy: TransformersPolicy, requests: Sequence[GenerationRequest], device: Any) -> None:
        import torch
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        warpers = []
        if policy.temperature not in (None, 1.0):
            warpers.append(TemperatureLogitsWarper(policy.temperature))
        if policy.top_k:
            warpers.append(TopKLogitsWarper(policy.top_k))
        if policy.top_p is not None and policy.top_p < 1.0:
            warpers.append(TopPLogitsWarper(policy.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.raw = policy.logprobs_mode == "raw_logprobs"
        self.generators = []
        for r in requests:
            assert r.episode is not None
            state = np.random.SeedSequence([int(policy.seed or 0), int(r.episode.index), int(r.episode.turn)])
            g = torch.Generator(device=device)
            g.manual_seed(int(state.generate_state(1, dtype=np.uint64)[0] >> 1))
            self.generators.append(g)
        self.logprobs: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        warped = self.warpers(input_ids, scores.float())
        logp = torch.log_softmax(warped, dim=-1)
        probs = logp.exp()
        chosen = torch.stack([torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(self.generators)])
        reported = torch.log_softmax(scores.float(), dim=-1) if self.raw else logp
        self.logprobs.append(reported.gather(-1, chosen[:, None])[:, 0])
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(-1, chosen[:, None], 0.0)
        return out


class OpenAIPolicy:
    """An OpenAI-compatible ``/v1/completions`` endpoint as a policy (token ids in, token ids + logprobs out).

    Sends one request per turn with ``prompt`` = the token ids (vLLM and ``toolgym serve model`` accept token-id
    prompts), ``logprobs=1`` and vLLM's ``return_token_ids`` / ``return_tokens_as_token_ids`` / ``stop_token_ids``
    extensions, so no text is ever re-tokenised. Requests overlap (``concurrent = True``): the server batches.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"`` (``/v1`` is appended unless present).
        model: the served model name (``None``: the first of ``GET /v1/models``).
        temperature, top_p: sampling parameters.
        api_key: sent as a bearer token when given.
        max_concurrency: requests in flight at once.
        timeout_s: per-request timeout.
        extra_body: more request fields (vLLM sampling extensions, ...).
        logprobs_mode: what the returned logprobs mean (see :mod:`toolgym.rollout.types`; the same default as
            every toolgym backend). Sent as the request field ``logprobs_mode``, which ``toolgym serve model``
            honours per request; vLLM fixes it per server: start it with ``--logprobs-mode`` set to the same value
            (``trl vllm-serve`` does, with ``processed_logprobs``).
    """

    concurrent = True

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        api_key: str | None = None,
        max_concurrency: int = 256,
        timeout_s: float = 600.0,
        extra_body: Mapping[str, Any] | None = None,
        logprobs_mode: LogprobsMode = DEFAULT_LOGPROBS_MODE,
    ) -> None:
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.extra_body = dict(extra_body or {})
        self.logprobs_mode: LogprobsMode = check_logprobs_mode(logprobs_mode)
        self.calls = 0
        self._sem: dict[int, asyncio.Semaphore] = {}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _model_name(self, session: Any) -> str:
        if self.model is None:
            async with session.get(f"{self.base_url}/models", headers=self._headers()) as resp:
                resp.raise_for_status()
                data = await resp.json()
            self.model = data["data"][0]["id"]
        return self.model

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        import aiohttp

        loop_id = id(asyncio.get_running_loop())
        sem = self._sem.setdefault(loop_id, asyncio.Semaphore(self.max_concurrency))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            model = await self._model_name(session)

            async def one(r: GenerationRequest) -> Generation:
                async with sem:
                    return await self._complete(session, model, r)

            return list(await asyncio.gather(*(one(r) for r in requests)))

    async def _complete(self, session: Any, model: str, r: GenerationRequest) -> Generation:
        self.calls += 1
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(r.prompt_ids),
            "max_tokens": int(max(1, r.max_new_tokens)),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": 1,
            "stop_token_ids": list(r.stop_ids),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "logprobs_mode": self.logprobs_mode,
            **self.extra_body,
        }
        async with session.post(f"{self.base_url}/completions", json=body, headers=self._headers()) as resp:
            if resp.status >= 400:
                raise RuntimeError(f"completions request failed ({resp.status}): {(await resp.text())[:500]}")
            data = await resp.json()
        choice = data["choices"][0]
        lp_block = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            tokens = lp_block.get("tokens")
            if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise RuntimeError(
                    "the server returned no token ids: it needs vLLM's `return_token_ids` or "
                    "`return_tokens_as_token_ids` support (text is never re-tokenised)"
                )
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        logprobs = lp_block.get("token_logprobs")
        if logprobs is not None and len(logprobs) != len(ids):
            logprobs = None  # cannot be aligned with the ids
        return Generation.from_sampled(
            ids, logprobs, r.stop_ids, r.max_new_tokens, finish_reason=choice.get("finish_reason")
        )


class ScriptedPolicy:
    """A policy that writes each turn's text with a function of the episode: oracles, baselines, benchmarks.

    Args:
        script: ``fn(state: EpisodeState) -> str``: the assistant text of turn ``state.turn`` (tool calls in the
            model's native format, e.g. ``env.format.parser.format_calls(...)``; the answer in ``<answer>``).
            It may return ``None`` to give an empty answer.
        end_turn: append the env's end-of-turn token (as a model that stopped by itself would).

    Encoding goes through ``env.encode_action`` (the env's own tokenizer), so the ids are what a model would
    have sampled to write that text. Logprobs are ``0.0`` (the script is deterministic).
    """

    concurrent = True

    def __init__(self, script: Callable[[EpisodeState], str | None], *, end_turn: bool = True) -> None:
        self.script = script
        self.end_turn = end_turn
        self.calls = 0

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls += 1
        out = []
        for r in requests:
            if r.episode is None or r.episode.env is None:
                raise ValueError("ScriptedPolicy needs requests from a RolloutDriver (episode state with its env)")
            text = self.script(r.episode) or ""
            ids = [int(t) for t in r.episode.env.encode_action(text, end_turn=self.end_turn)]
            out.append(Generation.from_sampled(ids, [0.0] * len(ids), (), r.max_new_tokens, finish_reason="stop"))
        return out


