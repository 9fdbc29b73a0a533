"""The tracking store as a shared resource: a lock that serialises what must not interleave between processes (the
first-time setup of a fresh SQLite store, an alias compare-and-set), a one-line check for a read-only store, and
:func:`ensure_store`, which creates a fresh SQLite store whole or not at all and rebuilds one left half-created.

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
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from toolgym.errors import CLIError, ExitCode

__all__ = ["StoreBrokenError", "StoreReadOnlyError", "check_store_writable", "ensure_store", "local_store_path",
           "store_lock"]


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


class StoreBrokenError(CLIError):
    """A local SQLite store whose schema MLflow cannot open and which holds data, so it is not rebuilt: exit 3."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.INPUT)


#: what an error opening a half-created or half-migrated store says (anywhere in its chain of causes)
_SCHEMA_ERRORS = ("already exists", "duplicate column", "no such table", "no such column",
                  "out-of-date database schema", "can't locate revision", "alembic")
#: the tables whose rows are data a rebuild would lose
_DATA_TABLES = ("runs", "registered_models", "model_versions", "logged_models", "trace_info")


def _sqlite_path(uri: str) -> Path | None:
    return local_store_path(uri) if uri.startswith("sqlite:///") else None


def _schema_error(e: BaseException) -> bool:
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if any(m in str(seen).lower() for m in _SCHEMA_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _forget_engines(uri: str) -> None:
    """Close and drop the engines MLflow caches for ``uri`` (their connections would keep a replaced file)."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    for cls in (TrackingStore, RegistryStore):
        engine = cls._engine_map.pop(uri, None)
        if engine is not None:
            engine.dispose()


def _open(uri: str) -> None:
    """Open the store the way MLflow's clients do (its schema checked, migrations run on an empty file)."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    TrackingStore(uri, DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
    RegistryStore(uri)


def _held(path: Path) -> dict[str, int] | None:
    """Rows per data table of an SQLite file (``None`` when it cannot be read as a database)."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            return {t: con.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in _DATA_TABLES if t in tables}
        finally:
            con.close()
    except sqlite3.Error:
        return None


def _build(path: Path, *, replace: bool) -> None:
    """Create the schema in a temporary file beside ``path``, then move it into place: a process killed meanwhile
    leaves only the temporary file, never a half-made store. ``replace``: over a broken store; else only where no
    file has appeared meanwhile (another program's store is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.creating"):  # left by a killed process (we hold the lock)
        stale.unlink(missing_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".creating", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o666 & ~umask)  # the mode sqlite itself would give the file
    tmp_uri = f"sqlite:///{tmp}"
    try:
        try:
            _open(tmp_uri)
        finally:
            _forget_engines(tmp_uri)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # no-clobber
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        tmp.unlink(missing_ok=True)
        _forget_engines(f"sqlite:///{path}")


def ensure_store(uri: str) -> None:
    """Make a local SQLite store ready for MLflow's clients; call it under :func:`store_lock`. Other stores (a
    server, a file store) are left to MLflow.

    * no file yet (or an empty one): the schema is created in a temporary file in the same directory and moved
      into place, so a process killed during the migrations leaves no store rather than a broken one;
    * a file MLflow cannot open for a schema reason (tables half-created by a process killed before this check
      existed, ``table ... already exists``, ``duplicate column``, an unfinished migration) and with no runs,
      models, versions or traces: rebuilt the same way.

    Raises:
        StoreBrokenError (exit 3): the store is broken that way but holds data (or cannot be read as a database):
            it is left as it is, and the message names the file.
    """
    path = _sqlite_path(uri)
    if path is None:
        return
    if not path.exists() or path.stat().st_size == 0:
        _build(path, replace=path.exists())
        return
    try:
        _open(uri)
    except Exception as e:
        if not _schema_error(e):
            raise
        held = _held(path)
        if held is None or any(held.values()):
            what = ("it cannot be read as a database" if held is None else
                    "it holds " + ", ".join(f"{n} {t.replace('_', ' ')}" for t, n in held.items() if n))
            raise StoreBrokenError(f"the tracking store {path} cannot be opened ({_first_line(e)}); {what}, so it "
                                   "is left as it is: back it up, then run `mlflow db upgrade sqlite:///"
                                   f"{path}`, or move it away to start a new store") from None
        _forget_engines(uri)
        _build(path, replace=True)


def _first_line(e: Any) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"
