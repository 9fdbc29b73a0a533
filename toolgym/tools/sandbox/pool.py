"""The warm pool: :class:`Sandbox` keeps forked, isolated, limited workers ready and runs one snippet in each.

Bound to the event loop that first uses it; workers come from one fork server per sandbox (:mod:`.forkserver`);
the host enforces the wall clock and the output cap and classifies the end (:func:`.limits.classify`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import sys
import tempfile
import time
import weakref
from typing import Any

from toolgym.tools.sandbox.forkserver import BASE_ENV, _ForkServer, _kill, _Worker
from toolgym.tools.sandbox.host import count_user_processes, namespaces_available, plan_mounts
from toolgym.tools.sandbox.limits import CappedOutput, SandboxLimits, SandboxResult, classify
from toolgym.tools.sandbox.worker import READY

__all__ = ["Sandbox"]

_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_SLOTS: dict[int | None, list[int]] = {}


class Sandbox:
    """A pool of forked, isolated, resource-limited Python workers; each runs one snippet.

    Args:
        limits: per-snippet :class:`SandboxLimits`.
        pool_size: warm workers kept ready (0: fork one per call).
        isolation: ``"auto"`` (namespaces when available), ``"namespaces"`` (required; error otherwise) or
            ``"none"`` (rlimits, scrubbed env, temp dir and privilege drop only).
        python: interpreter to run (default: this one).
        site_packages: make this environment's site-packages importable in the sandbox (numpy, sympy, ...).
        uid_base: first of 1024 per-worker unprivileged uids used when running as root (default: derived from
            the process id, so two processes on one host rarely overlap).
        fork_server: fork workers from one long-lived server process (default). ``False`` starts a fresh
            interpreter for every worker (same isolation, ~10x the CPU per call; the benchmark's baseline).

    Bound to the event loop that first uses it (the toolgym runtime loop through the envs); call :meth:`aclose`
    to kill the workers and the fork server (also done at interpreter exit).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        pool_size: int = 4,
        isolation: str = "auto",
        python: str | None = None,
        site_packages: bool = True,
        uid_base: int | None = None,
        fork_server: bool = True,
    ) -> None:
        if isolation not in ("auto", "namespaces", "none"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', not {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.pool_size = max(0, int(pool_size))
        self.python = python or sys.executable
        self.fork_server = fork_server
        ns = isolation != "none" and namespaces_available(self.python)
        if isolation == "namespaces" and not ns:
            raise RuntimeError("isolation='namespaces' requested but PID/mount/network namespaces are not available "
                               "(they need root)")
        self.namespaces = ns
        self.is_root = os.geteuid() == 0
        # per-process uid range (1024 uids) so concurrent trainer processes rarely share RLIMIT_NPROC budgets
        self.uid_base = uid_base if uid_base is not None else 200_000 + (os.getpid() % 4096) * 1024
        self._path = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))] if site_packages else []
        # the file-system view: private tmpfs, hidden host sockets, read-only binds of the interpreter's files
        plan = plan_mounts(namespaces=ns, is_root=self.is_root, path=self._path)
        self._mounts, self._hide, self._binds, self._covers = plan.mounts, plan.hide, plan.binds, plan.covers
        self.drop_privileges = plan.drop_privileges
        self._free_slots = _SLOTS.setdefault(uid_base, list(range(1024)))  # shared by sandboxes of a process
        self._ready: list[_Worker] = []
        self._spawning = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: _ForkServer | None = None
        self._closed = False
        self.spawned = 0
        self.spawn_failures = 0
        self.servers_started = 0
        _LIVE.add(self)

    # -- introspection ----------------------------------------------------------------------------
    @property
    def isolation(self) -> dict[str, bool]:
        """What is in force: ``network``/``pid``/``mount`` namespaces, ``privilege_drop``, ``rlimits``."""
        return {
            "network_namespace": self.namespaces,
            "pid_namespace": self.namespaces,
            "private_tmp": self.namespaces,
            "ipc_namespace": self.namespaces,
            "host_sockets_hidden": self.namespaces,
            "privilege_drop": self.drop_privileges,
            "nproc_limit": True,
            "rlimits": True,
            "scrubbed_env": True,
        }

    @property
    def server_pid(self) -> int | None:
        """Process id of the running fork server (``None`` before first use, after :meth:`aclose`, or with
        ``fork_server=False``). It is a child of this process, runs as this process's user, and never runs user
        code; its CPU time and its workers' (``/proc/<pid>/stat``) are what the benchmark reports."""
        server = self._server
        return server.proc.pid if server is not None and server.alive else None

    # -- pool -------------------------------------------------------------------------------------
    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:  # used from a new loop: the old workers and server belong to the old loop
                self._kill_all()
            self._loop = loop
            self._ready, self._spawning, self._waiters, self._tasks = [], 0, [], set()

    def _config(self) -> tuple[dict[str, Any], int | None, str | None]:
        lim = self.limits
        slot = None
        uid = None
        if self.drop_privileges:
            slot = self._free_slots.pop(0) if self._free_slots else (self.spawned % 1024)
            uid = self.uid_base + slot
        if self.namespaces:
            workdir, host_dir = "/tmp/work", None
        else:
            host_dir = tempfile.mkdtemp(prefix="toolgym-sbx-")
            workdir = host_dir
        nproc = lim.max_procs
        if not self.drop_privileges:  # RLIMIT_NPROC counts every process of the uid: leave room for the user's others
            nproc += count_user_processes()
        mb = 1024 * 1024
        rlimits = [
            ("RLIMIT_CPU", lim.cpu_s, lim.cpu_s + 1),
            ("RLIMIT_AS", lim.memory_mb * mb, lim.memory_mb * mb),
            ("RLIMIT_NPROC", nproc, nproc),
            ("RLIMIT_FSIZE", lim.file_size_mb * mb, lim.file_size_mb * mb),
            ("RLIMIT_NOFILE", lim.open_files, lim.open_files),
            ("RLIMIT_CORE", 0, 0),
        ]
        env = {**BASE_ENV, "HOME": workdir, "TMPDIR": "/tmp" if self.namespaces else workdir}
        cfg = {
            "namespaces": self.namespaces, "mounts": self._mounts, "tmpfs_bytes": lim.tmpfs_mb * mb,
            "workdir": workdir, "uid": uid, "rlimits": rlimits, "path": self._path, "binds": self._binds,
            "covers": self._covers, "hide": self._hide, "env": env,
        }
        return cfg, slot, host_dir

    def _get_server(self) -> _ForkServer:
        assert self._loop is not None
        if not self.fork_server:  # a fresh interpreter for this one worker
            return _ForkServer(self.python, self._loop, preload=False)
        if self._server is None or not self._server.alive:
            self._server = _ForkServer(self.python, self._loop, preload=True)
            self.servers_started += 1
        return self._server

    async def _spawn(self) -> _Worker:
        cfg, slot, host_dir = self._config()
        self.spawned += 1
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        child = [pipes[0][0], pipes[1][1], pipes[2][1]]
        host = [pipes[0][1], pipes[1][0], pipes[2][0]]
        for fd in host:
            os.set_blocking(fd, False)
        server: _ForkServer | None = None
        w: _Worker | None = None
        try:
            server = self._get_server()
            try:
                pid, exit_fut = await asyncio.wait_for(server.fork(cfg, child), 30.0)
            except TimeoutError:  # a wedged server: replace it
                server.close(died=True)
                raise
            finally:
                for fd in child:
                    os.close(fd)
            w = _Worker(pid, server, exit_fut, *host)
            exit_fut.add_done_callback(functools.partial(self._on_exit, slot, host_dir, server))
            w.early = await asyncio.wait_for(self._wait_ready(w), 30.0)
        except BaseException:
            self.spawn_failures += 1
            if w is None:
                for fd in host:
                    os.close(fd)
                self._on_exit(slot, host_dir, server, None)
            else:
                self._finish(w)
            raise
        return w

    async def _wait_ready(self, w: _Worker) -> bytes:
        """Wait for the worker's ready marker; returns any output after it. Raises when the worker failed."""
        assert self._loop is not None
        loop = self._loop
        buf = bytearray()
        done = loop.create_future()

        def on_read() -> None:
            try:
                chunk = os.read(w.stdout, 4096)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            buf.extend(chunk)
            if (not chunk or len(buf) >= len(READY) or not READY.startswith(buf)) and not done.done():
                done.set_result(None)

        loop.add_reader(w.stdout, on_read)
        try:
            await done
        finally:
            loop.remove_reader(w.stdout)
        if buf[: len(READY)] != READY:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(w.exit), 2.0)  # its stderr is complete once it is gone
            err = b""
            with contextlib.suppress(OSError):
                err = os.read(w.stderr, 4096)
            raise RuntimeError(f"sandbox worker failed to start: {err.decode(errors='replace').strip() or bytes(buf)!r}")
        return bytes(buf[len(READY):])

    def _on_exit(self, slot: int | None, host_dir: str | None, server: _ForkServer | None,
                 _fut: asyncio.Future[int | None] | None) -> None:
        """The worker is gone (reaped by the server): its uid and temp dir may be reused."""
        if slot is not None and slot not in self._free_slots:
            self._free_slots.append(slot)
        if host_dir:
            shutil.rmtree(host_dir, ignore_errors=True)
        if server is not None and server is not self._server:  # a one-worker server (fork_server=False)
            server.close()

    def _finish(self, w: _Worker) -> None:
        """Kill the worker (if still running) and close the host ends of its pipes."""
        _kill(w)
        loop = self._loop
        for attr in ("stdin", "stdout", "stderr"):
            fd = getattr(w, attr)
            if fd >= 0:
                if loop is not None and not loop.is_closed():
                    loop.remove_reader(fd)
                    loop.remove_writer(fd)
                os.close(fd)
                setattr(w, attr, -1)

    def _refill(self) -> None:
        if self._closed:
            return
        while len(self._ready) + self._spawning < self.pool_size:
            self._spawning += 1
            task = asyncio.get_running_loop().create_task(self._refill_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _refill_one(self) -> None:
        try:
            w = await self._spawn()
        except Exception:  # a failed spawn is counted; callers spawn directly if the pool is dry
            self._spawning -= 1
            await asyncio.sleep(0.5)
            self._wake()
            return
        self._spawning -= 1
        if self._closed:
            self._finish(w)
            return
        self._ready.append(w)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                break

    async def _acquire(self) -> _Worker:
        if self.pool_size == 0:
            return await self._spawn()
        self._refill()
        while True:
            while self._ready:
                w = self._ready.pop(0)
                if not w.exit.done():
                    self._refill()
                    return w
                self._finish(w)
            if self._spawning == 0:  # refills keep failing: try once directly, surfacing the error
                return await self._spawn()
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def start(self) -> None:
        """Fill the warm pool now and wait until it is full (otherwise it fills on first use)."""
        self._bind()
        self._refill()
        while len(self._ready) < self.pool_size and self._spawning:
            await asyncio.sleep(0.01)

    # -- running ----------------------------------------------------------------------------------
    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh sandboxed worker and classify how it ended. Never raises for what the code
        does; cancelling the caller kills the worker."""
        if self._closed:
            raise RuntimeError("sandbox is closed")
        self._bind()
        try:
            w = await self._acquire()
        except Exception as e:
            return SandboxResult("sandbox_error", stderr=str(e))
        try:
            return await self._execute(w, code)
        finally:
            self._finish(w)

    async def _execute(self, w: _Worker, code: str) -> SandboxResult:
        lim = self.limits
        assert self._loop is not None
        loop = self._loop
        data = memoryview(code.encode("utf-8", errors="surrogatepass"))
        t0 = time.perf_counter()
        deadline = t0 + lim.wall_s
        output = CappedOutput(lim.max_output_bytes, w.early)
        writing = False
        eof = loop.create_future()
        open_fds = {w.stdout, w.stderr}

        def on_read(fd: int) -> None:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(fd)
                open_fds.discard(fd)
                if not open_fds and not eof.done():
                    eof.set_result(None)
                return
            if output.add(chunk, stderr=fd == w.stderr):  # past the cap (later chunks are drained to EOF)
                _kill(w)

        def feed() -> None:
            nonlocal data, writing
            try:
                while data:
                    data = data[os.write(w.stdin, data):]
            except BlockingIOError:
                if not writing:
                    writing = True
                    loop.add_writer(w.stdin, feed)
                return
            except OSError:  # it exited without reading everything
                pass
            if writing:
                loop.remove_writer(w.stdin)
            os.close(w.stdin)
            w.stdin = -1

        for fd in open_fds:
            loop.add_reader(fd, on_read, fd)
        feed()
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(w.exit), max(deadline - time.perf_counter(), 0.0))
        except TimeoutError:
            timed_out = True
            _kill(w)
        if not w.exit.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(w.exit), 5.0)
        if not eof.done():  # the rest of its output (with a PID namespace every writer is gone by now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(eof), min(max(deadline - time.perf_counter(), 0.1), 1.0))
        wall = time.perf_counter() - t0
        return classify(w.exit.result() if w.exit.done() else None, output.stdout, output.stderr,
                        timed_out=timed_out, overflow=output.overflow, wall_s=wall)

    # -- shutdown ---------------------------------------------------------------------------------
    def _kill_all(self) -> None:
        for w in self._ready:
            with contextlib.suppress(Exception):
                self._finish(w)
        self._ready = []
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.close()
            self._server = None

    async def aclose(self) -> None:
        """Kill the warm workers and the fork server (and so any call still running) and stop refilling."""
        self._closed = True
        for t in list(self._tasks):
            t.cancel()
        self._kill_all()


@atexit.register
def _kill_live_sandboxes() -> None:
    # Hang up on every fork server: each kills and reaps its workers (the warm ones too) and exits. A plain
    # shutdown(2) is safe from this thread while an event loop in another thread may still watch the socket.
    for sb in list(_LIVE):
        server = sb._server
        if server is not None:
            with contextlib.suppress(Exception):
                server.hang_up()
