"""A safe arithmetic calculator tool (no ``eval``): expressions are parsed with :mod:`ast` and only numbers,
``+ - * / // % **``, unary signs and parentheses are evaluated, with bounds on exponent and result size."""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

from toolgym.tools.base import ToolError, ToolErrorKind
from toolgym.tools.function import FunctionTool

__all__ = ["CalculatorError", "calculator_tool", "evaluate", "format_number"]

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000
MAX_DIGITS = 4000
MAX_LENGTH = 2000


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate (the message says why)."""


def _num(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError("non-finite number")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_num(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _num(node.left), _num(node.right)
        op = type(node.op)
        if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        if op is ast.Pow:
            if right.denominator != 1:
                raise CalculatorError("only integer exponents are supported")
            if abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("division by zero")
        out = _BIN[op](left, right)
        if len(str(out.numerator)) > MAX_DIGITS:
            raise CalculatorError("result too large")
        return Fraction(out)
    if isinstance(node, ast.Expression):
        return _num(node.body)
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """Evaluate an arithmetic ``expression`` exactly (as a :class:`~fractions.Fraction`).

    Accepts ``^`` as power, ``×``/``÷`` and thousands separators like ``1,234`` are not accepted (commas are
    ambiguous). Raises :class:`CalculatorError` for anything else.
    """
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression longer than {MAX_LENGTH} characters")
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").strip()
    if not text:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"invalid expression: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise CalculatorError("invalid expression") from None
    try:
        return _num(tree)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(x: Fraction) -> str:
    """An exact integer as digits; otherwise a decimal with up to 10 significant decimals."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10g}"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: an arithmetic expression with numbers, + - * / // % ** (or ^) and parentheses, e.g. "(12 + 3) * 4"
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:
        raise ToolError(str(e), kind=ToolErrorKind.EXCEPTION) from None


def calculator_tool(timeout_s: float | None = 5.0) -> FunctionTool:
    """The ``calculator`` tool (sync, pure: cacheable)."""
    return FunctionTool(calculator, timeout_s=timeout_s)
