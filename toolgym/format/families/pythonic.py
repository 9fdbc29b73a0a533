"""Pythonic calls (Llama 3.2 / Llama 4): ``[get_weather(city="Paris"), f(x=1)]``, read with :mod:`ast`.

Nothing is evaluated: the turn is parsed into a syntax tree, and each keyword's value is read from its node in
the manner of ``ast.literal_eval``, narrowed to what vLLM's pythonic parser reads: constants (strings, numbers,
booleans, ``None``), lists and dicts with constant keys. A tuple, a set or a unary minus (``-3``) is refused,
as vLLM refuses them.
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
#: a function or keyword name vLLM's pattern accepts: an ASCII letter first
_NAME = re.compile(r"[A-Za-z]\w*")
_MAX_LEN = 200_000


def python_literal_text(v: Any) -> str:
    """A JSON value written as the Python literal a pythonic call uses (``True``, ``None``, ``'text'``)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{python_literal_text(k)}: {python_literal_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(python_literal_text(x) for x in v) + "]"
    return repr(v)


def _literal(node: ast.expr, depth: int = 0) -> Any:
    """A constant, a list or a dict with constant keys, as vLLM's pythonic parser reads values (a tuple, a set,
    a unary minus or any expression is refused there: ValueError here)."""
    if depth > 64:
        raise ValueError("value nested too deeply")
    if isinstance(node, ast.Constant):
        v = node.value
        if v is not None and not isinstance(v, str | int | float):
            raise ValueError(f"a {type(v).__name__} has no JSON form")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("not a finite number")
        return v
    if isinstance(node, ast.List):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise ValueError("dict keys must be literals")
        return {_literal(k, depth + 1): _literal(v, depth + 1) for k, v in zip(node.keys, node.values, strict=True)}
    kind = "a negative number" if isinstance(node, ast.UnaryOp) else f"a {type(node).__name__}"
    raise ValueError(f"{kind}: only constants, lists and dicts are read")


def _value(text: str, node: ast.expr) -> Any:
    """A keyword's value: a literal only (ValueError otherwise, or when it has no JSON form)."""
    value = _literal(node)
    reject_underscored_numbers(text, node)
    return json_value(value)


@register_parser("pythonic", "llama4_pythonic")
class PythonicParser(ToolCallParser):
    """A turn that is a Python list of calls, ``[f(a=1, b='x'), g()]``, optionally inside
    ``<|python_start|>…<|python_end|>`` (Llama 4). Read with :func:`ast.parse`; keyword values must be literals.

    A turn that does not start (after the optional tag) with ``[NAME(`` is a plain answer. One that does must be
    exactly the list: a syntax error, leading whitespace, text around it, a positional argument, a name starting
    with ``_``, a value other than a constant, list or dict (a name, a call, a tuple, ``-3``) or one with no JSON
    form (bytes, ``1e999``) is a parse error for that call or the turn (vLLM drops an unreadable call and keeps
    the others, or reads the whole turn as text).
    """

    stop_tokens = ("<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>")
    template_markers = (("[func_name1(",),)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        s = body.strip() if reasoning else body.rstrip()
        if s[:1].isspace() and _LOOKS_LIKE_CALLS.match(s.lstrip()):
            return ParsedTurn("", [ToolCall("", raw=s, parse_error="pythonic calls must start the turn (no leading "
                                            "whitespace; vLLM reads the turn as text)")], reasoning)
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
        if not _NAME.fullmatch(name):
            return ToolCall("", raw=raw, parse_error=f"a function name must start with a letter, got {name!r}")
        if node.args:
            return ToolCall(name, raw=raw, parse_error=f"positional arguments in a call to {name!r}: use key=value")
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return ToolCall(name, raw=raw, parse_error=f"**-unpacking in a call to {name!r}")
            if not _NAME.fullmatch(kw.arg):
                return ToolCall(name, raw=raw, parse_error=f"an argument name must start with a letter: {kw.arg!r}")
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
