"""GRPO optimizer steps without signal leave the weights and the optimizer state as they are.

When every advantage of every micro-batch of an optimizer step, on every process, is zero and nothing else enters
the loss (:func:`trainers.grpo.zero_advantage.zero_loss_at_zero_advantage`: ``beta == 0``, no entropy bonus, no
router auxiliary loss, an advantage-weighted loss type), the step's gradients are exactly zero. ``optimizer.step()``
would still move every weight: AdamW applies its momentum ``lr * m_hat / (sqrt(v_hat) + eps)`` (the last steps'
direction, fading by ``beta1`` = 0.9 a step: ~10 steps) and its weight decay ``lr * weight_decay * w``, and it
advances its step count and decays its moment estimates.

:class:`NoSignalSteps` records, for each training micro-batch, whether it carries signal (:meth:`observe`: a
non-zero advantage, or a loss with another term). After the backward of an optimizer step's last micro-batch
(:meth:`end_of_step`; before gradient clipping and ``optimizer.step()``) the flag is reduced over the processes
(a sum: every rank takes the same decision) and, when no micro-batch of any rank had signal, every gradient is
dropped (``grad = None``). torch's optimizers (AdamW, Adam, SGD, ...) leave a parameter without a gradient alone: no
moment update, no weight decay, no step count, so the weights and the optimizer state stay bit-identical. Gradient
clipping then sees no gradient (``grad_norm`` 0), and an fp16 ``GradScaler`` finds no overflow (its scale evolves
as after any finite step).

**The learning-rate schedule still advances**: a skipped step counts in ``global_step``, ``max_steps`` and warmup,
and the learning rate at step ``t`` is the schedule's value at ``t`` whatever was skipped before (the
``learning_rate`` TRL logs, and what a resumed run recomputes). verl does the same for the steps it skips on a
non-finite gradient norm. (Transformers' ``Trainer`` holds the scheduler back only after an fp16 overflow,
accelerate's ``optimizer_step_was_skipped``, which this does not set.)

Not under DeepSpeed: its engine steps the optimizer inside the last micro-batch's backward, before
:meth:`end_of_step` can act (:class:`~trainers.grpo.trainer.TurnCreditGRPOTrainer` warns and turns it off).

Logged (TRL's metrics): ``toolgym/skipped_optimizer_step``, 1 for a skipped optimizer step and 0 otherwise (over a
logging window of several steps, the share skipped), and ``toolgym/skipped_optimizer_steps``, the run's count.
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.grpo.zero_advantage import all_zero, zero_loss_at_zero_advantage

__all__ = ["NoSignalSteps", "has_signal"]


def has_signal(trainer: Any, inputs: dict[str, Any]) -> bool:
    """Whether the micro-batch ``inputs`` of ``trainer`` (a TRL ``GRPOTrainer``) can give a non-zero gradient: some
    advantage is non-zero, or the loss has a term that does not vanish with the advantage (a KL term with
    ``beta > 0``, an entropy bonus, an auxiliary loss; an unknown loss type counts as one)."""
    return not (zero_loss_at_zero_advantage(trainer) and all_zero(inputs))


class NoSignalSteps:
    """Skips the optimizer steps without signal (module docstring).

    Args:
        enabled: skip them; when ``False`` the steps are only tracked (nothing is dropped or logged).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        #: whether a micro-batch of the current optimizer step (on this process) carried signal
        self.signal = False
        #: optimizer steps skipped so far
        self.skipped = 0

    def observe(self, trainer: Any, inputs: dict[str, Any]) -> None:
        """Record one training micro-batch of the current optimizer step (call it for every one)."""
        if not self.signal and has_signal(trainer, inputs):
            self.signal = True

    def end_of_step(self, trainer: Any, model: torch.nn.Module) -> bool:
        """At the backward's end of an optimizer step's last micro-batch, on every process: whether the step is
        skipped (then every gradient of ``model`` is dropped, the count grows and ``toolgym/skipped_optimizer_step``
        gets a 1, else a 0). Resets the step's record."""
        signal, self.signal = self.signal, False
        if not self.enabled:
            return False
        accelerator = trainer.accelerator
        if accelerator.num_processes > 1:  # one decision for every rank: the sum of their flags
            flag = torch.tensor([float(signal)], device=accelerator.device)
            signal = float(accelerator.reduce(flag, reduction="sum").item()) > 0
        skip = not signal
        if skip:
            for p in model.parameters():
                p.grad = None
            self.skipped += 1
        trainer._metrics["train"]["toolgym/skipped_optimizer_step"].append(float(skip))
        return skip
