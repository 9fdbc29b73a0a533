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
