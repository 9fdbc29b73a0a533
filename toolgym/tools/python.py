"""Sandboxed Python execution: the ``python`` tool and the :class:`Sandbox` behind it.

Every snippet runs in its own process, which runs exactly that one snippet and exits. The processes are forked
by a **fork server** ("zygote"): one long-lived ``python -I -S`` per :class:`Sandbox` that has imported what a
worker needs once and never runs user code itself; each fork is a copy of that pristine interpreter (a few ms of
CPU instead of the ~50 ms of starting and isolating a new interpreter). A warm pool keeps ``pool_size`` workers
forked, isolated and limited ahead of time, waiting for code on stdin; the pool refills in the background. If
the fork server dies it is restarted on the next call (calls in flight end as ``sandbox_error``).

Each worker, before it reads any code:

* is PID 1 of a new **PID namespace** and has new **mount and network namespaces** (``unshare(2)``) when the
  host allows it: no network interfaces but a down loopback, its own ``/proc`` showing only its own processes,
  and when the worker exits or is killed every process it started dies with it. It leads its own session and
  process group, so the host can always kill it (``killpg``) and it cannot move out of that group;
* has its own **IPC namespace** (SysV shared memory, semaphores and message queues are private and vanish with it);
* gets one private, size-limited ``tmpfs`` behind the world-writable directories (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock``: one size bound for all), and an empty read-only ``/run`` (no view of host
  services' path-based unix sockets; abstract ones are cut off by the network namespace); its working directory
  is a fresh directory in its private ``/tmp``;
* drops root privileges to a dedicated unprivileged uid per worker (when the host runs as root), so it cannot
  write outside its tmpfs, signal host processes or exceed ``RLIMIT_NPROC`` (which root ignores);
* applies ``setrlimit``: CPU seconds, address space, processes, file size, open files, no core dumps;
* has a scrubbed environment (no host variables), closes every inherited file descriptor but its stdio, and runs
  in an interpreter started with ``-I -S`` (isolated mode).

The host enforces a wall-clock timeout and an output cap, killing the worker's process group (and so its PID
namespace) when either is exceeded. ``Sandbox(fork_server=False)`` starts a fresh interpreter per worker instead
(same isolation; the baseline of ``benchmarks/sandbox.py``). See ``docs/sandbox.md`` for what is and is not
isolated, in particular when namespaces are unavailable.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = ["PythonTool", "Sandbox", "SandboxLimits", "SandboxResult", "namespaces_available"]

_READY = b"\x00toolgym-sandbox-ready\n"
_CPU_EXIT = 152  # 128 + SIGXCPU: the worker's SIGXCPU handler exits with this
_SETUP_EXIT = 120

# The fork server, run as ``python -I -S -c _PROGRAM FD PRELOAD``. FD is a SOCK_SEQPACKET socket to the host,
# which sends ``b"<id> <config literal>"`` with the worker's stdin/stdout/stderr attached (SCM_RIGHTS). The
# server forks (into a new PID namespace when asked) and answers ``P <id> <pid>`` (or ``E <id> <error>``), and
# ``X <pid> <wait status>`` once it reaped the worker. When the host hangs up it kills its workers and exits.
# A forked worker leaves serve() and runs the rest of this program: it isolates and limits itself, says it is
# ready, reads the whole snippet from stdin and runs it as __main__. Tracebacks omit the program's own frame.
_PROGRAM = r"""
import os, sys, resource, signal, ctypes, socket, select, traceback, types
if sys.argv[2] == "1":  # preload what snippets often import: the import is paid once, in the server
    for _name in ("math", "re", "json", "collections", "itertools", "functools", "fractions", "decimal",
                  "statistics", "datetime", "random", "string", "heapq", "bisect"):
        try:
            __import__(_name)
        except ImportError:
            pass
import gc, atexit
libc = ctypes.CDLL(None, use_errno=True)
NEWNS, NEWNET, NEWPID, NEWIPC = 0x20000, 0x40000000, 0x20000000, 0x8000000

def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))

def serve(fd):
    sock = socket.socket(fileno=fd)
    pidns = None
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.register(rfd, select.POLLIN)
    children = set()
    def kill(pid):
        if pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:  # not yet its own group leader
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    try:
        while True:
            poller.poll()
            try:
                while os.read(rfd, 256):
                    pass
            except BlockingIOError:
                pass
            while True:
                try:
                    msg, anc, _, _ = sock.recvmsg(1 << 16, socket.CMSG_LEN(12), socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                fds = [int.from_bytes(data[i:i + 4], sys.byteorder) for level, kind, data in anc
                       if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS for i in range(0, len(data) - 3, 4)]
                if not msg:
                    raise EOFError
                req, _, text = msg.partition(b" ")
                if req == b"K":  # kill a worker (and its group): only the reaper knows its pid is still its own
                    kill(int(text))
                    continue
                cfg = eval(text, {"__builtins__": {}})  # a literal written by the host
                pid = -1
                try:
                    if cfg["namespaces"]:
                        if pidns is None:
                            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
                        _check(libc.unshare(NEWPID), "unshare(CLONE_NEWPID)")
                    try:
                        pid = os.fork()  # in a new PID namespace: the worker is its PID 1
                    finally:
                        if pid and cfg["namespaces"]:  # later forks of this server stay in its own namespace
                            _check(libc.setns(pidns, NEWPID), "setns(CLONE_NEWPID)")
                except OSError as e:
                    if pid > 0:
                        raise
                    for f in fds:
                        os.close(f)
                    sock.send(b"E " + req + b" " + repr(e).encode())
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    return cfg, fds
                for f in fds:
                    os.close(f)
                children.add(pid)
                sock.send(b"P %s %d" % (req, pid))
            while children:
                try:
                    info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                except ChildProcessError:
                    break
                if info is None:
                    break
                kill(info.si_pid)  # what it left in its group (without a PID namespace), while its pid is held
                pid, status = os.waitpid(info.si_pid, 0)
                children.discard(pid)
                sock.send(b"X %d %d" % (pid, status))
    except (EOFError, OSError):  # the host hung up (or went away): no worker outlives this server
        for pid in children:
            kill(pid)
        for pid in children:  # reap them: orphaned zombies would wait for the host's init
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        os._exit(0)

def setup(cfg, fds):
    for i, f in enumerate(fds):
        os.dup2(f, i)
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))  # the server's socket above all
    # new stdio objects for the new fds 0-2, configured like an interpreter's own
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", 1, encoding="utf-8", errors="backslashreplace", closefd=False)
    os.setsid()  # its own session and process group: killpg reaches it, and it cannot leave the group
    if cfg["namespaces"]:
        # own IPC namespace: SysV shared memory, semaphores and message queues are private and die with the worker
        _check(libc.unshare(NEWNS | NEWNET | NEWIPC), "unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)")
        _check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "make / private")  # MS_REC|MS_PRIVATE
        # hold the bind sources open first: a source under /tmp is hidden once the private tmpfs covers /tmp
        srcs = [os.open(src, os.O_RDONLY | os.O_DIRECTORY) for src in cfg["binds"]]
        # /run (host services' path sockets: dbus, docker, databases) and /root-like dirs in the way of a bind:
        # an empty tmpfs, read-only for the worker's uid
        for d in cfg["hide"] + cfg["covers"]:
            os.makedirs(d, exist_ok=True)
            _check(libc.mount(b"tmpfs", d.encode(), b"tmpfs", 2 | 4, b"size=64k,mode=755"), "mount tmpfs on " + d)
        # ONE size-limited tmpfs for every writable directory (the first, /tmp; the others are bind mounts of its
        # subdirectories), so tmpfs_bytes bounds all the worker can store in memory-backed files
        mounts = cfg["mounts"]
        if mounts:
            opts = ("size=%d,mode=1777" % cfg["tmpfs_bytes"]).encode()
            root = mounts[0]
            _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", 2 | 4, opts), "mount tmpfs on " + root)  # NOSUID|NODEV
            for d in mounts[1:]:
                sub = root + "/.sandbox" + d.replace("/", "-")
                os.makedirs(sub)
                os.chmod(sub, 0o1777)
                os.makedirs(d, exist_ok=True)
                _check(libc.mount(sub.encode(), d.encode(), None, 4096, None), "bind " + d)  # MS_BIND
        _check(libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None), "mount /proc")  # + NOEXEC
        for fd, dst in zip(srcs, cfg["binds"]):  # the interpreter's dirs, read-only, at their own paths
            os.makedirs(dst, exist_ok=True)
            _check(libc.mount(("/proc/self/fd/%d" % fd).encode(), dst.encode(), None, 4096, None), "bind " + dst)
            _check(libc.mount(None, dst.encode(), None, 4096 | 32 | 1 | 2 | 4, None), "remount " + dst)  # RDONLY
            os.close(fd)
    sys.path.extend(cfg["path"])
    os.environ.clear()
    os.environ.update(cfg["env"])
    os.makedirs(cfg["workdir"], exist_ok=True)
    uid = cfg["uid"]
    if uid is not None:
        os.chown(cfg["workdir"], uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(cfg["workdir"])
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (after setuid, which clears it): die with the server
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))

compile("print(sum(i * i for i in range(9)))", "<code>", "exec")  # the first compile() sets up the compiler: ~3 ms
gc.freeze()  # workers' collections skip the server's objects: their memory stays shared, not copied
_cfg, _fds = serve(int(sys.argv[1]))
try:
    setup(_cfg, _fds)
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
sys.stdout.buffer.write(b"\x00toolgym-sandbox-ready\n")
sys.stdout.buffer.flush()
_code = sys.stdin.read()
try:
    sys.stdin.close()
    sys.stdin = open(os.devnull)
except Exception:
    pass
sys.stdout.reconfigure(errors="backslashreplace")
del _cfg, _fds, serve, setup, libc
_main = types.ModuleType("__main__")
sys.modules["__main__"] = _main
try:
    exec(compile(_code, "<code>", "exec"), _main.__dict__)
    _rc = 0
except SystemExit as _e:  # as the interpreter does it
    _rc = _e.code
    if _rc is None:
        _rc = 0
    elif not isinstance(_rc, int):
        print(_rc, file=sys.stderr)
        _rc = 1
except BaseException as _e:
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
# The interpreter's shutdown, less the teardown of every module (which would write to, and so copy, every page
# this process still shares with the fork server): join threads, run atexit callbacks, flush, exit.
_t = sys.modules.get("threading")
if _t is not None:
    _t._shutdown()
atexit._run_exitfuncs()
for _s in (sys.stdout, sys.stderr):
    try:
        _s.flush()
    except Exception:
        _rc = _rc or 120
os._exit(_rc & 0xFF)
"""

# Checks that this host lets root create PID, mount and network namespaces and mount in them (run once).
_NS_CHECK = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x20000000) == 0
pid = os.fork()
if pid == 0:
    ok = (libc.unshare(0x20000 | 0x40000000 | 0x8000000) == 0 and libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) == 0
          and libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 6, b"size=1048576") == 0
          and libc.mount(b"proc", b"/proc", b"proc", 14, None) == 0 and os.getpid() == 1)
    os._exit(0 if ok else 1)
os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""

_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# hidden behind an empty read-only tmpfs (namespaced mode): where host services keep their path-based unix sockets
# (a network namespace isolates abstract sockets and TCP, not sockets that are files)
_HIDDEN_DIRS = ("/run", "/var/run")


def namespaces_available(python: str | None = None) -> bool:
    """``True`` when this process may put sandbox workers in new PID, mount and network namespaces (needs root
    and a kernel that allows it; checked once per process by running ``python``)."""
    return _namespaces_available(python or sys.executable)


@functools.cache
def _namespaces_available(python: str) -> bool:
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    try:
        r = subprocess.run([python, "-I", "-S", "-c", _NS_CHECK], capture_output=True, timeout=10)
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
        tmpfs_mb: size of the one private tmpfs behind ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``
            (namespaced mode): the total the snippet may store in memory-backed files. It is not counted in
            ``memory_mb`` (``RLIMIT_AS`` counts mappings, not tmpfs pages): a worker's worst case is
            ``memory_mb + tmpfs_mb``, released when the worker exits.
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


_LIVE: weakref.WeakSet[Sandbox] = weakref.WeakSet()
_SLOTS: dict[int | None, list[int]] = {}
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
             "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
                [python, "-I", "-S", "-c", _PROGRAM, str(child.fileno()), "1" if preload else "0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(child.fileno(),), env=_BASE_ENV,
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
        msg = b"%d %s" % (req, repr(cfg).encode())
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
            kind, a, b = data.split(b" ", 2)
            if kind == b"X":  # a worker was reaped
                ex = self._exits.pop(int(a), None)
                if ex is not None and not ex.done():
                    ex.set_result(int(b))
            elif kind == b"P":  # a worker was forked
                pid = int(b)
                ex = self.loop.create_future()
                self._exits[pid] = ex
                fut = self._pending.pop(int(a), None)
                if fut is None or fut.done():  # its caller gave up waiting: nobody will use it
                    self.kill(pid)
                else:
                    fut.set_result((pid, ex))
            else:  # E: the fork failed
                fut = self._pending.pop(int(a), None)
                if fut is not None and not fut.done():
                    fut.set_exception(OSError(f"the sandbox fork server could not fork: {b.decode(errors='replace')}"))

    def kill(self, pid: int) -> None:
        """Ask the server to SIGKILL worker ``pid`` and its process group (if not reaped yet)."""
        if not self.alive:
            return
        try:
            self.sock.send(b"K %d" % pid)
        except BlockingIOError:  # the server is behind on its messages: try again shortly
            with contextlib.suppress(RuntimeError):
                self.loop.call_later(0.01, self.kill, pid)
        except OSError:  # it is gone: the reader's EOF handling kills its orphans
            pass

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
        self._mounts = [d for d in _WRITABLE_DIRS if os.path.isdir(d)] if ns else []
        self._hide = [d for d in _HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)] if ns else []
        # An unprivileged uid must be able to read the interpreter's files. Prefixes it cannot reach (a pyenv under
        # /root, mode 0700) or that a private tmpfs hides (a virtualenv under /tmp) are bind-mounted read-only at
        # their own paths; a directory in the way (/root) is covered by an empty tmpfs the binds are mounted in.
        self._binds: list[str] = []
        self._covers: list[str] = []
        self.drop_privileges = self.is_root
        if self.is_root:
            # prefixes the dropped uid cannot reach, and prefixes under a directory the private tmpfs covers
            # (e.g. a virtualenv in a checkout under /tmp)
            def unreachable(p: str) -> bool:
                return not _world_readable(p) or (ns and any(_under(p, d) for d in self._mounts + self._hide))

            hidden = [p for p in dict.fromkeys((sys.base_prefix, sys.prefix)) if unreachable(p)]
            if ns:  # site-packages outside those prefixes (PYTHONPATH, .pth files), e.g. another venv under /tmp
                for p in self._path:
                    if os.path.isdir(p) and not any(_under(p, q) for q in hidden) and unreachable(p):
                        hidden.append(p)
                hidden = [p for p in hidden if not any(q != p and _under(p, q) for q in hidden)]
            if hidden and ns:
                self._binds = sorted(hidden, key=len)
                covers = {_blocking_ancestor(p) for p in hidden}
                self._covers = sorted(c for c in covers if c and not any(_under(c, d) for d in self._mounts))
            elif hidden:  # no mount namespace: the dropped uid could not import the stdlib
                self.drop_privileges = False
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
        env = {**_BASE_ENV, "HOME": workdir, "TMPDIR": "/tmp" if self.namespaces else workdir}
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
            if (not chunk or len(buf) >= len(_READY) or not _READY.startswith(buf)) and not done.done():
                done.set_result(None)

        loop.add_reader(w.stdout, on_read)
        try:
            await done
        finally:
            loop.remove_reader(w.stdout)
        if buf[: len(_READY)] != _READY:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(w.exit), 2.0)  # its stderr is complete once it is gone
            err = b""
            with contextlib.suppress(OSError):
                err = os.read(w.stderr, 4096)
            raise RuntimeError(f"sandbox worker failed to start: {err.decode(errors='replace').strip() or bytes(buf)!r}")
        return bytes(buf[len(_READY):])

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
        bufs = {w.stdout: bytearray(w.early), w.stderr: bytearray()}
        out, err = bufs[w.stdout], bufs[w.stderr]
        state = {"overflow": False, "writer": False}
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
            if state["overflow"]:  # keep draining to EOF so the pipe closes
                return
            room = lim.max_output_bytes - len(out) - len(err)
            if len(chunk) > room:
                bufs[fd] += chunk[: max(room, 0)]
                state["overflow"] = True
                _kill(w)
                return
            bufs[fd] += chunk

        def feed() -> None:
            nonlocal data
            try:
                while data:
                    data = data[os.write(w.stdin, data):]
            except BlockingIOError:
                if not state["writer"]:
                    state["writer"] = True
                    loop.add_writer(w.stdin, feed)
                return
            except OSError:  # it exited without reading everything
                pass
            if state["writer"]:
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
        status_word = w.exit.result() if w.exit.done() else None
        rc = None if status_word is None else os.waitstatus_to_exitcode(status_word)
        out_s = out.decode("utf-8", errors="replace")
        err_s = err.decode("utf-8", errors="replace")
        sig = None
        if rc is not None and rc < 0:
            with contextlib.suppress(ValueError):
                sig = signal.Signals(-rc).name
        if timed_out:
            status = "timeout"
        elif state["overflow"]:
            status = "output_limit"
        elif rc is None:
            status = "sandbox_error"
            err_s += ("\n" if err_s and not err_s.endswith("\n") else "") + "[the sandbox fork server exited]\n"
        elif rc == 0:
            status = "ok"
        elif rc == _CPU_EXIT or sig == "SIGXCPU":
            status = "cpu_limit"
        elif rc < 0:
            status = "killed"
        elif rc == 1 and "MemoryError" in err_s[-400:]:
            status = "memory_limit"
        elif rc == _SETUP_EXIT and err_s.startswith("sandbox setup failed"):
            status = "sandbox_error"
        else:
            status = "error"
        return SandboxResult(
            status, rc if rc is not None and rc >= 0 else None, sig, out_s, err_s, state["overflow"], wall,
        )

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


def _under(path: str, directory: str) -> bool:
    """``True`` when ``path`` (symlinks resolved) is ``directory`` or inside it."""
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip("/") + "/")


def _world_readable(path: str) -> bool:
    """``True`` when any user can traverse to ``path`` (symlinks resolved) and read it."""
    import stat

    p = os.path.realpath(path)
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return _blocking_ancestor(p) is None and bool(mode & stat.S_IXOTH) and bool(mode & stat.S_IROTH)


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory above ``path`` that other users cannot traverse (no ``o+x``), if any."""
    import stat

    parts = os.path.abspath(path).split("/")
    for i in range(2, len(parts)):
        d = "/".join(parts[:i])
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return None
    return None


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
    # Hang up on every fork server: each kills and reaps its workers (the warm ones too) and exits. A plain
    # shutdown(2) is safe from this thread while an event loop in another thread may still watch the socket.
    for sb in list(_LIVE):
        server = sb._server
        if server is not None:
            with contextlib.suppress(Exception):
                server.sock.shutdown(socket.SHUT_RDWR)



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
