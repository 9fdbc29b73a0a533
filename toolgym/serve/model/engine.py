"""The generation engine of ``toolgym serve model``: per-sequence sampling settings, the sampler, and a KV-cache
decoding loop that runs queued sequences in dynamic batches on one worker thread (no HTTP here: see
:mod:`toolgym.serve.model.server`).

Batching: concurrent sequences are gathered by a :class:`toolgym.batching.MicroBatcher` (up to ``max_batch_size``
sequences, ``batch_wait_s`` after the first), left-padded with :func:`toolgym.rollout.padding.left_pad` (the
helper :class:`~toolgym.rollout.TransformersPolicy` uses) and decoded together; each sequence is released as soon
as it finishes.

Logprobs follow :data:`SamplingParams.logprobs_mode` (vLLM's names; default ``"processed_logprobs"``, the same as
every toolgym backend: see :mod:`toolgym.rollout.types` for why): ``"raw_logprobs"`` = the model's
``log_softmax(logits)``; ``"processed_logprobs"`` = under the distribution sampled from (logit bias, penalties,
allowed ids, temperature, top-k, top-p applied; ``-inf`` outside it, reported as ``-9999.0`` as vLLM does).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.batching import MicroBatcher
from toolgym.rollout.padding import left_pad
from toolgym.rollout.types import DEFAULT_LOGPROBS_MODE, LogprobsMode

__all__ = ["SamplingParams", "adjust_logits"]

log = logging.getLogger("toolgym.serve.model")

#: what a ``-inf`` logprob (a token outside the processed distribution) is reported as (vLLM's value)
NEG_INF_LOGPROB = -9999.0


@dataclass
class SamplingParams:
    """Per-sequence generation settings (validated from a request).

    Attributes:
        max_tokens: the most tokens to sample (>= 1).
        temperature: 0 = greedy; else logits are divided by it before sampling.
        top_p: nucleus sampling mass in (0, 1].
        seed: seeds this sequence's own generator (``None``: random).
        stop: strings that end the sequence (cut from the text unless ``include_stop_str_in_output``).
        stop_token_ids: token ids that end the sequence (kept in ``token_ids``, cut from the text).
        ignore_eos: keep sampling past the end-of-sequence token.
        logprobs: ``None`` = no logprobs; ``k >= 0`` = sampled-token logprob plus the top ``k`` alternatives.
        allowed_token_ids: restrict sampling to these ids.
        top_k: sample among the ``top_k`` most likely tokens (``<= 0``: no limit).
        logit_bias: ``{token id: bias}`` added to the logits before sampling (OpenAI's field; bias in [-100, 100]).
        presence_penalty: subtracted once from the logit of every token already generated (OpenAI / vLLM).
        frequency_penalty: subtracted from a token's logit once per time it was already generated.
        repetition_penalty: divides positive / multiplies negative logits of every token seen in the prompt or
            the output (the CTRL / transformers / vLLM definition; 1 = off).
        logprobs_mode: ``"processed_logprobs"`` (default) or ``"raw_logprobs"`` (see the module docstring).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    top_k: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs_mode: LogprobsMode = DEFAULT_LOGPROBS_MODE

    @property
    def adjusts_logits(self) -> bool:
        """Whether any logit processor (bias, penalties) is on; greedy decoding then argmaxes adjusted logits."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 or (
            self.repetition_penalty != 1.0
        )


def adjust_logits(x: Any, prompt_ids: Sequence[int], out_ids: Sequence[int], p: SamplingParams) -> Any:
    """Apply ``logit_bias`` then the repetition / frequency / presence penalties (vLLM's order and definitions)
    to a 1-D float tensor of logits ``[vocab]``; returns a new tensor (``x`` is not modified)."""
    import torch

    x = x.clone()
    if p.logit_bias:
        idx = torch.tensor(list(p.logit_bias), dtype=torch.long)
        x[idx] += torch.tensor(list(p.logit_bias.values()), dtype=x.dtype)
    if p.repetition_penalty != 1.0 and (prompt_ids or out_ids):
        seen = torch.tensor(sorted({*prompt_ids, *out_ids}), dtype=torch.long)
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if out_ids and (p.frequency_penalty != 0 or p.presence_penalty != 0):
        counts = torch.bincount(torch.tensor(out_ids, dtype=torch.long), minlength=x.numel()).to(x.dtype)
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(x.dtype)
    return x


@dataclass
class _Seq:
    """One sequence being generated (a prompt x one of its ``n`` samples)."""

    prompt_ids: list[int]
    params: SamplingParams
    sample_index: int = 0
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str | None = None  # set when a stop string cut the text
    future: asyncio.Future[_Seq] | None = None
    loop: asyncio.AbstractEventLoop | None = None


# ----------------------------------------------------------------------------------------------------- engine
class _Engine:
    """Runs queued sequences in dynamic batches on one worker thread."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 8, batch_wait_s: float = 0.003) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.tok = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        eos: set[int] = set()
        for src in (getattr(model, "generation_config", None), model.config):
            ids = getattr(src, "eos_token_id", None) if src is not None else None
            if ids is not None:
                eos.update([ids] if isinstance(ids, int) else ids)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = eos
        # only the last position's logits are needed: skip the [batch, prompt, vocab] tensor where supported
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(eos) if eos else 0))
        self._batcher: MicroBatcher[_Seq, _Seq] | None = None
        self.lock = threading.Lock()  # one forward pass at a time, whatever calls it
        self.batches = 0
        self.sequences = 0

    def start(self) -> None:
        """Start batching on the running loop (one batch at a time: the model runs on one worker thread)."""
        self._batcher = MicroBatcher(self._generate, max_batch=self.max_batch_size, max_wait_s=self.batch_wait_s)

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.aclose()
            self._batcher = None

    async def submit(self, seqs: list[_Seq]) -> list[_Seq]:
        """Generate ``seqs`` (returned, filled in, when the last one is done; each is released as it finishes)."""
        assert self._batcher is not None, "engine not started"
        loop = asyncio.get_running_loop()
        for s in seqs:
            # the sequence holds its own future, so the worker thread can release it before its batch ends
            s.loop, s.future = loop, self._batcher.enqueue(s)
        return list(await asyncio.gather(*(s.future for s in seqs if s.future is not None)))

    async def _generate(self, batch: list[_Seq]) -> list[_Seq]:
        try:
            await asyncio.to_thread(self._run_batch, batch)
        except Exception:  # a failing batch fails its requests (the batcher tells each), never the server
            log.exception("generation failed")
            raise
        return batch

    # runs in the worker thread -----------------------------------------------------------------------------
    def _release(self, s: _Seq) -> None:
        def done() -> None:
            if s.future is not None and not s.future.done():
                s.future.set_result(s)

        assert s.loop is not None
        s.loop.call_soon_threadsafe(done)

    def _run_batch(self, seqs: list[_Seq]) -> None:
        torch = self.torch
        with self.lock, torch.inference_mode():
            self.batches += 1
            self.sequences += len(seqs)
            gens = []
            for s in seqs:
                g = torch.Generator()
                g.manual_seed(s.params.seed + s.sample_index if s.params.seed is not None else secrets.randbits(62))
                gens.append(g)
            b = len(seqs)
            # the model runs on its own device; each step's last logits come to the CPU in one copy, where the
            # per-request samplers (seeded CPU generators, logit processors) run
            device = next(self.model.parameters()).device
            ids, mask = left_pad([s.prompt_ids for s in seqs], self.pad_id)
            ids, mask = ids.to(device), mask.to(device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **self._keep)
            past, logits = out.past_key_values, out.logits[:, -1, :].cpu()
            last_pos = pos[:, -1]
            active = [True] * b
            for _ in range(max(s.params.max_tokens for s in seqs)):
                nxt = []
                raw_all = torch.log_softmax(logits.float(), dim=-1)  # one op for the whole batch
                for i, s in enumerate(seqs):
                    if active[i] and s.future is not None and s.future.cancelled():
                        active[i] = False  # the client went away
                    if not active[i]:
                        nxt.append(self.pad_id)
                        continue
                    token = self._sample(logits[i], raw_all[i], s, gens[i])
                    nxt.append(token)
                    if self._finished(s, token):
                        active[i] = False
                        self._release(s)
                if not any(active):
                    break
                mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long, device=device)], dim=1)
                last_pos = last_pos + 1
                out = self.model(
                    input_ids=torch.tensor(nxt, dtype=torch.long, device=device).view(b, 1),
                    attention_mask=mask,
                    position_ids=last_pos.view(b, 1),
                    past_key_values=past,
                    use_cache=True,
                )
                past, logits = out.past_key_values, out.logits[:, -1, :].cpu()

    def _sample(self, logits: Any, raw: Any, s: _Seq, gen: Any) -> int:
        """Sample one token for ``s`` from its ``logits`` row (``raw``: the row's log-softmax)."""
        torch = self.torch
        p = s.params
        if p.temperature <= 1e-5 and not p.allowed_token_ids and not p.adjusts_logits:
            x = raw  # greedy: same argmax, no copy
        else:
            x = logits.float()
        if p.adjusts_logits:
            x = adjust_logits(x, s.prompt_ids, s.out_ids, p)
        if p.allowed_token_ids:
            keep = torch.full_like(x, float("-inf"))
            idx = torch.tensor(p.allowed_token_ids, dtype=torch.long)
            keep[idx] = x[idx]
            x = keep
        if p.temperature <= 1e-5:
            token = int(torch.argmax(x))
        else:
            x = x / p.temperature
            if 0 < p.top_k < x.numel():
                kth = torch.topk(x, p.top_k).values[-1]
                x = x.masked_fill(x < kth, float("-inf"))
            probs = torch.softmax(x, dim=-1)
            if p.top_p < 1.0:
                sp, si = torch.sort(probs, descending=True)
                cum = torch.cumsum(sp, dim=-1)
                drop = (cum - sp) > p.top_p  # keep the smallest prefix whose mass reaches top_p
                sp[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, si, sp)
                if p.logprobs is not None and p.logprobs_mode == "processed_logprobs":
                    x = x.masked_fill(torch.zeros_like(drop).scatter_(0, si, drop), float("-inf"))
            # inverse-CDF sampling: one uniform draw per token (cheaper than torch.multinomial on a large vocab)
            cdf = torch.cumsum(probs, dim=-1)
            u = torch.rand(1, generator=gen, dtype=cdf.dtype) * cdf[-1]
            token = min(int(torch.searchsorted(cdf, u, right=True)), cdf.numel() - 1)
            while probs[token] <= 0 and token > 0:  # guard float round-off at the top of the CDF
                token -= 1
        s.out_ids.append(token)
        if p.logprobs is not None:
            # raw: the model's log-softmax; processed: the distribution ``token`` was drawn from (x: the logits
            # after bias / penalties / allowed ids, and when sampling temperature, top-k and top-p)
            lp = raw if p.logprobs_mode == "raw_logprobs" or x is raw else torch.log_softmax(x, dim=-1)
            s.logprobs.append(max(float(lp[token]), NEG_INF_LOGPROB))
            if p.logprobs > 0:
                v, i = torch.topk(lp, p.logprobs)
                s.top.append([(t, max(val, NEG_INF_LOGPROB)) for t, val in zip(i.tolist(), v.tolist(), strict=True)])
            else:
                s.top.append([])
        return token

    def _finished(self, s: _Seq, token: int) -> bool:
        p = s.params
        if token in p.stop_token_ids:
            s.finish_reason, s.stop_reason = "stop", token
            return True
        if not p.ignore_eos and token in self.eos_ids:
            s.finish_reason = "stop"
            return True
        if p.stop:
            text = self.tok.decode(s.out_ids, skip_special_tokens=p.skip_special_tokens)
            hits = [(text.find(st), st) for st in p.stop if st and st in text]
            if hits:
                at, st = min(hits)
                s.text = text[: at + len(st)] if p.include_stop_str_in_output else text[:at]
                s.finish_reason, s.stop_reason = "stop", st
                return True
        if len(s.out_ids) >= p.max_tokens:
            s.finish_reason = "length"
            return True
        return False

