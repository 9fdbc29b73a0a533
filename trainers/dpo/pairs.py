"""Preference pairs from env episodes (:func:`make_pairs`) and their dataset on disk (:func:`save_pairs`,
:func:`load_pairs`): what DPO (:mod:`trainers.dpo`) and the reward model (:mod:`trainers.reward_model`) train on.
No TRL here (``datasets`` only when a dataset is built)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.trajectory import Trajectory

__all__ = ["PAIR_COLUMNS", "load_pairs", "make_pairs", "pairs_dataset", "save_pairs"]

PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids", "chosen_mask", "rejected_mask",
                "chosen_reward", "rejected_reward", "task_id")


# ---------------------------------------------------------------------------------------------------------------
# Pairs
# ---------------------------------------------------------------------------------------------------------------


def _get(t: Trajectory | Mapping[str, Any], key: str) -> Any:
    return t[key] if isinstance(t, Mapping) else getattr(t, key)


def _task_id(t: Trajectory | Mapping[str, Any]) -> str:
    task = _get(t, "task") or {}
    return str(task.get("id", ""))


def make_pairs(
    trajectories: Sequence[Trajectory | Mapping[str, Any]],
    *,
    margin: float = 0.5,
    pairs_per_task: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Preference pairs from episodes (``Trajectory`` objects or their JSONL dicts).

    Episodes are grouped by task id **and** prompt ids (a pair always shares its prompt). In each group, candidate
    pairs ``(hi, lo)`` with ``reward(hi) - reward(lo) >= margin`` and ``reward(hi) > reward(lo)`` are taken widest
    gap first (ties in a seeded random order), each episode in at most one pair, up to ``pairs_per_task``.

    Returns:
        rows with ``prompt_ids``, ``chosen_ids``, ``rejected_ids`` (token ids), ``chosen_mask``, ``rejected_mask``
        (the loss masks, one int per completion token), ``chosen_reward``, ``rejected_reward``, ``task_id``.
    """
    if pairs_per_task < 1:
        raise ValueError(f"pairs_per_task must be >= 1, got {pairs_per_task}")
    if not (margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be a finite number >= 0, got {margin}")
    groups: dict[tuple[str, tuple[int, ...]], list[Trajectory | Mapping[str, Any]]] = {}
    for t in trajectories:
        c, m = _get(t, "completion_ids"), _get(t, "loss_mask")
        if len(c) != len(m):
            raise ValueError(f"completion_ids ({len(c)}) and loss_mask ({len(m)}) differ in length")
        groups.setdefault((_task_id(t), tuple(int(x) for x in _get(t, "prompt_ids"))), []).append(t)
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for (task_id, prompt), eps in groups.items():
        rewards = [float(_get(t, "reward")) for t in eps]
        cands = [(rewards[i] - rewards[j], rng.random(), i, j) for i in range(len(eps)) for j in range(len(eps))
                 if rewards[i] > rewards[j] and rewards[i] - rewards[j] >= margin]
        cands.sort(key=lambda c: (-c[0], c[1]))
        used: set[int] = set()
        n = 0
        for _, _, i, j in cands:
            if n >= pairs_per_task:
                break
            if i in used or j in used:
                continue
            used.update((i, j))
            n += 1
            hi, lo = eps[i], eps[j]
            rows.append({
                "prompt_ids": list(prompt),
                "chosen_ids": [int(x) for x in _get(hi, "completion_ids")],
                "rejected_ids": [int(x) for x in _get(lo, "completion_ids")],
                "chosen_mask": [int(x) for x in _get(hi, "loss_mask")],
                "rejected_mask": [int(x) for x in _get(lo, "loss_mask")],
                "chosen_reward": rewards[i],
                "rejected_reward": rewards[j],
                "task_id": task_id,
            })
    return rows


def pairs_dataset(pairs: Sequence[Mapping[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of pair rows: the :data:`PAIR_COLUMNS` present in the first row (``prompt_ids``,
    ``chosen_ids`` and ``rejected_ids`` are required; an empty list gives an empty dataset with every column)."""
    from datasets import Dataset, Features, Sequence, Value

    ids = Sequence(Value("int64"))
    types = {"prompt_ids": ids, "chosen_ids": ids, "rejected_ids": ids, "chosen_mask": Sequence(Value("int8")),
             "rejected_mask": Sequence(Value("int8")), "chosen_reward": Value("float64"),
             "rejected_reward": Value("float64"), "task_id": Value("string")}
    cols = [k for k in PAIR_COLUMNS if not pairs or k in pairs[0]]
    missing = {"prompt_ids", "chosen_ids", "rejected_ids"} - set(cols)
    if missing:
        raise ValueError(f"pair rows lack {sorted(missing)}")
    return Dataset.from_dict({k: [p[k] for p in pairs] for k in cols}, features=Features({k: types[k] for k in cols}))


def save_pairs(pairs: Sequence[Mapping[str, Any]] | Any, path: str | Path) -> Path:
    """Write pairs as a Hugging Face dataset directory (``datasets.load_from_disk(path)`` reads it)."""
    ds = pairs if hasattr(pairs, "save_to_disk") else pairs_dataset(pairs)
    ds.save_to_disk(str(path), num_shards=1 if len(ds) == 0 else None)  # 0 shards would not load back
    return Path(path)


def load_pairs(path: str | Path) -> Any:
    """The pairs dataset saved by :func:`save_pairs`."""
    from datasets import load_from_disk

    return load_from_disk(str(path))
