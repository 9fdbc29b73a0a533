"""The sandbox's worker program as a module: its protocol, exit codes and snippet runner called directly, the real
program driven over its socket without a :class:`Sandbox`, and the host-side output cap and classification.

The sandbox as a whole (isolation, attacks, the pool) is tested in ``test_python_sandbox.py``.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from toolgym.tools.sandbox import worker
from toolgym.tools.sandbox.forkserver import BASE_ENV, WORKER_PROGRAM
from toolgym.tools.sandbox.limits import CappedOutput, classify


# -- protocol ---------------------------------------------------------------------------------------------
def test_requests_and_replies_round_trip():
    cfg = {"namespaces": False, "mounts": ["/tmp"], "tmpfs_bytes": 1 << 20, "workdir": "/tmp/a b", "uid": None,
           "rlimits": [("RLIMIT_CPU", 1, 2)], "env": {"HOME": "/tmp/x y", "LANG": "C.UTF-8"}}
    req, got = worker.parse_request(worker.fork_request(17, cfg))
    assert req == b"17" and got == cfg
    assert worker.parse_request(worker.kill_request(4321)) == (b"K", 4321)
    assert worker.parse_reply(worker.forked_reply(req, 999)) == (b"P", 17, b"999")
    assert worker.parse_reply(worker.exited_reply(999, 9)) == (b"X", 999, b"9")
    kind, n, text = worker.parse_reply(worker.failed_reply(req, OSError(1, "Operation not permitted")))
    assert (kind, n) == (b"E", 17) and text == b"PermissionError(1, 'Operation not permitted')"


def test_a_request_config_cannot_call_anything():
    """The config is a literal: evaluated with no builtins, a call in it fails instead of running."""
    with pytest.raises(NameError):
        worker.parse_request(b"3 __import__('os').getpid()")


def test_fds_passed_with_a_message_are_received():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        socket.send_fds(a, [b"1 {}"], [w, r])
        msg, anc, _, _ = b.recvmsg(1 << 16, socket.CMSG_LEN(12))
        fds = worker.received_fds(anc)
        assert msg == b"1 {}" and len(fds) == 2 and set(fds).isdisjoint({r, w})
        os.write(fds[0], b"through the copy")  # the received copy of the write end feeds the original read end
        assert os.read(r, 100) == b"through the copy"
        for f in fds:
            os.close(f)
    finally:
        for f in (r, w):
            os.close(f)
        a.close()
        b.close()
    assert worker.received_fds([]) == []


# -- exit codes and the snippet runner --------------------------------------------------------------------
def test_exit_status_is_the_interpreters(capsys):
    assert worker.exit_status(None) == 0
    assert worker.exit_status(3) == 3
    assert worker.exit_status(True) == 1
    assert capsys.readouterr().err == ""
    assert worker.exit_status("bad input") == 1
    assert capsys.readouterr().err == "bad input\n"


@pytest.fixture
def main_module(monkeypatch):
    """``execute`` registers the snippet's module as ``__main__``: restore pytest's afterwards."""
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])


def test_execute_runs_the_snippet_as_main(main_module, capsys):
    assert worker.execute("x = 41\nimport __main__\nprint(__main__.x + 1, __name__)") == 0
    assert capsys.readouterr().out == "42 __main__\n"
    assert isinstance(sys.modules["__main__"], types.ModuleType) and sys.modules["__main__"].x == 41
    assert worker.execute("import sys\nprint('bye')\nsys.exit(4)") == 4
    assert worker.execute("raise SystemExit('no')") == 1
    out = capsys.readouterr()
    assert out.out == "bye\n" and out.err == "no\n"


def test_a_traceback_shows_the_snippet_not_the_worker(main_module, capsys):
    assert worker.execute("print('before')\ndef f():\n    return 1 / 0\nf()") is None
    out = capsys.readouterr()
    assert out.out == "before\n"
    assert out.err.startswith("Traceback (most recent call last):\n  File \"<code>\", line 4, in <module>\n")
    assert 'File "<code>", line 3, in f' in out.err and out.err.endswith("ZeroDivisionError: division by zero\n")
    assert "worker" not in out.err and "toolgym" not in out.err


def test_snippets_do_not_inherit_the_workers_future_imports(main_module, capsys):
    """worker.py uses ``from __future__ import annotations``; a snippet's annotations must still be evaluated."""
    assert worker.execute("def f(x: int) -> str: pass\nprint(f.__annotations__)") == 0
    assert capsys.readouterr().out == "{'x': <class 'int'>, 'return': <class 'str'>}\n"


@pytest.mark.timeout(60)
def test_the_cpu_limit_handler_exits_with_cpu_exit():
    """A real RLIMIT_CPU: the SIGXCPU handler writes its line and exits with CPU_EXIT, classified cpu_limit. Run
    in an isolated interpreter that only has worker.py's directory: the module needs nothing but the stdlib."""
    code = ("import resource, signal, sys\n"
            f"sys.path.insert(0, {os.path.dirname(WORKER_PROGRAM)!r})\n"
            "import worker\n"
            "signal.signal(signal.SIGXCPU, worker.on_sigxcpu)\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (1, 3))\n"
            "print('spinning', flush=True)\n"
            "while True:\n    pass\n")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, timeout=50)
    assert r.returncode == worker.CPU_EXIT == 152, r
    assert r.stdout == b"spinning\n" and r.stderr == b"\nCPU time limit exceeded\n"
    res = classify(r.returncode << 8, r.stdout, r.stderr, timed_out=False, overflow=False, wall_s=1.0)
    assert res.status == "cpu_limit" and res.exit_code == 152


# -- the real program over its socket ---------------------------------------------------------------------
def _recv(sock: socket.socket, timeout: float = 20.0) -> tuple[bytes, int, bytes]:
    sock.settimeout(timeout)
    return worker.parse_reply(sock.recv(4096))


def _read_until_eof(fd: int, timeout: float = 20.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return out
            out += chunk
    raise TimeoutError(out)


@pytest.mark.timeout(60)
def test_the_fork_server_forks_runs_kills_and_reaps_workers(tmp_path: Path):
    """worker.py run as the fork server (as :class:`_ForkServer` starts it), without namespaces or a uid: a
    worker runs a snippet, another is killed on request, an unknown pid is ignored; hanging up ends the server."""
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-I", "-S", WORKER_PROGRAM, str(child.fileno()), "0"],
                            pass_fds=(child.fileno(),), env=BASE_ENV, cwd="/", start_new_session=True)
    child.close()
    cfg = {"namespaces": False, "mounts": [], "tmpfs_bytes": 0, "workdir": str(tmp_path / "w"), "uid": None,
           "rlimits": [("RLIMIT_CORE", 0, 0)], "path": [], "binds": [], "covers": [], "hide": [],
           "env": {"HOME": str(tmp_path), "MARK": "x"}}

    def fork(req: int) -> tuple[int, int, int, int]:
        pipes = [os.pipe() for _ in range(3)]
        socket.send_fds(host, [worker.fork_request(req, cfg)], [pipes[0][0], pipes[1][1], pipes[2][1]])
        for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
            os.close(fd)
        kind, n, pid = _recv(host)
        assert (kind, n) == (b"P", req)
        return int(pid), pipes[0][1], pipes[1][0], pipes[2][0]

    try:
        host.send(worker.kill_request(1))  # not one of its workers: ignored (pid 1 is never a worker)
        pid, stdin, stdout, stderr = fork(1)
        os.write(stdin, b"import os, sys\nprint(os.getcwd(), os.environ['MARK'], sys.argv)\n"
                        b"print('err', file=sys.stderr)\nsys.exit(5)")
        os.close(stdin)
        out, err = _read_until_eof(stdout), _read_until_eof(stderr)
        assert out == worker.READY + f"{tmp_path / 'w'} x ['<sandbox>']\n".encode() and err == b"err\n"
        assert _recv(host)[:2] == (b"X", pid)
        for fd in (stdout, stderr):
            os.close(fd)

        pid2, stdin2, stdout2, stderr2 = fork(2)
        os.write(stdin2, b"import time; print('up', flush=True); time.sleep(60)")
        os.close(stdin2)
        assert os.read(stdout2, 100).startswith(worker.READY)  # ready (and maybe already 'up')
        host.send(worker.kill_request(pid2))
        kind, reaped, status = _recv(host)
        assert (kind, reaped) == (b"X", pid2)
        res = classify(int(status), b"", b"", timed_out=False, overflow=False, wall_s=0.0)
        assert res.status == "killed" and res.signal == "SIGKILL"
        for fd in (stdout2, stderr2):
            os.close(fd)
    finally:
        host.close()  # hang up: the server kills what is left and exits
        assert proc.wait(20) == 0


# -- host side: output cap and classification -------------------------------------------------------------
def test_output_is_capped_across_stdout_and_stderr():
    o = CappedOutput(10)
    assert not o.add(b"12345") and not o.add(b"678", stderr=True)
    assert o.add(b"90abc")  # crosses the cap: what fits is kept
    assert (bytes(o.stdout), bytes(o.stderr), o.overflow) == (b"1234590", b"678", True)
    assert not o.add(b"more", stderr=True) and bytes(o.stderr) == b"678"  # drained, not kept
    early = CappedOutput(4, b"abcd")  # output that came with the ready marker counts
    assert not early.add(b"") and early.add(b"e") and bytes(early.stdout) == b"abcd"


@pytest.mark.parametrize(("status", "stderr", "timed_out", "overflow", "want"), [
    (0, b"", False, False, "ok"),
    (3 << 8, b"", False, False, "error"),
    (1 << 8, b"Traceback ...\nMemoryError\n", False, False, "memory_limit"),
    (worker.CPU_EXIT << 8, b"\nCPU time limit exceeded\n", False, False, "cpu_limit"),
    (signal.SIGXCPU, b"", False, False, "cpu_limit"),
    (signal.SIGSEGV, b"", False, False, "killed"),
    (worker.SETUP_EXIT << 8, b"sandbox setup failed: OSError()\n", False, False, "sandbox_error"),
    (worker.SETUP_EXIT << 8, b"the snippet's own exit(120)\n", False, False, "error"),
    (signal.SIGKILL, b"", True, False, "timeout"),
    (signal.SIGKILL, b"", False, True, "output_limit"),
    (None, b"partial", False, False, "sandbox_error"),
])
def test_classification(status, stderr, timed_out, overflow, want):
    res = classify(status, b"out", stderr, timed_out=timed_out, overflow=overflow, wall_s=0.5)
    assert res.status == want and res.stdout == "out" and res.truncated == overflow and res.wall_s == 0.5
    if status is not None and status & 0x7F:  # ended by a signal: no exit code, the signal's name
        assert res.exit_code is None and res.signal == signal.Signals(status).name
    elif status is not None:
        assert res.exit_code == status >> 8 and res.signal is None
    else:
        assert res.exit_code is None and res.stderr == "partial\n[the sandbox fork server exited]\n"
