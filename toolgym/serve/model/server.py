"""The HTTP layer of ``toolgym serve model``: the aiohttp application, request parsing and OpenAI-shaped
responses around a :class:`~toolgym.serve.model.engine._Engine` (see :mod:`toolgym.serve.model` for the API)."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from aiohttp import web

from toolgym.format.textonly import ControlTokens, outside_spans
from toolgym.rollout.types import DEFAULT_LOGPROBS_MODE, LOGPROBS_MODES, LogprobsMode, check_logprobs_mode
from toolgym.serve.model.engine import SamplingParams, _Engine, _Seq
from toolgym.serve.model.protocol import (
    MAX_LOGPROBS,
    MAX_N,
    BadRequest,
    _error,
    _usage,
    _want,
    check_unsupported,
    parse_logit_bias,
    tool_calls_from_text,
)

__all__ = ["ModelServer"]

log = logging.getLogger("toolgym.serve.model")


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
        logprobs_mode: what reported logprobs mean unless a request sets the ``logprobs_mode`` field
            (``"processed_logprobs"``, the default of every toolgym backend, or ``"raw_logprobs"``; vLLM's
            ``--logprobs-mode``; see :mod:`toolgym.rollout.types`).
        max_body_bytes: the largest request body; a larger ``Content-Length`` gets a 413 before the body is read.

    A prompt (or a chat request's text) with more characters than ``max_prompt_chars`` (twice the longest vocabulary
    entry times ``max_model_len``: it cannot fit the context whatever it says) gets a 400 at once, before any
    tokenising; shorter ones are tokenised on worker threads, off the event loop.
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
        logprobs_mode: LogprobsMode = DEFAULT_LOGPROBS_MODE,
        max_body_bytes: int = 64 * 1024**2,
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
        self.max_body_bytes = max_body_bytes
        # no text longer than this can fit the context whatever it says (each token covers at most the longest
        # vocabulary entry's characters; x2 for normalisation): longer prompts get a 400 before any tokenising
        longest = _longest_token_chars(tokenizer)
        self.max_prompt_chars = None if longest is None else 2 * longest * max_model_len
        self.default_max_tokens = default_max_tokens
        self.logprobs_mode: LogprobsMode = check_logprobs_mode(logprobs_mode)
        self.created = int(time.time())
        # tokenising and chat-template rendering run here, off the event loop (a multi-megabyte prompt takes
        # seconds): /health and the other requests keep being served meanwhile
        self._prep = ThreadPoolExecutor(max_workers=2, thread_name_prefix="toolgym-serve-tokenize")
        self._runner: web.AppRunner | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------------------------------- lifecycle
    def app(self) -> web.Application:
        """The aiohttp application (starts the batching worker on startup)."""
        app = web.Application(middlewares=[self._errors], client_max_size=self.max_body_bytes)
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
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
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
        size = request.content_length
        if size is not None and size > self.max_body_bytes:  # refused before a byte of it is read
            raise BadRequest(f"the body has {size} bytes; this server accepts at most {self.max_body_bytes}",
                             status=413)
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
        if seed is not None and not -(2**63) <= seed < 2**63:
            raise BadRequest("`seed` must be a 64-bit signed integer", "seed")
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
        mode = _want(body, "logprobs_mode", str, self.logprobs_mode)
        if mode not in LOGPROBS_MODES:
            raise BadRequest(f"`logprobs_mode` must be one of {', '.join(LOGPROBS_MODES)}", "logprobs_mode")
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
            logprobs_mode=mode,
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

    def _check_chars(self, value: Any, param: str) -> None:
        """400 when the text in ``value`` (a prompt, a list of prompts, chat messages) is longer than any prompt that
        fits the context can be (``max_prompt_chars``), counted without tokenising."""
        limit = self.max_prompt_chars
        if limit is None:
            return
        n = _text_chars(value) if not isinstance(value, str) else len(value)
        if n > limit:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the {param} has {n} characters, "
                f"more than {limit} (the most that {self.max_model_len} tokens of this tokenizer can hold).", param,
            )

    def _check_len(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)} tokens and max_tokens is {params.max_tokens}.",
                "max_tokens",
            )

    def _token_str(self, tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids else self.tok.decode([tid])

    def _text(self, s: _Seq, *, skip_special_tokens: bool | None = None) -> str:
        """The sampled text (the cut one when a stop string ended it), without the final stop / eos token (it is
        in ``token_ids``, not in the text); ``skip_special_tokens``: the request's setting unless given."""
        if s.text is not None:
            return s.text
        ids = s.out_ids
        if s.finish_reason == "stop" and ids and (ids[-1] in s.params.stop_token_ids or ids[-1] in self.engine.eos_ids):
            ids = ids[:-1]
        skip = s.params.skip_special_tokens if skip_special_tokens is None else skip_special_tokens
        return self.tok.decode(ids, skip_special_tokens=skip)

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
        self._check_chars(body.get("prompt"), "prompt")
        prompts = await self._off_loop(self._prompts, body.get("prompt"))
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
        return self._envelope("cmpl", "text_completion", choices, _usage(prompts, done))

    def _envelope(self, prefix: str, kind: str, choices: list[dict[str, Any]], usage: dict[str, Any],
                  **extra: Any) -> web.Response:
        """The OpenAI response object (``id`` = ``PREFIX-<hex>``, ``object`` = ``kind``) around ``choices``."""
        return web.json_response({"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                                  "model": self.served_model_name, "choices": choices, "usage": usage, **extra})

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

    async def _off_loop(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the tokenising threads (a disconnected client's request still finishes its call there,
        then is dropped before generation)."""
        return await asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    def _chat_prompt(self, clean: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any],
                     gen_prompt: bool) -> list[int]:
        """The prompt token ids of a chat request (runs off the loop)."""

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
        return control.encode(text, outside_spans(render, clean, tools or [], text, control))

    async def chat_completions(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list", "messages")
        self._check_chars(messages, "messages")
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

        prompt_ids = await self._off_loop(self._chat_prompt, clean, tools, kwargs, gen_prompt)
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
            parsed = tool_calls_from_text(self._text(s, skip_special_tokens=False), self.tool_parser) if parse_calls else None
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
        return self._envelope("chatcmpl", "chat.completion", choices, _usage([prompt_ids], done),
                              prompt_token_ids=prompt_ids)


def _longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters one token of ``tokenizer`` stands for (its longest vocabulary entry); ``None`` when the
    tokenizer has no vocabulary to read."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - no bound, then: every prompt is tokenised
        return None
    return max((len(k) for k in vocab if isinstance(k, str)), default=None) or None


def _text_chars(value: Any) -> int:
    """Characters of every string inside ``value`` (nested lists and objects; keys excluded), without recursion."""
    n, todo = 0, [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
    return n
