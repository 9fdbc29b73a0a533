"""The reward protocol.

A reward scores a finished episode (**outcome**, :meth:`Reward.outcome`) and/or each turn as it happens
(**process**, :meth:`Reward.turn`). Both are coroutines so judges and tool verifications can run
concurrently across a batch. Plain callables are accepted everywhere a reward is: see :func:`as_reward`.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from toolgym.trajectory import Trajectory, Turn

__all__ = [
    "FunctionReward",
    "Reward",
    "RewardLike",
    "as_reward",
    "outcome_with_components",
    "turn_with_components",
]


class Reward(abc.ABC):
    """Base class of rewards.

    Attributes:
        name: the key under which this reward's value appears in ``reward_components`` / metrics.
        per_turn: ``True`` when :meth:`turn` is implemented (the env then calls it after every step).
    """

    name: str = "reward"
    per_turn: bool = False

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
        """Score a finished episode. Default 0."""
        return 0.0

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
        """Score one turn right after the env answered it (``turn`` is ``trajectory.turns[-1]``). Default 0."""
        return 0.0

    def components(self) -> dict[str, float]:
        """Named sub-scores of the last call (e.g. of a :class:`Combine`); default empty."""
        return {}


class FunctionReward(Reward):
    """Wraps ``fn(trajectory, task) -> float`` (sync or async) as an outcome reward."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
        out = self.fn(trajectory, task)
        if inspect.isawaitable(out):
            out = await out
        return float(out)


RewardLike = Reward | Callable[..., Any]


def as_reward(obj: RewardLike | None) -> Reward | None:
    """A :class:`Reward` from a Reward, a plain ``fn(trajectory, task)`` callable, or ``None``."""
    if obj is None or isinstance(obj, Reward):
        return obj
    if callable(obj):
        return FunctionReward(obj)
    raise TypeError(f"not a reward: {obj!r}")


async def outcome_with_components(
    reward: Reward, trajectory: Trajectory, task: Mapping[str, Any]
) -> tuple[float, dict[str, float]]:
    """``(reward.outcome(...), reward.components())`` read in one task.

    A reward object is shared by a whole batch, so the components of one call live in the context of the task
    that made it. Call this (e.g. through ``runtime.run_async``) rather than reading ``components()`` from
    another task.
    """
    value = float(await reward.outcome(trajectory, task))
    return value, reward.components()


async def turn_with_components(
    reward: Reward, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]
) -> tuple[float, dict[str, float]]:
    """``(reward.turn(...), reward.components())`` read in one task (see :func:`outcome_with_components`)."""
    value = float(await reward.turn(turn, trajectory, task))
    return value, reward.components()
