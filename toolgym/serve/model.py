"""``toolgym serve model``: an OpenAI-compatible HTTP server over a local transformers causal LM.

A real judge / policy endpoint on a CPU for tests and small runs; on GPUs use ``vllm serve`` instead (the
request and response fields used here are vLLM's, so one client works against both).

Endpoints:

* ``POST /v1/chat/completions`` — ``messages`` (``tools`` and ``chat_template_kwargs`` go to the chat template),
  ``logprobs`` (bool) + ``top_logprobs`` (0-20).
* ``POST /v1/completions`` — ``prompt`` as a string, a list of token ids, or a list of either (several prompts);
  ``logprobs`` (int 0-20: that many top alternatives per token).
* ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``.

Sampling fields (both endpoints): ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``seed``,
``stop`` (strings), ``stop_token_ids``, ``ignore_eos``, ``n``, ``skip_special_tokens``,
``include_stop_str_in_output``, ``logit_bias``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty`` (vLLM's definitions; they apply to greedy decoding too), ``allowed_token_ids`` (vLLM
extension: sample only among these ids), ``return_tokens_as_token_ids`` (logprob tokens written
``"token_id:<id>"``, as vLLM does). A field that would change the output but is not implemented
(``bad_words``, ``response_format`` other than text, ``prompt_logprobs``, ``min_p``, ``min_tokens``, guided
decoding, ...: :data:`UNSUPPORTED_FIELDS`) gets a 400 naming it; no sampling field is ignored silently.

Tool calls (chat): with ``tool_call_parser`` (``--tool-call-parser NAME``, a :mod:`toolgym.format.parsers`
name such as ``hermes``), a request with ``tools`` gets the model's calls parsed into ``message.tool_calls``
(``finish_reason: "tool_calls"``; a malformed call leaves the text as plain content, as in vLLM). Without a
parser, ``tools`` with ``tool_choice`` ``"auto"`` (the default) is refused with a 400, as vLLM does without
``--enable-auto-tool-choice``; ``tool_choice: "none"`` renders the tools and parses nothing; a forced or
``"required"`` choice is a 400 (no guided decoding).

Responses mirror vLLM's: every choice carries ``token_ids`` (the sampled ids, a final stop / end-of-sequence
token included) and, for completions, ``prompt_token_ids``; chat responses carry ``prompt_token_ids`` at the
top level. (vLLM returns these only when the request sets ``return_token_ids: true``; send it and the same client
works against both.) Completion logprobs: ``choices[i].logprobs = {tokens, token_logprobs, top_logprobs,
text_offset}``; chat logprobs: ``choices[i].logprobs.content[j] = {token, logprob, bytes, top_logprobs}``.
Logprobs are the model's **raw** log-softmax (before temperature / top-p / allowed ids), like vLLM's default
``logprobs_mode="raw_logprobs"``. ``finish_reason`` is ``"stop"`` or ``"length"``; ``stop_reason`` is the stop
string or stop token id that ended the choice (``None`` for end-of-sequence / length).

Scheduling: one model, one generation thread. Requests queue up and are run in small dynamic batches (up to
``max_batch_size`` sequences, left-padded, one KV cache); each sequence's response is released as soon as it
finishes. Seeded requests are reproducible for the same batch composition (a different batch can change
padding and hence float rounding). Not supported: streaming, ``echo``, beam search (400 errors say so).

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` with 400 for bad requests, 404 for an
unknown model / path, 405 for a wrong method, 500 for a failure inside the server.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import math
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from toolgym.format.textonly import ControlTokens, outside_spans

__all__ = ["BadRequest", "ModelServer", "SamplingParams", "build_app", "load", "main", "run"]

log = logging.getLogger("toolgym.serve.model")

MAX_LOGPROBS = 20
MAX_N = 64


class BadRequest(Exception):
    """A client error; becomes an HTTP 400 (or ``status``) JSON error response."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


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
        self._queue: asyncio.Queue[_Seq] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.lock = threading.Lock()  # one forward pass at a time, whatever calls it
        self.batches = 0
        self.sequences = 0

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None

    async def submit(self, seqs: list[_Seq]) -> list[_Seq]:
        assert self._queue is not None, "engine not started"
        loop = asyncio.get_running_loop()
        for s in seqs:
            s.loop, s.future = loop, loop.create_future()
            self._queue.put_nowait(s)
        return list(await asyncio.gather(*(s.future for s in seqs if s.future is not None)))

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            if self.batch_wait_s:
                await asyncio.sleep(self.batch_wait_s)  # let concurrent requests join this batch
            while len(batch) < self.max_batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [s for s in batch if s.future is not None and not s.future.done()]  # drop cancelled
            if not batch:
                continue
            try:
                await asyncio.to_thread(self._run_batch, batch)
            except Exception as e:  # a failing batch fails its requests, never the server
                log.exception("generation failed")
                for s in batch:
                    if s.future is not None and not s.future.done():
                        s.future.set_exception(e)

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
            width = max(len(s.prompt_ids) for s in seqs)
            ids = torch.full((b, width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((b, width), dtype=torch.long)
            for i, s in enumerate(seqs):  # left padding
                ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids, dtype=torch.long)
                mask[i, width - len(s.prompt_ids) :] = 1
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **self._keep)
            past, logits = out.past_key_values, out.logits[:, -1, :]
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
                mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
                last_pos = last_pos + 1
                out = self.model(
                    input_ids=torch.tensor(nxt, dtype=torch.long).view(b, 1),
                    attention_mask=mask,
                    position_ids=last_pos.view(b, 1),
                    past_key_values=past,
                    use_cache=True,
                )
                past, logits = out.past_key_values, out.logits[:, -1, :]

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
                sp[(cum - sp) > p.top_p] = 0.0  # keep the smallest prefix whose mass reaches top_p
                probs = torch.zeros_like(probs).scatter_(0, si, sp)
            # inverse-CDF sampling: one uniform draw per token (cheaper than torch.multinomial on a large vocab)
            cdf = torch.cumsum(probs, dim=-1)
            u = torch.rand(1, generator=gen, dtype=cdf.dtype) * cdf[-1]
            token = min(int(torch.searchsorted(cdf, u, right=True)), cdf.numel() - 1)
            while probs[token] <= 0 and token > 0:  # guard float round-off at the top of the CDF
                token -= 1
        s.out_ids.append(token)
        if p.logprobs is not None:
            s.logprobs.append(float(raw[token]))
            if p.logprobs > 0:
                v, i = torch.topk(raw, p.logprobs)
                s.top.append(list(zip(i.tolist(), v.tolist(), strict=True)))
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


# ----------------------------------------------------------------------------------------------------- server
def _want(body: dict[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"`{key}` must be {_type_name(types)}, got a boolean", key)
    if not isinstance(value, types):
        raise BadRequest(f"`{key}` must be {_type_name(types)}, got {type(value).__name__}", key)
    return value


def _type_name(types: type | tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in ts))


#: Request fields that would change the output but are not implemented: a request that sets one to anything but
#: its neutral value gets a 400 naming it (never silently ignored). ``field -> (is neutral?, what to say)``.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, str]] = {
    "bad_words": (lambda v: v == [], "is not supported"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text",
                        "is not supported (only {\"type\": \"text\"}): no structured output / guided decoding"),
    "prompt_logprobs": (lambda v: False, "is not supported"),
    "min_p": (lambda v: v == 0, "is not supported"),
    "min_tokens": (lambda v: v == 0, "is not supported"),
    "length_penalty": (lambda v: v == 1, "applies to beam search, which is not supported"),
    "guided_json": (lambda v: False, "is not supported: no guided decoding"),
    "guided_regex": (lambda v: False, "is not supported: no guided decoding"),
    "guided_choice": (lambda v: False, "is not supported: no guided decoding"),
    "guided_grammar": (lambda v: False, "is not supported: no guided decoding"),
    "structured_outputs": (lambda v: False, "is not supported: no guided decoding"),
    "logits_processors": (lambda v: v == [], "is not supported"),
    "truncate_prompt_tokens": (lambda v: False, "is not supported"),
    "parallel_tool_calls": (lambda v: v is True, "= false is not supported: the model's calls are returned as written"),
}


def check_unsupported(body: dict[str, Any]) -> None:
    """Raise :class:`BadRequest` naming the first field of ``body`` that is set to a value this server cannot
    honour (see :data:`UNSUPPORTED_FIELDS`; ``null`` always passes)."""
    for key, (neutral, why) in UNSUPPORTED_FIELDS.items():
        value = body.get(key)
        if value is not None and not neutral(value):
            raise BadRequest(f"`{key}` {why} by toolgym serve model", key)


def parse_logit_bias(value: Any, vocab_size: int) -> dict[int, float]:
    """OpenAI's ``logit_bias`` (``{"token id": bias}``, bias in [-100, 100]) as ``{int id: float}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("`logit_bias` must be an object mapping token ids to biases", "logit_bias")
    out: dict[int, float] = {}
    for k, v in value.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise BadRequest(f"`logit_bias` keys must be token ids, got {k!r}", "logit_bias") from None
        if not 0 <= tid < vocab_size:
            raise BadRequest(f"`logit_bias` token id {tid} is outside [0, {vocab_size})", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not -100 <= v <= 100:
            raise BadRequest(f"`logit_bias` values must be numbers in [-100, 100], got {v!r}", "logit_bias")
        out[tid] = float(v)
    return out


def tool_calls_from_text(text: str, parser: Any) -> tuple[str | None, list[dict[str, Any]]] | None:
    """Parse the model's tool calls in ``text`` with a :class:`~toolgym.format.parsers.ToolCallParser`.

    Returns ``(content or None, [OpenAI tool_call dicts])`` when the text holds at least one call and every call
    is well-formed; ``None`` otherwise (no call, or a malformed one: the text is then returned as plain content,
    as vLLM's parsers do). Arguments are JSON strings, as in the OpenAI API.
    """
    import json

    parsed = parser.parse(text)
    if not parsed.calls or parsed.n_malformed:
        return None
    calls = [
        {
            "id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in parsed.calls
    ]
    return parsed.content or None, calls


class ModelServer:
    """An OpenAI-compatible server over ``model`` + ``tokenizer`` (see the module docstring).

    Args:
        model: a transformers causal LM (eval mode; CPU or GPU).
        tokenizer: its tokenizer (with a chat template for ``/v1/chat/completions``).
        served_model_name: the ``id`` in ``/v1/models``; requests naming another model get a 404.
        max_batch_size: the most sequences generated together.
        max_model_len: prompt + generated tokens limit (default: the tokenizer's / model's context length).
        default_max_tokens: ``max_tokens`` of a chat request that sets none (completions default to 16, as
            in the OpenAI API).
        tool_call_parser: a :mod:`toolgym.format.parsers` name (``hermes``, ``llama3``, ...) or parser: chat
            requests with ``tools`` get the model's calls parsed into ``message.tool_calls``. ``None``: a chat
            request with ``tools`` (and ``tool_choice`` other than ``"none"``) gets a 400, as in vLLM.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        served_model_name: str = "model",
        max_batch_size: int = 8,
        max_model_len: int | None = None,
        default_max_tokens: int = 256,
        batch_wait_s: float = 0.003,
        tool_call_parser: Any = None,
    ) -> None:
        from toolgym.format.parsers import get_parser

        self.tool_parser = None if tool_call_parser is None else get_parser(tool_call_parser)
        self.engine = _Engine(model, tokenizer, max_batch_size=max_batch_size, batch_wait_s=batch_wait_s)
        self.tok = tokenizer
        self.served_model_name = served_model_name
        if max_model_len is None:
            limits = [
                getattr(model.config, "max_position_embeddings", None),
                getattr(tokenizer, "model_max_length", None),
            ]
            limits = [int(x) for x in limits if isinstance(x, int) and 0 < x < 10**7]
            max_model_len = min(limits) if limits else 4096
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.created = int(time.time())
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------------------------------- lifecycle
    def app(self) -> web.Application:
        """The aiohttp application (starts the batching worker on startup)."""
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024**2)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model_id:.+}", self.model_info)
        app.router.add_get("/health", self.health)

        async def on_startup(_: web.Application) -> None:
            self.engine.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.engine.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in the running event loop; returns the base URL (``port=0`` picks a free port)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve from a daemon thread with its own event loop (tests, notebooks, benchmarks); returns the base
        URL. Stop with :meth:`stop_thread`."""
        ready: Future[str] = Future()

        def target() -> None:
            loop = asyncio.new_event_loop()
            self._thread_loop = loop
            asyncio.set_event_loop(loop)
            try:
                ready.set_result(loop.run_until_complete(self.start(host, port)))
            except BaseException as e:
                ready.set_exception(e)
                return
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=target, name="toolgym-serve-model", daemon=True)
        self._thread.start()
        return ready.result(timeout=60)

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread`."""
        loop, thread = getattr(self, "_thread_loop", None), getattr(self, "_thread", None)
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as e:
            return _error(e.status, e.message, e.kind, e.param)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            kind = {404: "NotFoundError", 405: "MethodNotAllowed", 413: "RequestTooLarge"}.get(e.status, "HTTPError")
            return _error(e.status, f"{e.reason}: {request.method} {request.path}", kind)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("internal error")
            return _error(500, f"internal error: {e!r}", "InternalServerError")

    # ------------------------------------------------------------------------------------------- handlers
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "toolgym",
            "max_model_len": self.max_model_len,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model_info(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (the OpenAI SDK's ``client.models.retrieve``)."""
        model_id = request.match_info["model_id"]
        if model_id != self.served_model_name:
            raise BadRequest(f"The model `{model_id}` does not exist.", "model", status=404, kind="NotFoundError")
        return web.json_response(self._model_card())

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except Exception as e:
            raise BadRequest(f"the body is not valid JSON: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.served_model_name:
            raise BadRequest(f"The model `{model}` does not exist.", "model", status=404, kind="NotFoundError")
        if body.get("stream"):
            raise BadRequest("streaming is not supported by toolgym serve model", "stream")
        if body.get("use_beam_search"):
            raise BadRequest("beam search is not supported", "use_beam_search")
        check_unsupported(body)
        return body

    def _params(self, body: dict[str, Any], *, max_tokens_default: int, logprobs: int | None) -> SamplingParams:
        max_tokens = _want(body, "max_tokens", int, None)
        if max_tokens is None:
            max_tokens = _want(body, "max_completion_tokens", int, max_tokens_default)
        if max_tokens < 1:
            raise BadRequest("`max_tokens` must be at least 1", "max_tokens")
        temperature = float(_want(body, "temperature", (int, float), 1.0))
        if not math.isfinite(temperature) or temperature < 0:
            raise BadRequest("`temperature` must be >= 0", "temperature")
        top_p = float(_want(body, "top_p", (int, float), 1.0))
        if not 0 < top_p <= 1:
            raise BadRequest("`top_p` must be in (0, 1]", "top_p")
        seed = _want(body, "seed", int, None)
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            raise BadRequest("`stop` must be a string or a list of strings", "stop")
        stop_ids = self._ids(_want(body, "stop_token_ids", list, []), "stop_token_ids")
        allowed = body.get("allowed_token_ids")
        if allowed is not None:
            allowed = self._ids(_want(body, "allowed_token_ids", list, []), "allowed_token_ids")
            if not allowed:
                raise BadRequest("`allowed_token_ids` must not be empty", "allowed_token_ids")
        top_k = _want(body, "top_k", int, 0)
        if top_k < -1:
            raise BadRequest("`top_k` must be -1 or 0 (no limit) or a positive integer", "top_k")
        penalties = {}
        for key, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
            v = float(_want(body, key, (int, float), 0.0))
            if not lo <= v <= hi:
                raise BadRequest(f"`{key}` must be in [{lo}, {hi}]", key)
            penalties[key] = v
        rep = float(_want(body, "repetition_penalty", (int, float), 1.0))
        if not (math.isfinite(rep) and rep > 0):
            raise BadRequest("`repetition_penalty` must be > 0", "repetition_penalty")
        return SamplingParams(
            top_k=max(top_k, 0),
            logit_bias=parse_logit_bias(body.get("logit_bias"), self.engine.vocab_size),
            repetition_penalty=rep,
            **penalties,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=list(stop),
            stop_token_ids=stop_ids,
            ignore_eos=bool(_want(body, "ignore_eos", bool, False)),
            logprobs=logprobs,
            skip_special_tokens=bool(_want(body, "skip_special_tokens", bool, True)),
            include_stop_str_in_output=bool(_want(body, "include_stop_str_in_output", bool, False)),
            allowed_token_ids=allowed,
        )

    def _ids(self, ids: Any, param: str) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest(f"`{param}` must be a list of token ids (integers)", param)
        bad = [t for t in ids if not 0 <= t < self.engine.vocab_size]
        if bad:
            raise BadRequest(f"`{param}` has token ids outside [0, {self.engine.vocab_size}): {bad[:5]}", param)
        return list(ids)

    def _n(self, body: dict[str, Any], prompts: int) -> int:
        n = _want(body, "n", int, 1)
        if n < 1:
            raise BadRequest("`n` must be at least 1", "n")
        if n * prompts > MAX_N:
            raise BadRequest(f"n x prompts must be at most {MAX_N}, got {n * prompts}", "n")
        best_of = body.get("best_of")
        if best_of is not None and best_of != n:
            raise BadRequest("`best_of` other than `n` is not supported", "best_of")
        return n

    def _check_len(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)} tokens and max_tokens is {params.max_tokens}.",
                "max_tokens",
            )

    def _token_str(self, tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids else self.tok.decode([tid])

    def _text(self, s: _Seq) -> str:
        if s.text is not None:
            return s.text
        ids = s.out_ids
        if s.finish_reason == "stop" and ids and (ids[-1] in s.params.stop_token_ids or ids[-1] in self.engine.eos_ids):
            ids = ids[:-1]  # the stop token is in token_ids, not in the text
        return self.tok.decode(ids, skip_special_tokens=s.params.skip_special_tokens)

    def _raw_text(self, s: _Seq) -> str:
        """The sampled text with special tokens kept (what a tool-call parser reads), final stop token cut."""
        ids = s.out_ids
        if s.finish_reason == "stop" and ids and (ids[-1] in s.params.stop_token_ids or ids[-1] in self.engine.eos_ids):
            ids = ids[:-1]
        return s.text if s.text is not None else self.tok.decode(ids, skip_special_tokens=False)

    def _tool_mode(self, body: dict[str, Any], tools: list[Any] | None) -> bool:
        """Whether to parse tool calls out of this chat request's output (``tools`` + ``tool_choice``)."""
        choice = body.get("tool_choice")
        if not tools:
            if choice not in (None, "none", "auto"):
                raise BadRequest("`tool_choice` needs `tools`", "tool_choice")
            return False
        if choice == "none":
            return False
        if choice not in (None, "auto"):
            raise BadRequest(
                '`tool_choice` other than "auto" / "none" (a forced or "required" call) needs guided decoding, '
                "which toolgym serve model does not support",
                "tool_choice",
            )
        if self.tool_parser is None:
            raise BadRequest(
                '"auto" tool choice needs a tool-call parser: start the server with --tool-call-parser NAME '
                "(e.g. hermes); without one, requests with `tools` are refused",
                "tools",
            )
        return True

    async def completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if body.get("echo"):
            raise BadRequest("`echo` is not supported", "echo")
        if "suffix" in body and body["suffix"] is not None:
            raise BadRequest("`suffix` is not supported", "suffix")
        prompts = self._prompts(body.get("prompt"))
        logprobs = _want(body, "logprobs", int, None)
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise BadRequest(f"`logprobs` must be in [0, {MAX_LOGPROBS}]", "logprobs")
        params = self._params(body, max_tokens_default=16, logprobs=logprobs)
        n = self._n(body, len(prompts))
        for p in prompts:
            self._check_len(p, params)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        seqs = [_Seq(p, params, j) for p in prompts for j in range(n)]
        done = await self.engine.submit(seqs)
        choices = []
        for index, s in enumerate(done):
            text = self._text(s)
            lp = None
            if params.logprobs is not None:
                tokens = [self._token_str(t, as_ids) for t in s.out_ids]
                offsets, at = [], 0
                for t in s.out_ids:
                    offsets.append(at)
                    at += len(self.tok.decode([t]))
                lp = {
                    "text_offset": offsets,
                    "token_logprobs": s.logprobs,
                    "tokens": tokens,
                    "top_logprobs": [
                        {self._token_str(t, as_ids): v for t, v in [*top, (tok, val)]}
                        for top, tok, val in zip(s.top, s.out_ids, s.logprobs, strict=True)
                    ],
                }
            choices.append(
                {
                    "index": index,
                    "text": text,
                    "logprobs": lp,
                    "finish_reason": s.finish_reason,
                    "stop_reason": s.stop_reason,
                    "token_ids": s.out_ids,
                    "prompt_token_ids": s.prompt_ids,
                }
            )
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.served_model_name,
                "choices": choices,
                "usage": _usage(prompts, done),
            }
        )

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if prompt is None or prompt == "" or prompt == []:
            raise BadRequest("`prompt` is required and must not be empty", "prompt")
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            items = [prompt]
        elif isinstance(prompt, list):
            items = prompt
        else:
            raise BadRequest("`prompt` must be a string, a list of token ids, or a list of those", "prompt")
        out = []
        for p in items:
            if isinstance(p, str):
                if not p:
                    raise BadRequest("a prompt must not be empty", "prompt")
                out.append(list(self.tok(p, add_special_tokens=True)["input_ids"]))
            elif isinstance(p, list) and p:
                out.append(self._ids(p, "prompt"))
            else:
                raise BadRequest("`prompt` must be a string, a list of token ids, or a list of those", "prompt")
        return out

    async def chat_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list", "messages")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string `role`", "messages")
            content = m.get("content")
            if isinstance(content, list):  # OpenAI content parts: keep the text ones
                if not all(isinstance(c, dict) and c.get("type") == "text" for c in content):
                    raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
                content = "".join(str(c.get("text", "")) for c in content)
            if content is not None and not isinstance(content, str):
                raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
            clean.append({**m, "content": content if content is not None else ""})
        want_lp = bool(_want(body, "logprobs", bool, False))
        top = _want(body, "top_logprobs", int, 0)
        if not 0 <= top <= MAX_LOGPROBS:
            raise BadRequest(f"`top_logprobs` must be in [0, {MAX_LOGPROBS}]", "top_logprobs")
        params = self._params(body, max_tokens_default=self.default_max_tokens, logprobs=top if want_lp else None)
        kwargs = dict(_want(body, "chat_template_kwargs", dict, {}))
        tools = _want(body, "tools", list, None)
        parse_calls = self._tool_mode(body, tools)
        gen_prompt = bool(_want(body, "add_generation_prompt", bool, True))

        def render(msgs: list[dict[str, Any]], tls: list[dict[str, Any]] | None) -> str:
            return self.tok.apply_chat_template(
                msgs, tools=tls or None, tokenize=False, add_generation_prompt=gen_prompt, **kwargs
            )

        try:
            text = render(clean, tools)
        except Exception as e:
            raise BadRequest(f"the chat template could not render these messages: {e}", "messages") from e
        # Message contents and tool descriptions are outside text: a control token spelled there is encoded as
        # text, never as the control id (a tool result cannot forge a turn; see docs/families.md).
        control = ControlTokens.of(self.tok, kwargs.get("chat_template") or getattr(self.tok, "chat_template", None))
        prompt_ids = control.encode(text, outside_spans(render, clean, tools or [], text, control))
        self._check_len(prompt_ids, params)
        n = self._n(body, 1)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        done = await self.engine.submit([_Seq(prompt_ids, params, j) for j in range(n)])
        choices = []
        for index, s in enumerate(done):
            lp = None
            if want_lp:
                content = []
                for tid, val, alts in zip(s.out_ids, s.logprobs, s.top, strict=True):
                    tok = self._token_str(tid, as_ids)
                    content.append(
                        {
                            "token": tok,
                            "logprob": val,
                            "bytes": list(tok.encode()),
                            "top_logprobs": [
                                {"token": (a := self._token_str(t, as_ids)), "logprob": v, "bytes": list(a.encode())}
                                for t, v in alts
                            ],
                        }
                    )
                lp = {"content": content}
            message: dict[str, Any] = {"role": "assistant", "content": self._text(s), "tool_calls": []}
            finish = s.finish_reason
            parsed = tool_calls_from_text(self._raw_text(s), self.tool_parser) if parse_calls else None
            if parsed is not None:
                message["content"], message["tool_calls"] = parsed
                finish = "tool_calls"
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": lp,
                    "finish_reason": finish,
                    "stop_reason": s.stop_reason,
                    "token_ids": s.out_ids,
                }
            )
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.served_model_name,
                "choices": choices,
                "usage": _usage([prompt_ids], done),
                "prompt_token_ids": prompt_ids,
            }
        )


def _usage(prompts: Sequence[list[int]], seqs: Sequence[_Seq]) -> dict[str, int]:
    p = sum(len(x) for x in prompts)
    c = sum(len(s.out_ids) for s in seqs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error"},
        status=status,
    )


# ----------------------------------------------------------------------------------------------------- entry
def load(model: str | None = None) -> tuple[Any, Any, str]:
    """``(model, tokenizer, served name)``: ``None`` = the embedded SmolLM2-135M-Instruct, ``"tiny"`` = a tiny
    random model over the embedded tokenizer (tests), else a path / ``.gguf`` / cached hub id."""
    from toolgym import models

    if model is None or model in ("embedded", "smollm2"):
        m, tok = models.load_model(None)
        return m, tok, models.EMBEDDED_MODEL_ID
    if model in ("tiny", "tiny-random"):
        tok = models.load_tokenizer(None)
        return models.tiny_random_model(tok), tok, "tiny-random"
    m, tok = models.load_model(model)
    return m, tok, str(model)


def run(
    host: str = "127.0.0.1",
    port: int = 8000,
    model: str | None = None,
    *,
    served_model_name: str | None = None,
    max_batch_size: int = 8,
    default_max_tokens: int = 256,
    threads: int | None = None,
    tool_call_parser: str | None = None,
) -> None:
    """Load ``model`` (see :func:`load`) and serve it until interrupted (blocking)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    m, tok, name = load(model)
    server = ModelServer(
        m,
        tok,
        served_model_name=served_model_name or name,
        max_batch_size=max_batch_size,
        default_max_tokens=default_max_tokens,
        tool_call_parser=tool_call_parser,
    )
    print(f"toolgym serve model: {server.served_model_name} on http://{host}:{port}/v1", flush=True)
    web.run_app(server.app(), host=host, port=port, access_log=None, print=None)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``toolgym serve model`` arguments (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="toolgym serve model", description="OpenAI-compatible server over a local transformers model."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model", default=None, help="path, .gguf or cached hub id; 'tiny' = tiny random; default: embedded"
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--default-max-tokens", type=int, default=256, help="chat max_tokens when a request sets none")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    from toolgym.format.parsers import list_parsers

    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=list_parsers(),
        help="parse the model's tool calls into message.tool_calls for chat requests with `tools` (as vLLM's "
        "flag); without it such requests get a 400",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``toolgym serve model`` (``python -m toolgym.serve.model``)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    run(
        args.host,
        args.port,
        args.model,
        served_model_name=args.served_model_name,
        max_batch_size=args.max_batch_size,
        default_max_tokens=args.default_max_tokens,
        threads=args.threads,
        tool_call_parser=args.tool_call_parser,
    )
    return 0


def build_app(model: Any, tokenizer: Any, **kwargs: Any) -> web.Application:
    """An aiohttp application serving ``model`` (kwargs: see :class:`ModelServer`)."""
    return ModelServer(model, tokenizer, **kwargs).app()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
