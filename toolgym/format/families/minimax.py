"""MiniMax-M2: ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke></minimax:tool_call>``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.format.families.common import split_reasoning, tag_blocks
from toolgym.format.families.invoke import read_invokes
from toolgym.format.families.qwen3_coder import convert_value
from toolgym.format.families.schema_types import property_schemas
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["MiniMaxM2Parser"]

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"


def value_text(v: Any) -> str:
    """An argument value as a text-valued format writes it: a string verbatim, anything else as JSON."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


@register_parser("minimax_m2")
class MiniMaxM2Parser(ToolCallParser):
    """MiniMax-M2 calls: ``<minimax:tool_call>`` blocks of ``<invoke name="NAME">`` elements, each holding
    ``<parameter name="KEY">VALUE</parameter>`` elements. Values are text, typed with the tool's JSON schema as
    ``qwen3_coder`` types them (a parameter outside the schema, or any value without one, stays text).

    Errors reported: an unclosed block, invoke or parameter, text between invokes or parameters, a missing or
    malformed ``name``, a parameter given twice, a block without invokes, a value that cannot have its declared
    type (a boolean other than true/false).
    """

    stop_tokens = ("[e~[",)
    template_markers = ((OPEN, "<invoke name="),)

    def __init__(self) -> None:
        super().__init__()
        self.param_schemas: dict[str, dict[str, Any]] = {}

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        """Also keep each parameter's resolved JSON schema (references inlined, root unions merged)."""
        super().set_tools(schemas)
        self.param_schemas = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            params = f.get("parameters") if isinstance(f, Mapping) else None
            if isinstance(f.get("name"), str) and isinstance(params, Mapping):
                self.param_schemas[f["name"]] = property_schemas(params)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        outside, blocks = tag_blocks(body, OPEN, CLOSE)
        calls: list[ToolCall] = []
        for inner, err in blocks:
            if err:
                calls.append(ToolCall("", raw=inner, parse_error=err))
                continue
            invokes, between = read_invokes(inner)
            for inv in invokes:
                calls.append(ToolCall(inv.name, raw=inv.raw, parse_error=inv.error) if inv.error else self._call(inv))
            if between:
                calls.append(ToolCall("", raw=inner, parse_error=between))
            elif not invokes:
                calls.append(ToolCall("", raw=inner, parse_error=f"{OPEN} holds no <invoke>"))
        return ParsedTurn("".join(outside).strip(), calls, reasoning)

    def _call(self, inv: Any) -> ToolCall:
        schemas = self.param_schemas.get(inv.name, {})
        args: dict[str, Any] = {}
        for key, attrs, raw in inv.params:
            if attrs:
                return ToolCall(inv.name, raw=inv.raw, parse_error=f"unexpected attributes on parameter {key!r}")
            try:
                args[key] = convert_value(raw, schemas.get(key))
            except ValueError as e:
                return ToolCall(inv.name, raw=inv.raw, parse_error=f"argument {key!r} of {inv.name!r}: {e}")
        return ToolCall(inv.name, args, raw=inv.raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        """``content``, then the block exactly as MiniMax-M2's chat template renders structured ``tool_calls``."""
        if not calls:
            return content
        invokes = "".join(
            f'<invoke name="{n}">\n'
            + "".join(f'<parameter name="{k}">{value_text(v)}</parameter>\n' for k, v in a.items())
            + "</invoke>\n"
            for n, a in calls
        )
        return f"{content}\n{OPEN}\n{invokes}{CLOSE}"  # as MiniMax's template writes it, "\n" first even alone
