"""A group's prompt prefilled once: rows of one ``generate()`` call with the same prompt share its keys and values.

A GRPO generation batch holds ``num_generations`` copies of each prompt, and ``generate()`` prefills every copy:
with 8 samples of a 550-token prompt and 60-token completions, most of the tokens a generation step processes are
copies of one prompt. :func:`shared_prefill` groups a call's rows by their prompt tokens (padding left out), runs one
forward over each distinct prompt but its last column (laid out, padding included, as in the call's own left-padded
batch, with the positions ``generate()`` gives it: the attention mask's running count), and returns a
:class:`~toolgym.rollout.turn_cache.TurnCall` whose ``fill`` writes those keys and values into every copy's row of
the call's cache (expanded along the batch dimension, not recomputed). ``generate()`` then prefills only the last
prompt column of every row, over that cache, and decodes as before: the logits are those of a full prefill up to
float rounding (a prompt's keys come from a batch of ``U`` distinct prompts instead of ``B`` rows; in float32 the
log-probabilities agree to ~1e-6, ``tests/test_shared_prefix_generation.py``), so the sampling distribution and, with
seeded per-episode samplers, the sampled tokens are those of the unshared call; bfloat16 rounding can flip greedy
near-ties, as between batch sizes.

Used by :class:`toolgym.rollout.TransformersPolicy` (``shared_prefix=True``) and GRPO's transformers generation
(``trainers/grpo/generation.py``) on a call's first turn; a later turn whose rows extend kept rows runs on the
:class:`~toolgym.rollout.turn_cache.TurnCache` instead. Models whose cache is not all full-attention layers
(:func:`toolgym.rollout.kvcache.reserved_cache`'s condition) are left alone, as is a call without a repeated prompt.
"""

from __future__ import annotations

import inspect
from typing import Any

from toolgym.rollout.turn_cache import TurnCall

__all__ = ["prompt_groups", "shared_prefill"]


def prompt_groups(input_ids: Any, attention_mask: Any) -> tuple[list[int], list[int]]:
    """Rows with the same prompt tokens (padding left out).

    Args:
        input_ids, attention_mask: ``(B, W)`` left-padded tensors (any device).

    Returns:
        ``(firsts, rows)``: ``firsts[u]`` is the first row of the ``u``-th distinct prompt (in row order), and
        ``rows[i]`` the index in ``firsts`` of row ``i``'s prompt (``len(rows) == B``).
    """
    mask = attention_mask.bool().cpu()
    ids = input_ids.cpu()
    index: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    rows: list[int] = []
    for i in range(ids.shape[0]):
        key = tuple(ids[i][mask[i]].tolist())
        u = index.get(key)
        if u is None:
            u = index[key] = len(firsts)
            firsts.append(i)
        rows.append(u)
    return firsts, rows


def shared_prefill(model: Any, input_ids: Any, attention_mask: Any) -> TurnCall | None:
    """Prefill each distinct prompt of a call once (module docstring).

    Args:
        model: a causal LM; called where ``generate()`` will run (same ``torch.autocast``), gradients off.
        input_ids, attention_mask: the call's ``(B, W)`` left-padded tensors.

    Returns:
        A :class:`~toolgym.rollout.turn_cache.TurnCall` over the call's own ``input_ids`` / ``attention_mask`` whose
        ``W - 1`` cache columns hold the distinct prompts' keys and values (``layers``: ``(U, kv_heads, W - 1,
        head_dim)`` per layer, ``rows``: ``(B,)`` the distinct prompt of each row; ``saved_tokens``: the prompt
        tokens not prefilled), or ``None`` when sharing saves nothing (no two rows with the same prompt of two or
        more tokens) or the model's cache layers are not all full attention.
    """
    import torch

    from toolgym.rollout.kvcache import cache_kwarg, full_attention, reserved_cache

    width = int(input_ids.shape[1])
    if width < 2 or input_ids.shape[0] < 2:
        return None
    firsts, rows = prompt_groups(input_ids, attention_mask)
    lengths = attention_mask.bool().sum(dim=1).tolist()
    seen: set[int] = set()
    saved = 0
    for i, u in enumerate(rows):
        if u in seen:
            saved += max(0, int(lengths[i]) - 1)
        seen.add(u)
    if saved == 0:
        return None
    device = next(model.parameters()).device
    pick = torch.tensor(firsts, dtype=torch.long, device=input_ids.device)
    ids = input_ids.index_select(0, pick)[:, : width - 1].to(device)
    attn = attention_mask.index_select(0, pick)[:, : width - 1].to(device)
    # the positions generate() gives a left-padded row: the running count of its real tokens
    positions = attn.long().cumsum(-1) - 1
    positions.masked_fill_(attn == 0, 0)
    with torch.no_grad():
        cache = reserved_cache(model, len(firsts), width - 1)
        if cache is None or not full_attention(cache):
            return None
        model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, **{cache_kwarg(): cache},
              **_one_logit(model))
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    return TurnCall(input_ids, attention_mask, width - 1, layers,
                    rows=torch.tensor(rows, dtype=torch.long, device=layers[0][0].device), saved_tokens=saved)


def _one_logit(model: Any) -> dict[str, Any]:
    """``{"logits_to_keep": 1}`` when ``model``'s forward takes it (only the keys and values are wanted: no
    ``(U, W, vocab)`` logits), else nothing. A forward patched onto the instance (TRL's fused LM head) or a peft
    wrapper passes it on through ``**kwargs`` to the model class's forward, which must name it."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    try:
        own = inspect.signature(type(base).forward).parameters
        outer = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    passes = "logits_to_keep" in outer or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in outer.values())
    return {"logits_to_keep": 1} if "logits_to_keep" in own and passes else {}
