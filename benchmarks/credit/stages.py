"""Resumable stages of ``python -m benchmarks.credit``: configuration keys, done markers, results records, checkpoints.

A *stage* is one unit of the credit protocol that is either finished or not: the shared warm start, its held-out
evaluation, one GRPO arm with its mid-budget and final evaluations. Its :class:`Stage` ``spec`` holds everything
that changes what it computes (estimator, seed, gamma, budgets, model, learning rate, evaluation tasks, ...; never
wall-clock things such as thread counts or checkpoint frequency); its ``key`` is a stable hash of that spec.

On disk, under the run's output directory ``OUT`` and a results directory ``RESULTS``:

- ``OUT/<name>-<key>/``: the stage's working files (GRPO checkpoints, trajectories, the warm-start weights) and,
  written last and atomically, ``done.json``;
- ``RESULTS/<name>-<key>.json``: the stage's small results record (per-task verdicts, tokens, wall and CPU time,
  the CPU model, library versions, the spec): what the verdict is computed from, committed to the repository.

A stage with either file is finished (:func:`load_done`): a rerun skips it and reads its record back, so a run
continues on another machine from the committed records alone.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common.stages import config_key, machine, read_json, write_json

__all__ = ["PROTOCOL", "Stage", "finish", "latest_checkpoint", "load_done", "state_digest", "system_info",
           "write_json"]

#: Part of every stage's spec: records of another protocol version never count as finished stages of this one.
PROTOCOL = "credit-v2"

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass(frozen=True)
class Stage:
    """One finished-or-not unit of the protocol: ``name`` (readable, e.g. ``arm-gigpo-g0.9-seed3``) and ``spec``
    (JSON-able: everything that changes what the stage computes)."""

    name: str
    spec: Mapping[str, Any] = field(hash=False)

    @property
    def key(self) -> str:
        """12 hex digits of the SHA-256 of the spec as canonical JSON (sorted keys): equal specs, equal keys, in
        every process and on every machine."""
        return config_key({"protocol": PROTOCOL, **self.spec})

    @property
    def id(self) -> str:
        """``<name>-<key>``: the stage's directory under ``OUT`` and its record's file stem under ``RESULTS``."""
        return f"{self.name}-{self.key}"

    def dir(self, out: Path) -> Path:
        return Path(out) / self.id

    def record_path(self, results_dir: Path) -> Path:
        return Path(results_dir) / f"{self.id}.json"


def load_done(stage: Stage, out: Path, results_dir: Path) -> dict[str, Any] | None:
    """The stage's results record if it is finished, else ``None``. The committed record counts first; a stage
    finished under ``OUT`` whose record is missing from ``results_dir`` gets it written there."""
    rec = read_json(stage.record_path(results_dir))
    if rec is not None and rec.get("key") == stage.key:
        return rec
    rec = read_json(stage.dir(out) / "done.json")
    if rec is not None and rec.get("key") == stage.key:
        write_json(stage.record_path(results_dir), rec)
        return rec
    return None


def finish(stage: Stage, out: Path, results_dir: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """Mark the stage finished: its record (plus ``stage``, ``key``, ``spec``) goes to ``results_dir``, then
    ``OUT/<id>/done.json`` is written, both atomically; returns the record as written."""
    rec = {"stage": stage.name, "key": stage.key, "protocol": PROTOCOL, **record, "spec": dict(stage.spec)}
    write_json(stage.record_path(results_dir), rec)
    write_json(stage.dir(out) / "done.json", rec)
    return rec


def latest_checkpoint(grpo_dir: Path, progress_dir: Path) -> tuple[Path, int, dict[str, Any]] | None:
    """The newest complete GRPO checkpoint under ``grpo_dir`` and the arm's progress at that step:
    ``(path, step, progress)``, or ``None`` when there is none.

    Complete means: ``checkpoint-N/trainer_state.json`` parses (the Trainer writes it after the weights, optimizer
    and RNG states) and ``progress_dir/step-N.json`` exists (the arm's token count and curve at step N). Newer
    incomplete checkpoint directories (a process killed while saving) are removed.
    """
    found: list[tuple[int, Path]] = []
    if Path(grpo_dir).is_dir():
        for p in Path(grpo_dir).iterdir():
            m = _CHECKPOINT.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
    for step, path in sorted(found, reverse=True):
        state = read_json(path / "trainer_state.json")
        progress = read_json(Path(progress_dir) / f"step-{step}.json")
        if state is not None and progress is not None and int(state.get("global_step", -1)) == step:
            return path, step, progress
        shutil.rmtree(path, ignore_errors=True)
    return None


def state_digest(state_dict: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex digits) over a torch state dict's names, dtypes, shapes and bytes, in sorted name order:
    equal weights, equal digest."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def system_info(threads: int | None = None) -> dict[str, Any]:
    """Where a stage ran: :func:`benchmarks.common.stages.machine` (CPU model, cores, bfloat16 units, library versions) and
    the torch threads it used."""
    return {**machine(), "threads": threads}
