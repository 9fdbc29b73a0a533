"""The host side of a fork server: start it, ask it for workers, learn their pids and wait statuses, kill them.

The server is :mod:`.worker` run as ``python -I -S worker.py FD PRELOAD`` with a scrubbed environment; the
messages are that module's protocol functions. A worker as the host sees it is a :class:`_Worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from toolgym.tools.sandbox import worker as _protocol

#: the whole environment of the fork server, and the base of every worker's
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: the program the server runs (a file: ``-I`` keeps its directory off ``sys.path``)
WORKER_PROGRAM = _protocol.__file__


@dataclass(eq=False)
class _Worker:
    """A forked worker as the host sees it: its pid (= its process group), the server that forked it, the host
    ends of its stdio pipes (non-blocking) and a future for its wait status (``None`` when unknown: the fork
    server died)."""

    pid: int
    server: _ForkServer
    exit: asyncio.Future[int | None]
    stdin: int = -1
    stdout: int = -1
    stderr: int = -1
    early: bytes = b""  # output that arrived with the ready marker


class _ServerDied(RuntimeError):
    pass


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _kill(w: _Worker) -> None:
    """SIGKILL the worker's process group (with a PID namespace: everything it started), unless it was reaped.

    The fork server does the killing: it reaps the workers, so only it knows that a pid still names the worker
    (pids are reused) and it kills a worker's group before reaping it. The host kills directly only workers
    orphaned by a dead server."""
    if w.exit.done():
        return
    if w.server.alive:
        w.server.kill(w.pid)
        return
    try:
        os.killpg(w.pid, signal.SIGKILL)
    except ProcessLookupError:  # forked but not yet its own group leader
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.pid, signal.SIGKILL)
    except PermissionError:
        pass


class _ForkServer:
    """The host side of one fork server process: asks it for workers, learns their pids and wait statuses.

    Args:
        python: the interpreter to run.
        loop: the event loop whose reader receives the server's messages.
        preload: import commonly used stdlib modules once in the server (not for the fresh-per-call baseline).
    """

    def __init__(self, python: str, loop: asyncio.AbstractEventLoop, *, preload: bool) -> None:
        self.loop = loop
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-S", WORKER_PROGRAM, str(child.fileno()), "1" if preload else "0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(child.fileno(),), env=BASE_ENV,
                cwd="/", start_new_session=True,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            child.close()
        self.sock.setblocking(False)
        self.alive = True
        self._next = 0
        self._pending: dict[int, asyncio.Future[tuple[int, asyncio.Future[int | None]]]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        loop.add_reader(self.sock.fileno(), self._on_readable)

    async def fork(self, cfg: dict[str, Any], fds: list[int]) -> tuple[int, asyncio.Future[int | None]]:
        """Fork a worker with ``fds`` as its stdin/stdout/stderr; returns its pid and a future for its wait status.
        Raises ``OSError`` when the server could not fork, :class:`_ServerDied` when the server is gone."""
        if not self.alive:
            raise _ServerDied("the sandbox fork server exited")
        self._next += 1
        req = self._next
        fut = self.loop.create_future()
        self._pending[req] = fut
        msg = _protocol.fork_request(req, cfg)
        try:
            while True:
                try:
                    socket.send_fds(self.sock, [msg], fds)
                    break
                except BlockingIOError:
                    writable = self.loop.create_future()
                    self.loop.add_writer(self.sock.fileno(), _set_once, writable)
                    try:
                        await writable
                    finally:
                        self.loop.remove_writer(self.sock.fileno())
                except OSError as e:
                    self.close(died=True)
                    raise _ServerDied(f"the sandbox fork server exited ({e})") from e
            return await fut
        finally:
            self._pending.pop(req, None)

    def _on_readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(died=True)
                return
            kind, a, b = _protocol.parse_reply(data)
            if kind == b"X":  # a worker was reaped
                ex = self._exits.pop(a, None)
                if ex is not None and not ex.done():
                    ex.set_result(int(b))
            elif kind == b"P":  # a worker was forked
                pid = int(b)
                ex = self.loop.create_future()
                self._exits[pid] = ex
                fut = self._pending.pop(a, None)
                if fut is None or fut.done():  # its caller gave up waiting: nobody will use it
                    self.kill(pid)
                else:
                    fut.set_result((pid, ex))
            else:  # E: the fork failed
                fut = self._pending.pop(a, None)
                if fut is not None and not fut.done():
                    fut.set_exception(OSError(f"the sandbox fork server could not fork: {b.decode(errors='replace')}"))

    def kill(self, pid: int) -> None:
        """Ask the server to SIGKILL worker ``pid`` and its process group (if not reaped yet)."""
        if not self.alive:
            return
        try:
            self.sock.send(_protocol.kill_request(pid))
        except BlockingIOError:  # the server is behind on its messages: try again shortly
            with contextlib.suppress(RuntimeError):
                self.loop.call_later(0.01, self.kill, pid)
        except OSError:  # it is gone: the reader's EOF handling kills its orphans
            pass

    def hang_up(self) -> None:
        """Shut the socket down (safe from any thread, e.g. at interpreter exit while an event loop in another
        thread still watches it): the server kills and reaps its workers and exits."""
        self.sock.shutdown(socket.SHUT_RDWR)

    def close(self, *, died: bool = False) -> None:
        """Hang up: the server kills its remaining workers and exits. When it ``died`` instead, its orphaned
        workers are killed here. Either way their wait status becomes ``None``."""
        if not self.alive:
            return
        self.alive = False
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(_ServerDied("the sandbox fork server exited"))
        exits, self._exits = self._exits, {}
        for pid, ex in exits.items():
            if died:
                _kill(_Worker(pid, self, ex))
            if not ex.done():
                ex.set_result(None)
        self._reap(0)

    def _reap(self, attempt: int) -> None:
        if self.proc.poll() is not None:
            return
        if attempt == 100:  # ~10 s after the hang-up and still there: end it (its workers die with it)
            self.proc.kill()
        if attempt < 200:  # else subprocess reaps it when the next child process is started
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.call_later(0.01 * min(attempt + 1, 10), self._reap, attempt + 1)
