"""Trajectory files: JSONL, one :meth:`~toolgym.trajectory.Trajectory.to_dict` per line.

(Kept as it was in ``toolgym/rollout.py``; ``toolgym.trajectory`` / ``toolgym.jsonl`` are to own serialisation.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.trajectory import Trajectory

__all__ = ["read_trajectories", "write_trajectories"]


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> Path:
    """Write trajectories as JSONL (one ``Trajectory.to_dict()`` per line); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a" if append else "w", encoding="utf-8") as fh:
        for t in trajectories:
            fh.write(json.dumps(t.to_dict(), default=_json_default) + "\n")
    return p


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """The JSONL rows written by :func:`write_trajectories` (dicts, with ``prompt_ids``, ``completion_ids``,
    ``loss_mask``, ``reward``, ``task``, ...)."""
    from toolgym.data.jsonl import read_jsonl

    return read_jsonl(path)

