"""Keys and values kept across the turns of an episode, so that a turn prefills only what the env appended.

Every turn of an episode is a new ``generate()`` call whose prompt is the whole episode so far: the first prompt,
the model's earlier turns and the env's observations. Prefilling it again costs more with every turn; on a CPU
a later turn's prefill can cost more than its decoding steps (measured in ``docs/training.md``).

:class:`TurnCache` keeps, after each call, every row's keys and values for the tokens the model has seen (its real
prompt tokens and the tokens it sampled, up to the first stop id; the last sampled token was never fed back). A later
call whose every row starts with a kept row's tokens (compared token by token) then runs on a cache built from those
rows: each row's kept entries are laid out left-padded in a cache region, the new tokens (the rest of each prompt)
left-padded after it, and the gaps masked; transformers takes the positions from the attention mask, so every token
keeps its logical position. Only the new tokens are prefilled. A call where some row has no kept prefix runs as
before (and its rows are kept for the next turn). Entries are used once and dropped; the oldest go first past
``max_bytes``. The cache is cleared when a weight of the model has changed in place since it was filled (an
optimizer step, merged adapters), read from the weights' version counters.

The numbers: a kept key was computed while decoding (one position at a time) and a prefilled one for the whole
prompt at once; in float32 they agree to rounding, in bfloat16 greedy decoding can flip near-ties between the two,
as it can between batch sizes. Works with models whose cache layers are plain full-attention ``DynamicLayer`` s
(:func:`toolgym.rollout.kvcache.reserved_cache`'s condition), else it keeps nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TurnCache", "TurnCall", "generation_cache"]


@dataclass
class TurnCall:
    """A ``generate()`` call laid out over keys and values computed before it (kept rows of earlier turns, or the
    shared prompts of :func:`toolgym.rollout.shared_prefix.shared_prefill`): ``input_ids`` / ``attention_mask``
    ``(B, C + S)`` (``C`` cache columns, ``S`` new columns), ``cache_len`` = ``C``, and ``fill(cache)`` writes the
    keys and values into a fresh cache's first ``C`` positions. ``rows``: ``None`` when ``layers`` hold one row per
    call row, else a ``(B,)`` long tensor, the row of ``layers`` each call row takes (rows expanded along the batch
    dimension while filling); ``saved_tokens``: prompt tokens the call does not prefill."""

    input_ids: Any
    attention_mask: Any
    cache_len: int
    layers: list[tuple[Any, Any]]  # per layer: keys, values (B or U, kv_heads, C, head_dim)
    rows: Any = None
    saved_tokens: int = 0

    def fill(self, cache: Any) -> None:
        for idx, (k, v) in enumerate(self.layers):
            if self.rows is not None:  # one layer's expanded copy at a time
                k, v = k.index_select(0, self.rows), v.index_select(0, self.rows)
            cache.layers[idx].update(k, v)
        self.layers = []


def generation_cache(model: Any, batch: int, length: int, call: TurnCall | None = None, *, reserve: bool = True,
                     keep: bool = False) -> Any | None:
    """The key/value cache one ``generate()`` call of ``batch`` rows and ``length`` positions runs on, with ``call``'s
    kept keys and values written in: :func:`toolgym.rollout.kvcache.reserved_cache` when ``reserve`` and the model
    allows it, else a ``DynamicCache`` when there are kept rows to write (``call``) or the call's rows are to be kept
    (``keep``), else ``None`` (``generate()`` builds its own). Enter it where ``generate()`` runs (autocast,
    ``no_grad``)."""
    from toolgym.rollout.kvcache import reserved_cache

    cache = reserved_cache(model, batch, length) if reserve else None
    if cache is None and (call is not None or keep):
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
    if call is not None:
        call.fill(cache)
    return cache


class TurnCache:
    """Per-row keys and values of earlier ``generate()`` calls (module docstring).

    Args:
        max_bytes: bytes of keys and values kept at most, over all rows (a token costs ``2 x layers x kv_heads x
            head_dim`` values: ~23 KB for SmolLM2-135M in bfloat16, ~147 KB for Qwen3-4B); the oldest rows are
            dropped first.
    """

    def __init__(self, max_bytes: int = 192 * 2**20) -> None:
        self.max_bytes = int(max_bytes)
        self._rows: OrderedDict[tuple[int, ...], list[tuple[Any, Any]]] = OrderedDict()
        self._bytes = 0
        self._version: int | None = None
        #: calls that ran on kept keys and values / that prefilled everything; prompt tokens not prefilled
        self.hits = 0
        self.misses = 0
        self.saved_tokens = 0

    def clear(self) -> None:
        self._rows.clear()
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values kept."""
        return self._bytes

    @staticmethod
    def _size(entry: list[tuple[Any, Any]]) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in entry)

    def __len__(self) -> int:
        return len(self._rows)

    @staticmethod
    def _weights_version(model: Any) -> int:
        return sum(int(p._version) for p in model.parameters())

    def _check_weights(self, model: Any) -> None:
        version = self._weights_version(model)
        if self._version is not None and version != self._version:
            self.clear()
        self._version = version

    def _lengths(self) -> list[int]:
        """The kept rows' lengths, longest first (the longest kept prefix of a prompt wins)."""
        return sorted({len(k) for k in self._rows}, reverse=True)

    def _find(self, row: Sequence[int], lengths: Sequence[int]) -> tuple[int, ...] | None:
        for n in lengths:
            if n <= len(row):
                key = tuple(row[:n])
                if key in self._rows:
                    return key
        return None

    def extends_a_kept_row(self, prompt_ids: Sequence[int]) -> bool:
        """Whether ``prompt_ids`` starts with a kept row's tokens and goes on past them (a batch of such prompts runs
        on kept keys and values)."""
        key = self._find(list(prompt_ids), self._lengths()) if self._rows else None
        return key is not None and len(key) < len(prompt_ids)

    def prepare(self, model: Any, input_ids: Any, attention_mask: Any, pad_token_id: int) -> TurnCall | None:
        """The call laid out over kept rows, or ``None`` (run it as it is) when some row has none. ``input_ids`` /
        ``attention_mask``: ``(B, W)``, left-padded. Rows used are dropped from the cache."""
        import torch

        self._check_weights(model)
        if not self._rows:
            self.misses += 1
            return None
        mask = attention_mask.bool().cpu()  # one device-to-host copy, not one per row
        host_ids = input_ids.cpu()
        rows = [host_ids[i][mask[i]].tolist() for i in range(host_ids.shape[0])]
        lengths = self._lengths()
        keys = [self._find(r, lengths) for r in rows]
        if any(k is None or len(k) >= len(r) for k, r in zip(keys, rows, strict=True)):
            self.misses += 1
            return None
        kept = [len(k) for k in keys]  # type: ignore[arg-type]
        width_c = max(kept)
        width_s = max(len(r) - c for r, c in zip(rows, kept, strict=True))
        b = len(rows)
        ids = torch.full((b, width_c + width_s), int(pad_token_id), dtype=input_ids.dtype)
        attn = torch.zeros((b, width_c + width_s), dtype=attention_mask.dtype)
        entries = [self._rows[k] for k in keys]  # type: ignore[index]  (rows sampled alike share one entry)
        for k in set(keys):
            self._bytes -= self._size(self._rows.pop(k))  # type: ignore[arg-type]
        first = entries[0]
        layers = []
        for idx in range(len(first)):
            k0, v0 = first[idx][0], first[idx][1]
            k = k0.new_zeros((b, k0.shape[0], width_c, k0.shape[-1]))
            v = v0.new_zeros((b, v0.shape[0], width_c, v0.shape[-1]))
            for i, e in enumerate(entries):
                c = kept[i]
                k[i, :, width_c - c:] = e[idx][0]
                v[i, :, width_c - c:] = e[idx][1]
            layers.append((k, v))
        for i, (r, c) in enumerate(zip(rows, kept, strict=True)):
            ids[i, width_c - c: width_c] = torch.tensor(r[:c], dtype=input_ids.dtype)
            attn[i, width_c - c: width_c] = 1
            new = r[c:]
            ids[i, width_c + width_s - len(new):] = torch.tensor(new, dtype=input_ids.dtype)
            attn[i, width_c + width_s - len(new):] = 1
        self.hits += 1
        self.saved_tokens += sum(kept)
        return TurnCall(ids.to(input_ids.device), attn.to(attention_mask.device), width_c, layers,
                        saved_tokens=sum(kept))

    def keep(self, model: Any, cache: Any, input_ids: Any, attention_mask: Any, sequences: Any,
             stop_ids: Sequence[int]) -> None:
        """Keep every row of a finished call: ``input_ids`` / ``attention_mask`` ``(B, W)`` as the call got them,
        ``sequences`` ``(B, W + T)`` as it returned them, ``cache`` its key/value cache (``W + T - 1`` positions);
        a row's sampled tokens count up to its first id of ``stop_ids``."""
        import torch

        from toolgym.rollout.kvcache import full_attention

        if not full_attention(cache):  # a sliding window keeps only its last positions
            return
        layers = cache.layers
        if any(getattr(layer, "keys", None) is None or layer.keys.dim() != 4 for layer in layers):
            return
        width = input_ids.shape[1]
        length = int(layers[0].keys.shape[-2])
        stops = set(int(s) for s in stop_ids)
        mask = attention_mask.bool().cpu()
        seqs = sequences.cpu()
        for i in range(seqs.shape[0]):
            generated = seqs[i, width:].tolist()
            n = next((j + 1 for j, t in enumerate(generated) if t in stops), len(generated))
            fed = min(n - 1, length - width)  # the last sampled token was not fed back
            if fed < 0:
                continue
            cols = torch.cat([torch.nonzero(mask[i]).flatten(), torch.arange(width, width + fed)])
            key = tuple(seqs[i, cols].tolist())
            if key in self._rows:
                continue
            dev_cols = cols.to(layers[0].keys.device)
            # (advanced indexing copies: the kept rows do not hold the call's cache alive)
            entry = [(layer.keys[i, :, dev_cols], layer.values[i, :, dev_cols]) for layer in layers]
            self._rows[key] = entry
            self._bytes += self._size(entry)
        while self._bytes > self.max_bytes and self._rows:
            _, old = self._rows.popitem(last=False)
            self._bytes -= self._size(old)
        self._version = self._weights_version(model)
