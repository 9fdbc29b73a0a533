"""Per-event-loop HTTP clients of the remote rewards (:class:`~toolgym.rewards.judge.LLMJudge`,
:class:`~toolgym.rewards.reward_model.RewardModelReward`).

An ``aiohttp.ClientSession`` (and an ``asyncio`` semaphore or future) belongs to the event loop that made it, while
one reward object may be awaited from several loops (toolgym's runtime loop, a test's loop, a trainer's). So each
such reward keeps one state object per loop in a :class:`PerLoop`: made on first use in a loop, dropped when the
loop is garbage-collected, and closed by ``await reward.aclose()`` in that loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import aiohttp

__all__ = ["HasSession", "PerLoop", "client_session"]


class HasSession(Protocol):
    """A per-loop state: its HTTP session (``None`` until first needed)."""

    @property
    def session(self) -> aiohttp.ClientSession | None: ...


S = TypeVar("S", bound=HasSession)


def client_session(api_key: str | None = None, *, limit: int | None = None) -> aiohttp.ClientSession:
    """A session that sends ``Authorization: Bearer <api_key>`` when a key is given; ``limit`` caps its open
    connections (aiohttp's default, 100, when ``None``). Call it inside the loop that will use it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    connector = aiohttp.TCPConnector(limit=limit) if limit is not None else None
    return aiohttp.ClientSession(headers=headers, connector=connector)


class PerLoop(Generic[S]):
    """One state ``S`` (made by ``make()``) per running event loop; weakly keyed, so a dead loop's state goes."""

    def __init__(self, make: Callable[[], S]) -> None:
        self._make = make
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, S] = weakref.WeakKeyDictionary()

    def get(self) -> S:
        """The running loop's state, made on first use (call from inside a coroutine)."""
        loop = asyncio.get_running_loop()
        st = self._states.get(loop)
        if st is None:
            st = self._states[loop] = self._make()
        return st

    def renew(self) -> S:
        """A fresh state for the running loop, replacing the current one (e.g. after its session was closed)."""
        st = self._states[asyncio.get_running_loop()] = self._make()
        return st

    async def aclose(self) -> None:
        """Close the running loop's session and forget its state (no-op outside a loop or before first use);
        other loops' states close when their loop is garbage-collected."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        st = self._states.pop(loop, None)
        if st is not None and st.session is not None and not st.session.closed:
            await st.session.close()
