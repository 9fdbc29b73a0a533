"""GLM-4.5/4.6/4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from toolgym.format.families.common import ToolCallBlocks, render_text_calls
from toolgym.format.families.qwen3_coder import json_value, python_literal
from toolgym.format.families.schema_types import SchemaTypedParameters, admits, value_types
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["Glm45Parser"]


# -- GLM-4.5 ----------------------------------------------------------------------------------------
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _literal(raw: str) -> tuple[bool, Any]:
    """``(True, value)`` for a JSON text, else for a Python literal with a JSON form; ``(False, None)`` for any
    other text. ValueError for a literal with no JSON form (vLLM's turn fails there: no call)."""
    try:
        return True, json.loads(raw)
    except (ValueError, RecursionError):
        pass
    try:
        value = python_literal(raw)
    except ValueError:
        return False, None
    return True, json_value(value)


def _read(raw: str, spec: Any) -> Any:
    """A value as the serving engines' GLM parsers read it. A parameter whose every branch is a string (``null``
    aside) keeps its text verbatim. Any other (no type, a union, one non-string type, outside the schema) is read
    as JSON, else as a Python literal, and that value is kept when the schema admits its type (:func:`admits`;
    always when untyped); a value the schema does not admit is the text when a string is admitted (a JSON string
    loses its quotes once: ``"a\\"b"`` is ``a"b``), else kept for the schema check to report."""
    types = value_types(spec) if spec is not None else None
    if types is not None and "string" in types and types <= {"string", "null"}:
        return raw
    parsed, value = _literal(raw)
    if not parsed:
        return raw
    if spec is None or admits(spec, value):
        return value
    native = value_types(spec, raw)
    return raw if native is not None and "string" in native else value


@register_parser("glm45", "glm47")
class Glm45Parser(SchemaTypedParameters, ToolCallBlocks, ToolCallParser):
    """GLM-4.5 / 4.6 / 4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``
    (newlines between parts optional). Values are text, read with the tool's parameter schemas as the serving
    engines read them (:func:`_read`; a root union by the siblings already read). The template
    writes no end-of-turn token: the model stops by writing the next header (``<|observation|>`` to call tools,
    ``<|user|>`` to hand back)."""

    stop_tokens = ("<|observation|>", "<|user|>", "<|endoftext|>")
    template_markers = (("<arg_key>", "<arg_value>"),)
    turn_closed_by_header = True


    def read_union_member(self, raw: str, spec: Any, read: Callable[[str, Any], Any]) -> Any:
        """A parameter only a root union's branches declare: a JSON string (``"text"``) is its content when the
        fitting declarations admit a string, whatever they are. Both engines read it so: vLLM's GLM parsers look
        a parameter's type up in the root's ``properties`` only, so such a parameter is untyped there and its JSON
        is read (quotes lost once); SGLang's GLM detectors unquote a JSON string of a string parameter. Any other
        text is read by :func:`_read` with the fitting declarations."""
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, str):
            types = value_types(spec, value) if spec is not None else None
            if types is None or "string" in types:
                return value
        return read(raw, spec)

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|observation|>" if parsed.calls else "<|user|>"

    def _call(self, inner: str) -> ToolCall:
        raw = f"<tool_call>{inner}</tool_call>"
        cut = inner.find("<arg_key>")
        name = (inner if cut == -1 else inner[:cut]).strip()
        if not name or "\n" in name or "<" in name:
            return ToolCall("", raw=raw, parse_error="a GLM <tool_call> must start with the function name")
        rest = "" if cut == -1 else inner[cut:]
        pairs: dict[str, str] = {}
        pos = 0
        for m in _GLM_PAIR.finditer(rest):
            if rest[pos : m.start()].strip():
                return ToolCall(name, raw=raw, parse_error="unexpected text between <arg_key>/<arg_value> pairs")
            key = m.group(1).strip()
            if key in pairs:
                return ToolCall(name, raw=raw, parse_error=f"argument {key!r} given twice")
            pairs[key] = m.group(2)
            pos = m.end()
        if rest[pos:].strip():
            return ToolCall(name, raw=raw, parse_error="an <arg_key> without its <arg_value> (or stray text)")
        return self.typed_call(name, pairs, _read, raw, "argument")

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        return render_text_calls(calls, content, "\n", "<tool_call>{name}\n",
                                 "<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n", "</tool_call>")
