"""Plots (matplotlib, Agg backend, PNG): training curves and tool-latency histograms.

* :func:`plot_training_curves`: reward / success / tool-call-rate curves per training step from a training log:
  a JSONL file of per-step metric rows (``{"step": 3, "reward": 0.4, "success": 0.25, ...}``), a JSON list of
  such rows, a Hugging Face ``trainer_state.json`` (its ``log_history``, as written by TRL's ``GRPOTrainer``:
  ``reward``, ``toolgym/success``, ``toolgym/tool_call_rate``, ...), or the demo's ``metrics.json``
  (``grpo.steps``). :func:`load_training_log` normalises them all to rows with the short names.
* :func:`plot_runs`: the same metrics for several runs overlaid, one panel per metric, one line per run (legend:
  the run name, by default from the log's path); ``toolgym plot curves LOG1 LOG2 ... --out curves.png``.
* :func:`plot_latency_histogram`: per-tool latency histograms (log-scaled milliseconds) from trajectory JSONL
  files (every ``turns[].results[].latency_s``), a :class:`~toolgym.tools.executor.ToolExecutor` or its
  ``metrics``, a ``{tool: [seconds, ...]}`` mapping, or a JSON file holding such a mapping (optionally under a
  ``"latencies_s"`` key).

matplotlib is imported lazily and switched to the non-interactive Agg backend: no display is needed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "latencies_from",
    "load_training_log",
    "plot_latency_histogram",
    "plot_runs",
    "plot_training_curves",
    "run_names",
]

#: Short metric name -> the names it may have in a log (first match wins).
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "rewards/env_reward/mean", "train/reward", "env_reward"),
    "success": ("success", "toolgym/success", "train/toolgym/success"),
    "tool_call_rate": ("tool_call_rate", "toolgym/tool_call_rate", "train/toolgym/tool_call_rate"),
    "calls_per_episode": ("calls_per_episode", "toolgym/calls_per_episode"),
    "turns": ("turns", "toolgym/turns"),
    "truncated": ("truncated", "toolgym/truncated"),
    "loss": ("loss", "train/loss"),
    "reward_std": ("reward_std", "train/reward_std"),
}
STEP_KEYS = ("step", "global_step", "train/global_step")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _normalise(raw: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(raw):
        if not isinstance(r, Mapping):
            continue
        row: dict[str, Any] = {}
        step = next((r[k] for k in STEP_KEYS if k in r and _finite(r[k]) is not None), None)
        row["step"] = int(float(step)) if step is not None else i + 1
        for short, names in METRIC_ALIASES.items():
            for n in names:
                v = _finite(r.get(n))
                if v is not None:
                    row[short] = v
                    break
        errors = r.get("errors")
        if isinstance(errors, Mapping):
            row["errors"] = {str(k): float(v) for k, v in errors.items() if _finite(v) is not None}
        else:
            errs = {k.rsplit("/", 1)[-1]: float(v) for k, v in r.items()
                    if isinstance(k, str) and k.startswith(("toolgym/errors/", "train/toolgym/errors/"))
                    and _finite(v) is not None}
            if errs:
                row["errors"] = errs
        if len(row) > 1:  # some metric besides the step
            rows.append(row)
    return rows


def load_training_log(source: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-step metric rows ``[{"step", "reward", "success", "tool_call_rate", ..., "errors": {kind: x}}]``.

    ``source``: a path (``.jsonl`` of rows, a JSON list of rows, ``trainer_state.json`` with ``log_history``, or
    the demo's ``metrics.json`` with ``grpo.steps``) or the already-loaded rows / dict. Rows without any known
    metric (e.g. TRL's final ``train_runtime`` summary) are dropped; a row without a step gets its 1-based index.

    Raises:
        FileNotFoundError: the path does not exist. ValueError: the file is neither JSON nor JSONL, or it is a
            trajectory file (episodes, not steps: a curve over its rows would mean nothing).
    """
    data: Any = source
    if isinstance(source, str | Path):
        text = Path(source).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            from toolgym.jsonl import iter_jsonl

            try:
                data = [row for _, row in iter_jsonl(source, objects=False)]
            except ValueError as e:  # "<path>:<line>: not valid JSON (...)"
                raise ValueError(f"neither JSON nor JSONL: {e}") from None
    if isinstance(data, Mapping):
        if "log_history" in data:
            data = data["log_history"]
        elif isinstance(data.get("grpo"), Mapping) and "steps" in data["grpo"]:
            data = data["grpo"]["steps"]
        elif "steps" in data:
            data = data["steps"]
        else:
            data = [data]
    rows = list(data)
    if any(isinstance(r, Mapping) and "completion_ids" in r and "loss_mask" in r for r in rows[:5]):
        where = f"{source}: " if isinstance(source, str | Path) else ""
        raise ValueError(f"{where}a trajectory file (one episode per row), not a training log with one row per "
                         "step: give the trainer's log (JSONL rows, trainer_state.json, the demo's metrics.json); "
                         "for trajectories use `toolgym view` or `toolgym plot latency`")
    return _normalise(rows)


def plot_training_curves(
    log: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any],
    out: str | Path,
    *,
    metrics: Sequence[str] = ("reward", "success", "tool_call_rate"),
    title: str | None = "training",
    smooth: int = 1,
) -> Path:
    """Plot metric curves against the training step and save a PNG; returns ``out``.

    Rates (``success``, ``tool_call_rate``, ``truncated``) and the reward share the left panel; when the log has
    error counts (``errors`` per kind, per episode) they get a second panel.

    Args:
        log: see :func:`load_training_log`.
        out: the PNG path (parent directories are created).
        metrics: which short metric names to draw (those absent from the log are skipped).
        title: figure title.
        smooth: moving-average window in steps (1 = raw values); the raw values stay as faint points.

    Raises:
        ValueError: the log has none of the requested metrics.
    """
    rows = load_training_log(log)
    present = [m for m in metrics if any(m in r for r in rows)]
    if not present:
        raise ValueError(f"the training log has none of the metrics {list(metrics)} (rows: {len(rows)})")
    kinds = sorted({k for r in rows for k, v in (r.get("errors") or {}).items() if v})
    plt = _pyplot()
    ncols = 2 if kinds else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4), squeeze=False)
    ax = axes[0][0]
    for m in present:
        pts = [(r["step"], r[m]) for r in rows if m in r]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if smooth > 1 and len(ys) > 1:
            line = ax.plot(xs, _moving_average(ys, smooth), "-", label=f"{m} (avg {smooth})")[0]
            ax.plot(xs, ys, ".", alpha=0.35, color=line.get_color())
        else:
            ax.plot(xs, ys, "o-" if len(xs) < 40 else "-", label=m, markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    if kinds:
        ax2 = axes[0][1]
        for k in kinds:
            pts = [(r["step"], (r.get("errors") or {}).get(k, 0.0)) for r in rows]
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if len(pts) < 40 else "-", label=k, markersize=4)
        ax2.set_xlabel("step")
        ax2.set_ylabel("errors per episode")
        ax2.set_title("tool errors by kind")
        ax2.grid(alpha=0.3)
        ax2.legend()
    return _save(fig, out)


#: Log file stems too generic to name a run: the run is then named after the log's folder.
GENERIC_STEMS = frozenset({"trainer_state", "metrics", "log", "logs", "train", "training", "history", "steps"})


def run_names(paths: Sequence[str | Path]) -> list[str]:
    """A legend name per training log: the file stem, or its folder's name when the stem is generic
    (``out/run-a/trainer_state.json`` -> ``run-a``); duplicates get the parent folders prepended until unique
    (then ``#2``, ``#3`` suffixes)."""
    ps = [Path(p) for p in paths]
    depth = [0 if p.stem not in GENERIC_STEMS else 1 for p in ps]

    def name(p: Path, d: int) -> str:
        parts = [*p.parent.parts[len(p.parent.parts) - d :], p.stem] if d else [p.stem]
        if p.stem in GENERIC_STEMS and d:
            parts = parts[:-1]
        return "/".join(x for x in parts if x not in ("", "/", ".")) or p.stem

    names = [name(p, d) for p, d in zip(ps, depth, strict=True)]
    for _ in range(8):
        dup = {n for n in names if names.count(n) > 1}
        if not dup:
            break
        for i, p in enumerate(ps):
            if names[i] in dup and depth[i] < len(p.parent.parts):
                depth[i] += 1
                names[i] = name(p, depth[i])
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} #{seen[n]}")
    return out


def plot_runs(
    logs: Sequence[str | Path] | Mapping[str, str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any]],
    out: str | Path,
    *,
    metrics: Sequence[str] = ("reward", "success", "tool_call_rate"),
    title: str | None = "training runs",
    smooth: int = 1,
) -> Path:
    """Overlay several runs' training curves and save a PNG; returns ``out``.

    One panel per metric (those present in at least one log), one line per run, the same colour for a run in
    every panel, and a legend with the run names.

    Args:
        logs: training-log paths (named by :func:`run_names`) or a ``{run name: log}`` mapping (each log as
            :func:`load_training_log` takes it).
        out: the PNG path (parent directories are created).
        metrics: short metric names to draw.
        title: figure title.
        smooth: moving-average window in steps (1 = raw values).

    Raises:
        ValueError: no log given, or no log has any of the requested metrics.
        FileNotFoundError: a log path does not exist.
    """
    named = dict(logs) if isinstance(logs, Mapping) else dict(zip(run_names(list(logs)), logs, strict=True))
    if not named:
        raise ValueError("plot_runs needs at least one training log")
    runs = {name: load_training_log(log) for name, log in named.items()}
    present = [m for m in metrics if any(m in r for rows in runs.values() for r in rows)]
    if not present:
        raise ValueError(f"none of the {len(runs)} training logs has any of the metrics {list(metrics)}")
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(present), figsize=(5.2 * len(present), 4), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, m in enumerate(present):
        ax = axes[0][j]
        for i, (name, rows) in enumerate(runs.items()):
            pts = [(r["step"], r[m]) for r in rows if m in r]
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            c = colours[i % len(colours)]
            ys_line = _moving_average(ys, smooth) if smooth > 1 else ys
            ax.plot(xs, ys_line, "o-" if len(xs) < 40 else "-", label=name, color=c, markersize=3)
            if smooth > 1:
                ax.plot(xs, ys, ".", alpha=0.3, color=c)
        ax.set_title(m + (f" (avg {smooth})" if smooth > 1 else ""))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if j == 0:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, out)


def _save(fig: Any, out: str | Path) -> Path:
    """Lay out, write ``fig`` as a PNG at ``out`` (parents created) and close it."""
    plt = _pyplot()
    fig.tight_layout()
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _moving_average(ys: Sequence[float], w: int) -> list[float]:
    out = []
    for i in range(len(ys)):
        win = ys[max(0, i - w + 1) : i + 1]
        out.append(sum(win) / len(win))
    return out


def latencies_from(source: Any) -> dict[str, list[float]]:
    """``{tool name: [latency in seconds, ...]}`` from any of the sources :func:`plot_latency_histogram` takes.

    Sources: a trajectory JSONL path or a list of paths; trajectory rows or :class:`~toolgym.trajectory.Trajectory`
    objects; a ``ToolExecutor`` or ``ExecutorMetrics`` (``latencies_s``); a ``{tool: [seconds]}`` mapping; a JSON
    file with such a mapping (top level or under ``"latencies_s"``). Calls that failed before running (parse
    errors, unknown tools, invalid arguments) are left out of trajectory sources: they have no real latency.
    """
    if hasattr(source, "metrics") and hasattr(source.metrics, "latencies_s"):
        source = source.metrics
    if hasattr(source, "latencies_s"):
        return {str(k): [float(x) for x in v] for k, v in dict(source.latencies_s).items() if v}
    if isinstance(source, str | Path):
        p = Path(source)
        if p.suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            data = data.get("latencies_s", data) if isinstance(data, Mapping) else data
            return latencies_from(data)
        from toolgym.report.viewer import load_trajectory_rows

        return latencies_from(load_trajectory_rows(p))
    if isinstance(source, Mapping):
        out: dict[str, list[float]] = {}
        for k, v in source.items():
            xs = [f for f in (_finite(x) for x in v) if f is not None] if isinstance(v, Iterable) else []
            if xs:
                out[str(k)] = xs
        return out
    items = list(source)
    if items and all(isinstance(x, str | Path) for x in items):
        merged: dict[str, list[float]] = {}
        for x in items:
            for k, v in latencies_from(x).items():
                merged.setdefault(k, []).extend(v)
        return merged
    merged = {}
    skip = {"parse_error", "unknown_tool", "invalid_arguments"}
    for t in items:
        row = t if isinstance(t, Mapping) else t.to_dict()
        for turn in row.get("turns", []):
            for r in turn.get("results", []):
                if r.get("error_kind") in skip:
                    continue
                name = (r.get("call") or {}).get("name") or "?"
                v = _finite(r.get("latency_s"))
                if v is not None:
                    merged.setdefault(name, []).append(v)
    return merged


def plot_latency_histogram(
    source: Any,
    out: str | Path,
    *,
    title: str | None = "tool-call latency",
    bins: int = 40,
    log_scale: bool = True,
) -> Path:
    """Histogram of tool-call latencies per tool (milliseconds), with p50/p99 in the legend; saves a PNG.

    Args:
        source: see :func:`latencies_from`.
        out: the PNG path (parent directories are created).
        title: figure title.
        bins: number of bins.
        log_scale: log-spaced bins and a log x axis (latencies span orders of magnitude).

    Raises:
        ValueError: no latency in ``source``.
    """
    import numpy as np

    lat = latencies_from(source)
    if not lat:
        raise ValueError("no tool-call latencies found in the source")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    all_ms = np.concatenate([np.asarray(v, dtype=float) * 1e3 for v in lat.values()])
    lo, hi = max(float(all_ms.min()), 1e-3), max(float(all_ms.max()), 1e-3)
    if log_scale:
        edges = np.logspace(math.log10(lo) - 0.05, math.log10(hi) + 0.05, bins + 1)
    else:
        edges = np.linspace(0.0, hi * 1.02, bins + 1)
    for name, xs in sorted(lat.items()):
        ms = np.clip(np.asarray(xs, dtype=float) * 1e3, edges[0], edges[-1])
        p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
        ax.hist(ms, bins=edges, alpha=0.6, label=f"{name}: n={len(ms)}, p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    if log_scale:
        ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("calls")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out)
