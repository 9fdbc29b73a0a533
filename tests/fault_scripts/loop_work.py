"""Unbounded work on the shared event loop, run in its own process by tests/test_faults_loop_and_output.py
(a backtracking pattern must not freeze the loop). Prints one JSON object: per case the result's
error kind, how long the call took and the longest the loop went without running a 20 ms ticker."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from toolgym.tools.base import Tool, ToolCall
from toolgym.tools.executor import ToolExecutor


class Pattern(Tool):
    """A tool whose schema carries a pattern that backtracks."""

    name = "pattern"
    timeout_s = 3.0

    def __init__(self, pattern: str) -> None:
        self.parameters = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}

    async def acall(self, arguments: Any) -> str:
        return "matched"


class SlowText:
    def __str__(self) -> str:
        time.sleep(8)
        return "late"


class SlowStr(Tool):
    """An async tool whose result takes 8 s to turn into text."""

    name = "slow_str"
    timeout_s = 1.0

    async def acall(self, arguments: Any) -> Any:
        return SlowText()


async def case(ex: ToolExecutor, call: ToolCall) -> dict[str, Any]:
    gaps = [0.0]
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.02)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.1)
    t0 = time.perf_counter()
    r = await ex.run(call)
    took = time.perf_counter() - t0
    stop.set()
    await task
    return {"kind": r.error_kind.value if r.error_kind else None, "content": r.content[:300], "took": took,
            "max_gap": max(gaps)}


async def main() -> None:
    which = sys.argv[1]
    if which == "slow_str":
        ex, call = ToolExecutor([SlowStr()]), ToolCall("slow_str", {})
    else:
        pattern, text = {"nested": (r"^(a+)+$", "a" * 26 + "b"), "alternation": (r"^(a|aa)+$", "a" * 64 + "b")}[which]
        ex, call = ToolExecutor([Pattern(pattern)]), ToolCall("pattern", {"s": text})
    print(json.dumps(await case(ex, call)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
