"""Fault injection (invariant 6 of docs/design.md): a tool that raises anything, blocks, returns what cannot be encoded or
returns megabytes; an argument the MCP transport cannot encode; an MCP server that dies mid-call or hangs; a sandboxed
snippet reaching for host IPC, host sockets or memory-backed files. Each fault costs its own call a classified
error, never another episode's result, the batch, the runtime loop or the process; each case runs in the single
env, the vector step and a rollout (lock-step and continuous). Every test has a deadline, so a regression fails
instead of hanging CI. Real parts throughout: real ``@tool`` functions, the fault MCP server over stdio and HTTP,
the real sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.procs import alive, children, free_port
from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.models import load_tokenizer
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy, read_trajectories
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.calculator import calculator_tool
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.function import tool
from toolgym.tools.mcp import MCPToolset
from toolgym.tools.python import Sandbox, SandboxLimits, namespaces_available

FAULT_SERVER = str(Path(__file__).parent / "mcp_servers" / "fault_server.py")


# -- real tools with real faults --------------------------------------------------------------------------------
@tool
def cli(flags: str) -> str:
    """Run a tiny argparse command line (argparse exits the process on bad input: SystemExit).

    Args:
        flags: the command-line flags, space-separated
    """
    p = argparse.ArgumentParser(prog="cli")
    p.add_argument("--n", type=int, required=True)
    return str(p.parse_args(flags.split()).n * 2)


@tool
async def interrupt() -> str:
    """Raise KeyboardInterrupt."""
    raise KeyboardInterrupt


@tool
async def cancel_self() -> str:
    """Raise CancelledError from inside the tool (no one cancelled it)."""
    raise asyncio.CancelledError("tool-made")


@tool
async def surrogate() -> str:
    """Echo text with a lone surrogate, as a tool echoing the model's JSON "\\ud800" would."""
    return "bad \ud800 text"


@tool
async def big(mb: int) -> str:
    """Return mb megabytes of text.

    Args:
        mb: megabytes
    """
    return "lorem ipsum " * (mb * 1024 * 1024 // 12)


@tool(timeout_s=0.3)
def block(seconds: float) -> str:
    """Block the thread (a sync tool stuck in I/O).

    Args:
        seconds: how long to block
    """
    time.sleep(seconds)
    return "woke"


@tool
async def say(text: str) -> str:
    """Say text.

    Args:
        text: what to say
    """
    return f"said {text}"


def _raw_call(name: str, args_json: str) -> str:
    # written by hand (not json.dumps): the model's JSON may carry escapes such as "\ud800"
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args_json}}}\n</tool_call>'


# name -> (assistant text of the faulty call, check(result dict))
def _kind(kind: ToolErrorKind, needle: str = ""):
    def check(r: dict) -> None:
        assert r["error_kind"] == kind.value, r
        assert needle in r["content"], r["content"]

    return check


def _surrogate_ok(r: dict) -> None:
    assert r["error_kind"] is None and "\\ud800" in r["content"]
    r["content"].encode("utf-8")  # encodable text, whatever the tool returned


def _big_clipped(r: dict) -> None:
    assert r["error_kind"] is None and r["content"].endswith("[truncated]") and len(r["content"]) < 100_000


FAULTS = {
    "system_exit": (_raw_call("cli", '{"flags": "--bogus"}'), _kind(ToolErrorKind.EXCEPTION, "SystemExit")),
    "keyboard_interrupt": (_raw_call("interrupt", "{}"), _kind(ToolErrorKind.EXCEPTION, "KeyboardInterrupt")),
    "cancelled_by_tool": (_raw_call("cancel_self", "{}"), _kind(ToolErrorKind.EXCEPTION, "CancelledError")),
    "unencodable_result": (_raw_call("surrogate", "{}"), _surrogate_ok),
    "blocking_sync_tool": (_raw_call("block", '{"seconds": 3}'), _kind(ToolErrorKind.TIMEOUT)),
    "huge_result": (_raw_call("big", '{"mb": 8}'), _big_clipped),
    "extra_argument": (_raw_call("say", '{"text": "a", "loud": true}'), _kind(ToolErrorKind.INVALID_ARGUMENTS)),
    "mcp_unencodable_argument": (
        _raw_call("echo", '{"text": "x \\ud800"}'), _kind(ToolErrorKind.INVALID_ARGUMENTS, "cannot be encoded")
    ),
}
HEALTHY = [_raw_call("say", '{"text": "hi"}'), _raw_call("echo", '{"text": "fine"}'),
           _raw_call("calculator", '{"expression": "6*7"}')]  # fmt: skip
HEALTHY_CONTENT = ["said hi", "fine", "42"]
TASKS = [{"id": f"t{i}", "prompt": f"task {i}"} for i in range(64)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def mcp_tools():
    ts = MCPToolset({"mcpServers": {"fault": {"command": sys.executable, "args": [FAULT_SERVER],
                                              "stderr": "devnull", "include": ["echo"]}}})  # fmt: skip
    tools = ts.connect()
    yield ts, tools
    ts.close()


@pytest.fixture
def executor(mcp_tools):
    _, mtools = mcp_tools
    # the executor does not close the shared MCP session: a fresh one per test, the session per module
    return ToolExecutor([cli, interrupt, cancel_self, surrogate, big, block, say, calculator_tool(), *mtools],
                        default_timeout_s=10, max_retries=0)  # fmt: skip


def _env(tokenizer, executor, **kw) -> ToolEnv:
    return ToolEnv(TASKS, executor=executor, tokenizer=tokenizer, max_turns=3, max_obs_tokens=128,
                   max_episode_tokens=4096, **kw)  # fmt: skip


def _action(env: ToolEnv, text: str) -> np.ndarray:
    return env.encode_action(text)


# -- single env ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_single_env_step_answers_every_fault(fault, tokenizer, executor) -> None:
    text, check = FAULTS[fault]
    env = _env(tokenizer, executor)
    loop = runtime.get_loop()
    env.reset(seed=0)
    obs, _, te, tr, info = env.step(_action(env, text))
    assert not te and not tr and len(obs) > 0 and "error" not in info
    check(info["results"][0])
    assert len(obs) < 128 + 40  # clipped to max_obs_tokens, plus the template's framing
    # the same runtime loop (its thread survived) still serves calls: the calculator answers at once
    assert runtime.get_loop() is loop
    t0 = time.perf_counter()
    obs, _, te, tr, info = env.step(_action(env, HEALTHY[2]))
    assert info["results"][0]["content"] == "42" and time.perf_counter() - t0 < 5
    obs, _, te, tr, info = env.step(_action(env, "<answer>42</answer>"))
    assert tr or te
    assert info["drift"] == {}
    json.dumps(info["trajectory"].to_dict())  # writable as JSONL (what write_trajectories does)
    for r in info["trajectory"].tool_results:
        r.content.encode("utf-8")  # every observation is encodable text


# -- vector step ----------------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_vector_step_keeps_healthy_episodes(fault, tokenizer, executor) -> None:
    text, check = FAULTS[fault]
    n = 6
    venv = ToolVectorEnv(functools.partial(_env, tokenizer), n, executor=executor, autoreset_mode="disabled")
    venv.reset(seed=0)
    envs = [e.unwrapped for e in venv.envs]
    poisoned = 2
    actions = [_action(envs[i], text if i == poisoned else HEALTHY[i % 3]) for i in range(n)]
    obs, _, te, tr, infos = venv.step(actions)
    assert infos["stepped"].all() and not te.any() and not tr.any()
    for i in range(n):
        r = infos["results"][i][0]
        if i == poisoned:
            check(r)
        else:
            assert r["error_kind"] is None and r["content"] == HEALTHY_CONTENT[i % 3], r
        assert len(obs[i]) > 0


@pytest.mark.timeout(120)
def test_vector_step_survives_a_fault_outside_the_tools(tokenizer, executor) -> None:
    """A fault in the env itself (here a reward that raises on one task) ends that episode only, truncated, with
    ``infos["error"]``; the other episodes' results are kept."""

    def reward(traj, task):
        if task["id"] == "t1":
            raise ValueError("reward bug")
        return 1.0

    venv = ToolVectorEnv(functools.partial(_env, tokenizer, reward=reward), 3, executor=executor,
                         autoreset_mode="disabled")  # fmt: skip
    venv.reset(options={"tasks": TASKS[:3]})
    envs = [e.unwrapped for e in venv.envs]
    _, rewards, te, tr, infos = venv.step([_action(e, "<answer>x</answer>") for e in envs])
    assert list(te) == [True, False, True] and list(tr) == [False, True, False]
    assert list(rewards) == [1.0, 0.0, 1.0]
    assert "reward bug" in infos["error"][1] and not infos["_error"][0]
    assert all(t is not None for t in infos["trajectory"])


# -- rollout, both schedules -----------------------------------------------------------------------------------
def _script(fault_text: str, every: int):
    def script(state: EpisodeState) -> str:
        if state.turn == 0:
            return fault_text if state.index % every == 3 else HEALTHY[state.index % 3]
        return "<answer>done</answer>"

    return script


@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_rollout_keeps_and_writes_every_episode(fault, schedule, tokenizer, executor, tmp_path) -> None:
    text, check = FAULTS[fault]
    n_eps, every = 16, 8
    venv = ToolVectorEnv(functools.partial(_env, tokenizer), 4, executor=executor, autoreset_mode="disabled")
    driver = RolloutDriver(venv, ScriptedPolicy(_script(text, every)), schedule=schedule, max_turn_tokens=128)
    path = tmp_path / "t.jsonl"
    trajs = driver.run(TASKS[:n_eps], seeds=0, trajectory_path=path)
    assert [t.task["id"] for t in trajs] == [t["id"] for t in TASKS[:n_eps]]
    assert len(read_trajectories(path)) == n_eps
    for k, t in enumerate(trajs):
        assert t.terminated and len(t.turns) == 2
        r = t.turns[0].results[0].to_dict()
        if k % every == 3:
            check(r)
        else:
            assert r["error_kind"] is None and r["content"] == HEALTHY_CONTENT[k % 3]


# -- item by item, below the env --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_blocking_sync_tool_cannot_starve_other_sync_tools() -> None:
    """More blocked calls than the default thread pool has threads, then the (sync) calculator answers at once; the
    abandoned threads are counted and capped; past the cap, calls are refused at once with ``timeout``."""

    @tool(timeout_s=0.2, max_abandoned=4)
    def stuck(seconds: float) -> str:
        """Block.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    calc = calculator_tool()
    ex = ToolExecutor([stuck, calc])

    async def go():
        res = await ex.run_many([ToolCall("stuck", {"seconds": 2.0}) for _ in range(12)])
        assert [r.error_kind for r in res] == [ToolErrorKind.TIMEOUT] * 12
        t0 = time.perf_counter()
        ok = await ex.run(ToolCall("calculator", {"expression": "2+2"}))
        assert ok.content == "4" and time.perf_counter() - t0 < 1.0
        # 12 calls started (the lane has 32 workers) and were abandoned: more than the cap of 4
        assert stuck.lane.abandoned >= 4
        t0 = time.perf_counter()
        refused = await ex.run(ToolCall("stuck", {"seconds": 0.0}))
        assert refused.error_kind is ToolErrorKind.TIMEOUT and "not started" in refused.content
        assert time.perf_counter() - t0 < 0.1
        # the blocked calls return: their threads leave, the tool works again
        await asyncio.sleep(2.5)
        assert stuck.lane.abandoned == 0
        again = await ex.run(ToolCall("stuck", {"seconds": 0.0}))
        assert again.content == "woke"

    runtime.run_sync(go())


@pytest.mark.timeout(200)
def test_process_exits_with_a_sync_tool_blocked_forever(tmp_path) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import time
        from toolgym.envs.base import ToolEnv
        from toolgym.tools.function import tool

        @tool(timeout_s=0.2)
        def stuck() -> str:
            '''Block for an hour.'''
            time.sleep(3600)
            return "never"

        env = ToolEnv([{"id": "a", "prompt": "p"}], [stuck])
        env.reset(seed=0)
        _, _, _, _, info = env.step(env.encode_action('<tool_call>{"name": "stuck", "arguments": {}}</tool_call>'))
        print(info["error_kinds"])
    """))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "timeout" in out.stdout
    # it exits: interpreter shutdown must not join the pool thread sleeping for an hour
    assert time.perf_counter() - t0 < 150


@pytest.mark.timeout(120)
def test_huge_result_costs_what_a_short_one_does(tokenizer) -> None:
    env = ToolEnv(TASKS, [big, say], tokenizer=tokenizer, max_obs_tokens=256)
    times = {}
    for mb, text in ((0, _raw_call("say", '{"text": "x"}')), (50, _raw_call("big", '{"mb": 50}'))):
        env.reset(seed=0)
        t0 = time.perf_counter()
        obs, *_, info = env.step(env.encode_action(text))
        times[mb] = time.perf_counter() - t0 - float(info["results"][0]["latency_s"])
        assert len(obs) < 256 + 40
    # without the character bound the 50 MB result took minutes to tokenise; now it is a slice
    assert times[50] < max(20 * times[0], 1.0), times


# -- MCP: poisoning, in-flight retries, hung servers -------------------------------------------------------------
def _start_http_fault_server(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, FAULT_SERVER, "--http", str(port)], env={**os.environ, **env},
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return proc, port


@pytest.fixture(params=["stdio", "http"])
def fault_server(request, tmp_path):
    env = {"FAULT_SERVER_MARKER_DIR": str(tmp_path)}
    proc = None
    if request.param == "stdio":
        cfg = {"command": sys.executable, "args": [FAULT_SERVER], "stderr": "devnull", "env": env}
    else:
        proc, port = _start_http_fault_server(env)
        cfg = {"url": f"http://127.0.0.1:{port}/mcp"}
    ts = MCPToolset({"mcpServers": {"fault": cfg}}, backoff_s=0.05)
    tools = ts.connect()
    yield request.param, ts, tools, proc
    ts.close()
    if proc is not None:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(180)
def test_one_unencodable_argument_does_not_poison_the_shared_session(fault_server) -> None:
    _, ts, tools, _ = fault_server
    ex = ToolExecutor(tools, default_timeout_s=20, max_retries=0)
    conn = ts.servers["fault"]

    async def go():
        pid0 = (await ex.run(ToolCall("pid", {}))).content
        calls = [ToolCall("sleep_ms", {"ms": 300}) for _ in range(8)]
        calls.insert(3, ToolCall("echo", {"text": "x \ud800"}))
        calls.insert(5, ToolCall("echo", {"text": "\udfff y"}))
        res = await ex.run_many(calls)
        bad = [res[3], res[5]]
        assert all(r.error_kind is ToolErrorKind.INVALID_ARGUMENTS and r.attempts == 1 for r in bad), bad
        good = [r for i, r in enumerate(res) if i not in (3, 5)]
        assert all(r.ok and r.content == "slept 300 ms" for r in good), [r.content for r in good]
        assert (await ex.run(ToolCall("pid", {}))).content == pid0  # same session, same server

    runtime.run_sync(go())
    assert conn.restarts == 0


@pytest.mark.timeout(180)
def test_call_in_flight_when_server_dies_is_not_resent(tmp_path) -> None:
    cfg = {"command": sys.executable, "args": [FAULT_SERVER], "stderr": "devnull",
           "env": {"FAULT_SERVER_MARKER_DIR": str(tmp_path)}}  # fmt: skip
    ts = MCPToolset({"mcpServers": {"fault": cfg}}, backoff_s=0.05)
    tools = {t.name: t for t in ts.connect()}
    assert tools["sleep_ms"].idempotent and not tools["record"].idempotent  # from the server's annotations
    ex = ToolExecutor(tools.values(), default_timeout_s=20, max_retries=3)
    log = tmp_path / "record.log"

    async def go():
        pid = int((await ex.run(ToolCall("pid", {}))).content)
        rec = asyncio.ensure_future(ex.run(ToolCall("record", {"token": "once", "ms": 1500})))
        idem = asyncio.ensure_future(ex.run(ToolCall("sleep_ms", {"ms": 1500})))
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        r, i = await rec, await idem
        assert r.error_kind is ToolErrorKind.EXCEPTION and r.attempts == 1 and "not re-sent" in r.content
        assert i.ok and i.attempts == 2  # the idempotent call was retried on the restarted server
        assert log.read_text().splitlines() == ["once"]  # the non-idempotent tool ran exactly once

    try:
        runtime.run_sync(go())
    finally:
        ts.close()
    # config can opt a tool in: then it is retried too
    ts2 = MCPToolset({"mcpServers": {"fault": {**cfg, "idempotent": ["record"]}}})
    try:
        assert {t.name: t for t in ts2.connect()}["record"].idempotent
    finally:
        ts2.close()


@pytest.mark.timeout(180)
def test_hung_stdio_server_is_restarted_after_consecutive_timeouts(tmp_path) -> None:
    before = children()
    cfg = {"command": sys.executable, "args": [FAULT_SERVER], "stderr": "devnull", "restart_after_timeouts": 2,
           "env": {"FAULT_SERVER_MARKER_DIR": str(tmp_path)}}  # fmt: skip
    ts = MCPToolset({"mcpServers": {"fault": cfg}}, backoff_s=0.05)
    ex = ToolExecutor(ts.connect(), default_timeout_s=0.5, max_retries=0)
    conn = ts.servers["fault"]

    async def go():
        pid0 = int((await ex.run(ToolCall("pid", {}))).content)
        assert (await ex.run(ToolCall("freeze", {}))).error_kind is ToolErrorKind.TIMEOUT  # the server hangs now
        assert (await ex.run(ToolCall("echo", {"text": "a"}))).error_kind is ToolErrorKind.TIMEOUT
        # two calls in a row unanswered: the server is being restarted as hung; calls succeed once it is up
        # (starting a Python MCP server may take longer than the 0.5 s timeout on a loaded machine)
        deadline = time.monotonic() + 60
        while not (r := await ex.run(ToolCall("echo", {"text": "b"}))).ok and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert r.ok and r.content == "b", r.content
        pid1 = int((await ex.run(ToolCall("pid", {}))).content)
        assert pid1 != pid0
        return pid0

    try:
        pid0 = runtime.run_sync(go())
        assert conn.hung_restarts == 1
        deadline = time.monotonic() + 15
        while alive(pid0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid0)
    finally:
        ts.close()
    assert children() <= before


@pytest.mark.timeout(180)
def test_hung_http_session_is_replaced_after_consecutive_timeouts(tmp_path) -> None:
    """A streamable-HTTP server whose session is stuck (a per-session resource hangs while other sessions are
    served) gets a new session after ``restart_after_timeouts`` unanswered calls in a row; with ``0`` it keeps the
    stuck one. The server process is not toolgym's: it is neither killed nor restarted."""
    proc, port = _start_http_fault_server({"FAULT_SERVER_MARKER_DIR": str(tmp_path)})
    url = f"http://127.0.0.1:{port}/mcp"

    def toolset(restart_after: int) -> tuple[MCPToolset, ToolExecutor]:
        cfg = {"url": url, "restart_after_timeouts": restart_after}
        ts = MCPToolset({"mcpServers": {"fault": cfg}}, backoff_s=0.05, mode="legacy")  # a session-ful protocol
        return ts, ToolExecutor(ts.connect(), default_timeout_s=0.5, max_retries=0)

    async def wedge(ex: ToolExecutor, unanswered: int) -> tuple[str, str]:
        pid0 = (await ex.run(ToolCall("pid", {}))).content
        s0 = (await ex.run(ToolCall("session_id", {}))).content
        assert s0 != "None" and (await ex.run(ToolCall("wedge_session", {}))).ok
        for _ in range(unanswered):
            assert (await ex.run(ToolCall("session_echo", {"text": "a"}))).error_kind is ToolErrorKind.TIMEOUT
        return pid0, s0

    async def replaced(ex: ToolExecutor) -> None:
        pid0, s0 = await wedge(ex, 2)
        # two calls in a row unanswered: the session is replaced; calls on the new one are answered
        deadline = time.monotonic() + 30
        while not (r := await ex.run(ToolCall("session_echo", {"text": "b"}))).ok and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert r.ok and r.content == "b", r.content
        assert (await ex.run(ToolCall("session_id", {}))).content not in (s0, "None")
        assert (await ex.run(ToolCall("pid", {}))).content == pid0  # the same server process

    async def kept(ex: ToolExecutor) -> None:
        _, s0 = await wedge(ex, 3)
        assert (await ex.run(ToolCall("session_id", {}))).content == s0  # still the stuck session

    try:
        ts, ex = toolset(2)
        try:
            runtime.run_sync(replaced(ex))
            conn = ts.servers["fault"]
            assert conn.hung_restarts == 1 and conn.restarts == 1
        finally:
            ts.close()
        ts, ex = toolset(0)
        try:
            runtime.run_sync(kept(ex))
            assert ts.servers["fault"].hung_restarts == 0 and ts.servers["fault"].restarts == 0
        finally:
            ts.close()
        assert proc.poll() is None  # never toolgym's to stop
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(180)
def test_frozen_http_server_calls_time_out_on_time_once_the_session_is_dropped(tmp_path) -> None:
    """A whole HTTP server frozen (its event loop blocked): on a session-ful protocol every timed-out call on the
    stuck session also waits for the SDK's cancel notification to give up (~5 s here), and closing waits for it
    too. Once ``restart_after_timeouts`` drops that session, later calls time out on time and close is prompt."""
    proc, port = _start_http_fault_server({"FAULT_SERVER_MARKER_DIR": str(tmp_path)})
    cfg = {"url": f"http://127.0.0.1:{port}/mcp", "restart_after_timeouts": 2}
    ts = MCPToolset({"mcpServers": {"fault": cfg}}, backoff_s=0.05, mode="legacy", connect_timeout_s=30)
    ex = ToolExecutor(ts.connect(), default_timeout_s=0.5, max_retries=0)

    async def go() -> list[float]:
        assert (await ex.run(ToolCall("freeze", {}))).error_kind is ToolErrorKind.TIMEOUT
        assert (await ex.run(ToolCall("echo", {"text": "a"}))).error_kind is ToolErrorKind.TIMEOUT  # 2nd: dropped
        walls = []
        for _ in range(3):  # the new session's handshake is pending (the server answers nobody): calls time out
            t0 = time.monotonic()
            assert (await ex.run(ToolCall("echo", {"text": "b"}))).error_kind is ToolErrorKind.TIMEOUT
            walls.append(time.monotonic() - t0)
        return walls

    try:
        walls = runtime.run_sync(go())
        assert ts.servers["fault"].hung_restarts == 1
        assert max(walls) < 3.0, walls  # the per-call timeout (0.5 s), not the SDK's ~5 s cancel wait
        t0 = time.monotonic()
        ts.close()
        assert time.monotonic() - t0 < 5.0  # with the stuck session kept, close took ~15 s
    finally:
        ts.close()
        proc.kill()
        proc.wait()


# -- sandbox -------------------------------------------------------------------------------------------------
needs_ns = pytest.mark.skipif(not namespaces_available(), reason="needs root and Linux namespaces")


@needs_ns
@pytest.mark.timeout(120)
def test_sandbox_has_private_ipc_no_host_sockets_and_one_bounded_tmpfs(tmp_path) -> None:
    sock_path = f"/run/toolgym-fault-{uuid.uuid4().hex[:8]}.sock"
    host = socket.socket(socket.AF_UNIX)
    host.bind(sock_path)
    os.chmod(sock_path, 0o777)
    host.listen(1)
    sb = Sandbox(SandboxLimits(tmpfs_mb=8, wall_s=30, memory_mb=256), pool_size=0)
    shm = textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmget.restype = ctypes.c_int
        libc.shmat.restype = ctypes.c_void_p
        sid = libc.shmget(0x70071, 64 << 20, 0o1666)  # IPC_CREAT: 64 MiB, outside RLIMIT_AS until attached
        print("segment", sid)
        addr = libc.shmat(sid, None, 0)
        print("first byte", ctypes.c_char.from_address(addr).value if addr not in (None, 2**64 - 1) else None)
        if addr not in (None, 2**64 - 1):
            ctypes.memset(addr, 0x41, 16)
    """)
    probe = textwrap.dedent(f"""
        import os, socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({sock_path!r})
            print("connected")
        except OSError as e:
            print("refused", type(e).__name__)
        print("run", sorted(os.listdir("/run")), os.access("/run", os.W_OK))
        wrote = 0
        for d in ("/tmp", "/var/tmp", "/dev/shm"):
            try:
                with open(d + "/f", "wb") as f:
                    f.write(b"x" * (5 << 20))
                wrote += 5
            except OSError:
                pass
        print("wrote", wrote)
    """)

    async def go():
        a = await sb.run(shm)
        b = await sb.run(shm)  # a second worker must not see the first one's bytes
        c = await sb.run(probe)
        await sb.aclose()
        return a, b, c

    try:
        a, b, c = runtime.run_sync(go())
    finally:
        host.close()
        os.unlink(sock_path)
    assert a.status == b.status == "ok", (a, b)
    assert "first byte b'\\x00'" in b.stdout, b.stdout  # a fresh segment, not the 'A's of the first call
    ipcs = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
    assert "0x00070071" not in ipcs  # nothing left on the host
    assert "refused" in c.stdout and "connected" not in c.stdout, c.stdout
    assert "run ['lock'] False" in c.stdout, c.stdout
    assert "wrote 5" in c.stdout, c.stdout  # 8 MiB for all the writable directories together


# -- the runtime loop and huge actions -------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_runtime_loop_outlives_base_exceptions() -> None:
    loop = runtime.get_loop()

    async def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(RuntimeError, match="SystemExit"):
        runtime.run_sync(exits())

    def raw_callback() -> None:  # not a task: asyncio lets this out of run_forever
        raise KeyboardInterrupt

    loop.call_soon_threadsafe(raw_callback)

    async def still_there() -> str:
        await asyncio.sleep(0.01)
        return "alive"

    assert runtime.run_sync(still_there()) == "alive"
    assert runtime.get_loop() is loop


@pytest.mark.timeout(120)
def test_huge_action_is_checked_off_the_loop_and_truncates(tokenizer, executor) -> None:
    env = _env(tokenizer, executor)
    env.reset(seed=0)
    action = env.encode_action(HEALTHY[2] + " filler" * 40_000)
    assert len(action) > 40_000
    obs, _, te, tr, info = env.step(action)
    assert tr and not te and len(obs) == 0 and "error" not in info
    assert info["drift"] == {}  # checked (in a worker thread: the conversation is over 16k tokens), no drift
    assert info["trajectory"].loss_mask.count(1) == len(action)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_failed_rollout_still_writes_the_finished_episodes(schedule, tokenizer, executor, tmp_path) -> None:
    """A failure of the run itself (here the policy, on episode 9) propagates, but the episodes that finished
    before it are written, not lost."""

    class FailingPolicy(ScriptedPolicy):
        async def agenerate(self, requests):
            if any(r.episode.index == 9 for r in requests):
                raise ConnectionError("policy server went away")
            return await super().agenerate(requests)

    venv = ToolVectorEnv(functools.partial(_env, tokenizer), 4, executor=executor, autoreset_mode="disabled")
    policy = FailingPolicy(lambda s: HEALTHY[0] if s.turn == 0 else "<answer>done</answer>")
    driver = RolloutDriver(venv, policy, schedule=schedule, max_turn_tokens=128)
    path = tmp_path / "t.jsonl"
    with pytest.raises(ConnectionError):
        driver.run(TASKS[:16], seeds=0, trajectory_path=path)
    rows = read_trajectories(path)
    ids = {r["task"]["id"] for r in rows}
    assert {"t0", "t1", "t2", "t3"} <= ids and "t9" not in ids  # the first wave / slots finished before the failure
    assert all(r["terminated"] and len(r["turns"]) == 2 for r in rows)
