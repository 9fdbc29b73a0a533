"""Per-event-loop HTTP clients of the remote rewards (:class:`~toolgym.rewards.judge.LLMJudge`,
:class:`~toolgym.rewards.reward_model.RewardModelReward`).

An ``aiohttp.ClientSession`` (and an ``asyncio`` semaphore or future) belongs to the event loop that made it, while
one reward object may be awaited from several loops (toolgym's runtime loop, a test's loop, a trainer's). So each
such reward keeps one state object per loop in a :class:`PerLoop` (:class:`toolgym.runtime.PerLoop`, which the
retrievers use too): made on first use in a loop, dropped when the loop is garbage-collected, and closed by
``await reward.aclose()`` in that loop.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import aiohttp

from toolgym import runtime

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


class PerLoop(runtime.PerLoop[S]):
    """:class:`toolgym.runtime.PerLoop` of states that hold an HTTP session, closed by :meth:`aclose`."""

    async def aclose(self) -> None:
        """Close the running loop's session and forget its state (no-op outside a loop or before first use);
        other loops' states close when their loop is garbage-collected."""
        st = self.pop()
        if st is not None and st.session is not None and not st.session.closed:
            await st.session.close()
