"""The reward protocol and its result, :class:`Score`.

A reward scores a finished episode (**outcome**, :meth:`Reward.outcome`) and/or each turn as it happens
(**process**, :meth:`Reward.turn`). Both are coroutines so judges and tool verifications can run
concurrently across a batch, and both return a :class:`Score`: the value plus named sub-scores (components).
A user's reward may return a plain number instead; :meth:`Score.of` is the one place that turns it into a
``Score`` (with no components). Plain callables are accepted everywhere a reward is: see :func:`as_reward`.
"""

from __future__ import annotations

import abc
import inspect
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from toolgym.tools.threads import ThreadLane
from toolgym.trajectory import Trajectory, Turn

__all__ = [
    "FunctionReward",
    "Reward",
    "RewardLike",
    "Score",
    "as_reward",
    "outcome_score",
    "turn_score",
]


@dataclass(frozen=True)
class Score:
    """What a reward returns: ``value`` and named sub-scores.

    Attributes:
        value: the scalar reward (what the env adds to the step reward).
        components: ``{name: value}`` sub-scores and failure counters of this one call (e.g. ``exact_match``,
            ``judge/error/timeout``); the env stores them in ``info["reward_components"]``,
            ``Turn.reward_components`` and ``Trajectory.reward_components``. Empty when there are none.

    A ``Score`` unpacks as ``value, components = score`` and converts with ``float(score)``.
    """

    value: float
    components: Mapping[str, float] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        yield self.value
        yield dict(self.components)

    def __float__(self) -> float:
        return float(self.value)

    @classmethod
    def of(cls, result: Score | float, reward: object = None) -> Score:
        """The one coercion of a reward's result: a :class:`Score` as it is (value made a float, components
        copied); a plain number (``float``, ``int``, ``bool``, numpy scalar, 0-d array) as ``Score(float(x), {})``: no
        components, exactly as such a reward reported before ``Score`` existed. Anything else is a ``TypeError``
        naming ``reward``."""
        if isinstance(result, Score):
            return cls(float(result.value), dict(result.components))
        if isinstance(result, numbers.Real):
            return cls(float(result), {})
        if not isinstance(result, str | bytes):
            try:  # a 0-d array or tensor, as ``float(result)`` took them before Score existed
                return cls(float(result), {})
            except (TypeError, ValueError):
                pass
        who = f" from {reward!r}" if reward is not None else ""
        raise TypeError(f"a reward must return a Score or a number, got {type(result).__name__}{who}")

    @classmethod
    def failure(cls, value: float, name: str, kind: str) -> Score:
        """The Score of a remote reward that could not score (e.g. a judge or reward model that timed out):
        ``value`` (its ``failure_score``) with the components ``<name>/failed = 1`` and ``<name>/error/<kind> = 1``."""
        return cls(float(value), {f"{name}/failed": 1.0, f"{name}/error/{kind}": 1.0})


class Reward(abc.ABC):
    """Base class of rewards.

    Attributes:
        name: the key under which this reward's value appears in ``reward_components`` / metrics.
        per_turn: ``True`` when :meth:`turn` is implemented (the env then calls it after every step).

    Subclasses return a :class:`Score` (or a plain number: see :meth:`Score.of`). Callers that want a
    ``Score`` whatever the subclass returned use :func:`outcome_score` / :func:`turn_score`.
    """

    name: str = "reward"
    per_turn: bool = False

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score | float:
        """Score a finished episode. Default ``Score(0.0)``."""
        return Score(0.0)

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score | float:
        """Score one turn right after the env answered it (``turn`` is ``trajectory.turns[-1]``). Default
        ``Score(0.0)``."""
        return Score(0.0)


class FunctionReward(Reward):
    """Wraps ``fn(trajectory, task) -> Score | float`` (sync or async) as an outcome reward.

    A sync ``fn`` runs on a worker thread of its own (one call at a time, as on the event loop; daemon threads: see
    :class:`~toolgym.tools.threads.ThreadLane`), so a call that never returns is abandoned when the env's reward
    time limit cancels it, and never holds the event loop that runs every other episode's tools and rewards.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")
        self._async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._lane: ThreadLane | None = None

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if self._async:
            out = self.fn(trajectory, task)
        else:
            if self._lane is None:
                self._lane = ThreadLane(f"reward-{self.name}", max_workers=1, max_abandoned=16)
            out = await self._lane.run(self.fn, trajectory, task)
        if inspect.isawaitable(out):
            out = await out
        return Score.of(out, self.fn)


RewardLike = Reward | Callable[..., Any]


def as_reward(obj: RewardLike | None) -> Reward | None:
    """A :class:`Reward` from a Reward, a plain ``fn(trajectory, task)`` callable, or ``None``."""
    if obj is None or isinstance(obj, Reward):
        return obj
    if callable(obj):
        return FunctionReward(obj)
    raise TypeError(f"not a reward: {obj!r}")


async def outcome_score(reward: Reward, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
    """``reward.outcome(...)`` as a :class:`Score` (a plain number coerced by :meth:`Score.of`)."""
    return Score.of(await reward.outcome(trajectory, task), reward)


async def turn_score(reward: Reward, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
    """``reward.turn(...)`` as a :class:`Score` (a plain number coerced by :meth:`Score.of`)."""
    return Score.of(await reward.turn(turn, trajectory, task), reward)

