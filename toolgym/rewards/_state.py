"""Per-call reward components that are safe under concurrency.

A reward object is shared by every episode of a batch, and the batch is scored concurrently, so "the
components of the last call" cannot live in a plain attribute. They live in a :class:`contextvars.ContextVar`
instead: a coroutine awaited directly runs in its caller's context, so ``await r.outcome(...)`` followed by
``r.components()`` in the same task reads exactly the components of that call, whatever other tasks did in
between. (:class:`~toolgym.rewards.combine.Combine` reads each child's components inside the child's task.)
"""

from __future__ import annotations

import contextvars
import itertools

_ids = itertools.count()


class ComponentsState:
    """Holds the components of the current task's last call of one reward object."""

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
            f"toolgym_reward_components_{next(_ids)}", default=None
        )

    def set(self, components: dict[str, float]) -> None:
        self._var.set(dict(components))

    def get(self) -> dict[str, float]:
        return dict(self._var.get() or {})
