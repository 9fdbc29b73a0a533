"""ToolExecutor: classification of every failure, caps, timeouts with cancellation, retries, cache."""

from __future__ import annotations

import asyncio
import time

import pytest

from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind
from toolgym.tools.executor import ToolCache, ToolExecutor
from toolgym.tools.function import tool


@tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


class Sleepy(Tool):
    name = "sleepy"
    parameters = {"type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]}

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.finished = 0
        self.running = 0
        self.max_running = 0

    async def acall(self, arguments):
        self.started += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(arguments["s"])
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        self.finished += 1
        return "slept"


class Flaky(Tool):
    name = "flaky"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, failures: int, retryable: bool = True) -> None:
        self.failures, self.retryable, self.calls = failures, retryable, 0

    async def acall(self, arguments):
        self.calls += 1
        if self.calls <= self.failures:
            raise ToolError("service busy", retryable=self.retryable)
        return f"ok after {self.calls}"


class Boom(Tool):
    name = "boom"

    async def acall(self, arguments):
        raise ZeroDivisionError("kaboom")


def test_tool_decorator_schema_comes_from_signature_and_docstring():
    assert add.name == "add"
    assert add.description == "Add two integers."
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"] == {"type": "integer", "description": "first addend"}


async def test_every_failure_kind_is_classified_and_answered():
    ex = ToolExecutor([add, Boom()])
    calls = [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("", raw="<tool_call>{oops", parse_error="invalid JSON"),
        ToolCall("nope", {}),
        ToolCall("add", {"a": "one", "b": 2}),
        ToolCall("add", {"a": 1}),
        ToolCall("boom", {}),
    ]
    results = await ex.run_many(calls)
    assert [r.call for r in results] == calls
    assert results[0].ok and results[0].content == "3"
    kinds = [r.error_kind for r in results[1:]]
    assert kinds == [
        ToolErrorKind.PARSE_ERROR,
        ToolErrorKind.UNKNOWN_TOOL,
        ToolErrorKind.INVALID_ARGUMENTS,
        ToolErrorKind.INVALID_ARGUMENTS,
        ToolErrorKind.EXCEPTION,
    ]
    assert "available: add, boom" in results[2].content
    assert "a: 'one' is not of type 'integer'" in results[3].content
    assert "'b' is a required property" in results[4].content
    assert "ZeroDivisionError: kaboom" in results[5].content
    assert all(r.content.startswith(f"Error ({r.error_kind.value})") for r in results[1:])
    assert ex.metrics.errors == {
        "parse_error": 1, "unknown_tool": 1, "invalid_arguments": 2, "exception": 1
    }


async def test_invalid_arguments_never_reach_the_tool():
    s = Sleepy()
    ex = ToolExecutor([s])
    r = await ex.run(ToolCall("sleepy", {"s": "long"}))
    assert r.error_kind is ToolErrorKind.INVALID_ARGUMENTS and s.started == 0


async def test_timeout_cancels_the_call_and_reports_timeout():
    s = Sleepy()
    s.timeout_s = 0.05
    ex = ToolExecutor([s])
    t0 = time.perf_counter()
    r = await ex.run(ToolCall("sleepy", {"s": 30}))
    assert time.perf_counter() - t0 < 5
    assert r.error_kind is ToolErrorKind.TIMEOUT and "timed out after 0.05 s" in r.content
    assert s.cancelled == 1 and s.finished == 0 and s.running == 0


async def test_global_and_per_tool_caps_bound_concurrency():
    s = Sleepy()
    ex = ToolExecutor([s], max_concurrency=8)
    await ex.run_many([ToolCall("sleepy", {"s": 0.01}) for _ in range(40)])
    assert s.max_running == 8 and s.finished == 40
    s2 = Sleepy()
    s2.max_concurrency = 3
    ex2 = ToolExecutor([s2], max_concurrency=100)
    await ex2.run_many([ToolCall("sleepy", {"s": 0.01}) for _ in range(20)])
    assert s2.max_running == 3 and ex2.metrics.max_in_flight == 3


async def test_many_concurrent_calls_overlap():
    s = Sleepy()
    ex = ToolExecutor([s], max_concurrency=1024)
    t0 = time.perf_counter()
    rs = await ex.run_many([ToolCall("sleepy", {"s": 0.05}) for _ in range(256)])
    elapsed = time.perf_counter() - t0
    assert all(r.ok for r in rs)
    assert elapsed < 256 * 0.05 / 10  # far less than sequential (12.8 s)
    assert s.max_running == 256


async def test_retryable_errors_are_retried_and_others_are_not():
    f = Flaky(failures=2)
    ex = ToolExecutor([f], max_retries=2, retry_backoff_s=0.001)
    r = await ex.run(ToolCall("flaky", {}))
    assert r.ok and r.content == "ok after 3" and r.attempts == 3 and ex.metrics.retries == 2
    f2 = Flaky(failures=5)
    r2 = await ToolExecutor([f2], max_retries=2, retry_backoff_s=0.001).run(ToolCall("flaky", {}))
    assert r2.error_kind is ToolErrorKind.EXCEPTION and f2.calls == 3 and "service busy" in r2.content
    f3 = Flaky(failures=1, retryable=False)
    r3 = await ToolExecutor([f3], max_retries=2).run(ToolCall("flaky", {}))
    assert r3.error_kind is ToolErrorKind.EXCEPTION and f3.calls == 1


async def test_cache_records_then_replays_by_canonical_arguments(tmp_path):
    log = tmp_path / "tools.jsonl"
    calls = {"n": 0}

    @tool
    def rand(seed: int, scale: float = 1.0) -> str:
        """A value that changes on every real call.

        Args:
            seed: a seed
            scale: a scale
        """
        calls["n"] += 1
        return f"value-{calls['n']}"

    rec = ToolExecutor([rand], cache=ToolCache(log, read=False))
    r1 = await rec.run(ToolCall("rand", {"seed": 1, "scale": 2.0}))
    assert r1.content == "value-1" and not r1.cached
    rep = ToolExecutor([rand], cache=ToolCache(log, write=False, strict=True))
    r2 = await rep.run(ToolCall("rand", {"scale": 2.0, "seed": 1}))  # same arguments, other key order
    assert r2.content == "value-1" and r2.cached and calls["n"] == 1
    miss = await rep.run(ToolCall("rand", {"seed": 2}))
    assert miss.error_kind is ToolErrorKind.EXCEPTION and "replay log" in miss.content and calls["n"] == 1
    mem = ToolExecutor([rand], cache=ToolCache())
    a = await mem.run(ToolCall("rand", {"seed": 3}))
    b = await mem.run(ToolCall("rand", {"seed": 3}))
    assert a.content == b.content and b.cached and mem.metrics.cache_hits == 1


async def test_replayed_content_is_encodable_text(tmp_path):
    """A replay log written elsewhere may hold a lone surrogate ("\\ud800" in its JSON): a hit is still
    encodable text, as every result is."""
    log = tmp_path / "tools.jsonl"
    log.write_text('{"tool": "add", "arguments": "{\\"a\\":1,\\"b\\":2}", "content": "bad \\ud800"}\n')
    rep = ToolExecutor([add], cache=ToolCache(log, write=False, strict=True))
    r = await rep.run(ToolCall("add", {"a": 1, "b": 2}))
    assert r.cached and r.error_kind is None and r.content == "bad \\ud800"
    r.content.encode("utf-8")


async def test_an_error_message_is_encodable_text():
    """A tool's error message carrying a lone surrogate (echoed from the model's JSON) is made encodable."""

    @tool
    def fails(text: str) -> str:
        """Fail with the text.

        Args:
            text: what to complain about
        """
        raise ValueError(f"bad {text}")

    r = await ToolExecutor([fails]).run(ToolCall("fails", {"text": "\ud800"}))
    assert r.error_kind is ToolErrorKind.EXCEPTION and r.content == "Error (exception): ValueError: bad \\ud800"
    r.content.encode("utf-8")


def test_duplicate_tool_names_are_rejected():
    with pytest.raises(ValueError, match="duplicate tool name"):
        ToolExecutor([add, tool(add.fn)])


class Ledger(Tool):
    """An episode's own tool (never registered): appends to a shared ledger, yielding to the loop first."""

    cacheable = False

    def __init__(self, name: str, ledger: list[str]) -> None:
        self.name, self.ledger = name, ledger

    async def acall(self, arguments):
        await asyncio.sleep(0.01 if self.name == "first" else 0)
        self.ledger.append(self.name)
        return f"{self.name} done"


def test_an_episodes_own_tools_run_in_order_under_the_executors_bookkeeping():
    ledger: list[str] = []
    own = {n: Ledger(n, ledger) for n in ("first", "second")}
    ex = ToolExecutor([add])
    calls = [ToolCall("first", {}), ToolCall("second", {}), ToolCall("add", {"a": 1, "b": 2}), ToolCall("nope", {})]
    results = asyncio.run(ex.run_many(calls, own, in_order=True))
    assert ledger == ["first", "second"]  # in the order given, though the first one yields longer
    assert [r.error_kind for r in results[:2]] == [None, None] and results[0].content == "first done"
    # the registry is not consulted for an episode's calls; an unknown name lists the episode's tools
    assert results[2].error_kind is ToolErrorKind.UNKNOWN_TOOL and results[3].error_kind is ToolErrorKind.UNKNOWN_TOOL
    assert "available: first, second" in results[3].content
    assert ex.metrics.calls["first"] == 1 and len(ex.metrics.latencies_s["second"]) == 1
    assert ex.metrics.errors["unknown_tool"] == 2
    ledger.clear()
    asyncio.run(ex.run_many(calls[:2], own))  # concurrently: the one that yields less finishes first
    assert ledger == ["second", "first"]
