"""Kimi-K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>…<|tool_calls_section_end|>``."""

from __future__ import annotations

import json
import re
from typing import Any

from toolgym.format.families.common import json_object, section_calls, split_reasoning
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["KimiK2Parser"]

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END, ARG_BEGIN = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
#: the call id: ``functions.NAME:IDX`` (``NAME:IDX`` accepted, as vLLM does); NAME has no dot, colon or space
_CALL_ID = re.compile(r"(?:functions\.)?([^\s.:<>]+):(\d+)")


@register_parser("kimi_k2")
class KimiK2Parser(ToolCallParser):
    """Kimi-K2 calls: one section ``<|tool_calls_section_begin|>…<|tool_calls_section_end|>`` holding
    ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`` blocks.

    Errors reported: an unclosed section or call, text between calls, a call id that is not
    ``[functions.]NAME:IDX`` (vLLM skips it, or guesses the tool from the arguments when the id is a bare counter),
    a call without ``<|tool_call_argument_begin|>``, invalid JSON or non-object arguments (vLLM passes the text on
    as the arguments), a call block outside a section.
    """

    stop_tokens = ("<|im_end|>",)
    template_markers = ((SECTION_BEGIN, ARG_BEGIN),)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        start = body.find(SECTION_BEGIN)
        if start == -1:
            if CALL_BEGIN in body or SECTION_END in body:
                bad = ToolCall("", raw=body, parse_error=f"a Kimi call or section end without {SECTION_BEGIN}")
                return ParsedTurn(body.strip(), [bad], reasoning)
            return ParsedTurn(body.strip(), [], reasoning)
        tail, calls = section_calls(body, start, (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END), self._call, "Kimi")
        if SECTION_BEGIN in tail:
            calls.append(ToolCall("", raw=tail, parse_error="a second Kimi tool-call section in one turn"))
        return ParsedTurn((body[:start] + tail).strip(), calls, reasoning)

    @staticmethod
    def _call(inner: str) -> ToolCall:
        raw = f"{CALL_BEGIN}{inner}{CALL_END}"
        head, sep, payload = inner.partition(ARG_BEGIN)
        if not sep:
            return ToolCall("", raw=raw, parse_error=f"a Kimi call needs {ARG_BEGIN} after its id")
        m = _CALL_ID.fullmatch(head.strip())
        if m is None:
            return ToolCall("", raw=raw, parse_error=f"a Kimi call id must be functions.NAME:INDEX, got {head.strip()[:60]!r}")
        if not payload.strip():
            return ToolCall(m.group(1), raw=raw, parse_error=f"empty arguments for {m.group(1)!r} (write {{}})")
        return json_object(payload, raw, m.group(1))

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        body = "".join(
            f"{CALL_BEGIN}functions.{n}:{i}{ARG_BEGIN}{json.dumps(a, ensure_ascii=False)}{CALL_END}"
            for i, (n, a) in enumerate(calls)
        )
        return f"{content}{SECTION_BEGIN}{body}{SECTION_END}"
