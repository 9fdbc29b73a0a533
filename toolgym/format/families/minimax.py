"""MiniMax-M2: ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke></minimax:tool_call>``."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from toolgym.format.families.invoke import Invoke, parse_invoke_blocks
from toolgym.format.families.schema_types import SchemaTypedParameters, branch_type, branches, pick_branch
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["MiniMaxM2Parser"]

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
_NULL_WORDS = ("null", "none", "nil")
_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_or_text(text: str) -> Any:
    """JSON if ``text`` is a JSON value (``NaN``/``Infinity`` refused), else the text itself."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        if "not a JSON number" in str(e):
            raise
        return text
    except RecursionError:
        raise ValueError("value nested too deeply") from None


def read_value(text: str, spec: Any) -> Any:
    """One branch's reading of a (stripped) value, as vLLM's MiniMax-M2 parser reads it where that is certain:
    ``string`` (or no type) is the text; ``integer``/``number`` an exact number; ``boolean`` ``true``/``false``;
    ``object``/``array`` and unknown types JSON, else the text. ValueError where vLLM guesses (``yes`` for a
    boolean), fails (``inf``) or reads Python-only syntax (``1_000``)."""
    typ = branch_type(spec)
    if typ in (None, "string", "str", "text"):
        return text
    if typ in ("integer", "int", "number", "float"):
        if "_" in text and any(c.isdigit() for c in text):
            raise ValueError(f"number written with underscores: {text[:40]!r}")
        if _INTEGER.fullmatch(text):
            return int(text)
        if typ in ("number", "float") and _NUMBER.fullmatch(text):
            f = float(text)
            if not math.isfinite(f):
                raise ValueError(f"{text[:40]!r} is not a finite number")
            return int(f) if f == int(f) else f
        if text.lower().lstrip("+-") in ("inf", "infinity"):
            raise ValueError(f"{text[:40]!r} is not a finite number")
        return _json_or_text(text)
    if typ in ("boolean", "bool"):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ValueError(f"expected true or false, got {text[:40]!r}")
    return _json_or_text(text)


def convert(raw: str, spec: Any) -> Any:
    """A parameter's value text read with its schema ``spec`` (``None``: outside the schema, text). vLLM strips
    the text and reads ``null``/``none``/``nil`` as null whatever the type; a union follows the union rule of
    :mod:`~toolgym.format.families.schema_types`, one type is read by :func:`read_value`."""
    text = raw.strip()
    if text.lower() in _NULL_WORDS:
        return None
    if spec is None:
        return text
    chosen, value = pick_branch(text, spec, read_value)
    if chosen:
        return value
    first = next((b for b in branches(spec) if branch_type(b) != "null"), None)
    return _json_or_text(text) if first is None else read_value(text, first)


def value_text(v: Any) -> str:
    """An argument value as a text-valued format writes it: a string verbatim, anything else as JSON."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


@register_parser("minimax_m2")
class MiniMaxM2Parser(SchemaTypedParameters, ToolCallParser):
    """MiniMax-M2 calls: ``<minimax:tool_call>`` blocks of ``<invoke name="NAME">`` elements, each holding
    ``<parameter name="KEY">VALUE</parameter>`` elements. Values are text, stripped and typed with the tool's JSON
    schema by :func:`convert` (a parameter outside the schema, or any value without one, stays text).

    Errors reported: an unclosed block, invoke or parameter, text between invokes or parameters, a missing or
    malformed ``name``, a parameter given twice, a block without invokes, a value vLLM would guess at or fail on
    (a boolean other than true/false, ``inf``, ``1_000``).
    """

    stop_tokens = ("[e~[",)
    template_markers = ((OPEN, "<invoke name="),)


    def _parse(self, text: str) -> ParsedTurn:
        return parse_invoke_blocks(text, OPEN, CLOSE, "", self._call)

    def _call(self, inv: Invoke) -> ToolCall:
        schemas = self.param_schemas.get(inv.name, {})
        args: dict[str, Any] = {}
        for key, attrs, raw in inv.params:
            if attrs:
                return ToolCall(inv.name, raw=inv.raw, parse_error=f"unexpected attributes on parameter {key!r}")
            try:
                args[key] = convert(raw, schemas.get(key))
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
