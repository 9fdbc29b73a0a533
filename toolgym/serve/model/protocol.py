"""Request validation and response shapes of ``toolgym serve model``'s OpenAI-compatible API (no model here)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

__all__ = ["MAX_LOGPROBS", "MAX_N", "UNSUPPORTED_FIELDS", "BadRequest", "check_unsupported", "parse_logit_bias",
           "tool_calls_from_text"]

MAX_LOGPROBS = 20
MAX_N = 64


class BadRequest(Exception):
    """A client error; becomes an HTTP 400 (or ``status``) JSON error response."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind



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



def _usage(prompts: Sequence[list[int]], seqs: Sequence[Any]) -> dict[str, int]:
    p = sum(len(x) for x in prompts)
    c = sum(len(s.out_ids) for s in seqs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error"},
        status=status,
    )

