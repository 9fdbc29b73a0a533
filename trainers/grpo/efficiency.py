"""Memory hygiene for training on a CPU: hand the C heap's free pages back to the OS between micro-batches.

glibc keeps freed blocks inside its heap (and raises its mmap threshold after large frees), so a process's resident
memory stays at the high-water mark of its last transient; the next forward/backward then grows on top of that
instead of from what is live. :class:`TrimHeapCallback` trims after every micro-batch and optimizer step;
:class:`trainers.grpo.rollout_adapter.ToolgymRollout` (``trim_heap=True``) trims after each generation. Both are on with
:attr:`trainers.grpo.Config.trim_heap`; :func:`toolgym.resources.trim_heap` is a no-op where there is no glibc.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from toolgym.resources import trim_heap

__all__ = ["TrimHeapCallback"]


class TrimHeapCallback(TrainerCallback):
    """``malloc_trim(0)`` after every micro-batch (``on_substep_end``) and every optimizer step (``on_step_end``)."""

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trim_heap()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trim_heap()
