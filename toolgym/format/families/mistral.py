"""Mistral: ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+) or ``[TOOL_CALLS][{...}, ...]`` (pre-v11)."""

from __future__ import annotations

import json
from typing import Any

from toolgym.format.families.common import (
    JSON_DECODER,
    call_from_obj,
    json_object,
)
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["MistralParser"]


# -- Mistral ----------------------------------------------------------------------------------------
@register_parser("mistral")
class MistralParser(ToolCallParser):
    """Mistral: ``[TOOL_CALLS]NAME[ARGS]{json}`` (v11+, optional ``[CALL_ID]ID``) or ``[TOOL_CALLS][{...}, ...]``
    (pre-v11). Reasoning in ``[THINK]...[/THINK]`` (v13) is split off. Call ids are 9 alphanumerics, as Mistral's
    templates require."""

    stop_tokens = ("</s>",)
    template_markers = (("[TOOL_CALLS]",), ("[AVAILABLE_TOOLS]",))
    _TAG, _ARGS, _ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"

    def call_id(self, turn: int, index: int) -> str:
        return f"t{turn % 1000:03d}c{index % 10000:04d}"  # 9 alphanumerics, unique in an episode

    def _parse(self, text: str) -> ParsedTurn:
        reasoning = []
        body = text
        while "[THINK]" in body or "[/THINK]" in body:
            head, o, rest = body.partition("[THINK]")
            inner, c, tail = rest.partition("[/THINK]")
            if not o:  # a turn that starts inside reasoning (the prompt opened it)
                inner, _, tail = body.partition("[/THINK]")
                head = ""
            reasoning.append(inner.strip())
            body = head + tail
            if not c and o:
                break
        parts = body.split(self._TAG)
        calls: list[ToolCall] = []
        if len(parts) > 2 and any(p.strip().startswith("[") for p in parts[1:]):
            # vLLM refuses a second [TOOL_CALLS] when the calls are a JSON list (pre-v11): no call is made
            msg = f"a JSON list of calls must be the only {self._TAG} of a turn"
            return ParsedTurn(parts[0].strip(), [ToolCall("", raw=self._TAG + p, parse_error=msg) for p in parts[1:]],
                              "\n".join(r for r in reasoning if r))
        for part in parts[1:]:
            calls.extend(self._decode(part))
        return ParsedTurn(parts[0].strip(), calls, "\n".join(r for r in reasoning if r))

    def _decode(self, part: str) -> list[ToolCall]:
        raw = self._TAG + part
        s = part.strip()
        if s.startswith("["):  # pre-v11: a JSON list of calls
            try:
                obj, end = JSON_DECODER.raw_decode(s)
            except json.JSONDecodeError as e:
                return [ToolCall("", raw=raw, parse_error=f"invalid JSON in [TOOL_CALLS]: {e.msg} at char {e.pos}")]
            except RecursionError:
                return [ToolCall("", raw=raw, parse_error="tool call JSON is nested too deeply")]
            if s[end:].strip():
                return [ToolCall("", raw=raw, parse_error="extra text after the [TOOL_CALLS] JSON list")]
            if not isinstance(obj, list) or not obj:
                return [ToolCall("", raw=raw, parse_error="[TOOL_CALLS] must be followed by a non-empty JSON list")]
            return [call_from_obj(o, raw, "arguments") for o in obj]
        head, sep, payload = part.partition(self._ARGS)
        if not sep:
            return [ToolCall("", raw=raw, parse_error="[TOOL_CALLS] needs NAME[ARGS]{...} or a JSON list")]
        name, _, _call_id = head.partition(self._ID)
        name = name.strip()
        if not name:
            return [ToolCall("", raw=raw, parse_error="empty function name after [TOOL_CALLS]")]
        return [json_object(payload, raw, name)]

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        return content + "".join(f"{self._TAG}{n}{self._ARGS}{json.dumps(a, ensure_ascii=False)}" for n, a in calls)
