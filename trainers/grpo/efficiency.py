"""The memory and speed techniques of a GRPO run on a CPU, each behind its config flag, wired in one place
(:func:`apply`, called by :func:`trainers.grpo.build.build_trainer`):

* ``trim_heap`` -- hand the C heap's free pages back to the OS between micro-batches (:class:`TrimHeapCallback`)
  and after each generation (:class:`~trainers.grpo.rollout_adapter.ToolgymRollout`);
* always (mixed precision only) -- no half-precision weight cache in the training forward's autocast context
  (:func:`no_autocast_weight_cache`);
* ``skip_zero_advantage`` -- no forward/backward for micro-batches whose advantages are all zero
  (:mod:`trainers.grpo.zero_advantage`, applied inside :class:`~trainers.grpo.trainer.TurnCreditGRPOTrainer`);
* ``threads`` -- torch's CPU threads (:func:`trainers.contract.prepare`, before anything loads).

Generation's own techniques (inverse-CDF sampling on the CPU, the reserved key/value cache) are in
:mod:`trainers.grpo.generation`.

Heap trimming: glibc keeps freed blocks inside its heap (and raises its mmap threshold after large frees), so a process's resident
memory stays at the high-water mark of its last transient; the next forward/backward then grows on top of that
instead of from what is live. :class:`TrimHeapCallback` trims after every micro-batch and optimizer step;
:class:`trainers.grpo.rollout_adapter.ToolgymRollout` (``trim_heap=True``) trims after each generation. Both are on with
:attr:`trainers.grpo.Config.trim_heap`; :func:`toolgym.resources.trim_heap` is a no-op where there is no glibc.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from toolgym.resources import trim_heap

__all__ = ["TrimHeapCallback", "apply", "callbacks", "no_autocast_weight_cache"]


class TrimHeapCallback(TrainerCallback):
    """``malloc_trim(0)`` after every micro-batch (``on_substep_end``) and every optimizer step (``on_step_end``)."""

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trim_heap()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trim_heap()


def no_autocast_weight_cache(trainer: Any) -> bool:
    """Turn off the weight cache of the autocast context Accelerate wraps the model's forward in (mixed precision),
    before ``train()`` prepares the model; returns whether it did.

    With the cache on, each forward keeps a half-precision copy of every trainable weight until it returns (the
    cache lives as long as the outermost autocast context). A training forward uses each weight once, so the cache
    saves no cast there; under gradient checkpointing it only holds ~2 bytes per trainable parameter that would
    otherwise be freed layer by layer (SmolLM2-135M: ~212 MB). The values are the same: the same cast, made at
    use. Generation keeps one cache per ``generate()`` call (:class:`trainers.grpo.generation.TRLPolicy` runs it
    under its own context, without this wrapper). An autocast handler the caller configured is left as it is."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or not getattr(accelerator, "native_amp", False) or accelerator.autocast_handler is not None:
        return False
    from accelerate.utils import AutocastKwargs

    accelerator.autocast_handler = AutocastKwargs(cache_enabled=False)
    return True


def callbacks(trim: bool) -> list[Any]:
    """The trainer callbacks of the techniques that are on (``trim``: ``Config.trim_heap``)."""
    return [TrimHeapCallback()] if trim else []


def apply(trainer: Any) -> None:
    """The techniques that act on a built trainer, before ``train()`` (today: :func:`no_autocast_weight_cache`)."""
    no_autocast_weight_cache(trainer)
