"""The Python sandbox under attack, the python tool's classification, word problems and Python-v0 episodes.

Every adversarial snippet must be contained (host files, host processes and other concurrent calls unaffected,
no process left behind) and reported as a classified result. Workers are forked by a fork server; the tests
also kill that server mid-call and check that consecutive snippets share nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import toolgym
from toolgym.envs.python import TEMPLATES, generate_problem
from toolgym.format.parsers import get_parser
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.python import PythonTool, Sandbox, SandboxLimits, namespaces_available

NS = namespaces_available()
ROOT = os.geteuid() == 0
LIMITS = SandboxLimits(wall_s=3.0, cpu_s=2, memory_mb=256, max_procs=16, max_output_bytes=4096)
needs_ns = pytest.mark.skipif(not NS, reason="network/PID/mount namespaces need root + unshare on this host")


def _sandbox_pids(sb: Sandbox, zombies: bool = True) -> list[int]:
    """Host pids of processes owned by the sandbox's per-worker uids (empty when none are left); ``zombies=False``
    skips exited processes still waiting to be reaped."""
    if not sb.drop_privileges:
        return []
    lo, hi = sb.uid_base, sb.uid_base + 1024
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                uid = os.stat(f"/proc/{d}").st_uid
                with open(f"/proc/{d}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if lo <= uid < hi and (zombies or state != "Z"):
                pids.append(int(d))
    return pids


async def _no_leftovers(sb: Sandbox, zombies: bool = True) -> list[int]:
    """Close the sandbox (killing its idle warm workers), then wait until no process of its uids is left."""
    await sb.aclose()
    for _ in range(50):
        left = _sandbox_pids(sb, zombies)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return _sandbox_pids(sb, zombies)


@pytest.fixture
async def sandbox():
    sb = Sandbox(LIMITS, pool_size=3)
    await sb.start()
    yield sb
    await sb.aclose()


# -- basics -----------------------------------------------------------------------------------------------
async def test_runs_code_in_a_fresh_isolated_interpreter(sandbox, monkeypatch):
    monkeypatch.setenv("TOOLGYM_HOST_SECRET", "hunter2")
    assert len(sandbox._ready) == 3  # the warm pool is full before the first call
    r = await sandbox.run("import os, sys\nprint(sum(range(10**6)))\nprint(sorted(os.environ))\nprint(os.getcwd())")
    assert r.status == "ok" and r.exit_code == 0
    out = r.stdout.splitlines()
    assert out[0] == "499999500000"
    assert "TOOLGYM_HOST_SECRET" not in r.stdout and "PATH" in out[1]
    # fresh working directory each call: a file written by one call is gone in the next
    w = await sandbox.run("open('state.txt', 'w').write('x'); import os; print(os.listdir('.'))")
    assert w.stdout.strip() == "['state.txt']"
    r2 = await sandbox.run("import os; print(os.listdir('.'))")
    assert r2.stdout.strip() == "[]"
    # third-party packages of this environment are importable
    np_run = await sandbox.run("import numpy as np; print(int(np.arange(5).sum()))")
    assert np_run.stdout.strip() == "10", np_run.stderr
    if ROOT:
        assert sandbox.drop_privileges
        uid = await sandbox.run("import os; print(os.getuid())")
        assert int(uid.stdout) >= sandbox.uid_base
    await asyncio.sleep(0.5)
    assert len(sandbox._ready) + sandbox._spawning == 3  # the pool refilled in the background


async def test_exceptions_and_exit_codes_are_observations_the_model_can_read():
    tool = PythonTool(Sandbox(LIMITS, pool_size=1))
    ex = ToolExecutor([tool])
    res = await ex.run(ToolCall("python", {"code": "print('before')\n1/0"}))
    assert res.ok  # the tool worked; the model's code failed
    assert res.content.startswith("before\n[stderr]\nTraceback") and "ZeroDivisionError" in res.content
    assert "<code>" in res.content and "line 2" in res.content and "exit status 1" in res.content
    assert "toolgym" not in res.content  # the bootstrap's frames are not shown
    res = await ex.run(ToolCall("python", {"code": "import sys; print('bye'); sys.exit(3)"}))
    assert res.ok and res.content == "bye\n[exit status 3]"
    res = await ex.run(ToolCall("python", {"code": "x = 1"}))
    assert res.ok and "no output" in res.content
    res = await ex.run(ToolCall("python", {"source": "print(1)"}))
    assert res.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    await ex.aclose()


# -- adversarial ------------------------------------------------------------------------------------------
async def test_infinite_loop_is_killed_and_classified_as_timeout():
    tool = PythonTool(Sandbox(SandboxLimits(wall_s=1.5, cpu_s=1), pool_size=1))
    ex = ToolExecutor([tool])
    res = await ex.run(ToolCall("python", {"code": "while True:\n    pass"}))
    assert res.error_kind is ToolErrorKind.TIMEOUT
    assert tool.last_result is not None and tool.last_result.status in ("timeout", "cpu_limit")
    assert "limit" in res.content and res.latency_s < 10
    # a sleeping snippet uses no CPU: the wall clock stops it
    res = await ex.run(ToolCall("python", {"code": "import time; print('start', flush=True); time.sleep(60)"}))
    assert res.error_kind is ToolErrorKind.TIMEOUT and tool.last_result.status == "timeout"
    assert res.content.startswith("Error (timeout): start") and "wall-clock limit of 1.5 s" in res.content
    assert await _no_leftovers(tool.sandbox) == []


async def test_memory_bomb_hits_the_address_space_limit(sandbox):
    r = await sandbox.run("x = []\nwhile True:\n    x.append(bytearray(10**7))")
    assert r.status == "memory_limit" and "MemoryError" in r.stderr
    r = await sandbox.run("x = bytearray(2 * 1024**3)")
    assert r.status == "memory_limit"
    tool = PythonTool(sandbox)
    with pytest.raises(toolgym.tools.base.ToolError) as e:
        await tool.acall({"code": "s = 'a' * (1 << 31)"})
    assert e.value.kind is ToolErrorKind.EXCEPTION and "memory limit of 256 MiB" in e.value.message


async def test_output_flood_is_cut_and_the_worker_killed(sandbox):
    r = await sandbox.run("while True:\n    print('spam' * 1000)")
    assert r.status == "output_limit" and r.truncated
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= LIMITS.max_output_bytes
    assert r.wall_s < LIMITS.wall_s  # killed for the flood, not left to the wall clock
    assert "output exceeded 4096 bytes" in r.to_text(LIMITS)


async def test_fork_bomb_is_contained_and_leaves_no_process(sandbox):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    other = asyncio.ensure_future(sandbox.run("import time; time.sleep(0.5); print('still fine')"))
    r = await sandbox.run(code)
    assert r.status in ("timeout", "cpu_limit", "error", "killed", "output_limit")
    ok = await other
    assert ok.status == "ok" and ok.stdout == "still fine\n"
    assert await _no_leftovers(sandbox) == []


@needs_ns
async def test_daemonised_children_die_with_the_worker(sandbox):
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(300)\n"
            "    os._exit(0)\nprint('parent done')")
    r = await sandbox.run(code)
    assert r.status == "ok" and r.stdout == "parent done\n"
    assert await _no_leftovers(sandbox) == []
    assert sandbox._closed  # the PID namespace took the setsid'd grandchild with it


async def test_writes_outside_the_working_directory_do_not_reach_the_host(sandbox, tmp_path):
    tag = uuid.uuid4().hex
    targets = [f"/tmp/toolgym-escape-{tag}", f"/etc/toolgym-escape-{tag}", str(tmp_path / "escape"),
               f"{Path(__file__).resolve().parent}/toolgym-escape-{tag}"]
    code = f"import os\nfor p in {targets!r}:\n    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n" \
           "    except OSError as e:\n        print('denied', p, type(e).__name__)\n"
    r = await sandbox.run(code)
    assert r.status == "ok", r.stderr
    for t in targets:
        assert not Path(t).exists(), f"sandbox wrote {t} on the host"
    if NS and ROOT:
        # its own /tmp is a private tmpfs (allowed, invisible to the host); everything else is denied
        assert f"wrote /tmp/toolgym-escape-{tag}" in r.stdout
        assert r.stdout.count("denied") == 3
    big = await sandbox.run("open('big', 'wb').write(b'0' * (64 * 1024 * 1024))")
    assert big.status in ("error", "killed") and ("File size" in big.stderr or big.signal == "SIGXFSZ"
                                                   or "No space" in big.stderr or "Errno 27" in big.stderr)


@needs_ns
async def test_network_is_unreachable(sandbox):
    hits = []

    async def handle(reader, writer):
        hits.append(1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        r = await sandbox.run(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', PORT), timeout=2)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e)\n"
            "try:\n    socket.create_connection(('8.8.8.8', 53), timeout=2)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e)\n".replace("PORT", str(port)))
    finally:
        server.close()
        await server.wait_closed()
    assert r.status == "ok" and r.stdout.count("blocked") == 2 and "connected" not in r.stdout
    assert hits == []


async def test_killing_its_parent_or_the_host_does_not_work(sandbox):
    host = os.getpid()
    code = ("import os, signal\nfor pid in (os.getppid(), HOST, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "        print('sent', pid)\n    except OSError as e:\n        print('failed', pid, type(e).__name__)\n"
            "print('alive')").replace("HOST", str(host))
    r = await sandbox.run(code)
    assert r.status in ("ok", "killed")
    os.kill(host, 0)  # the host process is alive (we are running this line)
    if NS:
        assert f"failed {host}" in r.stdout  # the host is not even visible from the sandbox
    ok = await sandbox.run("print(6 * 7)")
    assert ok.stdout == "42\n"


async def test_crash_by_signal_is_classified(sandbox):
    r = await sandbox.run("import os\nos.abort()")
    assert r.status == "killed" and r.signal in ("SIGABRT", "SIGSEGV")
    tool = PythonTool(sandbox)
    with pytest.raises(toolgym.tools.base.ToolError) as e:
        await tool.acall({"code": "import ctypes; ctypes.string_at(0)"})
    assert e.value.kind is ToolErrorKind.EXCEPTION and "killed by signal" in e.value.message


async def test_attacks_run_concurrently_with_normal_calls_that_stay_correct():
    tool = PythonTool(Sandbox(LIMITS, pool_size=4))
    ex = ToolExecutor([tool])
    attacks = [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "x = []\nwhile True:\n    x.append(bytearray(10**7))",
        "while True:\n    pass",
        "while True:\n    print('x' * 10000)",
        f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({os.getpid()}, signal.SIGKILL)",
    ]
    normal = [f"print(sum(i * i for i in range({n})))" for n in (10, 1000, 54321, 99999)]
    calls = [ToolCall("python", {"code": c}, id=f"a{i}") for i, c in enumerate(attacks)]
    calls += [ToolCall("python", {"code": c}, id=f"n{i}") for i, c in enumerate(normal)]
    results = await ex.run_many(calls)
    for res, n in zip(results[len(attacks):], (10, 1000, 54321, 99999), strict=True):
        assert res.ok and res.content == str(sum(i * i for i in range(n)))
    kinds = [r.error_kind for r in results[: len(attacks)]]
    assert kinds[1] is ToolErrorKind.EXCEPTION and kinds[2] is ToolErrorKind.TIMEOUT
    assert kinds[3] is ToolErrorKind.EXCEPTION
    assert await _no_leftovers(tool.sandbox) == []


async def test_cancelling_a_call_kills_its_worker():
    sb = Sandbox(LIMITS, pool_size=1)
    task = asyncio.ensure_future(sb.run("import time; time.sleep(30)"))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _no_leftovers(sb) == []


def test_isolation_report_is_honest():
    sb = Sandbox(LIMITS, pool_size=0, isolation="none")
    assert sb.isolation["network_namespace"] is False and sb.isolation["rlimits"] is True
    assert Sandbox(LIMITS, pool_size=0).isolation["network_namespace"] is NS
    with pytest.raises(ValueError):
        Sandbox(isolation="docker")


async def test_no_namespace_mode_still_limits_and_cleans_up():
    sb = Sandbox(LIMITS, pool_size=0, isolation="none")
    r = await sb.run("import os; print(os.getcwd())")
    assert r.status == "ok", r.stderr
    assert not Path(r.stdout.strip()).exists()  # the host temp dir was removed
    r = await sb.run("x = bytearray(2 * 1024**3)")
    assert r.status == "memory_limit"
    await sb.aclose()


async def test_a_snippet_cannot_leave_its_process_group(sandbox):
    # it leads its own session, so setsid() fails and the wall-clock kill reaches it; clearing its parent-death
    # signal does not help either (an earlier design lost sleeping snippets that did this)
    code = ("import ctypes, os, time\ntry:\n    os.setsid()\n    print('escaped')\nexcept OSError as e:\n"
            "    print('setsid', e.errno)\nctypes.CDLL(None).prctl(1, 0)\nprint('sleeping', flush=True)\ntime.sleep(60)")
    r = await sandbox.run(code)
    assert r.status == "timeout" and r.stdout == "setsid 1\nsleeping\n"
    assert await _no_leftovers(sandbox) == []


async def test_the_snippet_inherits_no_file_descriptor_but_its_stdio(sandbox):
    # in particular not the fork server's control socket (which could ask for unsandboxed workers)
    r = await sandbox.run("import os\nfor fd in sorted(os.listdir('/proc/self/fd'), key=int):\n    try:\n"
                          "        print(fd, os.readlink(f'/proc/self/fd/{fd}'))\n    except OSError:\n        pass")
    assert r.status == "ok", r.stderr
    links = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert all(links[fd].startswith("pipe:") for fd in "012")
    others = {fd: t for fd, t in links.items() if fd not in "012"}
    assert all(t == "/dev/null" or t.startswith("/proc/") for t in others.values()), others
    assert not any("socket" in t for t in links.values())


async def test_consecutive_snippets_share_no_state(sandbox):
    # json is imported by the fork server itself: a snippet's change to it must not reach the next snippet
    shared = f"/tmp/toolgym-shared-{uuid.uuid4().hex}"  # the private /tmp with namespaces; the host's without
    try:
        first = await sandbox.run(
            "import builtins, json, os, random, sys\nopen('mine.txt', 'w').write('1')\nopen(SHARED, 'w').write('1')\n"
            "builtins.LEAK = 1\njson.LEAK = 1\nsys.modules['leak'] = json\nos.environ['LEAK'] = '1'\nSECRET = 42\n"
            "print(os.getpid(), random.random())".replace("SHARED", repr(shared)))
        assert first.status == "ok", first.stderr
        second = await sandbox.run(
            "import builtins, json, os, random, sys\nimport __main__\n"
            "print(sorted(os.listdir('.')), os.path.exists(SHARED), hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), "
            "'leak' in sys.modules, 'LEAK' in os.environ, hasattr(__main__, 'SECRET'))\n"
            "print(os.getpid(), random.random())\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
            .replace("SHARED", repr(shared)))
    finally:
        Path(shared).unlink(missing_ok=True)
    assert second.status == "ok", second.stderr
    lines = second.stdout.splitlines()
    assert lines[0] == f"[] {not NS} False False False False False"
    pid1, rand1 = first.stdout.split()
    pid2, rand2 = lines[1].split()
    assert rand1 != rand2  # the random module is reseeded in every worker
    if NS:  # each snippet is PID 1 of its own PID namespace and sees no other process
        assert pid1 == pid2 == "1" and lines[2] == "[1]"
    else:
        assert pid1 != pid2


async def test_interpreter_exit_is_like_a_normal_interpreter(sandbox):
    r = await sandbox.run("import atexit, sys, threading, time\natexit.register(print, 'atexit ran')\n"
                          "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n"
                          "sys.exit('bye')")
    assert r.status == "error" and r.exit_code == 1
    assert r.stdout == "thread done\natexit ran\n" and r.stderr == "bye\n"
    r = await sandbox.run("import sys\nprint('partial', end='')\nsys.exit()")
    assert r.status == "ok" and r.stdout == "partial"  # unflushed output is flushed at exit


async def test_a_large_snippet_is_fed_through_the_pipe(sandbox):
    code = "x = 0\n" + "x += 1\n" * 40_000 + "print(x)"  # 280 kB, more than a pipe buffer holds
    r = await sandbox.run(code)
    assert r.status == "ok" and r.stdout == "40000\n", r.stderr


async def test_killing_the_fork_server_mid_call_is_classified_and_the_pool_recovers():
    sb = Sandbox(LIMITS, pool_size=2)
    await sb.start()
    first_server = sb.server_pid
    assert first_server is not None and sb.servers_started == 1
    call = asyncio.ensure_future(sb.run("import time\nprint('started', flush=True)\ntime.sleep(30)"))
    await asyncio.sleep(0.5)
    os.kill(first_server, signal.SIGKILL)
    r = await asyncio.wait_for(call, 10)  # a classified result, not a hang until the wall clock
    assert r.status == "sandbox_error" and "fork server exited" in r.stderr and r.wall_s < LIMITS.wall_s
    ok = await sb.run("print(6 * 7)")  # the warm workers died with the server: a new server forks a new one
    assert ok.status == "ok" and ok.stdout == "42\n"
    assert sb.servers_started == 2 and sb.server_pid not in (None, first_server)
    # the dead server's orphaned workers were killed by the host; the host's init reaps them in its own time
    assert await _no_leftovers(sb, zombies=False) == []


async def test_fresh_interpreter_mode_runs_the_same_worker():
    sb = Sandbox(LIMITS, pool_size=0, fork_server=False)
    r = await sb.run("import os, sys\nprint(6 * 7, os.getcwd() == os.environ['HOME'], 'numpy' in sys.modules)")
    assert r.status == "ok" and r.stdout == "42 True False\n", r.stderr
    assert sb.servers_started == 0 and sb.server_pid is None  # no long-lived fork server
    r = await sb.run("while True:\n    pass")
    assert r.status in ("timeout", "cpu_limit")
    assert await _no_leftovers(sb) == []


@needs_ns
def test_a_virtualenv_under_tmp_stays_importable():
    # a clean-clone CI runs from /tmp/ci/.venv: the private tmpfs over /tmp must not hide the environment
    root = Path(tempfile.mkdtemp(prefix="toolgym-venv-", dir="/tmp"))
    root.chmod(0o755)  # like /tmp/ci: readable by the sandbox's uid, but hidden by its private /tmp
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=60)
        site = next((root / "venv" / "lib").glob("python*/site-packages"))
        (site / "toolgym_probe.py").write_text("VALUE = 'from the venv under /tmp'\n")
        repo = Path(__file__).resolve().parent.parent
        ours = [p for p in sys.path if p.endswith("site-packages")]
        script = ("import asyncio, json, sys\nfrom toolgym.tools.python import Sandbox\n"
                  "sb = Sandbox(pool_size=0)\n"
                  "r = asyncio.run(sb.run('import toolgym_probe, numpy\\nprint(toolgym_probe.VALUE)'))\n"
                  "print(json.dumps([sys.prefix, r.status, r.stdout, r.stderr]))")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join([str(repo), *ours])}
        p = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", script], capture_output=True, text=True,
                           env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        prefix, status, out, err = json.loads(p.stdout.splitlines()[-1])
        assert prefix.startswith("/tmp/") and status == "ok", err
        assert out == "from the venv under /tmp\n"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- word problems and the env --------------------------------------------------------------------------
def test_word_problems_are_deterministic_split_and_need_computation():
    a = [generate_problem(np.random.default_rng(7)) for _ in range(3)]
    b = [generate_problem(np.random.default_rng(7)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(0)
    train = [generate_problem(rng, "train") for _ in range(300)]
    test = [generate_problem(rng, "test") for _ in range(60)]
    assert {p["template"] for p in train} == set(TEMPLATES)
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert all(p["split"] == "train" for p in train) and all(p["split"] == "test" for p in test)
    assert all(int(p["answer"]) >= 0 for p in train)
    assert np.median([int(p["answer"]) for p in train]) > 10_000


def test_word_problem_answers_follow_from_the_question_text():
    import re

    rng = np.random.default_rng(11)
    checked = 0
    while checked < 20:
        p = generate_problem(rng)
        nums = [int(x) for x in re.findall(r"\d+", p["question"])]
        if p["template"] == "fleet":
            n, v, t1, u, t2 = nums
            assert int(p["answer"]) == n * (v * t1 + u * t2)
        elif p["template"] == "warehouse":
            a, b, c, d, _b = nums
            assert int(p["answer"]) == a * b - c + d * b
        elif p["template"] == "library":
            a, b, c, d, e = nums
            assert int(p["answer"]) == (a + b * c - d) // e
        else:
            continue
        checked += 1


@pytest.mark.slow
def test_python_env_episodes_with_a_scripted_policy():
    env = gym.make("toolgym/Python-v0", split="test", limits=LIMITS, pool_size=1)
    parser = get_parser("hermes")
    try:
        for seed in range(2):
            obs, info = env.reset(seed=seed)
            task = info["task"]
            assert task["split"] == "test" and len(obs) > 50
            call = parser.format_calls([("python", {"code": f"print({task['answer']})"})])
            obs, r, term, trunc, info = env.step(env.unwrapped.encode_action(call))
            assert not (term or trunc) and r == 0.0 and len(obs) > 0
            assert info["results"][0]["content"] == task["answer"]
            obs, r, term, trunc, info = env.step(env.unwrapped.encode_action(f"<answer>{task['answer']}</answer>"))
            assert term and r == 1.0
        obs, info = env.reset(seed=5)
        obs, r, term, trunc, info = env.step(env.unwrapped.encode_action("<answer>12</answer>"))
        assert term and r == 0.0
        # a runaway snippet in an episode: classified timeout observation, the episode goes on
        env.reset(seed=6)
        call = parser.format_calls([("python", {"code": "while True: pass"})])
        obs, r, term, trunc, info = env.step(env.unwrapped.encode_action(call))
        assert info["error_kinds"] == ["timeout"] and not term and len(obs) > 0
    finally:
        env.close()
