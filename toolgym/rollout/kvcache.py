"""A key/value cache allocated once per ``generate()`` call, before the prefill (memory of batched generation).

transformers' ``DynamicCache`` allocates each layer's keys and values inside the prefill forward, between that
forward's large transient tensors (hidden states, MLP activations, attention scores of a whole batch), and the
autocast weight cache is filled there too. glibc cannot hand the holes those transients leave back to the OS, so the
process's resident memory grows far above the model during one prefill of a large batch (figures in
``docs/training.md`` and ``docs/benchmarks.md``, "Evaluation memory"). :func:`reserved_cache` runs a
one-token probe forward first (it fills the autocast weight cache compactly and tells each layer's key/value shape
and dtype), then allocates every layer's buffers for the whole call (prompt width + ``max_new_tokens``) at once;
the prefill's transients then come and go above them. Each step writes into the buffers in place, so the decode
loop does not re-allocate the cache either (``torch.cat`` per layer per token in ``DynamicLayer``).

Under ``torch.autocast`` the buffers are kept in the autocast dtype: attention (SDPA, or eager's matmuls) casts its
inputs to that dtype anyway, so the numbers are bit-identical (a test compares the logits) and the keys take half
the memory (rotary embeddings leave them float32). Without autocast they keep the probe's dtypes.

Only models whose every cache layer is a plain full-attention ``DynamicLayer`` get one (Llama, Qwen, SmolLM, ...);
for any other (sliding windows, linear attention, encoder-decoder) :func:`reserved_cache` returns ``None`` and
``generate()`` builds its own cache as usual.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["cache_kwarg", "full_attention", "reserved_cache"]


@functools.cache
def _layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A ``DynamicLayer`` over preallocated ``(batch, kv_heads, capacity, head_dim)`` buffers: ``keys`` /
        ``values`` are views of the first ``length`` positions; past the capacity it grows (x2, one copy)."""

        def __init__(self, keys: Any, values: Any) -> None:
            super().__init__()
            self._k, self._v = keys, values
            self.length = 0
            self.device = keys.device
            self.is_initialized = True
            self.keys, self.values = keys[:, :, :0], values[:, :, :0]

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:  # allocated in __init__
            return None

        def _grow(self, end: int) -> None:
            cap = max(end, 2 * self._k.shape[-2])
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty(*old.shape[:2], cap, old.shape[-1])
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            end = self.length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                self._grow(end)
            self._k[:, :, self.length : end] = key_states
            self._v[:, :, self.length : end] = value_states
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def reset(self) -> None:
            self.length = 0
            self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove < 0:
                self.length = max(0, self.length + tokens_to_remove)
                self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
            else:
                super().crop(tokens_to_remove)

        def batch_select_indices(self, indices: Any) -> None:
            self._k, self._v = self._k[indices, ...], self._v[indices, ...]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    return ReservedLayer


def reserved_cache(model: Any, batch: int, length: int) -> Any | None:
    """A ``DynamicCache`` for ``model`` with every layer's keys/values preallocated for ``batch`` rows of ``length``
    positions (prompt width + ``max_new_tokens``), or ``None`` when the model's cache is not all full-attention
    ``DynamicLayer`` s. Call it where ``generate()`` will run: inside the same ``torch.autocast`` / ``no_grad``
    context (its probe forward fills the autocast weight cache and reads the dtypes from there)."""
    import torch
    from transformers.cache_utils import DynamicCache

    try:
        device = next(model.parameters()).device
        probe = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=True)
        probe_layers = list(getattr(getattr(probe, "past_key_values", None), "layers", None) or ())
        cache = DynamicCache(config=model.config)
    except Exception:  # an unusual model: generate() builds its own cache
        return None
    if not probe_layers or len(probe_layers) != len(cache.layers):
        return None
    if not (full_attention(cache) and full_attention(probe.past_key_values)):
        return None
    if any(p.keys is None or p.keys.dim() != 4 for p in probe_layers):
        return None
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    reserved = _layer_class()
    layers = []
    for p in probe_layers:
        k, v = p.keys, p.values
        # autocast lowers float32 only (a float64 model keeps float64 keys under it)
        layers.append(reserved(
            k.new_empty(batch, k.shape[1], length, k.shape[-1], dtype=_under(dtype, k.dtype)),
            v.new_empty(batch, v.shape[1], length, v.shape[-1], dtype=_under(dtype, v.dtype)),
        ))
    cache.layers = layers
    return cache


def full_attention(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a plain full-attention ``DynamicLayer`` (or a :func:`reserved_cache`
    layer): keys and values for every position, in order. Sliding windows, linear attention and the like are not."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", None) or ())
    return bool(layers) and all(type(layer) in (DynamicLayer, _layer_class()) for layer in layers)


def _under(autocast_dtype: Any, dtype: Any) -> Any:
    import torch

    return autocast_dtype if autocast_dtype is not None and dtype == torch.float32 else dtype


def cache_kwarg() -> str:
    """The ``generate()`` keyword a cache is passed by: ``cache`` (transformers >= 5.24 deprecates the old name) or
    ``past_key_values``."""
    from transformers.generation import utils

    return "cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values"
