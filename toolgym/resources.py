"""What a run costs: wall time, CPU time and peak resident memory, per phase and for the whole process.

:class:`Phases` times named phases of a run (``with phases("eval_before"): ...``) and records, for each, the wall
time, the process CPU time (user + system, all threads) and the peak resident set size reached *inside* that phase.
The per-phase peak is sampled (``VmRSS`` every 5 ms by a helper thread while the phase runs, plus its first and
last value), so a spike shorter than that can be missed; the whole-process peak is the kernel's own high-water mark
(``VmHWM``), which toolgym never resets: resetting it (``/proc/self/clear_refs``) also lowers what
``/usr/bin/time -v`` reports for the process, so an external measurement would under-report the peak. Where
``/proc`` is unavailable the per-phase figure is the process peak so far, still an upper bound. Memory figures are
MiB (2**20 bytes) of resident memory, the same quantity ``/usr/bin/time -v`` reports as "Maximum resident set
size" (there in KiB).
"""

from __future__ import annotations

import contextlib
import functools
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Phases", "current_rss_mb", "peak_rss_mb", "release_memory", "reset_peak_rss", "trim_heap"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_mb(key: str) -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0  # kB -> MiB
    except OSError:
        return None
    return None


def current_rss_mb() -> float | None:
    """Resident memory of this process now, MiB (``None`` where ``/proc`` is unavailable)."""
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """Peak resident memory of this process, MiB: since the last :func:`reset_peak_rss` where Linux allows it
    (``VmHWM``), else since the process started (``getrusage``; KiB on Linux, bytes on macOS)."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / (1024.0 * 1024.0) if sys.platform == "darwin" else ru / 1024.0


def reset_peak_rss() -> bool:
    """Reset the peak-RSS high-water mark to the current RSS (Linux ``clear_refs``); ``False`` where impossible.

    This lowers the process's "Maximum resident set size" as ``getrusage`` and ``/usr/bin/time -v`` report it at
    exit (they read the same high-water mark): :class:`Phases` does not use it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` where there is none (not Linux, musl, no C library found)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Hand the free pages of the C heap back to the OS (glibc ``malloc_trim(0)``); ``False`` where there is
    no such call (not Linux/glibc). Cheap (milliseconds), no garbage collection: safe to call after every
    micro-batch. glibc keeps freed blocks inside its heap, and after large frees it raises its mmap threshold so
    that later large blocks land in the heap too: between ``make demo``'s GRPO micro-batches much of the resident
    memory is such free memory, reused by the next backward only in part (``docs/training.md``)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS (:func:`trim_heap`; a no-op elsewhere).

    glibc keeps freed blocks of a process's heap (and raises its mmap threshold after large frees), so RSS stays
    at the high-water mark of earlier phases unless trimmed; call it between the phases of a long run."""
    import gc

    gc.collect()
    trim_heap()


class _RSSSampler:
    """Largest ``VmRSS`` seen from construction to :meth:`stop`, sampled every ``interval_s`` by a daemon thread
    (MiB; ``None`` where ``/proc`` is unavailable)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        import threading

        self.peak = current_rss_mb()
        self._stop = threading.Event()
        self._thread: Any = None
        if self.peak is not None:
            self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True,
                                            name="toolgym-rss-sampler")
            self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            rss = current_rss_mb()
            if rss is not None and (self.peak is None or rss > self.peak):
                self.peak = rss

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        rss = current_rss_mb()
        if rss is not None and self.peak is not None:
            self.peak = max(self.peak, rss)
        return self.peak


class Phases:
    """Wall time, CPU time and peak RSS of named phases, plus the whole-process peak.

    Usage::

        phases = Phases()
        with phases("load"):
            ...
        phases.to_dict()  # {"load": {"wall_s": .., "cpu_s": .., "peak_rss_mb": ..}, ...}

    or, without indenting a long function, ``phases.mark("load")`` ... ``phases.mark("eval")`` ...
    ``phases.mark(None)`` (each mark ends the open phase and starts the named one).
    A phase entered twice under the same name accumulates wall and CPU time and keeps the larger peak.
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.phases: dict[str, dict[str, float]] = {}
        self._process_peak = 0.0
        self._open: contextlib.ExitStack | None = None

    def mark(self, name: str | None) -> None:
        """End the open phase (if any), :func:`release_memory`, and start ``name`` (``None``: start nothing)."""
        if self._open is not None:
            self._open.close()
            self._open = None
            release_memory()
        if name is not None:
            stack = contextlib.ExitStack()
            stack.enter_context(self(name))
            self._open = stack

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._process_peak = max(self._process_peak, peak_rss_mb())
        sampler = _RSSSampler()
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            sampled = sampler.stop()
            peak = sampled if sampled is not None else peak_rss_mb()  # no /proc: the process peak, an upper bound
            self._process_peak = max(self._process_peak, peak_rss_mb())
            row = self.phases.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0})
            row["wall_s"] = round(row["wall_s"] + time.perf_counter() - w, 1)
            row["cpu_s"] = round(row["cpu_s"] + time.process_time() - c, 1)
            row["peak_rss_mb"] = round(max(row["peak_rss_mb"], peak), 1)

    def process_peak_rss_mb(self) -> float:
        """The largest RSS seen so far by this process (across phases and outside them), MiB."""
        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ru_mb = ru / (1024.0 * 1024.0) if sys.platform == "darwin" else ru / 1024.0
        return round(max(self._process_peak, peak_rss_mb(), ru_mb), 1)

    def to_dict(self) -> dict[str, Any]:
        """``{"phases": {name: {wall_s, cpu_s, peak_rss_mb}}, "total_wall_s", "total_cpu_s", "peak_rss_mb"}``
        (an open phase is closed first)."""
        self.mark(None)
        return {
            "phases": {k: dict(v) for k, v in self.phases.items()},
            "total_wall_s": round(time.perf_counter() - self.t0, 1),
            "total_cpu_s": round(time.process_time() - self.c0, 1),
            "peak_rss_mb": self.process_peak_rss_mb(),
        }
