"""Pythonic calls (Llama 3.2 / Llama 4): ``[get_weather(city="Paris"), f(x=1)]``, read with :mod:`ast`.

Nothing is evaluated: the turn is parsed into a syntax tree, and each keyword's value must be a literal
(``ast.literal_eval`` on that node alone: strings, numbers, booleans, ``None``, lists, dicts, tuples).
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from toolgym.format.families.common import split_reasoning
from toolgym.format.families.qwen3_coder import json_value
from toolgym.format.families.schema_types import reject_underscored_numbers
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["PythonicParser", "python_literal_text"]

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
#: what a turn that means to call looks like: ``[`` then ``name(``
_LOOKS_LIKE_CALLS = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAX_LEN = 200_000


def python_literal_text(v: Any) -> str:
    """A JSON value written as the Python literal a pythonic call uses (``True``, ``None``, ``'text'``)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{python_literal_text(k)}: {python_literal_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(python_literal_text(x) for x in v) + "]"
    return repr(v)


def _value(text: str, node: ast.expr) -> Any:
    """A keyword's value: a literal only (ValueError otherwise, or when it has no JSON form)."""
    value = ast.literal_eval(node)
    reject_underscored_numbers(text, node)
    if isinstance(value, complex | bytes | set | frozenset):
        raise ValueError(f"a {type(value).__name__} has no JSON form")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a finite number")
    return json_value(value)


@register_parser("pythonic", "llama4_pythonic")
class PythonicParser(ToolCallParser):
    """A turn that is a Python list of calls, ``[f(a=1, b='x'), g()]``, optionally inside
    ``<|python_start|>…<|python_end|>`` (Llama 4). Read with :func:`ast.parse`; keyword values must be literals.

    A turn that does not start (after the optional tag) with ``[NAME(`` is a plain answer. One that does must be
    exactly the list: a syntax error, text around it, a positional argument, a non-literal value (a name, an
    expression, a call) or a literal with no JSON form (bytes, a set, 1e999) is a parse error for that call or
    the turn (vLLM drops an unreadable call and keeps the others, or reads the whole turn as text).
    """

    stop_tokens = ("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>")
    template_markers = (("[func_name1(",),)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        s = body.strip()
        tagged = s.startswith(PY_START)
        if tagged:
            s = s[len(PY_START) :].strip()
            if s.endswith(PY_END):
                s = s[: -len(PY_END)].strip()
        if not _LOOKS_LIKE_CALLS.match(s):
            if tagged:
                return ParsedTurn("", [ToolCall("", raw=body, parse_error=f"{PY_START} not followed by [calls]")],
                                  reasoning)
            return ParsedTurn(s, [], reasoning)
        if len(s) > _MAX_LEN:
            return ParsedTurn("", [ToolCall("", raw=s[:2000], parse_error="pythonic tool calls too long")], reasoning)
        try:
            tree = ast.parse(s, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
            msg = getattr(e, "msg", str(e))
            return ParsedTurn("", [ToolCall("", raw=s, parse_error=f"not a Python list of calls: {msg}")], reasoning)
        if not isinstance(tree.body, ast.List):
            return ParsedTurn("", [ToolCall("", raw=s, parse_error="pythonic calls must be one [...] list")],
                              reasoning)
        return ParsedTurn("", [self._call(s, node) for node in tree.body.elts], reasoning)

    @staticmethod
    def _call(text: str, node: ast.expr) -> ToolCall:
        raw = ast.get_source_segment(text, node) or ""
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return ToolCall("", raw=raw, parse_error="each list element must be a call NAME(key=value, ...)")
        name = node.func.id
        if node.args:
            return ToolCall(name, raw=raw, parse_error=f"positional arguments in a call to {name!r}: use key=value")
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return ToolCall(name, raw=raw, parse_error=f"**-unpacking in a call to {name!r}")
            if kw.arg in args:
                return ToolCall(name, raw=raw, parse_error=f"argument {kw.arg!r} given twice")
            try:
                args[kw.arg] = _value(text, kw.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
                return ToolCall(name, raw=raw, parse_error=f"argument {kw.arg!r} of {name!r} is not a literal: {e}")
        return ToolCall(name, args, raw=raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        parts = [f"{n}(" + ", ".join(f"{k}={python_literal_text(v)}" for k, v in a.items()) + ")" for n, a in calls]
        return "[" + ", ".join(parts) + "]"
