"""Qwen3-Coder / Qwen3.5 XML: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``."""

from __future__ import annotations

import re
from typing import Any

from toolgym.format.families.common import (
    ToolCallBlocks,
    arg_text,
)
from toolgym.format.parsers import ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Qwen3CoderParser"]


# -- Qwen3-Coder / Qwen3.5 XML ---------------------------------------------------------------------
_FUNC = re.compile(r"<function=([^>\n]*)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]*)>(.*?)(</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


@register_parser("qwen3_coder", "qwen3_xml")
class Qwen3CoderParser(ToolCallBlocks, ToolCallParser):
    """Qwen3-Coder / Qwen3.5 XML calls. Errors: unclosed ``<tool_call>``/``<function=``/``<parameter=``, a block
    without ``<function=NAME>``, an empty name, a repeated parameter, text after ``</function>``."""

    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    template_markers = (("<function=", "<parameter="),)

    def _call(self, inner: str) -> ToolCall:
        raw = f"<tool_call>{inner}</tool_call>"
        m = _FUNC.search(inner)
        if m is None:
            return ToolCall("", raw=raw, parse_error="a <tool_call> block needs <function=NAME>")
        name = m.group(1).strip()
        if not name:
            return ToolCall("", raw=raw, parse_error="empty function name in <function=>")
        if not m.group(3):
            return ToolCall(name, raw=raw, parse_error=f"<function={name}> is not closed by </function>")
        if inner[: m.start()].strip() or inner[m.end() :].strip():
            return ToolCall(name, raw=raw, parse_error="unexpected text around <function=...> in a <tool_call>")
        args: dict[str, Any] = {}
        for p in _PARAM.finditer(m.group(2)):
            key = p.group(1).strip()
            if not p.group(3):
                return ToolCall(name, raw=raw, parse_error=f"<parameter={key}> is not closed by </parameter>")
            if key in args:
                return ToolCall(name, raw=raw, parse_error=f"parameter {key!r} given twice")
            val = p.group(2)
            val = val[1:] if val.startswith("\n") else val
            val = val[:-1] if val.endswith("\n") else val
            args[key] = self._typed(name, key, val)
        return ToolCall(name, args, raw=raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        blocks = []
        for name, args in calls:
            params = "".join(f"<parameter={k}>\n{arg_text(v)}\n</parameter>\n" for k, v in args.items())
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        out = "\n".join(blocks)
        return f"{content}\n\n{out}" if content and out else content or out
