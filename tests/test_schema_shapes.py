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
    # str | int: qwen3_coder reads the first non-null branch (vLLM); GLM takes the JSON value the union admits
    label = "7" if family == "qwen3_coder" else 7
    assert got == {"place": {"city": "Paris", "zip": 75001}, "unit": "celsius", "days": 3, "mode": 3,
                   "code": 7, "label": label}
    assert type(got["code"]) is int and type(got["label"]) is type(label)


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
    # a string either way: qwen3_coder keeps the text (vLLM), GLM reads the JSON string (quotes lost once)
    assert _args(family, write(x='"42"'), params) == {"x": '"42"' if family == "qwen3_coder" else "42"}


# -- The engines' readings (vLLM; SGLang where vLLM is silent): the rules table in docs/families.md ------------------
GLM = [("glm45", _glm), ("glm47", _glm)]
ANY_JSON = {"anyOf": [{"type": "string"}, {"description": "any JSON value"}]}  # a branch without a type
WIDE = {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "null"}, {"type": "object"}]}
JSON_TEXTS = [("7", 7), ("false", False), ("null", None), ('{"ok": false}', {"ok": False})]


@pytest.mark.parametrize(("family", "write"), GLM)
@pytest.mark.parametrize(("text", "want"), JSON_TEXTS)
def test_glm_reads_a_value_with_an_untyped_branch_as_json(family, write, text, want):
    got = _args(family, write(x=text), {"type": "object", "properties": {"x": ANY_JSON}})
    assert got == {"x": want} and type(got["x"]) is type(want)


@pytest.mark.parametrize(("family", "write"), GLM)
@pytest.mark.parametrize(("text", "want"), JSON_TEXTS)
def test_glm_reads_json_a_union_admits_as_json(family, write, text, want):
    got = _args(family, write(x=text), {"type": "object", "properties": {"x": WIDE}})
    assert got == {"x": want} and type(got["x"]) is type(want)


@pytest.mark.parametrize(("family", "write"), GLM)
def test_glm_keeps_the_text_of_json_a_union_does_not_admit(family, write):
    params = {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                                  "e": {"enum": ["7", 8]}}}
    assert _args(family, write(x="[1, 2]", e="7"), params) == {"x": "[1, 2]", "e": "7"}
    assert _args(family, write(x="true", e="8"), params) == {"x": "true", "e": 8}


@pytest.mark.parametrize(("family", "write"), GLM)
def test_glm_json_string_in_a_union_loses_its_quotes_once(family, write):
    params = {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                                  "s": {"type": "string"}}}
    got = _args(family, write(x='"say \\"hi\\""', s='"say \\"hi\\""'), params)
    # the union reads the JSON string; a string-only parameter keeps its text verbatim (vLLM; SGLang unquotes it)
    assert got == {"x": 'say "hi"', "s": '"say \\"hi\\""'}


@pytest.mark.parametrize("value", ["7", '{"ok": false}', '"quoted"'])
def test_qwen3_coder_keeps_text_for_untyped_and_string_first_unions_as_vllm_does(value):
    params = {"type": "object", "properties": {"x": ANY_JSON, "y": {}, "z": WIDE}}
    assert _args("qwen3_coder", _qwen(x=value, y=value, z=value), params) == {"x": value, "y": value, "z": value}


TAGGED = {"type": "object", "oneOf": [
    {"properties": {"kind": {"const": "json"}, "body": {"type": "object"}, "n": {"type": "integer"}}},
    {"properties": {"kind": {"const": "text"}, "body": {"type": "string"}, "n": {"type": "string"}}},
]}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_root_union_branch_is_picked_by_the_sibling_already_read(family, write):
    got = _args(family, write(kind="text", body='{"x":1}', n="7"), TAGGED)
    assert got == {"kind": "text", "body": '{"x":1}', "n": "7"}  # the string branch keeps the raw text
    got = _args(family, write(kind="json", body='{"x":1}', n="7"), TAGGED)
    assert got == {"kind": "json", "body": {"x": 1}, "n": 7}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_root_union_sibling_written_later_picks_the_branch_too(family, write):
    # a sibling whose reading needs no branch (a text) counts wherever it is written
    assert _args(family, write(n="7", body='{"x": 1}', kind="text"), TAGGED) == {"n": "7", "body": '{"x": 1}',
                                                                                    "kind": "text"}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
def test_root_union_pydantic_discriminated_models(family, write):
    class Num(BaseModel):
        kind: Literal["num"]
        value: int

    class Word(BaseModel):
        kind: Literal["word"]
        value: str

    params = {"oneOf": [Num.model_json_schema(), Word.model_json_schema()]}
    assert _args(family, write(kind="word", value="42"), params) == {"kind": "word", "value": "42"}
    assert _args(family, write(kind="num", value="42"), params) == {"kind": "num", "value": 42}


# -- Readings where the engines differ: vLLM where its GLM / Qwen3-Coder parsers have a rule, else SGLang ------------
CATCH_ALL = {"type": "object", "required": ["kind", "payload"], "oneOf": [
    {"properties": {"kind": {"const": "json"}, "payload": {"type": "object"}}},
    {"properties": {"kind": {"const": "list"}, "payload": {"type": "array"}}},
    {"properties": {"kind": {"const": "raw"}, "payload": {"type": "string"}}},  # the catch-all branch
]}


@pytest.mark.parametrize(("family", "write"), FAMILIES)
@pytest.mark.parametrize("kind_first", [True, False])
def test_root_union_catch_all_branch_keeps_the_text(family, write, kind_first):
    pairs = [("kind", "raw"), ("payload", '{"x":1}')]
    got = _args(family, write(**dict(pairs if kind_first else pairs[::-1])), CATCH_ALL)
    assert got == {"kind": "raw", "payload": '{"x":1}'}
    assert _args(family, write(kind="json", payload='{"x":1}'), CATCH_ALL) == {"kind": "json", "payload": {"x": 1}}


@pytest.mark.parametrize(("family", "write"), GLM)
@pytest.mark.parametrize("kind_first", [True, False])
def test_glm_root_union_quoted_discriminator_is_its_text(family, write, kind_first):
    # vLLM reads a parameter only a root union declares as untyped JSON, SGLang unquotes a string parameter's JSON
    # string: both give the discriminator raw, so the catch-all branch keeps the payload's text
    pairs = [("kind", '"raw"'), ("payload", '{"x":1}')]
    got = _args(family, write(**dict(pairs if kind_first else pairs[::-1])), CATCH_ALL)
    assert got == {"kind": "raw", "payload": '{"x":1}'}


def test_qwen3_coder_root_union_quoted_discriminator_stays_text_as_vllm_reads_it():
    got = _args("qwen3_coder", _qwen(kind='"raw"', payload="abc"), CATCH_ALL)
    assert got == {"kind": '"raw"', "payload": "abc"}  # no branch fits: the schema check reports it


NULLABLE_TEXT = [{"type": ["string", "null"]}, {"anyOf": [{"type": "string"}, {"type": "null"}]},
                 {"enum": ["value", None], "type": ["string", "null"]}]


@pytest.mark.parametrize(("family", "write"), GLM)
@pytest.mark.parametrize("spec", NULLABLE_TEXT)
def test_glm_nullable_string_keeps_null_as_text_as_vllm_does(family, write, spec):
    # vLLM's GLM parsers read a parameter whose types are a string (and null) verbatim; SGLang's GLM-4.7 detector
    # reads null there: toolgym follows vLLM
    params = {"type": "object", "properties": {"s": spec, "u": {}}}
    assert _args(family, write(s="null", u="null"), params) == {"s": "null", "u": None}
    assert _args(family, write(s='"null"', u='"null"'), params) == {"s": '"null"', "u": "null"}


ESCAPED = '"\\C|\\."'  # a quoted value with escapes JSON does not know


@pytest.mark.parametrize(("family", "write"), FAMILIES)
@pytest.mark.parametrize("warning_filter", ["default", "error"])
def test_unknown_escape_reads_the_same_under_any_warning_filter(family, write, warning_filter):
    import warnings

    params = {"type": "object", "properties": {"s": {"type": "string"}, "t": {"type": ["string", "null"]}}}
    if family != "qwen3_coder":
        params["properties"]["t"] = {}  # GLM: an untyped parameter reads JSON, then a Python literal
    with warnings.catch_warnings():
        warnings.simplefilter(warning_filter)
        got = _args(family, write(s=ESCAPED, t=ESCAPED), params)
    # a string parameter keeps its text verbatim (vLLM); the literal reading keeps the unknown escapes, quotes gone
    assert got == {"s": ESCAPED, "t": "\\C|\\."}


@pytest.mark.parametrize(("family", "write"), GLM)
def test_glm_does_not_coerce_a_quoted_number_and_the_schema_check_refuses_it(family, write):
    from toolgym.format.families.schema_types import validates

    specs = {"n": {"type": "integer"}, "e": {"type": "integer", "enum": [1, 2]}}
    got = _args(family, write(n='"42"', e='"2"'), {"type": "object", "properties": specs})
    # vLLM reads the JSON string and coerces nothing (SGLang's GLM-4.7 detector makes 42 and 2 of them)
    assert got == {"n": "42", "e": "2"}
    assert not any(validates(got[k], specs[k]) for k in specs)  # invalid_arguments, never another call
    assert _args(family, write(n="42", e="2"), {"type": "object", "properties": specs}) == {"n": 42, "e": 2}


@pytest.mark.parametrize("family", ["glm45", "glm47"])
def test_glm_call_without_separator_after_the_name_is_made(family):
    # vLLM's glm4_moe test_extract_tool_call_without_newline_after_name: a call (SGLang's glm4_moe finds none)
    text = "<tool_call>f<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>n</arg_key><arg_value>3</arg_value></tool_call>"
    assert _args(family, text, {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}) \
        == {"city": "Paris", "n": 3}
