"""Tool-call parsers: strictness on known inputs, and a hypothesis fuzz (>= 10,000 cases) proving that no
exception escapes and that every malformed call is reported and answered with a classified error."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolgym.format.parsers import get_parser, list_parsers
from toolgym.tools.base import ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.function import tool


@tool
def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: what to echo
    """
    return text


def test_registry_has_hermes_and_llama3():
    assert {"hermes", "qwen", "llama3"} <= set(list_parsers())
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        get_parser("nope")


@pytest.mark.parametrize(
    ("text", "n_ok", "errors"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', 1, []),
        ('Let me check.\n<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}</tool_call>', 2, []),
        ("<tool_call>{'name': 'f'}</tool_call>", 0, ["invalid JSON"]),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', 0, ["must be a JSON object"]),
        ('<tool_call>{"arguments": {}}</tool_call>', 0, ['non-empty string "name"']),
        ('<tool_call>["f"]</tool_call>', 0, ["must be a JSON object"]),
        ('<tool_call>{"name": "f", "arguments": {}}', 0, ["is not closed"]),
        ('<tool_call>{"name": "f"} {"name": "g"}</tool_call>', 0, ["extra text"]),
        ('done </tool_call>', 0, ["without a matching"]),
        ("<tool_call></tool_call>", 0, ["empty tool call"]),
        ('<tool_call>{"name": "a"}<tool_call>{"name": "b"}</tool_call>', 1, ["is not closed"]),
        ('<think>maybe <tool_call>{"name": "x"}</tool_call></think>The answer is 4.', 0, []),
    ],
)
def test_hermes_parser_is_strict_and_reports_each_malformed_call(text, n_ok, errors):
    parsed = get_parser("hermes").parse(text)
    ok = [c for c in parsed.calls if c.parse_error is None]
    bad = [c.parse_error for c in parsed.calls if c.parse_error is not None]
    assert len(ok) == n_ok
    assert len(bad) == len(errors)
    for msg, want in zip(bad, errors, strict=True):
        assert want in msg


def test_hermes_content_and_reasoning_are_separated():
    p = get_parser("hermes").parse('<think>plan</think>Sure.\n<tool_call>{"name": "f", "arguments": {"a": 2}}</tool_call>')
    assert p.reasoning == "plan" and p.content == "Sure." and p.calls[0].arguments == {"a": 2}


@pytest.mark.parametrize(
    ("text", "names", "errors"),
    [
        ('{"name": "f", "parameters": {"x": 1}}', ["f"], 0),
        ('<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"y": 2}}', ["f", "g"], 0),
        ("The answer is 12.", [], 0),
        ('{"name": "f", "parameters": {"x": 1}', [], 1),
        ('{"name": "f", "parameters": {}} and more', ["f"], 1),
        ("<|python_tag|>print(1)", [], 1),
    ],
)
def test_llama3_parser(text, names, errors):
    parsed = get_parser("llama3").parse(text)
    assert [c.name for c in parsed.calls if c.parse_error is None] == names
    assert parsed.n_malformed == errors


@pytest.mark.parametrize("family", ["hermes", "llama3"])
def test_format_calls_round_trips(family):
    p = get_parser(family)
    calls = [("search", {"query": "capital of France", "k": 3}), ("calc", {"expression": "1+2"})]
    parsed = p.parse(p.format_calls(calls))
    assert [(c.name, c.arguments) for c in parsed.calls] == calls


_json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", '"f"', "[", "]", "\n", " ",
     "<think>", "</think>", "<|python_tag|>", ";", '"parameters"', '"', "\\", "null", "1e999", "\x00", "é"]
)
_texts = st.one_of(
    st.text(max_size=200),
    st.lists(_fragments | st.text(max_size=6), max_size=40).map("".join),
    st.builds(
        lambda obj, pre, post: f"{pre}<tool_call>{json.dumps(obj)}</tool_call>{post}",
        _json_like, st.text(max_size=10), st.text(max_size=10),
    ),
    st.builds(lambda obj: json.dumps(obj), _json_like),
)


_executor = ToolExecutor([echo])
_loop = asyncio.new_event_loop()


@settings(max_examples=10_000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(text=_texts)
def test_fuzz_no_exception_escapes_and_every_call_gets_one_classified_answer(text):
    """10,000 generated turns, each parsed by both families; every call is then executed."""
    for family in ("hermes", "llama3"):
        parsed = get_parser(family).parse(text)
        assert isinstance(parsed.content, str)
        results = _loop.run_until_complete(_executor.run_many(parsed.calls))
        assert len(results) == len(parsed.calls)
        for call, r in zip(parsed.calls, results, strict=True):
            assert r.call is call
            if call.parse_error is not None:
                assert isinstance(call.parse_error, str) and call.parse_error
                assert r.error_kind is ToolErrorKind.PARSE_ERROR and call.parse_error in r.content
            else:
                assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)
                if call.name != "echo":
                    assert r.error_kind is ToolErrorKind.UNKNOWN_TOOL
                else:
                    assert r.ok or r.error_kind is ToolErrorKind.INVALID_ARGUMENTS
