"""DeepSeek V3 and V3.1: ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``."""

from __future__ import annotations

import json
import re
from typing import Any

from toolgym.format.families.common import json_object, section_calls, split_reasoning
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser"]


# -- DeepSeek V3 / V3.1 ----------------------------------------------------------------------------
_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_FENCE = re.compile(r"\A\s*```(?:json)?\s*\n?(.*?)\n?```\s*\Z", re.DOTALL)


class _DeepSeekBase(ToolCallParser):
    stop_tokens = ("<｜end▁of▁sentence｜>",)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        start = body.find(_DS_CALLS_BEGIN)
        if start == -1:
            if _DS_CALL_BEGIN in body:
                return ParsedTurn(body.strip(), [ToolCall("", raw=body, parse_error=f"{_DS_CALL_BEGIN} outside {_DS_CALLS_BEGIN}")], reasoning)
            return ParsedTurn(body.strip(), [], reasoning)
        tags = (_DS_CALLS_BEGIN, _DS_CALLS_END, _DS_CALL_BEGIN, _DS_CALL_END)
        tail, calls = section_calls(body, start, tags, self._decode, "DeepSeek")
        return ParsedTurn((body[:start] + tail).strip(), calls, reasoning)

    def _decode(self, inner: str) -> ToolCall:  # pragma: no cover - overridden
        raise NotImplementedError


@register_parser("deepseek_v31")
class DeepSeekV31Parser(_DeepSeekBase):
    """DeepSeek-V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`` inside the calls section."""

    template_markers = ((_DS_SEP,),)

    def _decode(self, inner: str) -> ToolCall:
        raw = f"{_DS_CALL_BEGIN}{inner}{_DS_CALL_END}"
        name, sep, payload = inner.partition(_DS_SEP)
        name = name.strip()
        if not sep or not name:
            return ToolCall("", raw=raw, parse_error=f"a DeepSeek call needs NAME{_DS_SEP}ARGUMENTS")
        return json_object(payload, raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        body = "".join(f"{_DS_CALL_BEGIN}{n}{_DS_SEP}{json.dumps(a, ensure_ascii=False)}{_DS_CALL_END}" for n, a in calls)
        return f"{content}{_DS_CALLS_BEGIN}{body}{_DS_CALLS_END}"


@register_parser("deepseek_v3")
class DeepSeekV3Parser(_DeepSeekBase):
    """DeepSeek-V3 / R1: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>``."""

    template_markers = ((_DS_SEP, "```json"),)

    def _decode(self, inner: str) -> ToolCall:
        raw = f"{_DS_CALL_BEGIN}{inner}{_DS_CALL_END}"
        kind, sep, rest = inner.partition(_DS_SEP)
        if not sep:
            return ToolCall("", raw=raw, parse_error=f"a DeepSeek-V3 call needs TYPE{_DS_SEP}NAME")
        name, nl, payload = rest.partition("\n")
        name = name.strip()
        if not name:
            return ToolCall("", raw=raw, parse_error="empty function name in a DeepSeek-V3 call")
        m = _DS_FENCE.match(payload)
        if not nl or m is None:
            return ToolCall(name, raw=raw, parse_error=f"the arguments of {name!r} must be a ```json fenced block")
        return json_object(m.group(1), raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        body = "\n".join(
            f"{_DS_CALL_BEGIN}function{_DS_SEP}{n}\n```json\n{json.dumps(a, ensure_ascii=False)}\n```{_DS_CALL_END}"
            for n, a in calls
        )
        return f"{content}{_DS_CALLS_BEGIN}{body}{_DS_CALLS_END}"
