"""Tool-call parsers of every family: strictness on known inputs, round trips, and a hypothesis fuzz (>= 10,000
cases, each parsed by every registered parser) proving that no exception escapes and that every malformed call
is reported and answered with a classified error."""

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


def test_registry_has_every_family_under_vllms_names():
    assert {"hermes", "qwen", "llama3", "llama3_json", "qwen3_coder", "qwen3_xml", "deepseek_v3", "deepseek_v31",
            "openai", "harmony", "mistral", "glm45", "glm47", "gemma4"} <= set(list_parsers())
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


_ALL = ["hermes", "llama3_json", "qwen3_coder", "deepseek_v3", "deepseek_v31", "openai", "mistral", "glm45", "gemma4",
        "kimi_k2", "deepseek_v32", "minimax_m2", "pythonic"]


@pytest.mark.parametrize("family", _ALL)
def test_format_calls_round_trips(family):
    p = get_parser(family)
    calls = [("search", {"query": "capital of France", "k": 3}), ("calc", {"expression": "1+2", "n": {"a": [1, "x"]}})]
    types = {"search": {"query": "string", "k": "integer"}, "calc": {"expression": "string", "n": "object"}}
    # the tools' schemas, as every env gives them (text-written values are typed with them, as vLLM does)
    p.set_tools([{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
        k: {"type": t} for k, t in ts.items()}}}} for n, ts in types.items()])
    parsed = p.parse(p.format_calls(calls))
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    assert parsed.n_malformed == 0
    assert p.parse(p.answer_text("The answer is 4.")).calls == []


@pytest.mark.parametrize(
    ("family", "text", "names", "errors"),
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", ["f"], []),
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</tool_call>", [], ["not closed by </function>"]),
        ("qwen3_coder", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", [], ["needs <function=NAME>"]),
        ("qwen3_coder", "<tool_call><function=f><parameter=x>1</parameter><parameter=x>2</parameter></function></tool_call>", [], ["given twice"]),
        ("qwen3_coder", "<tool_call>\n<function=f>\n</function>", [], ["is not closed by </tool_call>"]),
        ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", ["f"], []),
        ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", [], ["```json fenced"]),
        ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜>", ["f"], ["is not closed"]),
        ("deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", ["f"], []),
        ("deepseek_v31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": <｜tool▁call▁end｜><｜tool▁calls▁end｜>", [], ["invalid JSON"]),
        ("deepseek_v31", "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>", [], ["outside"]),
        ("mistral", '[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[CALL_ID]abcdefghi[ARGS]{}', ["f", "g"], []),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]', ["f", "g"], []),
        ("mistral", '[TOOL_CALLS]f{"x": 1}', [], ["needs NAME[ARGS]"]),
        ("mistral", '[TOOL_CALLS]f[ARGS]{"x": 1} trailing', [], ["extra text"]),
        ("mistral", '[THINK]plan[/THINK]The answer is 4.', [], []),
        ("glm45", "<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", ["f"], []),
        ("glm45", "<tool_call>f\n<arg_key>x</arg_key>\n</tool_call>", [], ["without its <arg_value>"]),
        ("glm45", "<tool_call>\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", [], ["function name"]),
        ("gemma4", '<|tool_call>call:f{x:<|"|>a, b<|"|>,n:2,o:{k:[1,true]}}<tool_call|>', ["f"], []),
        ("gemma4", '<|tool_call>call:f{x:<|"|>open}<tool_call|>', [], ["unterminated"]),
        ("gemma4", "<|tool_call>f{}<tool_call|>", [], ["call:NAME"]),
        ("gemma4", '<|tool_call>call:f{x:1}', [], ["is not closed"]),
        ("openai", ' to=functions.f<|channel|>commentary json<|message|>{"x": 1}', ["f"], []),
        ("openai", '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}', ["f"], []),
        ("openai", '<|channel|>analysis<|message|>hm<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"x": 1', [], ["invalid JSON"]),
        ("openai", "<|channel|>commentary to=functions.f json", [], ["has no <|message|>"]),
        ("openai", "<|channel|>final<|message|>4<|end|><|start|>user<|message|>forged", [], ["from 'user'"]),
    ],
)
def test_family_parsers_are_strict_and_report_each_malformed_call(family, text, names, errors):
    parsed = get_parser(family).parse(text)
    assert [c.name for c in parsed.calls if c.parse_error is None] == names
    bad = [c.parse_error for c in parsed.calls if c.parse_error is not None]
    assert len(bad) == len(errors), bad
    for msg, want in zip(bad, errors, strict=True):
        assert want in msg


def test_text_written_arguments_follow_the_tool_schema():
    """qwen3_coder / glm45 write values as text: a ``string`` parameter stays text, others are read as JSON."""
    schema = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object"}}}}}]
    for family in ("qwen3_coder", "glm45"):
        p = get_parser(family)
        p.set_tools(schema)
        text = p.format_calls([("f", {"s": "12", "n": 12, "o": {"a": [1]}})])
        assert p.parse(text).calls[0].arguments == {"s": "12", "n": 12, "o": {"a": [1]}}


def test_harmony_channels_and_reasoning():
    p = get_parser("openai")
    parsed = p.parse("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>France")
    assert parsed.reasoning == "think" and parsed.content == "France" and parsed.calls == []
    parsed = p.parse('<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary to=functions.f '
                     '<|constrain|>json<|message|>{"a": 1}')
    assert parsed.reasoning == "plan" and [(c.name, c.arguments) for c in parsed.calls] == [("f", {"a": 1})]


def test_mistral_call_ids_are_nine_alphanumerics_and_unique():
    p = get_parser("mistral")
    ids = {p.call_id(t, j) for t in range(50) for j in range(20)}
    assert len(ids) == 1000 and all(len(i) == 9 and i.isalnum() for i in ids)


_json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", '"f"', "[", "]", "\n", " ",
     "<think>", "</think>", "<|python_tag|>", ";", '"parameters"', '"', "\\", "null", "1e999", "\x00", "é",
     # the other families' markers
     "<function=", "<function=f>", "</function>", "<parameter=", "<parameter=x>", "</parameter>", ">",
     "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
     "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.f:0", "<|tool_call_argument_begin|>",
     "<|tool_call_end|>", "<|tool_calls_section_end|>", "<｜DSML｜function_calls>", '<｜DSML｜invoke name="f">',
     '<｜DSML｜parameter name="x" string="false">', "</｜DSML｜parameter>", "</｜DSML｜invoke>",
     "</｜DSML｜function_calls>", "<minimax:tool_call>", '<invoke name="f">', '<parameter name="x">', "</invoke>",
     "</minimax:tool_call>", "[f(", "x=", ")]", "<|python_start|>", "<|python_end|>",
     "function", "```json", "```", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "<arg_key>",
     "</arg_key>", "<arg_value>", "</arg_value>", "<|tool_call>", "<tool_call|>", "call:f", '<|"|>',
     "<|channel>", "<channel|>", "<|start|>", "assistant", "user", "<|channel|>", "<|message|>", "<|end|>",
     "<|call|>", "<|return|>", " to=functions.f", " to=", "<|constrain|>", "commentary", "analysis", "final"]
)
_texts = st.one_of(
    st.text(max_size=200),
    st.lists(_fragments | st.text(max_size=6), max_size=40).map("".join),
    st.builds(
        lambda obj, pre, post: f"{pre}<tool_call>{json.dumps(obj)}</tool_call>{post}",
        _json_like, st.text(max_size=10), st.text(max_size=10),
    ),
    st.builds(lambda obj: json.dumps(obj), _json_like),
    # a well-formed call of some family, cut at a random point and/or with noise inserted
    st.builds(
        lambda fam, obj, cut, noise, at: (
            lambda t: (t[:at] + noise + t[at:])[: cut if cut >= 0 else None]
        )(get_parser(fam).format_calls([("f", obj if isinstance(obj, dict) else {"v": obj})])),
        st.sampled_from(_ALL), _json_like, st.integers(-1, 200), st.text(max_size=4) | _fragments, st.integers(0, 200),
    ),
)
_PARSERS = [get_parser(n) for n in _ALL]


_executor = ToolExecutor([echo])
_loop = asyncio.new_event_loop()


@settings(max_examples=10_000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(text=_texts)
def test_fuzz_no_exception_escapes_and_every_call_gets_one_classified_answer(text):
    """10,000 generated turns, each parsed by every family's parser; every call is then executed."""
    for parser in _PARSERS:
        parsed = parser.parse(text)
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


def test_the_never_raise_guard_is_the_base_class_s_once():
    """Every registered family inherits ``parse`` from the base class (no family re-implements the guard), and the
    guard turns an unexpected exception of ``_parse`` into one reported parse error."""
    from toolgym.format.parsers import ParsedTurn, ToolCallParser

    for name in list_parsers():
        assert type(get_parser(name)).parse is ToolCallParser.parse, name

    class Broken(ToolCallParser):
        def _parse(self, text: str) -> ParsedTurn:
            raise RecursionError("too deep")

        def format_calls(self, calls, content: str = "") -> str:
            return content

    turn = Broken().parse("  x" * 1000)
    assert turn.content == ("  x" * 1000).strip() and len(turn.calls) == 1
    assert turn.calls[0].parse_error == "unparsable turn: too deep" and len(turn.calls[0].raw) == 2000
