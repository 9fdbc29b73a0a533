"""GLM-4.5/4.6/4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.format.families.common import (
    ToolCallBlocks,
    arg_text,
)
from toolgym.format.families.qwen3_coder import json_value, python_literal
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Glm45Parser"]


# -- GLM-4.5 ----------------------------------------------------------------------------------------
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _declares_string(spec: Any) -> bool:
    if not isinstance(spec, Mapping):
        return False
    t = spec.get("type")
    alts = spec.get("anyOf")
    return (t == "string" or (isinstance(t, list) and "string" in t)
            or (isinstance(alts, list) and any(isinstance(o, Mapping) and o.get("type") == "string" for o in alts)))


@register_parser("glm45", "glm47")
class Glm45Parser(ToolCallBlocks, ToolCallParser):
    """GLM-4.5 / 4.6 / 4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``
    (newlines between parts optional). Values are text, converted with the tool's parameter types. The template
    writes no end-of-turn token: the model stops by writing the next header (``<|observation|>`` to call tools,
    ``<|user|>`` to hand back)."""

    stop_tokens = ("<|observation|>", "<|user|>", "<|endoftext|>")
    template_markers = (("<arg_key>", "<arg_value>"),)
    turn_closed_by_header = True

    def __init__(self) -> None:
        super().__init__()
        self.string_params: dict[str, set[str]] = {}

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        """Also note which parameters are strings (``"string"``, a type list or an ``anyOf`` with a string)."""
        super().set_tools(schemas)
        self.string_params = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            params = f.get("parameters") if isinstance(f, Mapping) else None
            props = params.get("properties") if isinstance(params, Mapping) else None
            if isinstance(f.get("name"), str) and isinstance(props, Mapping):
                self.string_params[f["name"]] = {k for k, v in props.items() if _declares_string(v)}

    def _typed(self, tool: str, key: str, raw: str) -> Any:
        """A value as vLLM's GLM parsers read it: text for a string parameter, else JSON, else a Python literal,
        else text. ValueError for a literal with no JSON form (vLLM's turn fails there: no call)."""
        if key in self.string_params.get(tool, ()):
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
