"""Text-valued families (qwen3_coder, glm45/glm47) type values with the schema shapes real tools emit."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import toolgym.format  # noqa: F401 - registers the families
from toolgym.format.parsers import get_parser


class Unit(StrEnum):
    c = "celsius"
    f = "fahrenheit"


class Place(BaseModel):
    city: str
    zip: int


class Weather(BaseModel):
    place: Place  # $ref into $defs
    unit: Unit  # $ref to an enum definition
    days: int | None = None  # anyOf [integer, null]
    mode: Literal[3]  # const without a type
    code: int | str  # anyOf [integer, string]: the union rule
    label: str | int  # anyOf [string, integer]


def _tools(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": params}}]


def _qwen(**args: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def _glm(**args: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in args.items())
    return f"<tool_call>f\n{body}</tool_call>"


def _args(family: str, text: str, params: dict[str, Any]) -> dict[str, Any]:
    p = get_parser(family)
    p.set_tools(_tools(params))
    (call,) = p.parse(text).calls
    assert call.parse_error is None
    return call.arguments


FAMILIES = [("qwen3_coder", _qwen), ("glm45", _glm), ("glm47", _glm)]


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_pydantic_schema_refs_consts_and_unions_are_typed(family, write):
    params = Weather.model_json_schema()
    assert "$defs" in params  # the shapes under test are really there
    got = _args(family, write(place='{"city": "Paris", "zip": 75001}', unit="celsius", days="3", mode="3",
                              code="7", label="7"), params)
    assert got == {"place": {"city": "Paris", "zip": 75001}, "unit": "celsius", "days": 3, "mode": 3,
                   "code": 7, "label": "7"}
    assert type(got["code"]) is int and type(got["label"]) is str


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_union_falls_to_the_first_branch_that_validates(family, write):
    params = {"type": "object", "properties": {"x": {"type": ["integer", "string"]}}}
    assert _args(family, write(x="7"), params) == {"x": 7}
    assert _args(family, write(x="seven"), params) == {"x": "seven"}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_root_oneof_and_nested_anyof_are_typed(family, write):
    params = {"oneOf": [
        {"type": "object", "properties": {"n": {"anyOf": [{"anyOf": [{"type": "integer"}]}, {"type": "null"}]}}},
        {"type": "object", "properties": {"flag": {"enum": [True, False]}}},
    ]}
    assert _args(family, write(n="5", flag="true"), params) == {"n": 5, "flag": True}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_large_integers_stay_exact(family, write):
    params = {"type": "object", "properties": {"n": {"type": "number"}, "i": {"type": "integer"}}}
    got = _args(family, write(n="9007199254740993", i="9007199254740993"), params)
    assert got == {"n": 9007199254740993, "i": 9007199254740993}


def test_number_with_fraction_stays_a_float():
    got = _args("qwen3_coder", _qwen(n="2.5"), {"type": "object", "properties": {"n": {"type": "number"}}})
    assert got == {"n": 2.5}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_underscored_number_is_not_an_integer(family, write):
    params = {"type": "object", "properties": {"i": {"type": "integer"}, "u": {"type": ["integer", "null"]}},
              "additionalProperties": True}
    extra = {} if family == "qwen3_coder" else {"z": "123_456"}  # glm reads an undeclared value untyped
    got = _args(family, write(i="123_456", u="123_456", **extra), params)
    assert got == {"i": "123_456", "u": "123_456", **extra}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_quoted_value_of_an_integer_is_not_silently_an_integer_in_a_union(family, write):
    params = {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}
    assert _args(family, write(x='"42"'), params) == {"x": '"42"'}
