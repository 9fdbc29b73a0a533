"""Hermes / Qwen JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
from typing import Any

from toolgym.format.families.common import (
    JSON_DECODER,
    call_from_obj,
    split_reasoning,
)
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["HermesParser"]


@register_parser("hermes", "qwen")
class HermesParser(ToolCallParser):
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`` blocks (Hermes / Qwen / ChatML).

    Errors reported: invalid JSON, a non-object, a missing name, non-object arguments, an unclosed
    ``<tool_call>``, a stray ``</tool_call>``, and more than one JSON value in one block.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    template_markers = (("<tool_call>", "arguments"),)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        calls: list[ToolCall] = []
        content: list[str] = []
        pos = 0
        o, c = self.open_tag, self.close_tag
        while True:
            start = body.find(o, pos)
            stray = body.find(c, pos)
            if stray != -1 and (start == -1 or stray < start):
                content.append(body[pos:stray])
                calls.append(ToolCall("", raw=c, parse_error=f"{c} without a matching {o}"))
                pos = stray + len(c)
                continue
            if start == -1:
                content.append(body[pos:])
                break
            content.append(body[pos:start])
            end = body.find(c, start + len(o))
            nxt = body.find(o, start + len(o))
            if end == -1 or (nxt != -1 and nxt < end):
                stop = len(body) if nxt == -1 else nxt
                raw = body[start:stop]
                calls.append(ToolCall("", raw=raw, parse_error=f"{o} is not closed by {c}"))
                pos = stop
                continue
            raw = body[start : end + len(c)]
            calls.append(self._decode(body[start + len(o) : end].strip(), raw))
            pos = end + len(c)
        return ParsedTurn("".join(content).strip(), calls, reasoning)

    @staticmethod
    def _decode(payload: str, raw: str) -> ToolCall:
        if not payload:
            return ToolCall("", raw=raw, parse_error="empty tool call")
        try:
            obj, end = JSON_DECODER.raw_decode(payload)
        except json.JSONDecodeError as e:
            return ToolCall("", raw=raw, parse_error=f"invalid JSON in tool call: {e.msg} at char {e.pos}")
        except RecursionError:
            return ToolCall("", raw=raw, parse_error="tool call JSON is nested too deeply")
        if payload[end:].strip():
            return ToolCall("", raw=raw, parse_error="extra text after the JSON object in a tool call")
        return call_from_obj(obj, raw, "arguments")

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        parts = [content] if content else []
        for name, args in calls:
            parts.append(
                f"{self.open_tag}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{self.close_tag}"
            )
        return "\n".join(parts)
