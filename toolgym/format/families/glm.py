"""GLM-4.5/4.6/4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``."""

from __future__ import annotations

import json
import re
from typing import Any

from toolgym.format.families.common import (
    ToolCallBlocks,
    arg_text,
)
from toolgym.format.families.qwen3_coder import json_value, python_literal
from toolgym.format.families.schema_types import SchemaTypedParameters, branch_type, branches, pick_branch
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Glm45Parser"]


# -- GLM-4.5 ----------------------------------------------------------------------------------------
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _read(raw: str, spec: Any) -> Any:
    """A value as vLLM's GLM parsers read it: text for a string branch, else JSON, else a Python literal, else
    text. ValueError for a literal with no JSON form (vLLM's turn fails there: no call)."""
    if spec is not None and all(branch_type(b) in ("string", "null") for b in branches(spec)) \
            and any(branch_type(b) == "string" for b in branches(spec)):
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        pass
    try:
        value = python_literal(raw)
    except ValueError:
        return raw
    return json_value(value)


@register_parser("glm45", "glm47")
class Glm45Parser(SchemaTypedParameters, ToolCallBlocks, ToolCallParser):
    """GLM-4.5 / 4.6 / 4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``
    (newlines between parts optional). Values are text, converted with the tool's parameter types. The template
    writes no end-of-turn token: the model stops by writing the next header (``<|observation|>`` to call tools,
    ``<|user|>`` to hand back)."""

    stop_tokens = ("<|observation|>", "<|user|>", "<|endoftext|>")
    template_markers = (("<arg_key>", "<arg_value>"),)
    turn_closed_by_header = True


    def _typed(self, tool: str, key: str, raw: str) -> Any:
        """A value read with its parameter's schema: the union rule of :mod:`schema_types` for a union, else
        :func:`_read` (a string parameter stays text)."""
        spec = self.param_schemas.get(tool, {}).get(key)
        chosen, value = pick_branch(raw, spec, _read)
        return value if chosen else _read(raw, spec)

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|observation|>" if parsed.calls else "<|user|>"

    def _call(self, inner: str) -> ToolCall:
        raw = f"<tool_call>{inner}</tool_call>"
        cut = inner.find("<arg_key>")
        name = (inner if cut == -1 else inner[:cut]).strip()
        if not name or "\n" in name or "<" in name:
            return ToolCall("", raw=raw, parse_error="a GLM <tool_call> must start with the function name")
        rest = "" if cut == -1 else inner[cut:]
        args: dict[str, Any] = {}
        pos = 0
        for m in _GLM_PAIR.finditer(rest):
            if rest[pos : m.start()].strip():
                return ToolCall(name, raw=raw, parse_error="unexpected text between <arg_key>/<arg_value> pairs")
            key = m.group(1).strip()
            if key in args:
                return ToolCall(name, raw=raw, parse_error=f"argument {key!r} given twice")
            try:
                args[key] = self._typed(name, key, m.group(2))
            except ValueError as e:
                return ToolCall(name, raw=raw, parse_error=f"argument {key!r} of {name!r}: {e}")
            pos = m.end()
        if rest[pos:].strip():
            return ToolCall(name, raw=raw, parse_error="an <arg_key> without its <arg_value> (or stray text)")
        return ToolCall(name, args, raw=raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        blocks = []
        for name, args in calls:
            pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{arg_text(v)}</arg_value>\n" for k, v in args.items())
            blocks.append(f"<tool_call>{name}\n{pairs}</tool_call>")
        return "\n".join(([content] if content else []) + blocks)
