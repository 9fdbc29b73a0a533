"""toolgym's parsers against vLLM's own non-streaming tool-parser test cases (data: ``tests/vllm_parser_cases.py``).

Every case is read by toolgym's parser of the same name (given the same tools) and classified: ``agree`` (the
same calls), ``stricter`` (a parse error where vLLM recovers a call or reads text, and every call toolgym makes is
one of vLLM's, in order), ``text`` (no call where vLLM finds one) or ``wrong`` (a call vLLM would not make, or
other arguments). No case may be wrong, and each must be what the data file says (the docs list the stricter
and text cases per parser: ``docs/families.md``)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.vllm_cases import CASES, SOURCES, Case
from tests.vllm_cases.base import tool as tool_schema
from toolgym.format.parsers import get_parser, list_parsers


def classify(case: Case, name: str) -> str:
    parser = get_parser(name)
    parser.set_tools(case.tools)
    parsed = parser.parse(case.text)
    made = [(c.name, c.arguments) for c in parsed.calls if c.parse_error is None]
    errors = [c for c in parsed.calls if c.parse_error is not None]
    if made == list(case.vllm) and not errors:
        return "agree"
    it = iter(case.vllm)
    if not all(any(call == v for v in it) for call in made):  # not an in-order subsequence of vLLM's calls
        return "wrong"
    if errors:
        return "stricter"
    return "text" if not made else "wrong"  # fewer calls without telling the model would hide a call


_IDS = [f"{n}:{c.source}" for c in CASES for n in c.parsers]


@pytest.mark.parametrize(("name", "case"), [(n, c) for c in CASES for n in c.parsers], ids=_IDS)
def test_vllm_case(name, case):
    got = classify(case, name)
    assert got != "wrong", f"{name} makes a call vLLM would not make on {case.source}"
    assert got == case.toolgym, f"{case.source}: {got}, expected {case.toolgym}"
    assert (case.toolgym == "agree") == (not case.why), "a stricter or text case says why; an agreeing one does not"


def test_every_case_names_a_registered_parser_and_a_recorded_source():
    assert {n for c in CASES for n in c.parsers} <= set(list_parsers())
    assert {c.source.split("::")[0] for c in CASES} <= set(SOURCES)
    assert len({(n, c.source) for c in CASES for n in c.parsers}) == len(_IDS)  # ids are unique


def counts() -> dict[str, Counter[str]]:
    """Per parser name: how many cases agree / are stricter / read as text / are wrong (for the docs)."""
    out: dict[str, Counter[str]] = {}
    for c in CASES:
        for n in c.parsers:
            out.setdefault(n, Counter())[classify(c, n)] += 1
    return out


if __name__ == "__main__":  # the table in docs/families.md
    for name, cnt in sorted(counts().items()):
        print(f"{name}: " + ", ".join(f"{k} {cnt[k]}" for k in ("agree", "stricter", "text", "wrong")))


def _one(name: str, text: str, tools: list) -> tuple:
    p = get_parser(name)
    p.set_tools(tools)
    (call,) = p.parse(text).calls
    return call.name, call.arguments, call.parse_error


def _qcall(name: str, key: str, value: str) -> str:
    return f"<tool_call>\n<function={name}>\n<parameter={key}>\n{value}\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("spec", "value", "want"),
    [
        ({"type": ["integer", "null"]}, "4.5", 4.5),  # a type list: read as a Python literal, as vLLM does
        ({"type": ["string", "null"]}, "hello", "hello"),
        ({"type": ["integer", "null"]}, "None", None),
        ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, "7", 7),  # oneOf read like anyOf (vLLM: text)
        ({"type": "number"}, "2.0", 2),
        ({"type": "number"}, "nan", "nan"),
        ({"type": "integer"}, "x", "x"),
        ({"type": "object"}, "{'a': (1, 2)}", {"a": [1, 2]}),
        ({"type": "array"}, '"[1, 2]"', [1, 2]),
        ({}, "42", "42"),  # a schema without a type is text
    ],
)
def test_qwen3_coder_types_values_as_vllm_does(spec, value, want):
    name, args, err = _one("qwen3_coder", _qcall("f", "x", value), [tool_schema("f", x=spec)])
    assert err is None and args == {"x": want} and type(args["x"]) is type(want)


@pytest.mark.parametrize(
    ("spec", "value", "error"),
    [
        ({"type": "boolean"}, "yes", "expected true or false"),  # vLLM would guess false
        ({"type": "number"}, "1e999", "not a finite number"),  # vLLM's turn fails: no call
        ({"type": "object"}, "{1, 2}", "no JSON form"),  # a Python set: vLLM's turn fails
    ],
)
def test_qwen3_coder_reports_values_vllm_would_guess_or_fail_on(spec, value, error):
    _, _, err = _one("qwen3_coder", _qcall("f", "x", value), [tool_schema("f", x=spec)])
    assert err is not None and error in err


def test_qwen3_coder_names_and_parameters_outside_the_schema():
    # a parameter the schema lacks stays text; without any schema every value is text (vLLM: the same)
    assert _one("qwen3_coder", _qcall("f", "y", "42"), [tool_schema("f", x={"type": "integer"})])[1] == {"y": "42"}
    assert _one("qwen3_coder", _qcall("f", "x", "42"), [])[1] == {"x": "42"}
    for bad in ("{{ tc.name }}", "get weather", "f'", ""):
        assert _one("qwen3_coder", _qcall(bad, "x", "1"), [])[2] is not None


@pytest.mark.parametrize(
    ("spec", "value", "want"),
    [
        ({"type": ["string", "null"]}, "42", "42"),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "42", "42"),
        ({"type": "integer"}, "True", True),  # not JSON but a Python literal, as vLLM reads it
        ({"type": "object"}, "{'a': 1}", {"a": 1}),
        ({}, "2025-08-01", "2025-08-01"),
    ],
)
def test_glm_types_values_as_vllm_does(spec, value, want):
    text = f"<tool_call>f<arg_key>x</arg_key><arg_value>{value}</arg_value></tool_call>"
    assert _one("glm45", text, [tool_schema("f", x=spec)])[1] == {"x": want}


def test_docs_table_has_these_counts():
    """docs/families.md lists the counts per parser; they must be what the cases give."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "families.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[1].isdigit():
            for name in cells[0].replace("`", "").split(" / "):
                rows[name] = [int(c) for c in cells[1:]]
    got = {n: [c[k] for k in ("agree", "stricter", "text", "wrong")] for n, c in counts().items()}
    assert rows == got


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=f>\n<parameter=x>\n" + "a</parameter>b" * 20000 + "\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=x>\n</parameter>\n" * 3000,
        "<tool_call>\n<function=f>\n<parameter=x>\n" + "</parameter>\n<parameter=zz" * 10000,
    ],
    ids=["closes-in-a-value", "unclosed-blocks", "unknown-params"],
)
def test_qwen3_coder_tag_walk_stays_fast_on_adversarial_text(text):
    """Telling tags from tag text walks each tag once (a quadratic walk took 20+ s on these; linear: ~0.2 s)."""
    import time

    p = get_parser("qwen3_coder")
    p.set_tools([tool_schema("f", x={"type": "string"}, y={"type": "string"})])
    t0 = time.perf_counter()
    p.parse(text)
    assert time.perf_counter() - t0 < 10
