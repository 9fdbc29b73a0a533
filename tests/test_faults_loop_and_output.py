"""Faults outside the MCP transport: unbounded work on the shared event loop (a schema pattern that
backtracks, a slow ``__str__``), deeply nested arguments reaching the JSONL writer, a full disk and non-regular files
behind ``--out``. Each case has a deadline; a case that could hang the process runs in its own process."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolgym import runtime
from toolgym.cli import main as cli_main
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.errors import OutputFileError
from toolgym.jsonl import JSONLStream, check_writable, read_jsonl, write_jsonl
from toolgym.models import load_tokenizer
from toolgym.rollout import RolloutDriver, ScriptedPolicy, read_trajectories
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.function import tool
from toolgym.tools.sql import SQLTool
from toolgym.trajectory import check_trajectory_row

ROOT = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "fault_scripts"


def _script(name: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


# -- 2. unbounded work on the loop -------------------------------------------------------------------------------
@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["nested", "alternation", "slow_str"])
def test_work_a_call_brings_never_freezes_the_loop(case) -> None:
    try:
        out = _script("loop_work.py", case, timeout=120)
    except subprocess.TimeoutExpired:  # before: `re` backtracking with the GIL held, for good
        pytest.fail(f"{case}: the process hung")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # the loop kept running: before, a 26-character argument froze it for seconds, a slow __str__ for 8 s
    assert r["max_gap"] < 1.0, r
    if case == "slow_str":
        assert r["kind"] == "timeout" and r["took"] < 4, r  # before: "success" after 8 s past a 1 s timeout
    elif case == "nested":
        assert r["kind"] == "invalid_arguments" and "does not match" in r["content"], r
    else:
        assert r["kind"] == "invalid_arguments" and r["took"] < 10, r


# -- 3. deeply nested arguments reach the JSONL writer -------------------------------------------------------------
@tool
async def say(text: str) -> str:
    """Say text.

    Args:
        text: what to say
    """
    return f"said {text}"


def _deep_caller(levels: int, fn, *args):
    """Call ``fn`` from ``levels`` frames down (the writer runs deeper in a real caller's stack than the parser)."""
    return fn(*args) if levels == 0 else _deep_caller(levels - 1, fn, *args)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_deeply_nested_arguments_keep_every_row_whole(schedule, tmp_path) -> None:
    depth = 900  # parses on the runtime loop's thread; cannot be encoded 300 frames down
    deep = '<tool_call>{"name": "say", "arguments": {"text": "x", "more": ' + "[" * depth + "1" + "]" * depth + "}}</tool_call>"
    tok = load_tokenizer()

    def make(executor=None):
        return ToolEnv([{"id": f"t{i}", "prompt": "p"} for i in range(4)], executor=executor, tokenizer=tok,
                       max_turns=2)  # fmt: skip

    venv = ToolVectorEnv(make, 2, executor=ToolExecutor([say]), autoreset_mode="disabled")
    policy = ScriptedPolicy(lambda st: deep if st.turn == 0 and st.index == 1 else "<answer>a</answer>")
    driver = RolloutDriver(venv, policy, schedule=schedule, max_turn_tokens=100_000)
    out = tmp_path / "t.jsonl"
    with JSONLStream(out) as stream:  # as `toolgym rollout` writes, episode by episode
        trajs = driver.run([None] * 4, seeds=0, on_episode=lambda _k, t: _deep_caller(300, stream.write, t.to_dict()))
    assert len(trajs) == 4
    rows = read_trajectories(out)  # before: RecursionError, the run aborted with 1 of 4 rows written
    assert len(rows) == 4
    cut = [r for r in rows if "write_error" in r]
    assert len(cut) == 1 and cut[0]["write_error"].startswith("too_deep")
    for r in rows:
        check_trajectory_row(r)  # `toolgym view` reads every row


# -- 8. a full disk under --out ----------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_failed_write_leaves_whole_rows_and_is_classified(tmp_path, monkeypatch) -> None:
    out = tmp_path / "t.jsonl"
    stream = JSONLStream(out)
    stream.write({"row": 0, "pad": "a" * 100})
    real_write = os.write

    def disk_fills(fd, data):  # the kernel takes part of the row, then the disk is full
        if fd == stream.fh.fileno() and len(data) > 10:
            real_write(fd, bytes(data[:10]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_fills)
    with pytest.raises(OutputFileError, match="No space left"):
        stream.write({"row": 1, "pad": "b" * 100})
    monkeypatch.undo()
    stream.close()
    assert [r["row"] for r in read_jsonl(out)] == [0]  # before: a cut last row, which `view` refuses
    assert out.read_bytes().endswith(b"\n")


def _userns() -> bool:
    try:
        return subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _userns(), reason="needs unprivileged user + mount namespaces (a private small tmpfs)")
def test_rollout_onto_a_full_disk_exits_3_with_whole_rows(tmp_path) -> None:
    disk, copy = tmp_path / "disk", tmp_path / "copy.jsonl"
    disk.mkdir()
    # a 256 KiB tmpfs of its own (a private mount namespace) with 232 KiB taken: a few rows fit, then ENOSPC
    cmd = (f"mount -t tmpfs -o size=256k none {disk} && head -c 237568 /dev/zero > {disk}/fill; "
           f"{sys.executable} -m toolgym.cli rollout calculator --policy tiny --episodes 24 --max-new-tokens 48 "
           f"--out {disk}/t.jsonl --no-progress; rc=$?; cp {disk}/t.jsonl {copy}; exit $rc")
    r = subprocess.run(["unshare", "-r", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=280,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 3, r.stderr[-3000:]  # before: 1
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("toolgym: error:")]
    assert len(err) == 1 and "No space left on device" in err[0], r.stderr[-2000:]
    rows = read_trajectories(copy)  # every row whole (before: a cut last row)
    assert 0 < len(rows) < 24
    assert copy.read_bytes().endswith(b"\n")


# -- 9. --out naming something that is not a regular file ------------------------------------------------------------
@pytest.mark.timeout(60)
def test_out_through_a_symlink_keeps_the_link_and_writes_its_target(tmp_path) -> None:
    target, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    target.write_text('{"old": 1}\n')
    link.symlink_to(target)
    check_writable(link)
    with JSONLStream(link) as s:
        s.write({"new": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)  # before: replaced by a regular file
    assert read_jsonl(target) == [{"new": 1}]
    write_jsonl(link, [{"again": 2}])
    assert link.is_symlink() and read_jsonl(target) == [{"again": 2}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device", "link_to_fifo"])
def test_out_naming_a_device_or_fifo_is_refused_and_left_alone(kind, tmp_path, capsys) -> None:
    node = tmp_path / "node"
    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root")
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    else:
        os.mkfifo(node)
    out = node
    if kind == "link_to_fifo":
        out = tmp_path / "link"
        out.symlink_to(node)
    mode = node.lstat().st_mode
    with pytest.raises(OutputFileError, match="not a regular file"):
        check_writable(out)
    with pytest.raises(OutputFileError, match="not a regular file"):
        JSONLStream(out).write({"a": 1})
    with pytest.raises(OutputFileError):
        write_jsonl(out, [{"a": 1}])
    assert node.lstat().st_mode == mode and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"node", out.name})  # nothing replaced, nothing left next to it  # fmt: skip
    code = cli_main(["rollout", "calculator", "--policy", "tiny", "--episodes", "1", "--out", str(out)])
    assert code == 3
    assert "not a regular file" in capsys.readouterr().err
    assert node.lstat().st_mode == mode


# -- 6. SQL-v0: functions on an allow-list, slow queries in their own threads ------------------------------------------
@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "x.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER, doc TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, json.dumps({"n": i})) for i in range(100)])
    con.commit()
    con.close()
    return path


@pytest.mark.timeout(60)
def test_sql_functions_off_the_allow_list_are_refused_by_name(db) -> None:
    ex = ToolExecutor([SQLTool(db)])

    def run(q: str):
        return runtime.run_sync(ex.run(ToolCall("execute_sql", {"query": q})))

    for q in ("SELECT fts3_tokenizer('simple')", "SELECT hex(fts3_tokenizer('simple'))",
              "SELECT fts3_tokenizer('simple', x'4141414141414141')", "SELECT sqlite_compileoption_get(0)"):
        r = run(q)  # before: a library address, or an internal pointer overwritten
        assert r.error_kind is ToolErrorKind.EXCEPTION and "refused" in r.content and "function" in r.content, r
    assert "fts3_tokenizer()" in run("SELECT fts3_tokenizer('simple')").content
    ok = run("SELECT count(*), max(doc ->> '$.n'), upper('a'), round(avg(id), 1), date('2024-01-02') FROM t")
    assert ok.ok and "99" in ok.content and "2024-01-02" in ok.content, ok.content


@pytest.mark.timeout(120)
def test_a_fast_query_does_not_wait_behind_slow_ones(db) -> None:
    tool_ = SQLTool(db, time_limit_s=3.0)
    ex = ToolExecutor([tool_], default_timeout_s=30)
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"

    async def go():
        slow_calls = [asyncio.ensure_future(ex.run(ToolCall("execute_sql", {"query": slow}))) for _ in range(32)]
        await asyncio.sleep(0.3)  # the slow ones have taken their threads
        t0 = time.perf_counter()
        fast = await ex.run(ToolCall("execute_sql", {"query": "SELECT count(*) FROM t"}))
        took = time.perf_counter() - t0
        slow_results = await asyncio.gather(*slow_calls)
        return fast, took, slow_results

    fast, took, slow_results = runtime.run_sync(go())
    assert fast.ok and "100" in fast.content
    assert all(r.error_kind is ToolErrorKind.TIMEOUT for r in slow_results)
    # before: asyncio's default pool (min(32, cpus + 4) threads): the fast query waited for waves of slow ones
    assert took < 2.0, took
