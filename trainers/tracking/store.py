"""The tracking store as a shared resource: a lock that serialises what must not interleave between processes (the
first-time setup of a fresh SQLite store, an alias compare-and-set), and a one-line check for a read-only store.

MLflow's clients have no compare-and-set and set a fresh SQLite store up (schema migrations) in whichever process
opens it first: three commands on a fresh store at once crashed two of them, and two promotions at once both moved
the alias against the same old holder. For a local store (``sqlite:///PATH``, ``file:`` or a plain path) the lock
is an exclusive ``flock`` on ``PATH.lock`` next to it, which every toolgym process on the machine takes; a remote
tracking server (``http(s)://``) cannot be locked from here (:func:`store_lock` is then a no-op; see
docs/registry.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from toolgym.errors import CLIError, ExitCode

__all__ = ["StoreReadOnlyError", "check_store_writable", "local_store_path", "store_lock"]


class StoreReadOnlyError(CLIError):
    """The tracking store cannot be written (a read-only file or file system): exit code 3."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.INPUT)


def local_store_path(uri: str) -> Path | None:
    """The file (SQLite) or directory (file store) of a local tracking URI; ``None`` for a remote server."""
    if uri.startswith("sqlite:///"):
        return Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0]))
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    if "://" not in uri:
        return Path(uri)
    return None


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold the store's exclusive inter-process lock (a no-op for a remote server, or where no lock file can be
    made: a read-only store, which :func:`check_store_writable` reports)."""
    path = local_store_path(uri)
    if path is None:
        yield
        return
    lock = path.parent / f"{path.name}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def check_store_writable(uri: str) -> None:
    """Raise :class:`StoreReadOnlyError` (one line, exit 3) when a local store cannot be written: its database file
    (or, for a store not created yet, its directory) is read-only."""
    path = local_store_path(uri)
    if path is None:
        return
    # SQLite also writes a journal next to its file: the directory must be writable too
    where = [path] if path.exists() else []
    where += [next((p for p in path.parents if p.exists()), Path("/"))]
    if any(not os.access(p, os.W_OK) for p in where):
        raise StoreReadOnlyError(f"the tracking store {path} is read-only (it cannot be written here); use a "
                                 "writable copy or point MLFLOW_TRACKING_URI at a writable store")
