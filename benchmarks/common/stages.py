"""Resumable experiment stages: each finished stage is kept under the run's output directory, keyed by its
configuration, and skipped when the experiment runs again.

A :class:`Stage` is named by what it is (``eval-untrained-multiple``) and keyed by a hash of everything that changes
what it computes (its configuration, including the keys of the stages it starts from); thread counts, batch sizes
that change no result and wall-clock settings stay out of the key. Its files live in ``OUT/<name>-<key>/``; it is
finished when ``done.json`` is there, written last and atomically (a temporary file, then ``os.replace``). A
finished stage's result also goes to ``RESULTS/<name>-<key>.json`` (small JSON meant to be committed): on a new
machine, where ``OUT`` is empty, a stage whose result is committed is not computed again; only a stage whose *files*
a later stage needs (a checkpoint) is recomputed, and only when that later stage still has to run.

A stage runs under its lock (:meth:`Stage.lock`, an ``flock`` on ``OUT/<name>-<key>.lock``): processes that share
``OUT`` (one per seed, or the same command started twice) never compute one stage at once. Where a process has
other stages to do (the evaluations of one checkpoint), it leaves a locked one for later; otherwise it waits until
the holder has finished (or died: the kernel drops a dead process's lock), then finds the stage finished and skips
it.

Every result records the configuration, the key, the wall time, the process's CPU time and peak resident memory,
and the machine (:func:`machine`), so that figures are read with the machine they come from.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["Stage", "claim_each", "config_key", "free_first", "machine", "read_json", "stage_lock", "write_json"]


def config_key(config: Mapping[str, Any]) -> str:
    """The first 12 hex digits of the SHA-256 of ``config`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def machine() -> dict[str, Any]:
    """The CPU model, its core count and flags that matter here (AMX, AVX512-BF16), and the library versions."""
    cpu, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    versions: dict[str, str] = {}
    for name in ("torch", "transformers", "trl", "bfcl_eval"):
        try:
            from importlib.metadata import version

            versions[name] = version(name.replace("_", "-"))
        except Exception:  # noqa: BLE001 - a package that is not installed is recorded as missing
            versions[name] = "missing"
    return {"cpu": cpu, "cores": os.cpu_count(), "amx": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "python": platform.python_version(), **versions}


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` whole or not at all: a temporary file in the same directory, fsynced, then
    renamed over ``path`` (a reader sees the old file or the whole new one, never a part)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when the file is missing, unreadable or not a JSON object."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


@contextlib.contextmanager
def stage_lock(path: Path, what: str = "", wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block and yield ``True``. While another
    process holds it: with ``wait``, wait (saying so once on stdout); without, yield ``False`` at once, holding
    nothing (the caller does something else first and comes back). The kernel releases a lock when its holder
    exits, however it exits, so a killed run never leaves a stage locked. The file stays (removing it would let a
    third process lock a fresh file while a second still waits on the old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            print(f"[stages] waiting: another process is running {what or path.name}", flush=True)
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def claim_each(items: Iterable[T], lock: Callable[[T, bool], contextlib.AbstractContextManager[bool]]) -> Iterator[T]:
    """Yield each item once, with its lock (``lock(item, wait)``, e.g. :meth:`Stage.lock`) held until the next item
    is asked for: first every item no other process holds, then, waiting, the ones another process held. The caller
    checks under the lock whether the item was finished meanwhile."""
    pending = list(items)
    for wait in (False, True):
        for item in list(pending):
            with lock(item, wait) as held:
                if held:
                    pending.remove(item)
                    yield item


def free_first(stages: Iterable[Stage]) -> Iterator[Stage]:
    """Yield each unfinished stage once, for a child process that takes the stage's lock itself: each time, the
    first one no other process holds (probed and released at once), else the first one still unfinished (its
    child then waits on the holder and skips the stage if the holder finishes it). Several drivers that share
    ``OUT`` thus run different stages side by side instead of queueing on the same one."""
    pending = list(stages)
    while pending:
        pending = [st for st in pending if st.result() is None]
        if not pending:
            return
        pick = pending[0]
        for st in pending:
            with st.lock(wait=False) as held:
                if held:
                    pick = st
                    break
        pending.remove(pick)
        yield pick


class Stage:
    """One resumable stage of an experiment (see the module docstring).

    Args:
        out: the run's output directory (checkpoints, partial files).
        name: what the stage is, e.g. ``warmstart-seed0``.
        config: everything that changes what the stage computes (JSON-serialisable).
        results: the directory of committed results, or ``None`` to keep results only under ``out``.
    """

    def __init__(self, out: Path, name: str, config: Mapping[str, Any], results: Path | None = None) -> None:
        self.name, self.config, self.key = name, dict(config), config_key(config)
        self.dir = Path(out) / f"{name}-{self.key}"
        self.results = None if results is None else Path(results) / f"{name}-{self.key}.json"
        self._t0 = self._cpu0 = 0.0

    @property
    def done_file(self) -> Path:
        return self.dir / "done.json"

    def result(self) -> dict[str, Any] | None:
        """The finished stage's result (from ``out``, else from the committed results), or ``None``."""
        for path in (self.done_file, self.results):
            rec = None if path is None else read_json(path)
            if rec is not None and rec.get("key") == self.key:
                return rec
        return None

    def files_ready(self) -> bool:
        """Whether this machine holds the stage's files (``done.json`` under ``out``), not only its result."""
        return self.done_file.is_file()

    def lock(self, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        """The stage's lock (:func:`stage_lock` on ``OUT/<name>-<key>.lock``; yields whether it is held): hold it
        from before checking whether the stage is finished until it is, so that no two processes compute it at
        once."""
        return stage_lock(self.dir.with_name(self.dir.name + ".lock"), f"{self.name}-{self.key}", wait)

    def start(self) -> Path:
        """Mark the start (wall and CPU clocks) and return the stage's directory, created."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        return self.dir

    def finish(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """Record ``result`` with the configuration, key, wall and CPU seconds, peak RSS and machine; write it to
        the committed results (first) and to ``done.json`` (last: the stage is finished from then on)."""
        record = {"stage": self.name, "key": self.key, "config": self.config, **dict(result),
                  "wall_s": round(time.perf_counter() - self._t0, 1),
                  "cpu_s": round(time.process_time() - self._cpu0, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "machine": machine(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if self.results is not None:
            write_json(self.results, record)
        write_json(self.done_file, record)
        return record
