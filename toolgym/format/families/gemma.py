"""Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``."""

from __future__ import annotations

import json
import re
from typing import Any

from toolgym.format.families.common import (
    json_object,
    tag_blocks,
)
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Gemma4Parser"]


# -- Gemma 4 ----------------------------------------------------------------------------------------
_GQ = '<|"|>'
_BARE_KEY = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*:")


def _gemma_value_to_json(s: str) -> str:
    """Gemma 4's argument syntax (``<|"|>``-quoted strings, bare keys) as JSON text."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s.startswith(_GQ, i):
            j = s.find(_GQ, i + len(_GQ))
            if j == -1:
                raise ValueError('unterminated <|"|> string')
            out.append(json.dumps(s[i + len(_GQ) : j], ensure_ascii=False))
            i = j + len(_GQ)
            continue
        ch = s[i]
        out.append(ch)
        i += 1
        if ch in "{,":
            m = _BARE_KEY.match(s, i)
            if m:
                out.append(json.dumps(m.group(1)) + ":")
                i = m.end()
    return "".join(out)


def _gemma_arg(v: Any) -> str:
    if isinstance(v, str):
        return f"{_GQ}{v}{_GQ}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma_arg(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma_arg(x) for x in v) + "]"
    return "null" if v is None else str(v)


@register_parser("gemma4")
class Gemma4Parser(ToolCallParser):
    """Gemma 4: ``<|tool_call>call:NAME{k:v,...}<tool_call|>``; reasoning in ``<|channel>thought…<channel|>``.
    A turn that calls tools ends with ``<|tool_response>`` (the results follow in the same model turn); an answer
    ends with ``<turn|>``. The template needs structured ``tool_calls`` in the history."""

    stop_tokens = ("<turn|>", "<|tool_response>", "<eos>")
    template_markers = (("<|tool_call>",),)
    structured_history = True

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|tool_response>" if parsed.calls else "<turn|>"

    def _parse(self, text: str) -> ParsedTurn:
        reasoning: list[str] = []
        body = text
        while "<|channel>" in body:
            head, _, rest = body.partition("<|channel>")
            inner, c, tail = rest.partition("<channel|>")
            reasoning.append(inner.removeprefix("thought").strip())
            body = head + tail
            if not c:
                break
        outside, blocks = tag_blocks(body, "<|tool_call>", "<tool_call|>")
        calls = [ToolCall("", raw=inner, parse_error=err) if err else self._call(inner) for inner, err in blocks]
        return ParsedTurn("".join(outside).strip(), calls, "\n".join(r for r in reasoning if r))

    def _call(self, inner: str) -> ToolCall:
        raw = f"<|tool_call>{inner}<tool_call|>"
        s = inner.strip()
        if not s.startswith("call:"):
            return ToolCall("", raw=raw, parse_error="a Gemma 4 call must start with 'call:NAME{'")
        name, brace, rest = s[len("call:") :].partition("{")
        name = name.strip()
        if not brace or not name:
            return ToolCall("", raw=raw, parse_error="a Gemma 4 call needs call:NAME{arguments}")
        try:
            as_json = _gemma_value_to_json("{" + rest)
        except ValueError as e:
            return ToolCall(name, raw=raw, parse_error=f"arguments of {name!r}: {e}")
        return json_object(as_json, raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        body = "".join(
            "<|tool_call>call:" + n + "{" + ",".join(f"{k}:{_gemma_arg(v)}" for k, v in sorted(a.items())) + "}<tool_call|>"
            for n, a in calls
        )
        return content + body
