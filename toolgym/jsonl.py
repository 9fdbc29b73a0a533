"""JSON Lines: the only JSONL code in toolgym (task files, trajectory files, corpora, caches, replay logs).

* :func:`iter_jsonl` / :func:`read_jsonl` read a file line by line (streaming), naming ``path:line`` on a bad line;
* :func:`write_jsonl` writes rows atomically (a temporary file renamed into place) or appends them;
* :class:`JSONLStream` streams rows as they are produced (``toolgym eval`` / ``rollout`` output), never emptying an
  existing file before the first new row exists;
* :func:`check_writable` checks an output path before any work starts.

Rows are encoded with :mod:`json` (the standard library); numpy values and objects with ``to_dict()`` are encoded
as lists / numbers / their dict. Hand-written only in the file handling (atomic replace, one write per line): no
JSONL library offers atomic replacement or a streaming writer that never truncates early.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["JSONLStream", "check_writable", "iter_jsonl", "read_jsonl", "write_jsonl"]


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


def _line(row: Any, ensure_ascii: bool = True) -> bytes:
    return (json.dumps(row, default=_json_default, ensure_ascii=ensure_ascii) + "\n").encode("utf-8")


def _write_all(fd: int, data: bytes, path: Path) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if not n:
            raise OSError(f"cannot write to {path}")
        view = view[n:]


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
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if append:
        data = b"".join(_line(r, ensure_ascii) for r in rows)
        if data:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            try:
                _write_all(fd, data, p)
            finally:
                os.close(fd)
        else:
            p.touch()
        return p
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            for r in rows:
                fh.write(_line(r, ensure_ascii))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


class JSONLStream:
    """Writes JSONL rows one at a time as they are produced, without ever emptying an existing file early.

    The first row goes to a temporary file next to ``path``, which then atomically replaces ``path``; later rows
    are appended to it. Each row is one unbuffered ``write`` of the whole line, so a killed process leaves complete
    lines (a row is cut only if the kernel itself splits the write). Use as a context manager or call
    :meth:`close`. ``rows`` counts the rows written. numpy values and objects with ``to_dict()`` are encoded.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.fh: Any = None
        self.rows = 0

    def _write_all(self, data: bytes) -> None:
        _write_all(self.fh.fileno(), data, self.path)

    def write(self, row: Mapping[str, Any]) -> None:
        data = _line(row)
        if self.fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            self.fh = open(tmp, "ab", buffering=0)  # noqa: SIM115 (kept open: later rows are appended)
            try:
                self._write_all(data)
                os.fsync(self.fh.fileno())
                os.replace(tmp, self.path)  # the handle stays valid: later rows land in self.path
            except BaseException:
                self.fh.close()
                self.fh = None
                tmp.unlink(missing_ok=True)
                raise
        else:
            self._write_all(data)
        self.rows += 1

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def __enter__(self) -> JSONLStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise ``OSError`` unless a file can be created next to ``path`` (checked before any model loads; the
    target itself is left untouched)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_dir():
        raise IsADirectoryError(21, "is a directory", str(p))
    probe = p.with_name(f".{p.name}.{os.getpid()}.probe")
    probe.open("w").close()
    probe.unlink()
    if p.exists() and not os.access(p, os.W_OK):
        raise PermissionError(13, "permission denied", str(p))
