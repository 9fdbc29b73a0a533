"""Sandboxed Python execution: the ``python`` tool and the :class:`Sandbox` behind it.

Every snippet runs in its own fresh interpreter process, which runs exactly that one snippet and exits. A warm
pool keeps ``pool_size`` interpreters started, isolated and limited ahead of time, waiting for code on stdin, so a
call pays only for sending the code and reading the output; the pool refills in the background.

Each worker, before it reads any code:

* runs in new **network, mount and PID namespaces** (``unshare --net --mount --pid --fork --kill-child
  --mount-proc``) when the host allows it: no network interfaces but a down loopback, its own ``/proc`` showing
  only its own processes, and when the worker exits or is killed every process it started dies with it;
* gets private, size-limited ``tmpfs`` mounts over the world-writable directories (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock``); its working directory is a fresh directory in its private ``/tmp``;
* drops root privileges to a dedicated unprivileged uid per worker (when the host runs as root), so it cannot
  write outside its tmpfs, signal host processes or exceed ``RLIMIT_NPROC`` (which root ignores);
* applies ``setrlimit``: CPU seconds, address space, processes, file size, open files, no core dumps;
* has a scrubbed environment (no host variables) and runs ``python -I -S`` (isolated mode).

The host enforces a wall-clock timeout and an output cap, killing the worker's whole process group (and so its
PID namespace) when either is exceeded. See ``docs/sandbox.md`` for what is and is not isolated, in particular
when namespaces are unavailable.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = ["PythonTool", "Sandbox", "SandboxLimits", "SandboxResult", "namespaces_available"]

_READY = b"\x00toolgym-sandbox-ready\n"
_CPU_EXIT = 152  # 128 + SIGXCPU: the worker's SIGXCPU handler exits with this
_SETUP_EXIT = 120

# The worker program. argv[1] is a JSON config. It isolates and limits itself, says it is ready, then reads the
# whole snippet from stdin and runs it as __main__. Tracebacks omit the bootstrap's own frame.
_BOOTSTRAP = r"""
import os, sys, resource, signal
cfg = eval(sys.argv[1], {"__builtins__": {}})  # a literal written by the host (json/ast would cost ~30 ms)
try:
    if cfg["mounts"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        opts = ("size=%d,mode=1777" % cfg["tmpfs_bytes"]).encode()
        # hold the bind sources open first: a source under /tmp is hidden once the private tmpfs covers /tmp
        fds = [os.open(src, os.O_RDONLY | os.O_DIRECTORY) for src, _ in cfg["binds"]]
        for d in cfg["mounts"]:
            if libc.mount(b"tmpfs", d.encode(), b"tmpfs", 2 | 4, opts) != 0:  # MS_NOSUID | MS_NODEV
                e = ctypes.get_errno()
                raise OSError(e, "mount tmpfs on %s: %s" % (d, os.strerror(e)))
        for fd, (src, dst) in zip(fds, cfg["binds"]):  # read-only views of interpreter dirs
            os.makedirs(dst, exist_ok=True)
            if libc.mount(("/proc/self/fd/%d" % fd).encode(), dst.encode(), None, 4096, None) != 0 or libc.mount(
                    None, dst.encode(), None, 4096 | 32 | 1 | 2 | 4, None) != 0:  # MS_BIND, then REMOUNT|RDONLY
                e = ctypes.get_errno()
                raise OSError(e, "bind %s: %s" % (src, os.strerror(e)))
            os.close(fd)
    def _remap(p):
        for src, dst in cfg["binds"]:
            if p == src or p.startswith(src + "/"):
                return dst + p[len(src):]
        return p
    sys.path[:] = [_remap(p) for p in sys.path + cfg["path"]]
    for _m in list(sys.modules.values()):  # packages imported at startup (encodings, collections, ...)
        _p = getattr(_m, "__path__", None)
        if isinstance(_p, list):
            _p[:] = [_remap(p) for p in _p]
    sys.path_importer_cache.clear()
    os.makedirs(cfg["workdir"], exist_ok=True)
    uid = cfg["uid"]
    if uid is not None:
        os.chown(cfg["workdir"], uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(cfg["workdir"])
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))
except BaseException as e:
    sys.stderr.write("sandbox setup failed: %r\n" % (e,))
    sys.stderr.flush()
    os._exit(120)
def _xcpu(signum, frame):
    sys.stderr.write("\nCPU time limit exceeded\n")
    sys.stderr.flush()
    os._exit(152)
signal.signal(signal.SIGXCPU, _xcpu)
sys.argv = ["<sandbox>"]
out = sys.stdout.buffer
out.write(b"\x00toolgym-sandbox-ready\n")
out.flush()
code = sys.stdin.read()
try:
    sys.stdin.close()
    sys.stdin = open(os.devnull)
except Exception:
    pass
sys.stdout.reconfigure(errors="backslashreplace")
del cfg, out, resource, signal
_g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(code, "<code>", "exec"), _g)
except SystemExit:
    raise
except BaseException as _e:
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
"""

_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def namespaces_available(unshare: str | None = None) -> bool:
    """``True`` when ``unshare --net --mount --pid --fork`` works here (needs root; checked once per process)."""
    return _namespaces_available(unshare or shutil.which("unshare"))


@functools.cache
def _namespaces_available(unshare: str | None) -> bool:
    if not unshare or os.geteuid() != 0:
        return False
    import subprocess

    try:
        r = subprocess.run(
            [unshare, "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "true"],
            capture_output=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


@dataclass(frozen=True)
class SandboxLimits:
    """Per-snippet limits.

    Attributes:
        wall_s: wall-clock seconds from sending the code to the end; then the whole process group is killed.
        cpu_s: CPU seconds per process (``RLIMIT_CPU``; SIGXCPU at ``cpu_s``, SIGKILL one second later).
        memory_mb: address space per process in MiB (``RLIMIT_AS``); allocations beyond raise ``MemoryError``.
        max_procs: processes + threads of the worker's uid (``RLIMIT_NPROC``; effective only for a non-root uid).
        file_size_mb: largest file the snippet may write, MiB (``RLIMIT_FSIZE``).
        open_files: open file descriptors (``RLIMIT_NOFILE``).
        tmpfs_mb: size of each private tmpfs (namespaced mode): the total the snippet may store on disk.
        max_output_bytes: stdout + stderr kept; beyond it the worker is killed and the output marked truncated.
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    tmpfs_mb: int = 64
    max_output_bytes: int = 8192


@dataclass
class SandboxResult:
    """What one snippet did.

    Attributes:
        status: ``ok`` (exit 0), ``error`` (nonzero exit: an exception or ``sys.exit(n)``), ``timeout`` (wall
            clock), ``cpu_limit``, ``memory_limit`` (``MemoryError``), ``output_limit`` (killed for printing too
            much), ``killed`` (ended by a signal, e.g. SIGSEGV or SIGKILL), ``sandbox_error`` (the sandbox itself
            failed to start).
        exit_code: the process exit status (``None`` when killed by a signal or by the host).
        signal: the signal name that ended it, if any.
        stdout, stderr: decoded output, at most ``max_output_bytes`` together.
        truncated: output was cut at the cap.
        wall_s: seconds from sending the code to the end.
    """

    status: str
    exit_code: int | None = None
    signal: str | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self, limits: SandboxLimits | None = None) -> str:
        """The observation the model reads: stdout, then stderr and a status line when there is anything to say."""
        lim = limits or SandboxLimits()
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(("[stderr]\n" if parts else "") + self.stderr.rstrip("\n"))
        note = {
            "ok": "",
            "error": f"[exit status {self.exit_code}]",
            "timeout": f"[killed: wall-clock limit of {lim.wall_s:g} s exceeded]",
            "cpu_limit": f"[killed: CPU time limit of {lim.cpu_s} s exceeded]",
            "memory_limit": f"[memory limit of {lim.memory_mb} MiB exceeded]",
            "output_limit": f"[killed: output exceeded {lim.max_output_bytes} bytes; output truncated]",
            "killed": f"[killed by signal {self.signal}]",
            "sandbox_error": "[sandbox error: the code could not be run]",
        }[self.status]
        if self.truncated and self.status != "output_limit":
            note = (note + " " if note else "") + "[output truncated]"
        if note:
            parts.append(note)
        if not parts:
            return "(no output; print() the values you need)"
        return "\n".join(parts)


@dataclass
class _Worker:
    proc: asyncio.subprocess.Process
    uid_slot: int | None
    host_dir: str | None  # host temp dir to remove afterwards (non-namespaced mode)
    started: float = field(default_factory=time.perf_counter)


_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_SLOTS: dict[int, list[int]] = {}


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _close_transport(proc: asyncio.subprocess.Process) -> None:
    """Close the pipes of a killed worker now, so no transport is left for the garbage collector."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


class Sandbox:
    """A pool of pre-started, isolated, resource-limited Python interpreters; each runs one snippet.

    Args:
        limits: per-snippet :class:`SandboxLimits`.
        pool_size: warm workers kept ready (0: spawn one per call, the baseline of ``benchmarks/sandbox.py``).
        isolation: ``"auto"`` (namespaces when available), ``"namespaces"`` (required; error otherwise) or
            ``"none"`` (rlimits, scrubbed env, temp dir and privilege drop only).
        python: interpreter to run (default: this one).
        site_packages: make this environment's site-packages importable in the sandbox (numpy, sympy, ...).
        uid_base: first of 1024 per-worker unprivileged uids used when running as root (default: derived from
            the process id, so two processes on one host rarely overlap).

    Bound to the event loop that first uses it (the toolgym runtime loop through the envs); call :meth:`aclose`
    to kill the warm workers (also done at interpreter exit).
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
    ) -> None:
        if isolation not in ("auto", "namespaces", "none"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'none', not {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.pool_size = max(0, int(pool_size))
        self.python = python or sys.executable
        self.unshare = shutil.which("unshare")
        ns = isolation != "none" and namespaces_available(self.unshare)
        if isolation == "namespaces" and not ns:
            raise RuntimeError("isolation='namespaces' requested but `unshare --net --mount --pid` is not available")
        self.namespaces = ns
        self.is_root = os.geteuid() == 0
        # per-process uid range (1024 uids) so concurrent trainer processes rarely share RLIMIT_NPROC budgets
        self.uid_base = uid_base if uid_base is not None else 200_000 + (os.getpid() % 4096) * 1024
        self._path = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))] if site_packages else []
        self._mounts = [d for d in _WRITABLE_DIRS if os.path.isdir(d)] if ns else []
        # An unprivileged uid must be able to read the interpreter's files: bind-mount (read-only) the prefixes it
        # cannot reach (e.g. a pyenv under /root, mode 0700) into the private /tmp and remap sys.path there.
        self._binds: list[tuple[str, str]] = []
        self.drop_privileges = self.is_root
        if self.is_root:
            # prefixes the dropped uid cannot reach, and prefixes under a directory the private tmpfs covers
            # (e.g. a virtualenv in a checkout under /tmp)
            hidden = [
                p for p in dict.fromkeys((sys.base_prefix, sys.prefix))
                if not _world_readable(p) or (ns and any(_under(p, d) for d in self._mounts))
            ]
            if hidden and ns:
                self._binds = [(p, f"/tmp/.toolgym-python/{i}") for i, p in enumerate(hidden)]
            elif hidden:  # no mount namespace: the dropped uid could not import the stdlib
                self.drop_privileges = False
        self._free_slots = _SLOTS.setdefault(uid_base, list(range(1024)))  # shared by sandboxes of a process
        self._ready: list[_Worker] = []
        self._spawning = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.spawned = 0
        self.spawn_failures = 0
        _LIVE.add(self)

    # -- introspection ----------------------------------------------------------------------------
    @property
    def isolation(self) -> dict[str, bool]:
        """What is in force: ``network``/``pid``/``mount`` namespaces, ``privilege_drop``, ``rlimits``."""
        return {
            "network_namespace": self.namespaces,
            "pid_namespace": self.namespaces,
            "private_tmp": self.namespaces,
            "privilege_drop": self.drop_privileges,
            "nproc_limit": True,
            "rlimits": True,
            "scrubbed_env": True,
        }

    # -- pool -------------------------------------------------------------------------------------
    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:  # used from a new loop: the old workers' pipes belong to the old loop
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
            nproc += _count_user_processes()
        mb = 1024 * 1024
        rlimits = [
            ("RLIMIT_CPU", lim.cpu_s, lim.cpu_s + 1),
            ("RLIMIT_AS", lim.memory_mb * mb, lim.memory_mb * mb),
            ("RLIMIT_NPROC", nproc, nproc),
            ("RLIMIT_FSIZE", lim.file_size_mb * mb, lim.file_size_mb * mb),
            ("RLIMIT_NOFILE", lim.open_files, lim.open_files),
            ("RLIMIT_CORE", 0, 0),
        ]
        cfg = {
            "mounts": self._mounts, "tmpfs_bytes": lim.tmpfs_mb * mb, "workdir": workdir, "uid": uid,
            "rlimits": rlimits, "path": self._path, "binds": self._binds,
        }
        return cfg, slot, host_dir

    async def _spawn(self) -> _Worker:
        cfg, slot, host_dir = self._config()
        argv = [self.python, "-I", "-S", "-c", _BOOTSTRAP, repr(cfg)]
        if self.namespaces:
            assert self.unshare is not None
            argv = [self.unshare, "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "HOME": cfg["workdir"], "TMPDIR": "/tmp" if self.namespaces else cfg["workdir"],
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.spawned += 1
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=host_dir or "/", start_new_session=True,
                limit=1 << 20,
            )
            assert proc.stdout is not None and proc.stderr is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
            if line != _READY:
                err = (await asyncio.wait_for(proc.stderr.read(4096), 5.0)).decode(errors="replace")
                _kill_group(proc.pid)
                await proc.wait()
                raise RuntimeError(f"sandbox worker failed to start: {err.strip() or line!r}")
        except BaseException:
            self.spawn_failures += 1
            if proc is not None:
                _kill_group(proc.pid)
                _close_transport(proc)
            self._release(slot, host_dir)
            raise
        return _Worker(proc, slot, host_dir)

    def _release(self, slot: int | None, host_dir: str | None) -> None:
        if slot is not None and slot not in self._free_slots:
            self._free_slots.append(slot)
        if host_dir:
            shutil.rmtree(host_dir, ignore_errors=True)

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
            _kill_group(w.proc.pid)
            _close_transport(w.proc)
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
                if w.proc.returncode is None:
                    self._refill()
                    return w
                self._release(w.uid_slot, w.host_dir)
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
        """Run ``code`` in a fresh sandboxed interpreter and classify how it ended. Never raises for what the
        code does; cancelling the caller kills the worker."""
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
            _kill_group(w.proc.pid)
            if w.proc.returncode is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(w.proc.wait(), 5.0)
            _close_transport(w.proc)
            self._release(w.uid_slot, w.host_dir)

    async def _execute(self, w: _Worker, code: str) -> SandboxResult:
        lim = self.limits
        proc = w.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        t0 = time.perf_counter()
        deadline = t0 + lim.wall_s
        bufs = {"out": bytearray(), "err": bytearray()}
        state = {"overflow": False}

        async def pump(stream: asyncio.StreamReader, key: str) -> None:
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                if state["overflow"]:  # keep draining to EOF so the pipe closes
                    continue
                room = lim.max_output_bytes - len(bufs["out"]) - len(bufs["err"])
                if len(chunk) > room:
                    bufs[key] += chunk[: max(room, 0)]
                    state["overflow"] = True
                    _kill_group(proc.pid)
                    continue
                bufs[key] += chunk

        async def feed() -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(code.encode("utf-8", errors="surrogatepass"))
                await proc.stdin.drain()
                proc.stdin.close()

        async def whole() -> None:
            await asyncio.gather(feed(), pump(proc.stdout, "out"), pump(proc.stderr, "err"))
            await proc.wait()

        timed_out = False
        task = asyncio.ensure_future(whole())
        try:
            await asyncio.wait_for(asyncio.shield(task), max(deadline - time.perf_counter(), 0.0))
        except TimeoutError:
            timed_out = True
        finally:
            if not task.done():
                _kill_group(proc.pid)
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, 5.0)
                if not task.done():
                    task.cancel()
        wall = time.perf_counter() - t0
        rc = proc.returncode
        out = bufs["out"].decode("utf-8", errors="replace")
        err = bufs["err"].decode("utf-8", errors="replace")
        sig = None
        if rc is not None and rc < 0:
            with contextlib.suppress(ValueError):
                sig = signal.Signals(-rc).name
        if timed_out:
            status = "timeout"
        elif state["overflow"]:
            status = "output_limit"
        elif rc == 0:
            status = "ok"
        elif rc == _CPU_EXIT or sig == "SIGXCPU":
            status = "cpu_limit"
        elif rc is not None and rc < 0:
            status = "killed"
        elif rc == 1 and "MemoryError" in err[-400:]:
            status = "memory_limit"
        elif rc == _SETUP_EXIT and err.startswith("sandbox setup failed"):
            status = "sandbox_error"
        else:
            status = "error"
        return SandboxResult(
            status, rc if rc is not None and rc >= 0 else None, sig, out, err,
            state["overflow"], wall,
        )

    # -- shutdown ---------------------------------------------------------------------------------
    def _kill_all(self) -> None:
        for w in self._ready:
            _kill_group(w.proc.pid)
            self._release(w.uid_slot, w.host_dir)
        self._ready = []

    async def aclose(self) -> None:
        """Kill the warm workers and stop refilling."""
        self._closed = True
        for t in list(self._tasks):
            t.cancel()
        ready, self._ready = self._ready, []
        for w in ready:
            _kill_group(w.proc.pid)
        for w in ready:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.proc.communicate(), 5.0)  # reads to EOF: closes the pipes
            _close_transport(w.proc)
            self._release(w.uid_slot, w.host_dir)


def _under(path: str, directory: str) -> bool:
    """``True`` when ``path`` (symlinks resolved) is ``directory`` or inside it."""
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip("/") + "/")


def _world_readable(path: str) -> bool:
    """``True`` when any user can traverse to ``path`` and read it (every ancestor has the ``o+x`` bit)."""
    import stat

    p = os.path.realpath(path)
    parts = p.split("/")
    for i in range(2, len(parts) + 1):
        d = "/".join(parts[:i]) or "/"
        try:
            mode = os.stat(d).st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return bool(os.stat(p).st_mode & stat.S_IROTH)


def _count_user_processes() -> int:
    uid = os.getuid()
    n = 0
    with contextlib.suppress(OSError):
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}").st_uid == uid:
                        n += 1
    return n


@atexit.register
def _kill_live_sandboxes() -> None:
    for sb in list(_LIVE):
        with contextlib.suppress(Exception):
            sb._kill_all()


class PythonTool(Tool):
    """``python(code)``: run a Python snippet in a fresh sandboxed interpreter; returns stdout/stderr as text.

    How a run ended is reported so the model can read it either way:

    * exit 0, or a nonzero exit (an exception traceback, ``sys.exit(n)``): a normal observation -- the tool
      worked, the model's code failed, and the traceback is what the model needs (like a notebook cell);
      a nonzero exit appends ``[exit status N]``;
    * wall-clock timeout or CPU limit: a ``timeout`` :class:`ToolError`;
    * memory limit, output flood, death by a signal, or a sandbox failure: an ``exception`` :class:`ToolError`
      whose message says what happened (with the output so far).

    ``last_result`` keeps the :class:`SandboxResult` of the most recent call (for tests and debugging).

    Args:
        sandbox: a :class:`Sandbox` (default: one with ``SandboxLimits()`` and a warm pool of 4).
        name: tool name.
    """

    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python 3 source; print() what you want to see"},
        },
        "required": ["code"],
    }
    cacheable = True

    def __init__(self, sandbox: Sandbox | None = None, *, name: str = "python", max_concurrency: int | None = None):
        self.sandbox = sandbox or Sandbox()
        self.name = name
        lim = self.sandbox.limits
        self.timeout_s = lim.wall_s + 10.0  # the sandbox's own wall limit classifies first
        self.max_concurrency = max_concurrency if max_concurrency is not None else 2 * (os.cpu_count() or 2)
        self.description = (
            "Run Python 3 code in a fresh sandboxed interpreter and return what it prints (stdout, then stderr). "
            f"No network, no state kept between calls; limits: {lim.wall_s:g} s wall time, {lim.cpu_s} s CPU, "
            f"{lim.memory_mb} MiB memory, {lim.max_output_bytes} bytes of output."
        )
        self.last_result: SandboxResult | None = None

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError("argument 'code' must be a string", kind=ToolErrorKind.INVALID_ARGUMENTS)
        res = await self.sandbox.run(code)
        self.last_result = res
        text = res.to_text(self.sandbox.limits)
        if res.status in ("timeout", "cpu_limit"):
            raise ToolError(text, kind=ToolErrorKind.TIMEOUT)
        if res.status in ("memory_limit", "output_limit", "killed", "sandbox_error"):
            raise ToolError(text, kind=ToolErrorKind.EXCEPTION)
        return text

    async def aclose(self) -> None:
        await self.sandbox.aclose()
