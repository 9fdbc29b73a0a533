"""Qwen3-Coder / Qwen3.5 XML tool calls: telling real tags from tag text, and typing text-written values.

The format writes every argument value as raw text between ``<parameter=KEY>`` and ``</parameter>``, so a value
can itself contain those tags (a file's content that is a parser fixture, a chat template, a whole
``<tool_call>`` block). vLLM's ``qwen3_coder`` / ``qwen3_xml`` parsers decide which tags are structural with the
tool schema; toolgym follows the same rules (facts from vLLM's parser tests, no code copied), so a model is
never rewarded for a call that vLLM would read with other arguments:

* a ``<parameter=`` *opens* a parameter only at the start of a line (or of the value);
* inside a value, such line-start opens nest: each one pairs with the next ``</parameter>``;
* an unpaired ``</parameter>`` closes the value only when what follows (after whitespace) is ``</function>``,
  ``</tool_call>``, or ``<parameter=NAME>`` with ``NAME`` a parameter of the tool's schema (any name when the
  tool has no schema);
* ``</function>`` ends the call only after the last parameter closed that way, and ``</tool_call>`` must follow
  it (after whitespace).

Values are converted with the parameter's JSON-schema type, as vLLM does: ``anyOf`` uses its first non-null
type, nullable parameters read ``null`` / ``None`` as null, a type list (``["integer", "null"]``) reads the value
as a Python literal when it is one, string types stay text, integers and
numbers are read as such, booleans must be ``true`` / ``false``, containers are read as JSON and then as Python
literals (a single-quoted dict, a JSON string holding a Python repr); a parameter the schema does not declare
stays text. A tool whose parameters are a root ``oneOf``/``anyOf`` types each value with the parameter sets its
siblings fit (:meth:`~toolgym.format.families.schema_types.SchemaTypedParameters.read_arguments`). Where vLLM would guess (a boolean that is neither ``true`` nor ``false`` becomes ``false`` there),
toolgym reports an error instead (:class:`ValueError` from :func:`convert_value`).
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

from toolgym.format.families.common import ToolCallBlocks, render_text_calls
from toolgym.format.families.schema_types import (
    SchemaTypedParameters,
    branch_type,
    branches,
    pick_branch,
    reject_underscored_numbers,
)
from toolgym.format.parsers import ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = [
    "CLOSE_FUNCTION",
    "CLOSE_PARAM",
    "OPEN_PARAM",
    "Qwen3CoderParser",
    "TagScanner",
    "convert_value",
    "json_value",
    "python_literal",
    "resolve_type",
    "skip_ws",
    "valid_function_name",
]

OPEN_PARAM, CLOSE_PARAM = "<parameter=", "</parameter>"
CLOSE_FUNCTION, CLOSE_CALL = "</function>", "</tool_call>"
_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_FORBIDDEN_IN_NAME = frozenset("{}<>\"' \t\n\r")
_WS = " \t\n\r"


def skip_ws(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not whitespace (``len(text)`` if none)."""
    n = len(text)
    while pos < n and text[pos] in _WS:
        pos += 1
    return pos


def valid_function_name(name: str) -> bool:
    """A name a real tool can have: no template syntax (``{{ tc.name }}``), tags, quotes or whitespace."""
    return bool(name) and not any(c in _FORBIDDEN_IN_NAME for c in name)


def _structural_after(text: str, pos: int, names: frozenset[str] | None, longest: int) -> bool:
    """Whether ``text[pos:]`` (what follows a ``</parameter>``) starts, after whitespace, with a structural tag.
    ``longest``: the longest name in ``names`` (a ``>`` further away cannot end a schema name)."""
    n = len(text)
    while pos < n and text[pos] in _WS:
        pos += 1
    if text.startswith((CLOSE_FUNCTION, CLOSE_CALL), pos):
        return True
    if not text.startswith(OPEN_PARAM, pos):
        return False
    if names is None:
        return True
    first = pos + len(OPEN_PARAM)
    end = text.find(">", first, first + longest + 1)
    return end != -1 and text[first:end] in names


class TagScanner:
    """The parameter tags of one text, found once (sorted positions), so that finding where a value ends walks
    only the tags it passes, and a walk state already resolved (by a value scanned before) is not walked again:
    parsing stays linear in the text's size on adversarial input (thousands of tags or unclosed blocks)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._closes = [m.start() for m in re.finditer(re.escape(CLOSE_PARAM), text)]
        self._opens = [i for i in (m.start() for m in re.finditer(re.escape(OPEN_PARAM), text))
                       if i == 0 or text[i - 1] == "\n"]
        self._memo: dict[tuple[frozenset[str] | None, int, int], int] = {}

    def close_of_value(self, start: int, names: frozenset[str] | None) -> int:
        """Index of the ``</parameter>`` that closes the value starting at ``start`` (right after
        ``<parameter=KEY>``), or -1. ``names``: the tool's parameter names from its schema (``None``: no schema,
        any name is structural). A ``<parameter=`` right at ``start`` opens a nested one too."""
        text, closes, opens, memo = self.text, self._closes, self._opens, self._memo
        longest = max(map(len, names), default=0) if names is not None else 0
        depth, pos = 0, start
        ci, oi = bisect_left(closes, pos), bisect_left(opens, pos)
        at_start = text.startswith(OPEN_PARAM, start)
        path: list[tuple[frozenset[str] | None, int, int]] = []
        while True:
            key = (names, pos, depth)
            result = memo.get(key)
            if result is not None:
                break
            path.append(key)
            while ci < len(closes) and closes[ci] < pos:
                ci += 1
            while oi < len(opens) and opens[oi] < pos:
                oi += 1
            if ci == len(closes):
                result = -1
                break
            close = closes[ci]
            opened = start if at_start and pos == start else (opens[oi] if oi < len(opens) else -1)
            if opened != -1 and opened < close:
                depth += 1
                pos = opened + len(OPEN_PARAM)
            elif depth:
                depth -= 1
                pos = close + len(CLOSE_PARAM)
            elif _structural_after(text, close + len(CLOSE_PARAM), names, longest):
                result = close
                break
            else:
                pos = close + len(CLOSE_PARAM)
        for k in path:
            memo[k] = result
        return result

    def function_end(self, start: int, names: frozenset[str] | None) -> int:
        """Index of the structural ``</function>`` of the body starting at ``start`` (right after
        ``<function=NAME>``), or -1 when the body is not closed parameters followed by ``</function>``."""
        text = self.text
        pos, n = start, len(text)
        while pos < n:
            pos = skip_ws(text, pos)
            if text.startswith(CLOSE_FUNCTION, pos):
                return pos
            if not text.startswith(OPEN_PARAM, pos):
                return -1
            gt = text.find(">", pos + len(OPEN_PARAM))
            if gt == -1 or "\n" in text[pos:gt]:
                return -1
            close = self.close_of_value(gt + 1, names)
            if close == -1:
                return -1
            pos = close + len(CLOSE_PARAM)
        return -1


def resolve_type(spec: Any) -> tuple[str, bool]:
    """``(type, nullable)`` of a parameter's JSON schema, read as vLLM reads it: ``type`` when it is a name
    (a list of names gives ``"[...]"``, converted like an untyped value), else the first non-null type among the
    union branches (``anyOf``/``oneOf``, nested ones flattened; a branch's ``const``/``enum`` values give its
    type); ``"string"`` when none names one."""
    if not isinstance(spec, Mapping):
        return "string", False
    if "type" in spec:
        t = spec["type"]
        if isinstance(t, list | tuple):
            return "[...]", False
        typ = str(t).strip().lower()
        return typ, typ == "null"
    typ, nullable, picked = "string", False, False
    for option in branches(spec):
        t = branch_type(option)
        if t == "null":
            nullable = True
        elif t is not None and not picked:
            typ, picked = t, True
    return typ, nullable


def json_value(v: Any) -> Any:
    """``v`` as plain JSON data (tuples become lists); ValueError when it has no JSON form (sets, NaN, bytes)."""
    try:
        return json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"value has no JSON form: {e}") from None


def python_literal(text: str) -> Any:
    """A Python literal (``{'k': 'v'}``, ``None``, ``(1, 2)``), or ValueError. An escape Python does not know
    (``"\\C"``) stays as written, as the engines' ``ast.literal_eval`` keeps it: the reading never depends on the
    process's warning filters (Python warns about such escapes, and ``-W error`` would turn that into a failure)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text.strip(), mode="eval")
        reject_underscored_numbers(text.strip(), tree)
        return ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise ValueError(str(e)) from None


def convert_value(raw: str, spec: Any) -> Any:
    """A text-written argument value converted with its JSON schema ``spec`` (``None``: not in the schema, the
    value stays text). Raises ValueError where the text cannot have the declared type and vLLM would guess."""
    if spec is None:
        return raw
    chosen, value = pick_branch(raw, spec, _convert_one)
    return value if chosen else _convert_one(raw, spec)


_INTEGER_TEXT = re.compile(r"\s*-?\d+\s*")


def _convert_one(raw: str, spec: Any) -> Any:
    """:func:`convert_value` for one branch (no union rule)."""
    typ, nullable = resolve_type(spec)
    is_null = raw.lower() in ("null", "none")
    if nullable and is_null:
        return None
    if typ in _STRING_TYPES:
        return raw
    if is_null:
        return None
    if typ.startswith(_INT_PREFIXES):
        try:
            return int(raw) if _INTEGER_TEXT.fullmatch(raw) else raw
        except ValueError:  # more digits than Python converts
            return raw
    if typ.startswith(("num", "float")):
        if _INTEGER_TEXT.fullmatch(raw):  # integral text stays an exact integer, never through a float
            try:
                return int(raw)
            except ValueError:
                return raw
        try:
            f = float(raw)
        except ValueError:
            return raw
        if math.isinf(f):  # vLLM's conversion fails on the whole turn there: no call is made
            raise ValueError(f"{raw[:40]!r} is not a finite number")
        if math.isnan(f):
            return raw
        return int(f) if f == int(f) else f
    if typ in ("boolean", "bool", "binary"):
        low = raw.lower()
        if low not in ("true", "false"):
            raise ValueError(f"expected true or false, got {raw[:40]!r}")
        return low == "true"
    container = typ in ("object", "array", "arr") or typ.startswith(("dict", "list"))
    if container:
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            pass
        else:
            if isinstance(value, str):  # a JSON string holding a Python repr: read it once more
                try:
                    value = python_literal(value)
                except ValueError:
                    pass
            return json_value(value)
    try:
        value = python_literal(raw)
    except ValueError:
        return raw
    if container and isinstance(value, str):
        try:
            value = python_literal(value)
        except ValueError:
            pass
    return json_value(value)


@register_parser("qwen3_coder", "qwen3_xml")
class Qwen3CoderParser(SchemaTypedParameters, ToolCallBlocks, ToolCallParser):
    """Qwen3-Coder / Qwen3.5 XML calls. Tags inside values are told from real ones with the tool schema given to
    :meth:`set_tools`, as vLLM does (the rules above). Errors: unclosed ``<tool_call>`` /
    ``<function=`` / ``<parameter=``, a block without ``<function=NAME>``, a name that is not one (empty,
    template text such as ``{{ tc.name }}``, whitespace, quotes), a repeated parameter, text between parameters
    or after ``</function>``, a value that cannot have its declared type (a boolean other than true/false)."""

    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    template_markers = (("<function=", "<parameter="),)
    _OPEN, _CLOSE, _FUNC = "<tool_call>", "</tool_call>", "<function="


    def _names(self, tool: str) -> frozenset[str] | None:
        props = self.param_schemas.get(tool)
        return frozenset(props) if props else None

    def _block_end(self, body: str) -> Callable[[int], int]:
        scan = TagScanner(body)
        return lambda inner: self._structural_end(scan, inner)

    def _structural_end(self, scan: TagScanner, inner: int) -> int:
        """Index of the ``</tool_call>`` closing a well-formed call whose inside starts at ``inner``; -1 if none."""
        body = scan.text
        j = skip_ws(body, inner)
        if not body.startswith(self._FUNC, j):
            return -1
        gt = body.find(">", j + len(self._FUNC))
        if gt == -1:
            return -1
        fe = scan.function_end(gt + 1, self._names(body[j + len(self._FUNC) : gt]))
        if fe == -1:
            return -1
        k = skip_ws(body, fe + len(CLOSE_FUNCTION))
        return k if body.startswith(self._CLOSE, k) else -1

    def _call(self, inner: str) -> ToolCall:
        raw = f"{self._OPEN}{inner}{self._CLOSE}"
        j = skip_ws(inner, 0)
        if not inner.startswith(self._FUNC, j):
            return ToolCall("", raw=raw, parse_error="a <tool_call> block needs <function=NAME>")
        gt = inner.find(">", j + len(self._FUNC))
        if gt == -1:
            return ToolCall("", raw=raw, parse_error="<function= is not closed by >")
        name = inner[j + len(self._FUNC) : gt]
        if not valid_function_name(name):
            return ToolCall("", raw=raw, parse_error=f"not a function name in <function=>: {name[:60]!r}")
        names = self._names(name)
        scan = TagScanner(inner + self._CLOSE)  # a value's close may be followed by </tool_call>
        pairs: dict[str, str] = {}
        pos, n = gt + 1, len(inner)
        while True:
            pos = skip_ws(inner, pos)
            if pos >= n:
                return ToolCall(name, raw=raw, parse_error=f"<function={name}> is not closed by </function>")
            if inner.startswith(CLOSE_FUNCTION, pos):
                break
            if not inner.startswith(OPEN_PARAM, pos):
                return ToolCall(name, raw=raw, parse_error="unexpected text in <function=...>: expected <parameter=KEY> or </function>")
            kgt = inner.find(">", pos + len(OPEN_PARAM))
            key = inner[pos + len(OPEN_PARAM) : kgt] if kgt != -1 else ""
            if not key or "\n" in key:
                return ToolCall(name, raw=raw, parse_error="a <parameter=KEY> tag needs a key and its closing >")
            close = scan.close_of_value(kgt + 1, names)
            if close == -1:
                return ToolCall(name, raw=raw, parse_error=f"<parameter={key}> is not closed by </parameter>")
            if key in pairs:
                return ToolCall(name, raw=raw, parse_error=f"parameter {key!r} given twice")
            val = inner[kgt + 1 : close]
            val = val[1:] if val.startswith("\n") else val
            pairs[key] = val[:-1] if val.endswith("\n") else val
            pos = close + len(CLOSE_PARAM)
        if inner[pos + len(CLOSE_FUNCTION) :].strip():
            return ToolCall(name, raw=raw, parse_error="unexpected text after </function> in a <tool_call>")
        return self.typed_call(name, pairs, convert_value, raw, "parameter")

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        return render_text_calls(calls, content, "\n\n", "<tool_call>\n<function={name}>\n",
                                 "<parameter={key}>\n{value}\n</parameter>\n", "</function>\n</tool_call>")
