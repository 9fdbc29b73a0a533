"""MCP toolsets, MCP-v0 and `toolgym serve mcp`, against real servers.

Third-party servers (nobody here wrote them) are installed by ``tests/mcp_servers/install.py`` into isolated
environments under ``~/.cache/toolgym/mcp-venvs`` (never the project venv): PyPI ``mcp-server-sqlite`` and
``mcp-server-calculator`` (both on the 1.x SDK) and npm ``@modelcontextprotocol/server-everything`` (needs
node). The only server written here is ``tests/mcp_servers/fault_server.py``, for fault injection.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401 - registers the envs
from tests.procs import alive, children, free_port, stop
from toolgym.format.parsers import get_parser
from toolgym.runtime import run_sync
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.mcp import MCPToolset, assign_tool_names, load_mcp_config

sys.path.insert(0, str(Path(__file__).parent / "mcp_servers"))
import install

HERE = Path(__file__).parent
FAULT = str(HERE / "mcp_servers" / "fault_server.py")
HERMES = get_parser("hermes")

pytestmark = pytest.mark.timeout(300)


# -- helpers ------------------------------------------------------------------------------------------
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def fault_cfg(name: str = "fault", **extra) -> dict:
    return {name: {"command": sys.executable, "args": [FAULT], "stderr": "devnull", **extra}}


def start_http_server(port: int, tools: str = "calculator") -> subprocess.Popen:
    log = Path(f"/tmp/toolgym-serve-mcp-{port}.log")
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolgym.serve.mcp", "--tools", tools, "--transport", "http", "--port", str(port)],
            stderr=err,
        )
    ok = wait_for(lambda: _connectable(port) or proc.poll() is not None, 180)
    if not ok or proc.poll() is not None:
        stop(proc)
        pytest.fail(f"toolgym serve mcp did not start: {log.read_text()[-2000:]}")
    return proc


def _connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def answer_action(env, text: str) -> np.ndarray:
    return env.unwrapped.encode_action(text)


def call_action(env, *calls: tuple[str, dict]) -> np.ndarray:
    return env.unwrapped.encode_action(HERMES.format_calls(list(calls)))


@pytest.fixture(scope="session")
def third_party() -> dict[str, dict]:
    """mcpServers entries for the installed third-party servers (installed on first use)."""
    out = {
        "sqlite": {"command": str(install.ensure_pypi_server("sqlite")), "stderr": "devnull"},
        "calculator": {"command": str(install.ensure_pypi_server("calculator")), "stderr": "devnull"},
    }
    if shutil.which("node") and shutil.which("npm"):
        out["everything"] = {"command": "node", "args": [str(install.ensure_npm_server("everything"))],
                             "stderr": "devnull"}  # fmt: skip
    return out


# -- config -----------------------------------------------------------------------------------------
def test_config_json_pydata_and_errors(tmp_path: Path) -> None:
    cfg = {"mcpServers": {"a": {"command": "python", "args": ["s.py"], "env": {"X": "1"}, "timeout": 3},
                          "b": {"url": "http://127.0.0.1:9/mcp", "headers": {"K": "v"}}}}  # fmt: skip
    (tmp_path / "s.json").write_text(json.dumps(cfg))
    # RL-Factory's .pydata: a Python literal (single quotes, a list of blocks), read with ast.literal_eval
    (tmp_path / "s.pydata").write_text(
        "[{'mcpServers': {'a': {'command': 'python', 'args': ['s.py'], 'env': {'X': '1'}, 'timeout': 3}}},\n"
        " {'mcpServers': {'b': {'url': 'http://127.0.0.1:9/mcp', 'headers': {'K': 'v'}}}}]\n"
    )
    for src in (tmp_path / "s.json", str(tmp_path / "s.pydata"), cfg, json.dumps(cfg)):
        c = load_mcp_config(src)
        assert list(c) == ["a", "b"]
        assert c["a"].transport == "stdio" and c["a"].args == ["s.py"] and c["a"].env == {"X": "1"}
        assert c["a"].timeout_s == 3.0
        assert c["b"].transport == "streamable-http" and c["b"].headers == {"K": "v"}

    # code in a .pydata file is rejected, never executed
    marker = tmp_path / "pwned"
    (tmp_path / "evil.pydata").write_text(f"__import__('pathlib').Path({str(marker)!r}).touch()")
    with pytest.raises(ValueError, match="cannot parse"):
        load_mcp_config(tmp_path / "evil.pydata")
    assert not marker.exists()
    with pytest.raises(ValueError, match="exactly one of"):
        load_mcp_config({"mcpServers": {"x": {"command": "a", "url": "http://b"}}})
    with pytest.raises(ValueError, match="unknown keys"):
        load_mcp_config({"mcpServers": {"x": {"command": "a", "argz": []}}})
    with pytest.raises(ValueError, match="transport 'sse'"):
        load_mcp_config({"mcpServers": {"x": {"url": "http://b", "type": "sse"}}})
    with pytest.raises(ValueError, match="mcpServers"):
        load_mcp_config({"servers": {}})
    with pytest.raises(FileNotFoundError):
        load_mcp_config(tmp_path / "missing.json")
    assert list(load_mcp_config({"mcpServers": {"x": {"command": "a", "disabled": True}}})) == []


def test_unstartable_server_is_a_clear_error() -> None:
    ts = MCPToolset({"mcpServers": {"ghost": {"command": "/nonexistent/mcp-server"}}}, connect_timeout_s=10)
    with pytest.raises(ConnectionError, match="ghost"):
        ts.connect()


# -- our fault server over stdio ----------------------------------------------------------------------
@pytest.fixture
def fault_toolset(tmp_path: Path):
    before = children()
    ts = MCPToolset({"mcpServers": fault_cfg(env={"FAULT_SERVER_MARKER_DIR": str(tmp_path)})}, backoff_s=0.05)
    tools = ts.connect()
    yield ts, tools
    ts.close()
    assert wait_for(lambda: children() <= before), "server process left behind"


def test_discovery_validation_errors(fault_toolset) -> None:
    _, tools = fault_toolset
    by_name = {t.name: t for t in tools}
    assert {"echo", "add", "hang", "fail", "crash", "pid", "count"} <= set(by_name)
    # parameters are the server's inputSchema
    assert by_name["add"].parameters["properties"]["a"]["type"] == "integer"
    assert by_name["add"].parameters["required"] == ["a", "b"]
    ex = ToolExecutor(tools, default_timeout_s=10)

    async def go():
        ok = await ex.run(ToolCall("add", {"a": 2, "b": 40}))
        assert ok.ok and ok.content == "42"
        # invalid arguments: rejected before the server is called (its call counter does not move)
        n0 = int((await ex.run(ToolCall("count", {}))).content)
        bad = await ex.run_many([ToolCall("add", {"a": "x", "b": 1}), ToolCall("add", {"a": 1}),
                                 ToolCall("echo", {"text": 5})])  # fmt: skip
        assert [r.error_kind for r in bad] == [ToolErrorKind.INVALID_ARGUMENTS] * 3
        assert all(r.attempts == 0 for r in bad)
        assert int((await ex.run(ToolCall("count", {}))).content) == n0
        # isError -> exception, with the server's message
        err = await ex.run(ToolCall("fail", {"message": "boom"}))
        assert err.error_kind is ToolErrorKind.EXCEPTION and "fail" in err.content

    run_sync(go())


def test_hanging_tool_times_out_and_request_is_cancelled(fault_toolset, tmp_path: Path) -> None:
    _, tools = fault_toolset
    ex = ToolExecutor(tools, default_timeout_s=0.5)

    async def go():
        pid0 = (await ex.run(ToolCall("pid", {}))).content
        t0 = time.perf_counter()
        r = await ex.run(ToolCall("hang", {"token": "t1"}))
        assert r.error_kind is ToolErrorKind.TIMEOUT
        assert time.perf_counter() - t0 < 5
        # the session is still usable, on the same server process
        assert (await ex.run(ToolCall("echo", {"text": "after"}))).content == "after"
        assert (await ex.run(ToolCall("pid", {}))).content == pid0

    run_sync(go())
    assert (tmp_path / "started-t1").exists()
    # the server saw notifications/cancelled and cancelled the handler
    assert wait_for(lambda: (tmp_path / "cancelled-t1").exists(), 5)


def test_server_crash_is_classified_and_restarted(fault_toolset) -> None:
    ts, tools = fault_toolset
    conn = ts.servers["fault"]
    no_retry = ToolExecutor(tools, default_timeout_s=10, max_retries=0)
    with_retry = ToolExecutor(tools, default_timeout_s=10, max_retries=2)

    async def go():
        pid0 = int((await no_retry.run(ToolCall("pid", {}))).content)
        # the process exits mid-call: a classified, retryable failure, not a hang or a crash of ours
        r = await no_retry.run(ToolCall("crash", {}))
        assert r.error_kind is ToolErrorKind.EXCEPTION and "connection lost" in r.content
        # later calls succeed on a restarted server
        assert (await no_retry.run(ToolCall("echo", {"text": "back"}))).content == "back"
        pid1 = int((await no_retry.run(ToolCall("pid", {}))).content)
        assert pid1 != pid0 and not alive(pid0)
        # killed from outside while calls are in flight: the executor's retry makes them succeed
        slow = [asyncio.ensure_future(with_retry.run(ToolCall("sleep_ms", {"ms": 300}))) for _ in range(5)]
        await asyncio.sleep(0.1)
        os.kill(pid1, signal.SIGKILL)
        res = await asyncio.gather(*slow)
        assert all(x.ok for x in res), [x.content for x in res]
        assert all(x.attempts == 2 for x in res)
        pid2 = int((await with_retry.run(ToolCall("pid", {}))).content)
        assert pid2 not in (pid0, pid1)

    run_sync(go())
    assert conn.restarts == 2


def test_reconnect_backoff_when_server_cannot_start(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    # a wrapper that refuses to start while `flag` exists
    script = tmp_path / "wrap.sh"
    script.write_text(f"#!/bin/sh\n[ -e {flag} ] && exit 1\nexec {sys.executable} {FAULT}\n")
    script.chmod(0o755)
    ts = MCPToolset({"mcpServers": {"w": {"command": str(script), "stderr": "devnull"}}}, backoff_s=0.2)
    tools = ts.connect()
    ex = ToolExecutor(tools, default_timeout_s=10, max_retries=0)
    conn = ts.servers["w"]

    async def go():
        pid0 = int((await ex.run(ToolCall("pid", {}))).content)
        flag.touch()
        os.kill(pid0, signal.SIGKILL)
        r1 = await ex.run(ToolCall("echo", {"text": "x"}))  # notices the death
        r2 = await ex.run(ToolCall("echo", {"text": "x"}))  # restart fails: classified, retryable
        assert not r1.ok and not r2.ok and r2.error_kind is ToolErrorKind.EXCEPTION
        assert "cannot connect" in r2.content or "connection lost" in r2.content
        assert conn.connect_failures >= 1
        flag.unlink()
        r3 = await ex.run(ToolCall("echo", {"text": "ok"}))  # waits out the backoff, then restarts
        assert r3.ok and r3.content == "ok"

    try:
        run_sync(go())
    finally:
        ts.close()


def test_name_clashes_are_prefixed_predictably() -> None:
    cfg = {"mcpServers": {**fault_cfg("a"), **fault_cfg("b", include=["echo", "pid"])}}
    with MCPToolset(cfg) as ts:
        names = sorted(t.name for t in ts.tools)
        # shared names get "<server>__", the rest keep their names
        assert names == sorted(["a__echo", "b__echo", "a__pid", "b__pid", "add", "big_text", "count", "crash", "fail", "hang",
                                "sleep_ms", "record", "freeze", "session_id", "wedge_session",
                                "session_echo", "picture"])  # fmt: skip
        ex = ToolExecutor(ts.tools)
        ra, rb = run_sync(ex.run_many([ToolCall("a__pid", {}), ToolCall("b__pid", {})]))
        assert ra.ok and rb.ok and ra.content != rb.content  # two processes
        assert ts.servers["a"].sessions_opened == ts.servers["b"].sessions_opened == 1


def test_assign_tool_names_modes() -> None:
    tools = {"a": ["x", "y"], "b": ["x"]}
    assert assign_tool_names(tools) == {("a", "x"): "a__x", ("a", "y"): "y", ("b", "x"): "b__x"}
    assert set(assign_tool_names(tools, "always").values()) == {"a__x", "a__y", "b__x"}
    with pytest.raises(ValueError, match="shared by several"):
        assign_tool_names(tools, "never")
    assert assign_tool_names({"a": ["x"], "b": ["y"]}, "never") == {("a", "x"): "x", ("b", "y"): "y"}
    with pytest.raises(ValueError, match="after prefixing"):
        assign_tool_names({"a": ["x", "a__x"], "b": ["x"]})


# -- third-party servers ------------------------------------------------------------------------------
def test_third_party_stdio_servers(third_party, tmp_path: Path) -> None:
    cfg = {"mcpServers": {
        "sqlite": {**third_party["sqlite"], "args": ["--db-path", str(tmp_path / "t.db")]},
        "calculator": third_party["calculator"],
    }}  # fmt: skip
    before = children()
    with MCPToolset(cfg) as ts:
        names = {t.name for t in ts.tools}
        assert {"read_query", "write_query", "create_table", "list_tables", "calculate"} <= names
        ex = ToolExecutor(ts.tools, default_timeout_s=20)

        async def go():
            r = await ex.run(ToolCall("create_table", {"query": "CREATE TABLE t (x INTEGER)"}))
            assert r.ok, r.content
            r = await ex.run(ToolCall("write_query", {"query": "INSERT INTO t VALUES (2), (40)"}))
            assert r.ok, r.content
            r = await ex.run(ToolCall("read_query", {"query": "SELECT SUM(x) AS s FROM t"}))
            assert r.ok and "42" in r.content
            # this server answers bad SQL with a normal (not isError) text result: passed through as is
            r = await ex.run(ToolCall("read_query", {"query": "SELECT nope FROM missing"}))
            assert "no such table: missing" in r.content
            r = await ex.run(ToolCall("calculate", {"expression": "6 * 7"}))
            assert r.ok and r.content.strip() in ("42", "42.0")
            rs = await ex.run_many([ToolCall("calculate", {"expression": f"{i} + 1"}) for i in range(50)])
            assert [float(x.content) for x in rs] == [i + 1.0 for i in range(50)]

        run_sync(go())
        assert len(children() - before) == 2  # one process per server
    assert wait_for(lambda: children() <= before)


def test_server_everything(third_party) -> None:
    if "everything" not in third_party:
        pytest.skip("node/npm not installed: @modelcontextprotocol/server-everything needs node")
    before = children()
    with MCPToolset({"mcpServers": {"everything": third_party["everything"]}}) as ts:
        tools = {t.name: t for t in ts.tools}
        assert {"echo", "get-sum", "get-tiny-image", "get-structured-content"} <= set(tools)
        ex = ToolExecutor(ts.tools, default_timeout_s=20)

        async def go():
            r = await ex.run(ToolCall("echo", {"message": "hi"}))
            assert r.ok and "hi" in r.content
            r = await ex.run(ToolCall("get-sum", {"a": 2, "b": 40}))
            assert r.ok and "42" in r.content
            r = await ex.run(ToolCall("get-sum", {"a": "two", "b": 40}))  # server's own inputSchema (zod -> JSON)
            assert r.error_kind is ToolErrorKind.INVALID_ARGUMENTS
            r = await ex.run(ToolCall("get-tiny-image", {}))
            assert r.ok and "[image: image/png" in r.content and r.images[0].width == 20  # its iCCP chunk's CRC is bad
            r = await ex.run(ToolCall("get-structured-content", {"location": "Chicago"}))
            assert r.ok and r.content

        run_sync(go())
    assert wait_for(lambda: children() <= before)


# -- toolgym serve mcp over streamable HTTP ------------------------------------------------------------
@pytest.mark.slow
def test_serve_mcp_http_and_reconnect() -> None:
    port = free_port()
    proc = start_http_server(port, "calculator,sql")
    ts = None
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        ts = MCPToolset({"mcpServers": {"tg": {"url": url, "headers": {"X-Toolgym-Test": "1"}}}}, backoff_s=0.05)
        tools = ts.connect()
        assert {t.name for t in tools} == {"calculator", "execute_sql"}
        ex = ToolExecutor(tools, default_timeout_s=20, max_retries=0)

        async def go():
            r = await ex.run(ToolCall("calculator", {"expression": "(12 + 30) * 1"}))
            assert r.ok and r.content == "42"
            r = await ex.run(ToolCall("calculator", {"expression": "1/0"}))
            # the server's error kind travels in _meta; no double "Error (...)" prefix
            assert r.error_kind is ToolErrorKind.EXCEPTION and r.content.count("Error (") == 1
            r = await ex.run(ToolCall("execute_sql", {"query": "SELECT COUNT(*) FROM Artist"}))
            assert r.ok and "275" in r.content
            rs = await ex.run_many([ToolCall("calculator", {"expression": f"{i}*2"}) for i in range(200)])
            assert [x.content for x in rs] == [str(i * 2) for i in range(200)]

        run_sync(go())
        # the server goes away: classified error; it comes back: later calls succeed on a new session
        stop(proc)
        r = run_sync(ex.run(ToolCall("calculator", {"expression": "1+1"})))
        assert r.error_kind is ToolErrorKind.EXCEPTION
        proc = start_http_server(port, "calculator,sql")
        r = None
        for _ in range(20):  # the backoff may make the first attempts fail fast
            r = run_sync(ex.run(ToolCall("calculator", {"expression": "1+1"})))
            if r.ok:
                break
            time.sleep(0.1)
        assert r is not None and r.ok and r.content == "2"
        assert ts.servers["tg"].restarts >= 1
        ts.close()
    finally:
        stop(proc)


def test_serve_mcp_unknown_toolset_is_clear() -> None:
    from toolgym.serve.mcp import main, resolve_toolsets

    with pytest.raises(ValueError, match="unknown tool set 'nope'"):
        resolve_toolsets(["nope"])
    with pytest.raises(ImportError, match="no_such_module"):
        resolve_toolsets(["no_such_module:f"])
    assert main(["--tools", "nope"]) == 2


# -- MCP-v0 ------------------------------------------------------------------------------------------
@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    p = tmp_path / "tasks.jsonl"
    rows = [{"prompt": "What is 2 + 40? Use the add tool.", "answer": "42"},
            {"id": "echo-1", "prompt": "Echo hello.", "golden_answers": ["hello"], "answer": "hello"}]  # fmt: skip
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


@pytest.mark.slow
def test_mcp_env_episode_survives_server_kill(task_file: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "servers.json"
    cfg.write_text(json.dumps({"mcpServers": fault_cfg()}))
    before = children()
    env = gym.make("toolgym/MCP-v0", mcp_config=str(cfg), tasks=str(task_file), reward="numeric@answer",
                   executor_kwargs={"max_retries": 0, "default_timeout_s": 10})  # fmt: skip
    try:
        u = env.unwrapped
        assert {"add", "echo", "pid"} <= set(u.executor.tools)
        _, info = env.reset(seed=0, options={"task": u.tasks[0]})
        assert info["task"]["id"] == "tasks-1"
        assert "add" in info["prompt_text"]  # tool specs rendered into the prompt
        _, _, _, _, info = env.step(call_action(env, ("pid", {})))
        pid0 = int(info["results"][0]["content"])
        os.kill(pid0, signal.SIGKILL)  # mid-episode
        _, r, term, trunc, info = env.step(call_action(env, ("add", {"a": 2, "b": 40})))
        assert info["error_kinds"] == ["exception"] and not (term or trunc)  # classified, episode goes on
        _, r, term, trunc, info = env.step(call_action(env, ("add", {"a": 2, "b": 40})))
        assert info["error_kinds"] == [] and info["results"][0]["content"] == "42"
        _, r, term, trunc, info = env.step(answer_action(env, "<answer>42</answer>"))
        assert term and r == 1.0 and info["trajectory"].outcome_reward == 1.0
    finally:
        env.close()
    assert wait_for(lambda: children() <= before), "server process left behind after env.close()"


@pytest.mark.slow
def test_mcp_env_vector_1000_concurrent_calls_no_leak(task_file: Path) -> None:
    cfg = {"mcpServers": fault_cfg()}
    base_children, base_fds = children(), open_fds()
    venv = gym.make_vec("toolgym/MCP-v0", num_envs=64, mcp_config=cfg, tasks=str(task_file), reward="f1@answer",
                        max_episode_tokens=4096, max_obs_tokens=64)  # fmt: skip
    try:
        assert len(children() - base_children) == 1  # one server process for all 64 episodes
        venv.reset(seed=0)
        e0 = venv.envs[0]
        # 16 calls per episode, 64 episodes: 1,024 calls in one step, all in flight at once
        actions = [call_action(e0, *[("sleep_ms", {"ms": 1000}) if j % 2 else ("echo", {"text": f"{i}-{j}"})
                                     for j in range(16)]) for i in range(64)]  # fmt: skip
        t0 = time.perf_counter()
        obs, _, _, _, _ = venv.step(actions)
        wall = time.perf_counter() - t0
        summary = venv.executor.metrics.summary()
        assert sum(summary["calls"].values()) == 1024 and not summary["errors"], summary
        assert summary["max_in_flight"] > 64
        assert wall < 512 * 1.0 / 4  # far less than the 512 one-second sleeps one after another
        assert all(len(o) > 0 for o in obs)  # every episode got its observation and goes on
        _, rew, term, _, _ = venv.step([answer_action(e0, "<answer>hello</answer>")] * 64)
        assert term.all() and (rew >= 0).all()
    finally:
        venv.close()
    assert wait_for(lambda: children() <= base_children), "server process leaked"
    assert wait_for(lambda: open_fds() <= base_fds + 2), f"fds: {base_fds} -> {open_fds()}"


def test_reward_resolution(tmp_path: Path) -> None:
    from toolgym.envs.mcp import load_tasks, resolve_reward
    from toolgym.rewards.rules import F1, ExactMatch, NumericMatch

    rows = load_tasks([{"prompt": "q", "golden_answers": ["a"]}])
    assert rows[0]["id"] == "task-0"
    em = resolve_reward("exact_match", rows)
    assert isinstance(em, ExactMatch) and em.field == "golden_answers"
    assert isinstance(resolve_reward("F1@answer", rows), F1)
    assert isinstance(resolve_reward("numeric", rows, "n"), NumericMatch)
    (tmp_path / "my_reward.py").write_text("def score(trajectory, task):\n    return 0.5\n")
    fn = resolve_reward(f"{tmp_path / 'my_reward.py'}:score", rows)
    assert fn(None, {}) == 0.5
    assert resolve_reward("toolgym.rewards.rules:exact_match", rows) is not None
    with pytest.raises(ValueError, match="unknown reward"):
        resolve_reward("bleu", rows)
    with pytest.raises(ValueError, match="gold field"):
        resolve_reward("f1", [{"prompt": "q"}])
    with pytest.raises(ValueError, match="'prompt' or 'messages'"):
        load_tasks([{"question": "q"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_tasks(bad)
