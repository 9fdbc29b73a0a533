"""Left padding of a batch of prompts: the one helper shared by :class:`~toolgym.rollout.TransformersPolicy` and
``toolgym serve model``'s engine (so both backends feed the model exactly the same tensors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["left_pad"]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """Left-pad token-id prompts to one width.

    Args:
        prompts: ``B`` prompts of token ids (an empty prompt becomes a row of padding).
        pad_id: the id written in the padding positions (masked out, so its value does not matter to the model).

    Returns:
        ``(input_ids, attention_mask)``: two ``torch.long`` CPU tensors of shape ``[B, max prompt length]``; the
        mask is 1 on prompt tokens and 0 on padding, each row's tokens flush right.
    """
    import torch

    width = max((len(p) for p in prompts), default=0)
    ids = torch.full((len(prompts), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids, mask
