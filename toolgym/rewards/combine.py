"""Weighted combinations of rewards, and scoring a batch concurrently.

``Combine({ExactMatch(): 1.0, judge: 0.5, ToolCallFormat(): 1.0})`` is itself a :class:`Reward`:

* ``outcome`` runs every child's ``outcome`` concurrently and returns ``sum(weight * value)``;
* ``turn`` runs every ``per_turn`` child's ``turn`` concurrently and returns ``sum(weight * value)`` — so a
  per-turn reward contributes once per turn and its turn scores add up in ``trajectory.reward``;
* the :class:`~toolgym.rewards.base.Score` each returns has as components each child's **unweighted** value under
  the child's name plus every component the child reported itself (e.g. ``judge/error/timeout``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from toolgym.rewards.base import Reward, RewardLike, Score, as_reward, outcome_score, turn_score
from toolgym.trajectory import Trajectory, Turn

__all__ = ["Combine", "score_batch"]


class Combine(Reward):
    """A weighted sum of rewards.

    Args:
        rewards: ``{reward: weight}`` or ``[(reward, weight), ...]``; a reward may be a :class:`Reward` or a
            plain ``fn(trajectory, task)`` callable. Children with equal names get ``_2``, ``_3`` suffixes in
            components.
        name: this reward's name.
    """

    def __init__(
        self,
        rewards: Mapping[RewardLike, float] | Sequence[tuple[RewardLike, float]],
        *,
        name: str = "combined",
    ) -> None:
        items = list(rewards.items()) if isinstance(rewards, Mapping) else list(rewards)
        if not items:
            raise ValueError("Combine needs at least one reward")
        self.children: list[tuple[str, Reward, float]] = []
        seen: dict[str, int] = {}
        for obj, weight in items:
            r = as_reward(obj)
            assert r is not None
            base = r.name
            seen[base] = seen.get(base, 0) + 1
            label = base if seen[base] == 1 else f"{base}_{seen[base]}"
            self.children.append((label, r, float(weight)))
        self.name = name
        self.per_turn = any(r.per_turn for _, r, _ in self.children)

    @property
    def weights(self) -> dict[str, float]:
        return {label: w for label, _, w in self.children}

    @staticmethod
    def _merge(kids: list[tuple[str, Reward, float]], scores: list[Score]) -> Score:
        """``sum(weight * value)``; components: each child's unweighted value under its label, then the child's
        own components (a name already taken gets the child's label as prefix)."""
        comps: dict[str, float] = {}
        for (label, _, _), child in zip(kids, scores, strict=True):
            comps[label] = child.value
            for k, v in child.components.items():
                comps[k if k not in comps else f"{label}/{k}"] = v
        return Score(float(sum(w * s.value for (_, _, w), s in zip(kids, scores, strict=True))), comps)

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        kids = [(label, r, w) for label, r, w in self.children if type(r).outcome is not Reward.outcome]
        return self._merge(kids, list(await asyncio.gather(*(outcome_score(r, trajectory, task) for _, r, _ in kids))))

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        kids = [(label, r, w) for label, r, w in self.children if r.per_turn]
        return self._merge(kids, list(await asyncio.gather(*(turn_score(r, turn, trajectory, task) for _, r, _ in kids))))


async def score_batch(
    reward: RewardLike, trajectories: Sequence[Trajectory], tasks: Iterable[Mapping[str, Any]] | None = None
) -> list[Score]:
    """Score many finished trajectories concurrently: one outcome :class:`Score` per trajectory (it unpacks as
    ``(value, components)``).

    ``tasks`` defaults to each trajectory's own ``task``. Does not modify the trajectories.
    """
    r = as_reward(reward)
    if r is None:
        raise ValueError("score_batch needs a reward")
    task_list = [t.task for t in trajectories] if tasks is None else list(tasks)
    if len(task_list) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories but {len(task_list)} tasks")
    return list(await asyncio.gather(*(outcome_score(r, t, k) for t, k in zip(trajectories, task_list, strict=True))))
