"""JSON Lines: the only JSONL code in toolgym (task files, trajectory files, corpora, caches, replay logs).

* :func:`iter_jsonl` / :func:`read_jsonl` read a file line by line (streaming), naming ``path:line`` on a bad line;
* :func:`write_jsonl` writes rows atomically (a temporary file renamed into place) or appends them;
* :class:`JSONLStream` streams rows as they are produced (``toolgym eval`` / ``rollout`` output), never emptying an
  existing file before the first new row exists, and holds the file's writer lock for its whole life: a second
  stream to the same file (another process, or another run in this one) is refused with
  :class:`~toolgym.errors.OutputFileError`, never allowed to replace the first one's rows;
* :func:`check_writable` checks an output path before any work starts.

Output policy (every writer here): an output path that is a symbolic link is written *through* (the file it points
to is replaced or appended to; the link stays a link); a path that exists and is not a regular file (a device such
as ``/dev/null``, a FIFO, a socket, a directory) is refused with :class:`~toolgym.errors.OutputFileError`, never
replaced. A write that fails part-way (``ENOSPC``: the disk is full) is undone to the last whole row and raised as
:class:`~toolgym.errors.OutputFileError`. A row nested deeper than :data:`MAX_DEPTH` levels (a model's tool call
can be) is written whole, its deeper values replaced by a marker, with a ``write_error`` key saying so.

Rows are encoded with :mod:`json` (the standard library); numpy values and objects with ``to_dict()`` are encoded
as lists / numbers / their dict. Hand-written only in the file handling (atomic replace, one write per line): no
JSONL library offers atomic replacement or a streaming writer that never truncates early.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from toolgym.errors import OutputFileError

__all__ = [
    "MAX_DEPTH", "JSONLStream", "check_writable", "iter_jsonl", "lock_output", "output_target", "read_jsonl",
    "unlock_output", "write_jsonl",
]

MAX_DEPTH = 100
"""Deepest nesting a row keeps when it is too deep to encode (values below it become :data:`_CUT`)."""
_CUT = f"…[cut: nested deeper than {MAX_DEPTH} levels]"


def iter_jsonl(
    path: str | os.PathLike[str], *, error: type[Exception] = ValueError, objects: bool = True,
    on_cut_tail: Callable[[int, str], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``path`` (numbers start at 1).

    Raises ``error`` with ``path:line`` in its message for a line that is not JSON, or (when ``objects``) not a
    JSON object; ``FileNotFoundError`` when the file is missing.

    ``on_cut_tail``: when given, a last line with no newline that is not valid JSON (a row cut mid-write: the
    writer died, the disk filled up) is not an error: ``on_cut_tail(line number, message)`` is called instead and
    the whole rows before it are kept. Without it, such a line raises like any other bad line.
    """
    p = Path(path)
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                if on_cut_tail is not None and not line.endswith("\n"):
                    on_cut_tail(n, f"{p}:{n}: the last line was cut mid-write (no newline, not valid JSON)")
                    return
                raise error(f"{p}:{n}: not valid JSON ({e.msg})") from None
            if objects and not isinstance(value, dict):
                raise error(f"{p}:{n}: expected a JSON object, got {type(value).__name__}")
            yield n, value


def read_jsonl(path: str | os.PathLike[str], *, error: type[Exception] = ValueError) -> list[dict[str, Any]]:
    """Every JSON object of ``path`` (see :func:`iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path, error=error)]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def _capped(value: Any) -> tuple[Any, int]:
    """A copy of ``value`` whose containers deeper than :data:`MAX_DEPTH` are replaced by :data:`_CUT` (walked
    without recursion), and how many were cut."""
    cuts = 0
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 0)]
    while stack:
        v, parent, key, depth = stack.pop()
        if not isinstance(v, dict | list | tuple | str | int | float | bool | type(None)):
            v = _json_default(v)
        if isinstance(v, dict | list | tuple):
            if depth >= MAX_DEPTH:
                parent[key], cuts = _CUT, cuts + 1
                continue
            if isinstance(v, dict):
                new: Any = dict.fromkeys(str(k) for k in v)
                stack.extend((x, new, str(k), depth + 1) for k, x in v.items())
            else:
                new = [None] * len(v)
                stack.extend((x, new, i, depth + 1) for i, x in enumerate(v))
            parent[key] = new
        else:
            parent[key] = v
    return root[0], cuts


def _line(row: Any, ensure_ascii: bool = True) -> bytes:
    try:
        text = json.dumps(row, default=_json_default, ensure_ascii=ensure_ascii)
    except RecursionError:  # e.g. a model's tool call nested a thousand levels deep: keep the row, cut the depth
        row, cuts = _capped(row)
        if isinstance(row, dict):
            row["write_error"] = f"too_deep: {cuts} values nested deeper than {MAX_DEPTH} levels replaced by {_CUT!r}"
        text = json.dumps(row, default=_json_default, ensure_ascii=ensure_ascii)
    return (text + "\n").encode("utf-8")


def output_target(path: str | os.PathLike[str]) -> Path:
    """Where writing ``path`` lands: the file a symbolic link points to (the link is kept), else ``path``.

    Raises:
        OutputFileError: the target exists and is not a regular file (a device, a FIFO, a socket, a directory).
    """
    p = Path(path)
    if p.is_symlink():
        p = Path(os.path.realpath(p))
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return p
    except OSError as e:
        raise OutputFileError(e.errno, f"cannot write {path}: {e.strerror}", str(path)) from None
    if not stat.S_ISREG(mode):
        what = ("a directory" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise OutputFileError(errno.EINVAL, f"cannot write {path}: it is {what}, not a regular file; name a "
                              "regular file or a new path", str(path))  # fmt: skip
    return p


def _failed(e: OSError, path: Path, kept: str = "") -> OutputFileError:
    if isinstance(e, OutputFileError):
        return e
    return OutputFileError(e.errno, f"cannot write {path}: {e.strerror or e}{kept}", str(path))


def _write_all(fd: int, data: bytes, path: Path) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if not n:
            raise OSError(errno.EIO, f"cannot write to {path}")
        view = view[n:]


def _append_whole(fd: int, data: bytes, path: Path) -> None:
    """Append ``data`` (whole lines) to ``fd``; on a failure part-way (a full disk) the file is cut back to where it
    was, so it ends with a whole row, and :class:`OutputFileError` is raised."""
    start = os.fstat(fd).st_size
    try:
        _write_all(fd, data, path)
    except OSError as e:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise _failed(e, path, " (the rows written before are kept whole)") from None


def write_jsonl(
    path: str | os.PathLike[str], rows: Iterable[Any], *, append: bool = False, ensure_ascii: bool = True
) -> Path:
    """Write ``rows`` (JSON-encodable values, one per line) to ``path``; returns the path.

    ``append=False``: the rows are streamed to a temporary file next to ``path``, which is flushed to disk and then
    atomically replaces ``path``: a reader (or a crash) sees the old file or the whole new one, never a truncated
    one, and a row that cannot be encoded leaves ``path`` as it was. ``append=True``: every row is encoded first,
    then all of them are appended with one unbuffered write, so the existing lines are never touched and nothing is
    written when a row cannot be encoded. Parent directories are created. ``ensure_ascii`` as in :func:`json.dumps`.
    """
    given = Path(path)
    p = output_target(given)
    p.parent.mkdir(parents=True, exist_ok=True)
    if append:
        data = b"".join(_line(r, ensure_ascii) for r in rows)
        if data:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            try:
                _append_whole(fd, data, given)
            finally:
                os.close(fd)
        else:
            p.touch()
        return given
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for r in rows:
                fh.write(_line(r, ensure_ascii))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _failed(e, given, f" ({given} is left as it was)") from None
        raise
    return given


def _lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def _busy(target: Path, holder: str) -> OutputFileError:
    who = f" (process {holder})" if holder else ""
    return OutputFileError(errno.EBUSY, f"cannot write {target}: another run is writing it{who}; give this run "
                                        "another output file, or wait for that run to finish", str(target))


def lock_output(path: str | os.PathLike[str]) -> int:
    """Take the writer lock of the output file ``path`` (an exclusive ``flock`` on ``.<name>.lock`` next to the file
    it resolves to; the file itself is replaced atomically, so its own inode cannot carry the lock) and return the
    lock's file descriptor; release it with :func:`unlock_output`. The lock ends with the process, however it ends.

    Raises:
        OutputFileError: ``EBUSY`` while another writer holds it (its process id in the message).
    """
    target = output_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(target)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise _failed(e, target, f" (its writer lock {lock.name} cannot be created)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise _busy(target, holder) from None
        try:  # the holder before us may have removed the lock file between our open and our flock: retry
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)


def unlock_output(path: str | os.PathLike[str], fd: int) -> None:
    """Release a lock of :func:`lock_output` (its file is removed while still held, so no waiter locks a stale one)."""
    try:
        _lock_path(output_target(path)).unlink(missing_ok=True)
    except OSError:
        pass
    os.close(fd)


class JSONLStream:
    """Writes JSONL rows one at a time as they are produced, without ever emptying an existing file early.

    The first row goes to a temporary file next to ``path``, which then atomically replaces ``path``; later rows
    are appended to it. Each row is one unbuffered ``write`` of the whole line, so a killed process leaves complete
    lines (a row is cut only if the kernel itself splits the write). Use as a context manager or call
    :meth:`close`. ``rows`` counts the rows written. numpy values and objects with ``to_dict()`` are encoded.

    The stream holds the file's writer lock (:func:`lock_output`) from construction to :meth:`close`: a second
    stream to the same file raises :class:`~toolgym.errors.OutputFileError` (``EBUSY``) at construction.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fh: Any = None
        self.rows = 0
        self._lock: int | None = None
        self._lock = lock_output(self.path)

    def write(self, row: Mapping[str, Any]) -> None:
        """Write one row (whole: a failure part-way, e.g. a full disk, leaves the file as it was before the row and
        raises :class:`~toolgym.errors.OutputFileError`)."""
        data = _line(row)
        if self.fh is None:
            target = output_target(self.path)  # a symlink is written through; a device or FIFO is refused
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                self.fh = open(tmp, "ab", buffering=0)  # noqa: SIM115 (kept open: later rows are appended)
                _write_all(self.fh.fileno(), data, self.path)
                os.fsync(self.fh.fileno())
                os.replace(tmp, target)  # the handle stays valid: later rows land in the target
            except BaseException as e:
                if self.fh is not None:
                    self.fh.close()
                self.fh = None
                tmp.unlink(missing_ok=True)
                if isinstance(e, OSError):
                    raise _failed(e, self.path, f" ({self.path} is left as it was)") from None
                raise
        else:
            _append_whole(self.fh.fileno(), data, self.path)
        self.rows += 1

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if self._lock is not None:
            unlock_output(self.path, self._lock)
            self._lock = None

    def __enter__(self) -> JSONLStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise ``OSError`` unless a file can be created next to ``path`` (checked before any model loads; the
    target itself is left untouched): :class:`~toolgym.errors.OutputFileError` for a path that is not a regular
    file (see the output policy in the module docstring)."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(21, "is a directory", str(p))
    p = output_target(p)  # before anything is created next to it: /dev/null must not get a neighbour
    p.parent.mkdir(parents=True, exist_ok=True)
    probe = p.with_name(f".{p.name}.{os.getpid()}.probe")
    probe.open("w").close()
    probe.unlink()
    unlock_output(p, lock_output(p))  # another run writing it now: refused before any work starts
    if p.exists() and not os.access(p, os.W_OK):
        raise PermissionError(13, "permission denied", str(p))
