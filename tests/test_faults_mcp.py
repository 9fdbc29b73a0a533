"""Faults of MCP servers that must cost no more than their own call (invariant 6 of docs/design.md): a stdio server
writing a line that is not UTF-8, a result of tens of megabytes over stdio, a server listing one tool with a
malformed ``inputSchema`` or answering ``tools/list`` with garbage, an HTTP server that accepts and never answers.
Real servers throughout (the SDK's, in ``tests/mcp_servers/fault_server.py``); ``raw_server.py`` is a hand-written
server only for replies the SDK's server never sends. Every test has a deadline.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from toolgym import runtime
from toolgym.cli.common import ExitCode, env_construction_error
from toolgym.tools.base import ToolCall
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.mcp import MCPServerError, MCPToolset

SERVERS = Path(__file__).parent / "mcp_servers"
FAULT_SERVER = str(SERVERS / "fault_server.py")
RAW_SERVER = str(SERVERS / "raw_server.py")


def _stdio(script: str, *args: str, **extra) -> dict:
    return {"command": sys.executable, "args": [script, *args], "stderr": "devnull", **extra}


@pytest.mark.timeout(120)
def test_bytes_that_are_not_utf8_cost_no_call_and_no_restart() -> None:
    ts = MCPToolset({"mcpServers": {"raw": _stdio(RAW_SERVER, "plain")}}, backoff_s=0.05)
    ex = ToolExecutor(ts.connect(), default_timeout_s=5, max_retries=0)
    conn = ts.servers["raw"]

    async def go():
        calls = [ToolCall("good", {"text": str(i)}) for i in range(6)]
        calls.insert(3, ToolCall("garbage", {}))
        t0 = time.perf_counter()
        res = await ex.run_many(calls)
        # before: the SDK's strict decoding killed the session's reader; every call after it timed out
        assert [r.content for r in res] == ["0", "1", "2", "caf\ufffd", "3", "4", "5"], res
        assert time.perf_counter() - t0 < 4
        assert (await ex.run(ToolCall("good", {"text": "next"}))).content == "next"

    try:
        runtime.run_sync(go())
    finally:
        ts.close()
    assert conn.restarts == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_huge_stdio_result_costs_linear_time() -> None:
    ts = MCPToolset({"mcpServers": {"fault": _stdio(FAULT_SERVER)}})
    ex = ToolExecutor(ts.connect(), default_timeout_s=200, max_retries=0)

    async def timed(mb: int) -> float:
        t0 = time.perf_counter()
        r = await ex.run(ToolCall("big_text", {"mb": mb}))
        assert r.ok and len(r.content) == mb * 1024 * 1024, r.content[:200]
        return time.perf_counter() - t0

    async def go():
        await timed(1)  # warm-up
        small = min([await timed(4) for _ in range(2)])
        big = min([await timed(32)])
        return small, big

    try:
        small, big = runtime.run_sync(go())
    finally:
        ts.close()
    # 8x the bytes: linear is ~8x; the quadratic line buffer was ~40-60x (4 MB 0.26 s, 48 MB 17.6 s)
    assert big < 20 * small + 0.5, (small, big)


@pytest.mark.timeout(120)
def test_one_malformed_tool_leaves_the_others_and_is_named(caplog) -> None:
    ts = MCPToolset({"mcpServers": {"raw": _stdio(RAW_SERVER, "bad-schema")}})
    try:
        with caplog.at_level("WARNING", logger="toolgym.tools.mcp"):
            tools = ts.connect()
        assert [t.name for t in tools] == ["good"]
        assert set(ts.skipped) == {("raw", "bad_required"), ("raw", "bad_type")}
        assert "required" in ts.skipped[("raw", "bad_required")]
        logged = caplog.text
        assert "'raw'" in logged and "'bad_required'" in logged and "'bad_type'" in logged
        ex = ToolExecutor(tools)
        assert runtime.run_sync(ex.run(ToolCall("good", {"text": "ok"}))).content == "ok"
    finally:
        ts.close()


@pytest.mark.timeout(120)
def test_a_tools_list_the_client_rejects_is_not_an_unreachable_service() -> None:
    ts = MCPToolset({"mcpServers": {"raw": _stdio(RAW_SERVER, "bad-list")}})
    with pytest.raises(MCPServerError) as info:
        ts.connect()
    msg = str(info.value)
    assert "'raw'" in msg and "tools" in msg and "\n" not in msg
    err = env_construction_error("toolgym/X-v0", info.value)
    assert err.code == ExitCode.FAILURE and "cannot reach" not in err.message  # before: exit 4, "cannot reach"


@pytest.mark.timeout(120)
def test_an_http_server_that_never_answers_fails_within_the_configured_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # accepted, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_hold, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    ts = MCPToolset({"mcpServers": {"silent": {"url": url, "timeout": 2}}})
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConnectionError, match="silent"):
            ts.connect()
        # before: the 60 s connect budget, whatever the config's timeout said
        assert time.perf_counter() - t0 < 15
    finally:
        stop.set()
        thread.join(5)
        for s in held:
            s.close()
        listener.close()


@pytest.mark.timeout(180)
def test_answers_in_the_pipe_when_a_stdio_server_dies_are_all_delivered() -> None:
    # the server answers 151 calls, then exits on reading the next while the client is still writing the batch
    ts = MCPToolset({"mcpServers": {"raw": _stdio(RAW_SERVER, "die-after", "151")}}, backoff_s=0.05)
    ex = ToolExecutor(ts.connect(), default_timeout_s=30, max_retries=0)

    async def go():
        for _ in range(3):  # the first round on the first server process, the others on restarted ones
            assert (await ex.run(ToolCall("good", {"text": "warm"}))).content == "warm"
            res = await ex.run_many([ToolCall("good", {"text": str(i)}) for i in range(299)])
            answered = [r.content for r in res if r.ok]
            # every answer the server wrote reaches its caller; only the calls it never answered are lost
            assert answered == [str(i) for i in range(150)], (len(answered), res[len(answered)].content)
            assert all("connection lost" in r.content for r in res[150:])

    try:
        runtime.run_sync(go())
    finally:
        ts.close()
