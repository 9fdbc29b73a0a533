"""MicroBatcher: gather concurrent single requests into one batched call (the only request micro-batcher).

Used by the rollout driver (a local policy generates for every episode that is waiting), the BM25 retriever
(concurrent queries become one ``batch_search``) and ``toolgym serve model`` (concurrent sequences share one
KV-cache batch). Hand-written rather than taken from a library: the PyPI candidates are young, little-used
releases (``async-batcher`` 0.2, ``aiobatch`` a dev release), and the three callers need exact semantics a
dependency would have to match (batches run one at a time for a single local model, or overlapping for a server;
an item released before its batch ends; per-item errors); this is ~150 lines of plain asyncio.

Semantics:

* :meth:`MicroBatcher.submit` (or :meth:`~MicroBatcher.enqueue`, which returns the future) adds one item; a worker
  task collects the items that arrive within ``max_wait_s`` of the first one (``0``: the items submitted in the
  same event-loop tick) or until ``max_batch`` are waiting, and awaits ``fn(items)`` once for them.
* ``fn`` returns one result per item, in order. A result that is an exception instance is raised to that item's
  waiter only; an exception raised by ``fn`` (or a result list of the wrong length) is raised to every waiter of
  the batch. A waiter that was cancelled before its batch ran is left out of the batch.
* ``concurrent=False`` (default): one batch at a time; items arriving while ``fn`` runs form the next batch (a local
  model). ``concurrent=True``: each batch is sent as soon as it is formed, without waiting for earlier ones (a
  server or a thread pool that overlaps calls).
* No waiter hangs: if the worker is cancelled (:meth:`aclose`, loop shutdown) every waiting future is cancelled.

A batcher is bound to the event loop of its first :meth:`submit`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """Collects concurrent items into batched calls of ``fn`` (see the module docstring).

    Args:
        fn: ``async fn(items: list[T]) -> Sequence[R | BaseException]``, one result per item, in order.
        max_batch: the most items per call (``None``: no limit).
        max_wait_s: how long (seconds) a batch stays open after its first item arrives; ``0`` = only the items
            submitted in the same loop tick. A batch closes early once ``max_batch`` items wait.
        concurrent: let batches overlap (``True``) or run them one after the other (``False``).

    Attributes:
        batches: calls of ``fn`` made so far.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Awaitable[Sequence[Any]]],
        *,
        max_batch: int | None = None,
        max_wait_s: float = 0.0,
        concurrent: bool = False,
    ) -> None:
        if max_batch is not None and max_batch < 1:
            raise ValueError("max_batch must be >= 1 (or None)")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.concurrent = concurrent
        self.batches = 0
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._full: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- public API ----------------------------------------------------------------------------------------
    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Add ``item`` to the next batch; returns the future of its result (must run on the batcher's loop)."""
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        if self._loop is None:
            self._loop, self._full = loop, asyncio.Event()
        elif self._loop is not loop:
            raise RuntimeError("MicroBatcher used from another event loop than the one it started on")
        assert self._full is not None
        fut: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, fut))
        if self._worker is None or self._worker.done():  # the worker exits whenever nothing waits
            self._worker = loop.create_task(self._run())
        if self.max_batch is not None and len(self._pending) >= self.max_batch:
            self._full.set()
        return fut

    async def submit(self, item: T) -> R:
        """Add ``item`` to the next batch and wait for its result (or its exception)."""
        return await self.enqueue(item)

    async def aclose(self) -> None:
        """Stop the worker; items still waiting (or in a running batch) are cancelled."""
        self._closed = True
        tasks = [t for t in (self._worker, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._cancel_pending()

    # -- worker --------------------------------------------------------------------------------------------
    def _cancel_pending(self) -> None:
        pending, self._pending = self._pending, []
        for _, fut in pending:
            if not fut.done():
                fut.cancel()

    async def _run(self) -> None:
        assert self._full is not None and self._loop is not None
        try:
            while self._pending:
                if self.max_batch is None or len(self._pending) < self.max_batch:
                    if self.max_wait_s > 0:
                        timer = self._loop.call_later(self.max_wait_s, self._full.set)
                        try:
                            await self._full.wait()
                        finally:
                            timer.cancel()
                    else:
                        await asyncio.sleep(0)  # let every coroutine that is ready this tick submit its item
                self._full.clear()
                n = len(self._pending) if self.max_batch is None else self.max_batch
                batch, self._pending = self._pending[:n], self._pending[n:]
                if self.max_batch is not None and len(self._pending) >= self.max_batch:
                    self._full.set()
                batch = [(x, f) for x, f in batch if not f.done()]  # a cancelled waiter leaves its batch
                if not batch:
                    continue
                if self.concurrent:
                    task = self._loop.create_task(self._send(batch))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    await self._send(batch)
        finally:  # cancelled (aclose, loop shutdown) or a bug: nobody may wait forever
            self._cancel_pending()

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        futs = [f for _, f in batch]
        try:
            results = await self.fn([x for x, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call returned {len(results)} results for {len(batch)} items")
        except asyncio.CancelledError:
            for f in futs:
                if not f.done():
                    f.cancel()
            raise
        except Exception as exc:  # the batch fails, each of its waiters sees the error
            for f in futs:
                if not f.done():
                    f.set_exception(exc)
            return
        for f, r in zip(futs, results, strict=True):
            if f.done():  # cancelled meanwhile, or released early by fn
                continue
            if isinstance(r, BaseException):
                f.set_exception(r)
            else:
                f.set_result(r)
