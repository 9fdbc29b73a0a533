"""What the host allows and where its files are: the namespace probe (:func:`namespaces_available`), path
permissions, the mounts a worker needs (:func:`plan_mounts`) and process counting."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field

from toolgym.tools.sandbox import worker

__all__ = ["HIDDEN_DIRS", "WRITABLE_DIRS", "MountPlan", "count_user_processes", "namespaces_available",
           "plan_mounts"]

#: world-writable directories: in namespaced mode all four are backed by one private, size-limited tmpfs
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
#: hidden behind an empty read-only tmpfs (namespaced mode): where host services keep their path-based unix
#: sockets (a network namespace isolates abstract sockets and TCP, not sockets that are files)
HIDDEN_DIRS = ("/run", "/var/run")


def namespaces_available(python: str | None = None) -> bool:
    """``True`` when this process may put sandbox workers in new PID, mount and network namespaces (needs root
    and a kernel that allows it; checked once per process by running ``python``)."""
    return _namespaces_available(python or sys.executable)


@functools.cache
def _namespaces_available(python: str) -> bool:
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    try:
        r = subprocess.run([python, "-I", "-S", worker.__file__, "--probe-namespaces"], capture_output=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _under(path: str, directory: str) -> bool:
    """``True`` when ``path`` (symlinks resolved) is ``directory`` or inside it."""
    p, d = os.path.realpath(path), os.path.realpath(directory)
    return p == d or p.startswith(d.rstrip("/") + "/")


def _world_readable(path: str) -> bool:
    """``True`` when any user can traverse to ``path`` (symlinks resolved) and read it."""
    p = os.path.realpath(path)
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return _blocking_ancestor(p) is None and bool(mode & stat.S_IXOTH) and bool(mode & stat.S_IROTH)


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory above ``path`` that other users cannot traverse (no ``o+x``), if any."""
    parts = os.path.abspath(path).split("/")
    for i in range(2, len(parts)):
        d = "/".join(parts[:i])
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return None
    return None


def count_user_processes() -> int:
    """Processes of this process's real uid (``/proc``), as ``RLIMIT_NPROC`` counts them."""
    uid = os.getuid()
    n = 0
    with contextlib.suppress(OSError):
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}").st_uid == uid:
                        n += 1
    return n


@dataclass(frozen=True)
class MountPlan:
    """The file-system view of a worker (see ``docs/sandbox.md``, "Interpreter files").

    Attributes:
        mounts: writable directories backed by the private tmpfs (namespaced mode; the first holds it).
        hide: directories covered by an empty read-only tmpfs (host services' sockets).
        binds: interpreter prefixes the worker's uid could not reach, bind-mounted read-only at their own paths.
        covers: directories in the way of a bind (``/root``), covered by an empty tmpfs holding only the binds.
        drop_privileges: whether workers run as an unprivileged uid (root only; without a mount namespace only
            when that uid can read the interpreter).
    """

    mounts: list[str] = field(default_factory=list)
    hide: list[str] = field(default_factory=list)
    binds: list[str] = field(default_factory=list)
    covers: list[str] = field(default_factory=list)
    drop_privileges: bool = False


def plan_mounts(*, namespaces: bool, is_root: bool, path: list[str], prefixes: tuple[str, ...] | None = None
                ) -> MountPlan:
    """What a worker must mount so that an unprivileged uid can run the interpreter at ``prefixes`` (default:
    this one's ``sys.base_prefix`` and ``sys.prefix``) and import from ``path`` (site-packages dirs).

    Prefixes it cannot reach (a pyenv under ``/root``, mode 0700) or that a private tmpfs hides (a virtualenv
    under ``/tmp``) are bind-mounted read-only at their own paths; a directory in the way (``/root``) is covered
    by an empty tmpfs the binds are mounted in. Without a mount namespace such a prefix means privileges are not
    dropped (the dropped uid could not import the stdlib)."""
    ns = namespaces
    mounts = [d for d in WRITABLE_DIRS if os.path.isdir(d)] if ns else []
    hide = [d for d in HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)] if ns else []
    binds: list[str] = []
    covers: list[str] = []
    drop = is_root
    if is_root:
        # prefixes the dropped uid cannot reach, and prefixes under a directory the private tmpfs covers
        # (e.g. a virtualenv in a checkout under /tmp)
        def unreachable(p: str) -> bool:
            return not _world_readable(p) or (ns and any(_under(p, d) for d in mounts + hide))

        prefixes = prefixes if prefixes is not None else (sys.base_prefix, sys.prefix)
        hidden = [p for p in dict.fromkeys(prefixes) if unreachable(p)]
        if ns:  # site-packages outside those prefixes (PYTHONPATH, .pth files), e.g. another venv under /tmp
            for p in path:
                if os.path.isdir(p) and not any(_under(p, q) for q in hidden) and unreachable(p):
                    hidden.append(p)
            hidden = [p for p in hidden if not any(q != p and _under(p, q) for q in hidden)]
        if hidden and ns:
            binds = sorted(hidden, key=len)
            blocking = {_blocking_ancestor(p) for p in hidden}
            covers = sorted(c for c in blocking if c and not any(_under(c, d) for d in mounts))
        elif hidden:  # no mount namespace: the dropped uid could not import the stdlib
            drop = False
    return MountPlan(mounts, hide, binds, covers, drop)
