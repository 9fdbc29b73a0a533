"""GRPO micro-batches whose every advantage is zero are not computed: their gradient is exactly zero.

A GRPO group whose samples all earn the same reward (all fail, or all succeed) gets advantage 0 on every token, so
with ``beta=0``, no entropy bonus and no auxiliary loss its loss term ``-min(r * A, clip(r) * A)`` (and every
other advantage-weighted loss of TRL) is exactly 0, and so is its gradient. TRL still runs the forward and backward
of those rows. On ``make demo`` 50-100% of the groups of a step had zero reward spread (``frac_reward_zero_std``
0.63-0.70 on average over three seeds), so most of the training compute of a step was spent to add zeros.

:class:`trainers.grpo.trainer.TurnCreditGRPOTrainer` uses the two functions here:

* :func:`regroup`: after TRL has shuffled and split a freshly generated batch into its micro-batches, the rows are
  laid out again so that the zero-advantage rows fill the last micro-batches (kept in TRL's shuffled order
  otherwise). For the loss types whose normaliser does not depend on which rows share a micro-batch (a global token
  count, or a fixed row count per micro-batch: everything but ``bnpo``) the step's gradient is the same sum; only
  the order of the floating-point additions changes.
* :func:`all_zero`: :meth:`~trainers.grpo.trainer.TurnCreditGRPOTrainer._compute_loss` returns a zero loss for such
  a micro-batch without running the model, after giving every trainable parameter a zero gradient if it has none
  (so that the optimizer sees zeros, as it would have, and not ``None``: AdamW skips a parameter without a
  gradient, but moves one with a zero gradient by its momentum).

Only on a single process (:func:`skippable`): under DDP / DeepSpeed / FSDP every rank must run the same forwards
and backwards. The logged per-micro-batch metrics (entropy, clip ratios) then average over the micro-batches that
were computed.
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.grpo.prompt_packing import prompt_groups

__all__ = ["ADVANTAGE_WEIGHTED", "PARTITION_INVARIANT", "all_zero", "ensure_zero_grads", "regroup", "skippable",
           "zero_loss_at_zero_advantage"]

#: TRL 1.16 loss types whose per-token loss is a multiple of the advantage (zero advantage: zero loss)
ADVANTAGE_WEIGHTED = frozenset({"grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"})
#: ... and whose normaliser does not depend on which rows share a micro-batch (``bnpo`` divides by the
#: micro-batch's own token count)
PARTITION_INVARIANT = ADVANTAGE_WEIGHTED - {"bnpo"}


def zero_loss_at_zero_advantage(trainer: Any) -> bool:
    """Whether a zero advantage gives ``trainer`` (a TRL ``GRPOTrainer``) an exactly zero loss term and gradient:
    ``beta == 0`` (no KL term), no entropy bonus (fixed or adaptive), no router auxiliary loss, an advantage-weighted loss type."""
    return (
        float(getattr(trainer, "beta", 0.0)) == 0.0
        and not float(getattr(trainer, "entropy_coef", 0.0) or 0.0)
        and not getattr(trainer, "use_adaptive_entropy", False)
        and not getattr(trainer, "aux_loss_enabled", False)
        and getattr(trainer, "loss_type", None) in ADVANTAGE_WEIGHTED
    )


def skippable(trainer: Any) -> bool:
    """Whether a zero-advantage micro-batch of ``trainer`` (a TRL ``GRPOTrainer``) has an exactly zero gradient and
    may be left out: one process, and :func:`zero_loss_at_zero_advantage`."""
    return (getattr(getattr(trainer, "accelerator", None), "num_processes", 1) == 1
            and zero_loss_at_zero_advantage(trainer))


def _zero_rows(advantages: torch.Tensor) -> torch.Tensor:
    """``(B,)`` bool: rows whose advantages (``(B,)`` per sequence or ``(B, T)`` per token) are all zero."""
    return advantages.detach().reshape(advantages.shape[0], -1).eq(0).all(dim=1)


def all_zero(inputs: dict[str, Any]) -> bool:
    """Whether every advantage of the micro-batch ``inputs`` is zero (``False`` without an ``advantages`` tensor)."""
    adv = inputs.get("advantages")
    return isinstance(adv, torch.Tensor) and adv.numel() > 0 and bool(_zero_rows(adv).all())


def regroup(micro_batches: list[dict[str, Any]], *, zeros_last: bool = True,
            by_prompt: bool = False) -> list[dict[str, Any]] | None:
    """The rows of ``micro_batches`` (TRL's split of one generation batch: dicts of ``(rows, ...)`` tensors, lists
    of one item per row, 0-d tensors and ``None``, every micro-batch with the same number of rows) laid out again
    so that the rows with a non-zero advantage come first, then those without (each part in its current order;
    ``zeros_last``), in as many micro-batches of the same size. With ``by_prompt`` the rows of each part are also
    ordered by their prompt (rows with identical ``prompt_ids``/``prompt_mask`` next to each other, prompts in the
    order of their first row), so that a GRPO group's rows share micro-batches
    (:mod:`trainers.grpo.prompt_packing`). ``None`` (leave them as they are) when there is nothing to move or
    the batch holds something else (e.g. a vision model's per-image pixel values).

    Every index is made on the device of the advantages it is computed from and moved to the device of each tensor
    it selects from, so the batch may live on any device (a GPU's, with CPU-side lists alongside)."""
    if len(micro_batches) < 2:
        return None
    keys = list(micro_batches[0])
    rows = [len(mb["advantages"]) if isinstance(mb.get("advantages"), torch.Tensor) else -1 for mb in micro_batches]
    if rows[0] <= 0 or any(r != rows[0] for r in rows):
        return None
    merged: dict[str, Any] = {}
    for key in keys:
        values = [mb.get(key) for mb in micro_batches]
        first = values[0]
        if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
            merged[key] = first
        elif all(isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[1:] == first.shape[1:] and len(v) == rows[0]
                 for v in values):
            merged[key] = torch.cat(values, dim=0)
        elif all(isinstance(v, list) and len(v) == rows[0] for v in values):
            merged[key] = [x for v in values for x in v]
        else:
            return None
    zero = _zero_rows(merged["advantages"])
    if not zeros_last:
        zero = torch.zeros_like(zero)
    if by_prompt and isinstance(merged.get("prompt_ids"), torch.Tensor) and isinstance(
            merged.get("prompt_mask"), torch.Tensor):
        group = torch.as_tensor(prompt_groups(merged["prompt_ids"], merged["prompt_mask"]), device=zero.device)
        parts = [torch.nonzero(~zero).flatten(), torch.nonzero(zero).flatten()]
        # a stable sort of each part by group (equal keys keep their order)
        order = torch.cat([part[torch.sort(group[part], stable=True).indices] for part in parts])
    else:
        order = torch.cat([torch.nonzero(~zero).flatten(), torch.nonzero(zero).flatten()])
    if bool((order == torch.arange(len(order), device=order.device)).all()):
        return None
    positions = order.tolist()  # one device-to-host copy for the per-row lists, not one per row
    out: list[dict[str, Any]] = []
    for k in range(len(micro_batches)):
        idx = order[k * rows[0]: (k + 1) * rows[0]]
        mb: dict[str, Any] = {}
        for key, value in merged.items():
            if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
                mb[key] = value
            elif isinstance(value, torch.Tensor):
                mb[key] = value[idx.to(value.device)]
            else:
                mb[key] = [value[i] for i in positions[k * rows[0]: (k + 1) * rows[0]]]
        out.append(mb)
    return out


def ensure_zero_grads(model: Any) -> None:
    """Give every trainable parameter of ``model`` without a gradient a zero one (what a zero loss's backward
    would have accumulated)."""
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
