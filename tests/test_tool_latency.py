"""``toolgym bench tools``: a user's own tools timed directly and through the executor, with their arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolgym.bench import load_calls, main, parse_call, percentile, tools_from_module

USER_TOOLS = '''
import asyncio

from toolgym import ToolError, tool


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    if key == "missing":
        raise ToolError("no such key")
    return key.upper()


@tool
async def wait(ms: int) -> str:
    """Wait.

    Args:
        ms: milliseconds to wait.
    """
    await asyncio.sleep(ms / 1000)
    return "done"
'''


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "user_tools.py"
    path.write_text(USER_TOOLS)
    return path


def test_a_user_module_is_timed_with_the_users_calls_and_errors_counted_by_kind(module: Path, tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "rows.json"
    rc = main(["--module", str(module), "--call", 'lookup={"key": "a"}', "--call", 'lookup={"key": "missing"}',
               "--call", 'wait={"ms": 20}', "--calls", "12", "--concurrency", "1,3", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [(r["tool"], r["concurrency"]) for r in rows] == [("lookup", 1), ("lookup", 3), ("wait", 1), ("wait", 3)]
    for r in rows[:2]:
        assert r["executor"]["errors"] == {"exception": 6} and r["direct"]["errors"] == {"exception": 6}
    for r in rows[2:]:  # a 20 ms wait takes at least 20 ms on either path
        assert r["direct"]["p50_ms"] >= 20 and r["executor"]["p50_ms"] >= 20 and r["executor"]["errors"] == {}
        assert r["executor"]["p50_ms"] <= r["executor"]["p95_ms"] <= r["executor"]["p99_ms"]
    text = capsys.readouterr().out
    assert "overhead ms" in text and "exception:6" in text
    assert json.loads(text.strip().splitlines()[-1])["toolgym_bench"] == "tools"


def test_bad_input_is_a_classified_exit(module: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["--module", str(tmp_path / "absent.py")]) == 3
    assert main(["--module", str(module)]) == 2  # no calls: the error lists the tools and their parameters
    assert "lookup(key)" in capsys.readouterr().err
    assert main(["--module", str(module), "--call", 'nope={}']) == 2
    with pytest.raises(SystemExit) as e:
        main(["--module", str(module), "--call", "lookup=[1]"])
    assert e.value.code == 2
    bad = tmp_path / "calls.jsonl"
    bad.write_text('{"name": "lookup", "arguments": {"key": "a"}}\n\n["x"]\n')
    with pytest.raises(ValueError, match=r"calls.jsonl:3"):
        load_calls(bad)
    assert main(["--module", f"{module}:nope"]) == 3  # NAMES after a colon pick tools
    assert "no tool named nope" in capsys.readouterr().err


def test_module_selection_parsing_and_percentiles(module: Path):
    assert {t.name for t in tools_from_module(str(module))} == {"lookup", "wait"}
    assert [t.name for t in tools_from_module(f"{module}:wait")] == ["wait"]
    assert parse_call('f={"a": 1}') == ("f", {"a": 1})
    with pytest.raises(ValueError):
        parse_call("f")
    xs = [float(i) for i in range(1, 101)]
    assert (percentile(xs, 0.5), percentile(xs, 0.95), percentile(xs, 0.99)) == (50.0, 95.0, 99.0)
    assert percentile([], 0.5) == 0.0


def test_an_env_is_timed_on_its_oracles_calls(tmp_path: Path):
    out = tmp_path / "rows.json"
    assert main(["--env", "Calculator-v0", "--episodes", "3", "--calls", "10", "--concurrency", "2",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["tool"], r["concurrency"]) for r in rows] == [("calculator", 2)]
    assert rows[0]["executor"]["errors"] == {}
