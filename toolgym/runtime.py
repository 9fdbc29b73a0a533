"""The toolgym runtime loop: one background event loop where all tool I/O of a process runs.

Tools hold loop-bound resources (MCP sessions, aiohttp sessions, semaphores, subprocess pipes). Running
them all on one long-lived loop lets a sync ``env.step`` and an async ``await env.astep`` (from any
caller loop, e.g. a pytest-asyncio test or a rollout driver) share the same executor and sessions.
A sync call costs one cross-thread hop (tens of microseconds) per step, not per tool call.

The loop must outlive anything that runs on it: work submitted through :func:`run_sync` / :func:`run_async` that
raises ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` has it re-raised to its caller as a
``RuntimeError`` (asyncio would otherwise stop the loop with it and every later call would hang), and should the
loop's ``run_forever`` still be broken out of by one (a raw callback), the thread logs it and runs the loop again.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["PerLoop", "get_loop", "in_runtime", "run_async", "run_sync"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()


def get_loop() -> asyncio.AbstractEventLoop:
    """The process-wide runtime loop, started on first use in a daemon thread."""
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def _run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                while True:
                    try:
                        loop.run_forever()
                        return  # stopped on purpose (_shutdown)
                    except BaseException as e:  # noqa: BLE001 - the loop outlives what runs on it
                        logger.error("toolgym runtime loop: %r escaped a callback; the loop keeps running", e)

            thread = threading.Thread(target=_run, name="toolgym-runtime", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
        return _loop


def in_runtime() -> bool:
    """``True`` when called from inside the runtime loop's thread."""
    return _thread is not None and threading.current_thread() is _thread


async def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    """``await coro``, with a ``BaseException`` other than cancellation turned into ``RuntimeError`` so that it never
    reaches the loop (a task that raises ``SystemExit``/``KeyboardInterrupt`` stops ``run_forever``)."""
    try:
        return await coro
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as e:
        raise RuntimeError(f"{type(e).__name__} raised on the toolgym runtime loop: {e}") from e


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the runtime loop and block until it finishes. Must not be called from that loop."""
    if in_runtime():
        coro.close()
        raise RuntimeError("run_sync() called from the toolgym runtime loop; use `await` instead")
    return asyncio.run_coroutine_threadsafe(_guarded(coro), get_loop()).result()


async def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the runtime loop from any loop; cancelling the caller cancels the work."""
    if in_runtime():  # already on the runtime loop: no hop
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_guarded(coro), get_loop()))


def _shutdown() -> None:
    loop = _loop
    if loop is not None and not loop.is_closed() and loop.is_running():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_shutdown)


class PerLoop(Generic[T]):
    """One ``T`` (made by ``make()``) per running event loop, for loop-bound state: aiohttp sessions, asyncio
    semaphores and micro-batchers belong to the loop that made them, while one tool or reward may be awaited from
    several loops (this runtime loop, a test's, a trainer's). Weakly keyed: a dead loop's state goes with it.
    Thread-safe."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self) -> T:
        """The running loop's state, made on first use (call from inside a coroutine)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            st = self._states.get(loop)
            if st is None:
                st = self._states[loop] = self._make()
            return st

    def renew(self) -> T:
        """A fresh state for the running loop, replacing the current one (e.g. after its session was closed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            st = self._states[loop] = self._make()
            return st

    def pop(self) -> T | None:
        """Forget the running loop's state and return it (``None`` outside a loop or before first use)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        with self._lock:
            return self._states.pop(loop, None)
