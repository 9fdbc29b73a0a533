"""Hermes / Qwen JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

import json
from typing import Any

from toolgym.format.families.common import (
    JSON_DECODER,
    call_from_obj,
    render_calls,
    split_reasoning,
    tag_blocks,
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
        o, c = self.open_tag, self.close_tag
        outside, blocks = tag_blocks(body, o, c)
        calls = [ToolCall("", raw=inner, parse_error=err) if err else self._decode(inner.strip(), f"{o}{inner}{c}")
                 for inner, err in blocks]
        return ParsedTurn("".join(outside).strip(), calls, reasoning)

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
        return render_calls(calls, content, "\n", lambda name, args: (
            f"{self.open_tag}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{self.close_tag}"))
