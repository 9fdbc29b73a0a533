"""Shared-prefix GRPO training: each group's prompt is encoded once in the loss forward and backward.

A GRPO micro-batch holds several completions of the same prompt (a group: ``num_generations`` samples). TRL runs
the model on ``[prompt, completion]`` once per row, so a 550-token prompt with 8 completions of 60 tokens is
encoded 8 times. Here the rows of a micro-batch that share a prompt are packed into one row (the idea of Prefix
Grouper, arXiv 2506.05433)::

    [prompt[:-1], prompt[-1], c1[:-1], prompt[-1], c2[:-1], ..., prompt[-1], cG[:-1]]

with a 4-D attention mask in which the prompt attends causally to itself and each segment ``[prompt[-1], ck[:-1]]``
attends to the prompt and causally to itself (never to another completion), and position ids equal to the
columns those tokens have in TRL's row (so rotary embeddings see the same positions). The copy of the prompt's
last token at the head of each segment is the position whose logit predicts ``ck``'s first token; the segment's
position ``j`` predicts ``ck[j]``, so TRL's fused LM head scores every segment position against a pre-shifted
label (``shift_labels``) and the per-token log-probabilities and entropies are scattered back to TRL's
``(B, C)`` layout. It is one ordinary forward of the model, so gradient checkpointing, LoRA (peft) and autocast
work as they do on TRL's rows; per-token log-probabilities and gradients equal TRL's to float rounding
(``tests/test_shared_prefix.py``). Tokens processed per group: ``P + sum(len(ck))`` instead of
``G * (P + max(len(ck)))``.

Packing applies to what one forward sees: the rows of one micro-batch (or of one of TRL's ``batch_size`` chunks)
with identical prompt columns. :func:`prompt_groups` gives every row its group; :func:`pack` builds the packed
batch, or returns ``None`` (TRL's own path is used) when no prompt occurs twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ATTENTION_IMPLEMENTATIONS", "Packed", "pack", "prompt_groups", "unpack"]

#: attention implementations whose custom 4-D masks transformers passes through as they are (boolean for
#: ``sdpa``, additive float for ``eager``); others (flash attention, flex) take TRL's unshared path
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")

#: packed widths are rounded up to a multiple of this many columns (few distinct shapes for the allocator)
PACK_MULTIPLE = 64


@dataclass
class Packed:
    """A micro-batch packed one row per distinct prompt.

    Attributes:
        input_ids: ``(R, L)`` token ids (``R`` distinct prompts, ``L`` the packed width; padding is token 0).
        attention_mask: ``(R, 1, L, L)``: ``True`` where a query (row) may attend to a key (column) for ``sdpa``;
            for ``eager`` the additive float form (0 or the dtype's minimum).
        position_ids: ``(R, L)`` the column each token has in TRL's ``[prompt, completion]`` row.
        shift_labels: ``(R, L)`` the token each position predicts (``-100``: not scored).
        src: ``(N,)`` flat index into ``(R * L)`` of each scored position.
        dst: ``(N,)`` flat index into ``(B * C)`` of the completion token it scores.
        shape: ``(B, C)``, TRL's completion layout.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    shift_labels: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    shape: tuple[int, int]


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[int]:
    """Each row's group: rows with identical prompt columns (ids where the mask is 1, and the mask) get the same
    number, numbered in the order of their first row. ``prompt_ids``, ``prompt_mask``: ``(B, P)``."""
    key = torch.cat([prompt_ids * prompt_mask.ne(0), prompt_mask.ne(0).long()], dim=1).cpu()
    seen: dict[bytes, int] = {}
    return [seen.setdefault(row.numpy().tobytes(), len(seen)) for row in key]


def _pad(xs: list[torch.Tensor], length: int, value: int | bool) -> torch.Tensor:
    """The 1-D tensors ``xs`` right-padded with ``value`` to ``length`` and stacked: ``(len(xs), length)``."""
    return torch.stack([torch.nn.functional.pad(x, (0, length - len(x)), value=value) for x in xs])


def _packed_mask(key: torch.Tensor, seg: torch.Tensor, attn_implementation: str,
                 mask_dtype: torch.dtype) -> torch.Tensor:
    """The ``(R, 1, L, L)`` attention mask of packed rows: a query sees the keys at or before it that are valid
    (``key`` ``(R, L)`` bool) and in the prompt (segment 0) or in its own segment (``seg`` ``(R, L)``; -1 = padding);
    every query sees itself. Boolean for ``sdpa``; additive in ``mask_dtype`` (0 / dtype min) for ``eager``."""
    length = key.shape[1]
    idx = torch.arange(length, device=key.device)
    causal = idx[None, :] <= idx[:, None]
    same = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])
    allowed = causal[None] & same & key[:, None, :] & (seg[:, :, None] >= 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=key.device)[None]  # no query without a key
    mask = allowed[:, None]
    if attn_implementation == "eager":
        mask = torch.zeros(mask.shape, dtype=mask_dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(mask_dtype).min)
    return mask


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
         attn_implementation: str = "sdpa", mask_dtype: torch.dtype = torch.float32,
         multiple: int = PACK_MULTIPLE) -> Packed | None:
    """Pack TRL's ``[prompt, completion]`` rows one row per distinct prompt (module docstring).

    Args:
        input_ids: ``(B, P + C)``: left-padded prompts then right-padded completions, as TRL concatenates them.
        attention_mask: ``(B, P + C)`` 0/1.
        logits_to_keep: ``C``, the completion width.
        attn_implementation: ``sdpa`` (boolean mask) or ``eager`` (additive mask in ``mask_dtype``).
        multiple: the packed width is rounded up to a multiple of this.

    Returns:
        The packed batch, or ``None`` when packing saves nothing (no prompt occurs in two rows), when a prompt's
        last column is padding (no left-padded prompt), or when ``C`` or ``P`` is 0.
    """
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"shared-prefix packing needs an attention implementation among "
                         f"{ATTENTION_IMPLEMENTATIONS}, got {attn_implementation!r}")
    b, width = input_ids.shape
    c = int(logits_to_keep)
    p = width - c
    if c < 1 or p < 1:
        return None
    valid = attention_mask.ne(0)
    pm, cm = valid[:, :p], valid[:, p:]
    if not bool(pm[:, -1].all()):
        return None
    groups = prompt_groups(input_ids[:, :p], pm)
    n_groups = max(groups) + 1
    if n_groups == b:
        return None
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for r, g in enumerate(groups):
        members[g].append(r)
    cols = torch.arange(c, device=input_ids.device)
    # each row's completion length: up to its last unmasked column (holes inside stay, masked as keys)
    lengths = torch.where(cm, cols + 1, torch.zeros_like(cols)).amax(dim=1).tolist() if c else [0] * b
    # per packed row: token ids, positions, key-valid flags, segment ids (0: prompt, k: k-th completion), labels
    rows_ids, rows_pos, rows_key, rows_seg, rows_lab, src_rows, dst_rows = [], [], [], [], [], [], []
    for rows in members:
        r0 = rows[0]
        first = int(pm[r0].nonzero()[0])  # the prompt's leading padding is dropped
        ids = [input_ids[r0, first:p - 1]]
        pos = [torch.arange(first, p - 1, device=input_ids.device)]
        key = [pm[r0, first:p - 1]]
        seg = [torch.zeros(p - 1 - first, dtype=torch.long, device=input_ids.device)]
        lab = [torch.full((p - 1 - first,), -100, dtype=torch.long, device=input_ids.device)]
        offset = p - 1 - first
        src: list[torch.Tensor] = []
        dst: list[torch.Tensor] = []
        for k, r in enumerate(rows, start=1):
            n = int(lengths[r])
            if n == 0:
                continue
            ids.append(torch.cat([input_ids[r, p - 1:p], input_ids[r, p:p + n - 1]]))
            pos.append(torch.arange(p - 1, p - 1 + n, device=input_ids.device))
            key.append(torch.cat([pm[r, p - 1:p], cm[r, :n - 1]]))
            seg.append(torch.full((n,), k, dtype=torch.long, device=input_ids.device))
            scored = cm[r, :n]
            lab.append(input_ids[r, p:p + n].masked_fill(~scored, -100))
            at = scored.nonzero().flatten()
            src.append(offset + at)
            dst.append(r * c + at)
            offset += n
        rows_ids.append(torch.cat(ids))
        rows_pos.append(torch.cat(pos))
        rows_key.append(torch.cat(key))
        rows_seg.append(torch.cat(seg))
        rows_lab.append(torch.cat(lab))
        src_rows.append(torch.cat(src) if src else torch.zeros(0, dtype=torch.long, device=input_ids.device))
        dst_rows.append(torch.cat(dst) if dst else torch.zeros(0, dtype=torch.long, device=input_ids.device))
    longest = max(len(x) for x in rows_ids)
    length = max(1, -(-longest // max(1, multiple)) * max(1, multiple))
    ids_t, pos_t, lab_t = _pad(rows_ids, length, 0), _pad(rows_pos, length, 0), _pad(rows_lab, length, -100)
    key_t, seg_t = _pad(rows_key, length, False), _pad(rows_seg, length, -1)
    mask = _packed_mask(key_t, seg_t, attn_implementation, mask_dtype)
    src_t = torch.cat([s + i * length for i, s in enumerate(src_rows)])
    return Packed(ids_t, mask, pos_t, lab_t, src_t, torch.cat(dst_rows), (b, c))


def unpack(values: torch.Tensor, packed: Packed) -> torch.Tensor:
    """``(R, L)`` per-position values of the packed forward (log-probabilities, entropies) laid out as TRL's
    ``(B, C)`` completion tokens; positions no completion token maps to (padding, masked tokens) are 0.
    Differentiable."""
    b, c = packed.shape
    out = values.new_zeros(b * c)
    out = out.index_put((packed.dst,), values.reshape(-1)[packed.src])
    return out.view(b, c)
