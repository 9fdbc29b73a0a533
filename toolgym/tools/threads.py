"""ThreadLane: a bounded pool of daemon threads for one sync tool, which survives calls that never return.

Python cannot stop a running thread. A sync tool that blocks past its timeout keeps its thread busy; with a
shared pool (``asyncio.to_thread`` uses the loop's default executor, ``min(32, cpus + 4)`` threads) a handful
of such calls starve every other sync tool of the process, and ``ThreadPoolExecutor`` joins its threads at
exit, so the process cannot exit either. A lane fixes both for its tool:

* each tool has its own lane (``max_workers`` threads, started on demand, leaving after 30 s idle), so one tool cannot starve another;
* its threads are daemon threads: a blocked call never keeps the process alive;
* a call whose awaiting task is cancelled (a timeout) before its thread started is never run; one already
  running is *abandoned*: its thread no longer counts against ``max_workers`` (a new worker may start) and
  exits when the call returns;
* at most ``max_abandoned`` abandoned threads may exist per lane; past that, new calls are refused at once with
  a ``timeout`` :class:`~toolgym.tools.base.ToolError` (the tool is evidently hanging) until some return.

Limits: an abandoned call still holds whatever it holds (memory, locks, files) until it returns; a sync tool
that may block forever belongs in a subprocess (the Python sandbox) or should be written ``async``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from toolgym.tools.base import ToolError, ToolErrorKind

__all__ = ["ThreadLane"]

_IDLE_S = 30.0  # an idle worker thread exits after this many seconds


class _Job:
    __slots__ = ("abandoned", "args", "fn", "future", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.future: Future[Any] = Future()
        self.abandoned = False


class ThreadLane:
    """Daemon worker threads for one tool's sync calls (see the module docstring).

    Args:
        name: thread-name prefix (the tool name).
        max_workers: most threads running calls at once (abandoned ones excluded).
        max_abandoned: most abandoned threads (calls still running after their caller gave up) at once.

    Attributes:
        abandoned: threads currently abandoned (still running a call nobody waits for).
        abandoned_total: calls abandoned since creation.
    """

    def __init__(self, name: str, max_workers: int = 32, max_abandoned: int = 16) -> None:
        if max_workers < 1 or max_abandoned < 1:
            raise ValueError("max_workers and max_abandoned must be >= 1")
        self.name = name
        self.max_workers = max_workers
        self.max_abandoned = max_abandoned
        self.abandoned = 0
        self.abandoned_total = 0
        self._workers = 0  # live, non-abandoned worker threads
        self._busy = 0  # jobs queued or running on non-abandoned workers
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def _worker(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._busy < self._workers:  # the others can take every queued job: leave
                        self._workers -= 1
                        return
                continue
            if job.future.set_running_or_notify_cancel():
                try:
                    result = job.fn(*job.args, **job.kwargs)
                except BaseException as e:  # noqa: BLE001 - SystemExit & co. become the call's error
                    job.future.set_exception(e)
                else:
                    job.future.set_result(result)
            with self._lock:
                if job.abandoned:  # this thread was written off: it leaves; a fresh one took its place
                    self.abandoned -= 1
                    return
                self._busy -= 1

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Job:
        job = _Job(fn, args, kwargs)
        with self._lock:
            if self.abandoned >= self.max_abandoned:
                raise ToolError(
                    f"tool {self.name!r} has {self.abandoned} earlier calls still running past their timeout; "
                    "this call was not started",
                    kind=ToolErrorKind.TIMEOUT,
                )
            self._busy += 1
            start = self._busy > self._workers and self._workers < self.max_workers
            if start:
                self._workers += 1
        if start:
            threading.Thread(target=self._worker, name=f"toolgym-tool-{self.name}", daemon=True).start()
        self._queue.put(job)
        return job

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on a lane thread and await its result. Cancelling the caller cancels a call
        not yet started, or abandons a running one (see the module docstring)."""
        job = self._submit(fn, args, kwargs)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _abandon(self, job: _Job) -> None:
        if job.future.cancel():  # not started: it never runs, the worker just moves on
            return
        with self._lock:
            if job.future.done() or job.abandoned:
                return
            job.abandoned = True
            self.abandoned += 1
            self.abandoned_total += 1
            self._workers -= 1
            self._busy -= 1
            # capacity lost with the abandoned thread comes back: start a worker if calls are waiting
            start = self._busy > self._workers and self._workers < self.max_workers
            if start:
                self._workers += 1
        if start:
            threading.Thread(target=self._worker, name=f"toolgym-tool-{self.name}", daemon=True).start()

    def stats(self) -> dict[str, int]:
        """``{"workers", "busy", "abandoned", "abandoned_total"}`` right now."""
        with self._lock:
            return {
                "workers": self._workers, "busy": self._busy, "abandoned": self.abandoned,
                "abandoned_total": self.abandoned_total,
            }  # fmt: skip
