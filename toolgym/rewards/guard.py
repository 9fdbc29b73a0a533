"""Containment of a reward that fails: a time limit, a classified error, and no non-finite score.

A reward is user code run once per episode (and per turn for process rewards). One that never returns, raises, or
returns ``NaN``/``inf`` must cost its own episode only: :func:`guarded` runs one scoring call under a time limit and
turns every such fault into ``Score.failure(0.0, ...)`` plus a :class:`RewardFault` naming the kind, which the env
records in ``Trajectory.errors`` (``reward_timeout``, ``reward_exception``, ``reward_non_finite``). A non-finite
score is refused because it is not a number JSON can carry (strict readers reject a bare ``NaN``) and it makes
``outcome_reward >= threshold`` silently false.

Limit: the time limit cancels an ``async`` reward at its next ``await``. A plain sync function given as a reward runs
in a worker thread (:class:`~toolgym.rewards.base.FunctionReward`), so it is abandoned on time too; an ``async``
reward that blocks without awaiting holds the event loop and cannot be stopped from inside the process.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from dataclasses import dataclass

from toolgym.rewards.base import Score

__all__ = ["DEFAULT_REWARD_TIMEOUT_S", "RewardFault", "guarded"]

#: seconds one reward call may take before it is cancelled (``ToolEnv(reward_timeout_s=...)``)
DEFAULT_REWARD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RewardFault:
    """Why a reward call could not score: ``kind`` is ``timeout``, ``exception`` or ``non_finite``."""

    kind: str
    message: str

    @property
    def key(self) -> str:
        """The ``Trajectory.errors`` key: ``reward_<kind>``."""
        return f"reward_{self.kind}"


def _finite(score: Score) -> bool:
    return math.isfinite(score.value) and all(
        isinstance(v, int | float) and math.isfinite(v) for v in score.components.values()
    )


async def guarded(
    call: Awaitable[Score], name: str, timeout_s: float | None
) -> tuple[Score, RewardFault | None]:
    """Await one reward call (``outcome_score(...)`` or ``turn_score(...)``) under ``timeout_s`` seconds (``None``: no
    limit). Returns ``(score, None)`` for a finite score, else ``(Score.failure(0.0, name, kind), fault)``."""
    fault: RewardFault | None = None
    try:
        async with asyncio.timeout(timeout_s):
            score = await call
    except TimeoutError:
        fault = RewardFault("timeout", f"reward {name!r} gave no score within {timeout_s:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a reward's bug costs its episode a score, never the batch
        fault = RewardFault("exception", f"reward {name!r} raised {type(e).__name__}: {e}")
    else:
        if _finite(score):
            return score, None
        bad = {k: v for k, v in score.components.items() if not (isinstance(v, int | float) and math.isfinite(v))}
        fault = RewardFault("non_finite", f"reward {name!r} returned a non-finite score: value {score.value!r}"
                                          + (f", components {bad!r}" if bad else ""))
    return Score.failure(0.0, name, fault.kind), fault
