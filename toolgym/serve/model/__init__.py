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
What a logprob means is vLLM's ``logprobs_mode``: ``"processed_logprobs"`` by default (the distribution the token
was sampled from: logit bias, penalties, allowed ids, temperature, top-k, top-p applied; the same default as every
toolgym backend, and what TRL's importance-sampling correction expects: see :mod:`toolgym.rollout.types`) or
``"raw_logprobs"`` (the model's own log-softmax), set per server (``--logprobs-mode``) or per request (the
``logprobs_mode`` field, a toolgym extension). A token outside the processed distribution reads ``-9999.0``. ``finish_reason`` is ``"stop"`` or ``"length"``; ``stop_reason`` is the stop
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
import logging
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from toolgym.placement import DEVICE_CHOICES_HELP, DeviceError, resolve_device
from toolgym.rollout.types import DEFAULT_LOGPROBS_MODE, LOGPROBS_MODES, check_logprobs_mode
from toolgym.serve.model.engine import SamplingParams, adjust_logits
from toolgym.serve.model.protocol import (
    MAX_LOGPROBS,
    MAX_N,
    UNSUPPORTED_FIELDS,
    BadRequest,
    check_unsupported,
    parse_logit_bias,
    tool_calls_from_text,
)
from toolgym.serve.model.server import ModelServer

__all__ = [
    "MAX_LOGPROBS",
    "MAX_N",
    "UNSUPPORTED_FIELDS",
    "BadRequest",
    "ModelServer",
    "SamplingParams",
    "adjust_logits",
    "build_app",
    "build_parser",
    "check_unsupported",
    "load",
    "main",
    "parse_logit_bias",
    "run",
    "tool_calls_from_text",
]


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
    logprobs_mode: str = DEFAULT_LOGPROBS_MODE,
    token: str | None = None,
    device: str | None = "auto",
) -> None:
    """Load ``model`` (see :func:`load`), place it on ``device`` (:func:`toolgym.placement.place`: ``auto``,
    ``cpu``, ``cuda[:N]``) and serve it until interrupted (blocking). A non-loopback ``host`` needs ``token``, which
    every request then carries as ``Authorization: Bearer`` (:mod:`toolgym.serve.access`)."""
    import torch

    from toolgym.placement import place
    from toolgym.serve import access

    access.check_bind(host, token, what="serve model", env=access.SERVE_TOKEN_ENV)

    if threads:
        torch.set_num_threads(threads)
    m, tok, name = load(model)
    m, placement = place(m, device)
    print(f"toolgym serve model: {placement}", flush=True)
    server = ModelServer(
        m,
        tok,
        served_model_name=served_model_name or name,
        max_batch_size=max_batch_size,
        default_max_tokens=default_max_tokens,
        tool_call_parser=tool_call_parser,
        logprobs_mode=check_logprobs_mode(logprobs_mode),
    )
    print(f"toolgym serve model: {server.served_model_name} on http://{host}:{port}/v1", flush=True)
    # handler_cancellation: a client that disconnects cancels its request, and with it its generation
    app = server.app()
    app.middlewares.insert(0, access.aiohttp_guard(token))
    web.run_app(app, host=host, port=port, access_log=None, print=None, handler_cancellation=True)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``toolgym serve model`` arguments (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="toolgym serve model", description="OpenAI-compatible server over a local transformers model."
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; any other needs a "
                   "token)")
    p.add_argument("--port", type=int, default=8000)
    from toolgym.serve.access import SERVE_TOKEN_ENV, add_token_argument

    add_token_argument(p, SERVE_TOKEN_ENV)
    p.add_argument(
        "--model", default=None, help="path, .gguf or cached hub id; 'tiny' = tiny random; default: embedded"
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--default-max-tokens", type=int, default=256, help="chat max_tokens when a request sets none")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--device", default="auto", help=DEVICE_CHOICES_HELP)
    from toolgym.format.parsers import list_parsers

    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=list_parsers(),
        help="parse the model's tool calls into message.tool_calls for chat requests with `tools` (as vLLM's "
        "flag); without it such requests get a 400",
    )
    p.add_argument(
        "--logprobs-mode",
        default=DEFAULT_LOGPROBS_MODE,
        choices=LOGPROBS_MODES,
        help="what reported logprobs mean (vLLM's flag): after temperature / top-k / top-p (processed, the default: "
        "what TRL's importance ratio compares against) or the model's raw log-softmax",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``toolgym serve model`` (``python -m toolgym.serve.model``)."""
    from toolgym.serve.access import SERVE_TOKEN_ENV, check_bind, read_token

    args = build_parser().parse_args(argv)
    token = read_token(args.token_file, SERVE_TOKEN_ENV)
    check_bind(args.host, token, what="serve model", env=SERVE_TOKEN_ENV)  # CLIError (exit 2) before loading
    try:
        resolve_device(args.device)  # before the model loads: a GPU this machine does not have is a usage error
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
        logprobs_mode=args.logprobs_mode,
        token=token,
        device=args.device,
    )
    return 0


def build_app(model: Any, tokenizer: Any, **kwargs: Any) -> web.Application:
    """An aiohttp application serving ``model`` (kwargs: see :class:`ModelServer`)."""
    return ModelServer(model, tokenizer, **kwargs).app()

