"""The sandbox's fork server and worker: the program behind every sandboxed snippet.

This file is run as a script, ``python -I -S worker.py FD PRELOAD`` (see :mod:`.forkserver`), in an interpreter
that cannot import toolgym (isolated mode, no site: only the standard library and, in the workers, the
configured site-packages). So it imports nothing but the standard library; the host imports it too, for the
protocol below and the exit codes, which is why importing it does nothing but define names.

**Protocol.** FD is a ``SOCK_SEQPACKET`` socket to the host. The host sends :func:`fork_request` (``b"<id>
<config literal>"``) with the worker's stdin/stdout/stderr attached (``SCM_RIGHTS``), or :func:`kill_request`
(``b"K <pid>"``). The server forks (into a new PID namespace when the config asks) and answers
:func:`forked_reply` (``P <id> <pid>``) or :func:`failed_reply` (``E <id> <error>``), and :func:`exited_reply`
(``X <pid> <wait status>``) once it reaped the worker. When the host hangs up it kills its workers and exits.

**Worker.** A forked worker leaves :func:`serve` and runs the rest of :func:`main`: it isolates and limits
itself (:func:`setup`), writes :data:`READY`, reads the whole snippet from stdin and runs it as ``__main__``
(:func:`execute`; tracebacks omit this program's frame), then exits like an interpreter (:func:`finish`).

``python -I -S worker.py --probe-namespaces`` instead checks that this host lets root create the namespaces
and mount in them (:func:`probe_namespaces`; exit status 0 when it does).
"""

# No ``from __future__ import annotations`` effect reaches snippets: every compile() here passes dont_inherit.
from __future__ import annotations

import atexit
import ctypes
import gc
import os
import resource
import select
import signal
import socket
import sys
import traceback
import types

TYPE_CHECKING = False  # importing typing would cost every fresh interpreter ~2 ms
if TYPE_CHECKING:
    from typing import Any

#: what a worker writes on stdout once it is isolated and waits for code
READY = b"\x00toolgym-sandbox-ready\n"
#: a worker's exit status after SIGXCPU (128 + SIGXCPU, written by :func:`on_sigxcpu`)
CPU_EXIT = 152
#: a worker's exit status when :func:`setup` failed (stderr starts with ``sandbox setup failed``)
SETUP_EXIT = 120
#: what snippets often import: with PRELOAD 1 the server imports them once, and every worker inherits them
PRELOAD = ("math", "re", "json", "collections", "itertools", "functools", "fractions", "decimal",
           "statistics", "datetime", "random", "string", "heapq", "bisect")

# clone(2) flags
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWIPC = 0x20000, 0x40000000, 0x20000000, 0x8000000
# mount(2) flags
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


# -- protocol ---------------------------------------------------------------------------------------------
def fork_request(req: int, cfg: dict[str, Any]) -> bytes:
    """Host -> server: fork a worker with configuration ``cfg`` (a dict of literals: see ``Sandbox._config``)."""
    return b"%d %s" % (req, repr(cfg).encode())


def kill_request(pid: int) -> bytes:
    """Host -> server: SIGKILL worker ``pid`` and its process group, if it is a worker not reaped yet."""
    return b"K %d" % pid


def parse_request(msg: bytes) -> tuple[bytes, Any]:
    """Server side of a request: ``(b"K", pid)`` for a kill, else ``(request id, configuration dict)``."""
    req, _, text = msg.partition(b" ")
    if req == b"K":
        return req, int(text)
    return req, eval(text, {"__builtins__": {}})  # a literal written by the host


def forked_reply(req: bytes, pid: int) -> bytes:
    """Server -> host: request ``req`` forked worker ``pid``."""
    return b"P %s %d" % (req, pid)


def failed_reply(req: bytes, error: BaseException) -> bytes:
    """Server -> host: request ``req`` could not fork."""
    return b"E " + req + b" " + repr(error).encode()


def exited_reply(pid: int, status: int) -> bytes:
    """Server -> host: worker ``pid`` was reaped with wait status ``status``."""
    return b"X %d %d" % (pid, status)


def parse_reply(data: bytes) -> tuple[bytes, int, bytes]:
    """Host side of a reply: ``(kind, request id or pid, rest)`` with kind ``P``, ``E`` or ``X``."""
    kind, a, b = data.split(b" ", 2)
    return kind, int(a), b


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The file descriptors passed with a message (``SCM_RIGHTS`` items of ``recvmsg``'s ancillary data)."""
    return [int.from_bytes(data[i:i + 4], sys.byteorder) for level, kind, data in ancillary
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS for i in range(0, len(data) - 3, 4)]


# -- the fork server --------------------------------------------------------------------------------------
def serve(fd: int) -> tuple[dict[str, Any], list[int]]:
    """Serve the host on socket ``fd`` until it hangs up (then kill and reap every worker and ``_exit(0)``).
    Returns only in a forked worker: its configuration and its stdin/stdout/stderr."""
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
    children: set[int] = set()

    def kill(pid: int) -> None:
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
                fds = received_fds(anc)
                if not msg:
                    raise EOFError
                req, cfg = parse_request(msg)
                if req == b"K":  # kill a worker (and its group): only the reaper knows its pid is still its own
                    kill(cfg)
                    continue
                pid = -1
                try:
                    if cfg["namespaces"]:
                        if pidns is None:
                            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
                        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
                    try:
                        pid = os.fork()  # in a new PID namespace: the worker is its PID 1
                    finally:
                        if pid and cfg["namespaces"]:  # later forks of this server stay in its own namespace
                            _check(_libc.setns(pidns, CLONE_NEWPID), "setns(CLONE_NEWPID)")
                except OSError as e:
                    if pid > 0:
                        raise
                    for f in fds:
                        os.close(f)
                    sock.send(failed_reply(req, e))
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    return cfg, fds
                for f in fds:
                    os.close(f)
                children.add(pid)
                sock.send(forked_reply(req, pid))
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
                sock.send(exited_reply(pid, status))
    except (EOFError, OSError):  # the host hung up (or went away): no worker outlives this server
        for pid in children:
            kill(pid)
        for pid in children:  # reap them: orphaned zombies would wait for the host's init
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        os._exit(0)


# -- the worker -------------------------------------------------------------------------------------------
def setup(cfg: dict[str, Any], fds: list[int]) -> None:
    """Isolate and limit this (forked) process as ``cfg`` says, with ``fds`` as its stdin/stdout/stderr."""
    for i, f in enumerate(fds):
        os.dup2(f, i)
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))  # the server's socket above all
    # new stdio objects for the new fds 0-2, configured like an interpreter's own
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", 1, encoding="utf-8", errors="backslashreplace", closefd=False)
    os.setsid()  # its own session and process group: killpg reaches it, and it cannot leave the group
    if cfg["namespaces"]:
        _isolate_files(cfg)
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
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # (after setuid, which clears it): die with the server
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _isolate_files(cfg: dict[str, Any]) -> None:
    """New mount, network and IPC namespaces: private tmpfs, hidden host sockets, own /proc, read-only binds."""
    # own IPC namespace: SysV shared memory, semaphores and message queues are private and die with the worker
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC),
           "unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    # hold the bind sources open first: a source under /tmp is hidden once the private tmpfs covers /tmp
    srcs = [os.open(src, os.O_RDONLY | os.O_DIRECTORY) for src in cfg["binds"]]
    # /run (host services' path sockets: dbus, docker, databases) and /root-like dirs in the way of a bind:
    # an empty tmpfs, read-only for the worker's uid
    for d in cfg["hide"] + cfg["covers"]:
        os.makedirs(d, exist_ok=True)
        _check(_libc.mount(b"tmpfs", d.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755"),
               "mount tmpfs on " + d)
    # ONE size-limited tmpfs for every writable directory (the first, /tmp; the others are bind mounts of its
    # subdirectories), so tmpfs_bytes bounds all the worker can store in memory-backed files
    mounts = cfg["mounts"]
    if mounts:
        opts = f"size={cfg['tmpfs_bytes']},mode=1777".encode()
        root = mounts[0]
        _check(_libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs on " + root)
        for d in mounts[1:]:
            sub = root + "/.sandbox" + d.replace("/", "-")
            os.makedirs(sub)
            os.chmod(sub, 0o1777)
            os.makedirs(d, exist_ok=True)
            _check(_libc.mount(sub.encode(), d.encode(), None, MS_BIND, None), "bind " + d)
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    for fd, dst in zip(srcs, cfg["binds"], strict=True):  # the interpreter's dirs, read-only, at their own paths
        os.makedirs(dst, exist_ok=True)
        _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), dst.encode(), None, MS_BIND, None), "bind " + dst)
        _check(_libc.mount(None, dst.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
               "remount " + dst)
        os.close(fd)


def on_sigxcpu(signum: int, frame: types.FrameType | None) -> None:
    """SIGXCPU handler (the soft ``RLIMIT_CPU``): say so on stderr and exit with :data:`CPU_EXIT`."""
    sys.stderr.write("\nCPU time limit exceeded\n")
    sys.stderr.flush()
    os._exit(CPU_EXIT)


def exit_status(code: object) -> int:
    """The exit status for ``SystemExit(code)``, as the interpreter computes it: ``None`` is 0, an int is
    itself, anything else is printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def execute(code: str) -> int | None:
    """Run ``code`` as the module ``__main__`` (a new module object, registered in ``sys.modules``).

    Returns the exit status (0, or ``sys.exit``'s), or ``None`` when an exception escaped: its traceback, less
    this function's frame, is printed to stderr and stdout/stderr are flushed."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<code>", "exec", dont_inherit=True), main.__dict__)
    except SystemExit as e:  # as the interpreter does it
        return exit_status(e.code)
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        sys.stdout.flush()
        sys.stderr.flush()
        return None
    return 0


def finish(rc: int) -> int:
    """The interpreter's shutdown, less the teardown of every module (which would write to, and so copy, every
    page this process still shares with the fork server): join threads, run atexit callbacks, flush. Returns the
    exit status (120 when flushing failed after a 0)."""
    t = sys.modules.get("threading")
    if t is not None:
        t._shutdown()
    atexit._run_exitfuncs()
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            rc = rc or SETUP_EXIT
    return rc


def worker(cfg: dict[str, Any], fds: list[int]) -> None:
    """A forked worker's life: isolate, say ready, read the snippet, run it, exit (never returns)."""
    try:
        setup(cfg, fds)
    except BaseException as e:
        sys.stderr.write(f"sandbox setup failed: {e!r}\n")
        sys.stderr.flush()
        os._exit(SETUP_EXIT)
    signal.signal(signal.SIGXCPU, on_sigxcpu)
    sys.argv = ["<sandbox>"]
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    code = sys.stdin.read()
    try:
        sys.stdin.close()
        sys.stdin = open(os.devnull)  # the snippet's stdin for the rest of its life
    except Exception:
        pass
    sys.stdout.reconfigure(errors="backslashreplace")
    rc = execute(code)
    if rc is None:
        os._exit(1)
    os._exit(finish(rc) & 0xFF)


def probe_namespaces() -> int:
    """0 when this process may create PID, mount, network and IPC namespaces and mount ``/``, a tmpfs and
    ``/proc`` in them (the forked child becomes PID 1), else 1. Changes this process's PID namespace for its
    children: run it in a process of its own."""
    if _libc.unshare(CLONE_NEWPID) != 0:
        return 1
    pid = os.fork()
    if pid == 0:
        ok = (_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) == 0
              and _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
              and _libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1048576") == 0
              and _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0
              and os.getpid() == 1)
        os._exit(0 if ok else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def main(argv: list[str]) -> None:
    """``worker.py FD PRELOAD``: preload (PRELOAD ``1``), then serve on socket FD; forked workers run
    :func:`worker`. ``worker.py --probe-namespaces``: :func:`probe_namespaces`."""
    if argv[1] == "--probe-namespaces":
        os._exit(probe_namespaces())
    if argv[2] == "1":  # the import is paid once, in the server
        for name in PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass
    compile("print(sum(i * i for i in range(9)))", "<code>", "exec", dont_inherit=True)  # sets up the compiler
    gc.freeze()  # workers' collections skip the server's objects: their memory stays shared, not copied
    cfg, fds = serve(int(argv[1]))
    worker(cfg, fds)


if __name__ == "__main__":
    main(sys.argv)
