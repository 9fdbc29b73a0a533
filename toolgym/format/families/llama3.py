"""Llama 3 JSON: ``{"name": ..., "parameters": {...}}`` after the assistant header (or ``<|python_tag|>``)."""

from __future__ import annotations

import json
from typing import Any

from toolgym.format.families.common import (
    call_from_obj,
    split_reasoning,
)
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Llama3JsonParser"]


@register_parser("llama3_json", "llama3")
class Llama3JsonParser(ToolCallParser):
    """Llama 3.x JSON calls: the turn is ``{"name": ..., "parameters": {...}}`` (``"arguments"`` accepted),
    optionally prefixed by ``<|python_tag|>``; several calls are separated by ``;``.

    A turn whose text (after the optional tag) does not start with ``{`` is a plain answer. One that does
    must be entirely calls: any invalid JSON or trailing text is a parse error.
    """

    python_tag = "<|python_tag|>"
    stop_tokens = ("<|eot_id|>", "<|eom_id|>")
    template_markers = (("<|start_header_id|>", '"parameters"'), ("<|start_header_id|>", "ipython"))

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        s = body.strip()
        tagged = s.startswith(self.python_tag)
        if tagged:
            s = s[len(self.python_tag) :].lstrip()
        if not s.startswith("{"):
            if tagged:
                return ParsedTurn("", [ToolCall("", raw=body, parse_error="<|python_tag|> not followed by a JSON call")], reasoning)
            return ParsedTurn(s, [], reasoning)
        calls: list[ToolCall] = []
        dec = json.JSONDecoder()
        pos = 0
        while pos < len(s):
            try:
                obj, end = dec.raw_decode(s, pos)
            except json.JSONDecodeError as e:
                calls.append(ToolCall("", raw=s[pos:], parse_error=f"invalid JSON in tool call: {e.msg} at char {e.pos}"))
                break
            except RecursionError:
                calls.append(ToolCall("", raw=s[pos:], parse_error="tool call JSON is nested too deeply"))
                break
            if isinstance(obj, dict) and "name" in obj and "parameters" not in obj and "arguments" not in obj:
                # vLLM reads such an object as text, never as a call
                calls.append(ToolCall("", raw=s[pos:end], parse_error='a call needs "parameters" (or "arguments")'))
            else:
                calls.append(call_from_obj(obj, s[pos:end], "parameters"))
            pos = end
            rest = s[pos:].lstrip()
            if not rest:
                break
            if rest.startswith(";"):
                pos = len(s) - len(rest) + 1
                while pos < len(s) and s[pos].isspace():
                    pos += 1
                continue
            calls.append(ToolCall("", raw=rest, parse_error="unexpected text after a JSON tool call"))
            break
        return ParsedTurn("", calls, reasoning)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        body = "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
        return f"{content}\n{body}".strip() if content and not calls else body or content
