"""The demo's run in the tracking store and its evaluations as the registry takes them.

:func:`eval_reports` writes each held-out evaluation of a saved checkpoint (after the warm start, after GRPO) as a
``toolgym eval --json`` report next to the demo's outputs (``eval_after_warmstart.json``, ``eval_after_grpo.json``):
the same keys, the task ids and per-task successes promotion pairs, and the checkpoint's weights hash, so
``toolgym registry register runs/demo/final --eval runs/demo/eval_after_grpo.json`` (and the UI's Register form,
which lists them) accepts it.

:func:`log_run` records the demo as one finished MLflow run in the local store (:func:`trainers.tracking
.configure_mlflow`: ``runs/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` says otherwise, the store ``toolgym ui --runs
runs`` reads): the demo's config as parameters; per GRPO step ``reward``, ``loss``, ``frac_reward_zero_std`` and the
``toolgym/*`` episode metrics; the warm start's loss per step (``toolgym/warmstart_loss``); the held-out success
before / after the warm start / after GRPO (``toolgym/heldout/*``, fractions, with their 95% CI bounds) and GRPO's
paired gain; ``metrics.json``, ``demo.png``, the evaluation reports and the trajectory files as artifacts; the
lineage file in both checkpoints, so a registered version names this run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["EVAL_REPORTS", "STEP_METRICS", "eval_reports", "heldout_summary", "log_run"]

#: the held-out evaluation of each saved checkpoint: ``metrics.json`` key -> (checkpoint key, report file name)
EVAL_REPORTS = {"eval_after_warmstart": ("warmstart", "eval_after_warmstart.json"),
                "eval_after_grpo": ("final", "eval_after_grpo.json")}

#: a GRPO step row's key (the demo's step printer) -> the metric name a ``toolgym train grpo`` run logs it under
STEP_METRICS = {"reward": "reward", "reward_std": "reward_std", "frac_reward_zero_std": "frac_reward_zero_std",
                "loss": "loss", "success": "toolgym/success", "tool_call_rate": "toolgym/tool_call_rate",
                "calls_per_episode": "toolgym/calls_per_episode", "turns": "toolgym/turns",
                "step_s": "toolgym/step_seconds"}

_HELDOUT = {"eval_before": "before", "eval_after_warmstart": "after_warmstart", "eval_after_grpo": "after_grpo"}


def heldout_summary(trajectories: Sequence[Any], path: Path, wall_s: float) -> dict[str, Any]:
    """One held-out evaluation's entry of ``metrics.json``: :func:`toolgym.trajectory.summarize` plus ``n_tasks``,
    ``per_task_success`` (1.0 / 0.0 per task, aligned with ``eval_task_ids``: what promotion pairs), its Wilson
    ``success_ci95``, the trajectory file ``out`` and ``wall_s`` (seconds)."""
    from toolgym.evaluation import wilson_interval
    from toolgym.trajectory import summarize

    s = summarize(trajectories)
    wins = [float(t.outcome_reward >= 1.0) for t in trajectories]
    s.update(n_tasks=len(wins), per_task_success=wins, success_ci95=list(wilson_interval(int(sum(wins)), len(wins))),
             out=str(path), wall_s=round(wall_s, 1))
    return s


def eval_reports(metrics: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``<out>/eval_after_warmstart.json`` and ``<out>/eval_after_grpo.json`` (``toolgym eval --json``'s
    shape, ``evaluated`` naming the checkpoint and its weights hash); returns the files written. An evaluation
    without per-task successes, or whose checkpoint is not saved, is skipped."""
    from toolgym.weights import check_weights, weights_hash

    written = []
    for key, (ckpt_key, name) in EVAL_REPORTS.items():
        s = metrics.get(key)
        ckpt = Path(str(metrics.get("checkpoints", {}).get(ckpt_key, "")))
        if not isinstance(s, Mapping) or "per_task_success" not in s or not ckpt.is_dir():
            continue
        files = check_weights(ckpt)
        report = {
            "env_id": metrics["env_id"], "split": metrics.get("eval_split", "test"), "n_tasks": s["n_tasks"], "k": 1,
            "seed": metrics["eval_seeds"][0], "policy": str(ckpt.resolve()), "episodes": s["n_tasks"],
            "success": s["success"], "success_ci95": list(s["success_ci95"]), "pass_at_k": None,
            "mean_at_k": None, "reward": s.get("reward"), "tool_call_rate": s.get("tool_call_rate"),
            "calls_per_episode": s.get("calls_per_episode"), "turns": s.get("turns"),
            "truncated": s.get("truncated", 0.0), "errors": s.get("errors", {}),
            "episode_errors": s.get("episode_errors", {}), "wall_s": s.get("wall_s"),
            "out": s.get("out"), "task_ids": [str(t) for t in metrics["eval_task_ids"]],
            "per_task_success": [float(x) for x in s["per_task_success"]],
            "evaluated": {"kind": "checkpoint", "path": str(ckpt.resolve()),
                          "weights_sha256": weights_hash(ckpt, files)},
        }
        path = out / name
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


def _params(config: Mapping[str, Any]) -> dict[str, str]:
    return {f"demo.{k}": (v if isinstance(v, str) else json.dumps(v, default=str))[:6000] for k, v in config.items()}


def log_run(metrics: Mapping[str, Any], out: Path, *, run_name: str | None = None) -> str:
    """Log the finished demo (``metrics``: what ``metrics.json`` holds) as one MLflow run; returns its run id.

    Raises:
        trainers.tracking.TrackingError: MLflow missing or the store unreachable / read-only.
    """
    from trainers.tracking import LINEAGE_FILE, configure_mlflow, quiet_logs

    quiet_logs()
    uri = configure_mlflow()
    import mlflow

    from toolgym import __version__

    grpo_steps = list(metrics.get("grpo", {}).get("steps", []))
    last_step = max((int(r["step"]) for r in grpo_steps), default=0)
    with mlflow.start_run(run_name=run_name or f"demo {out.name}") as run:
        run_id = run.info.run_id
        mlflow.log_params({"env_id": metrics["env_id"], **_params(metrics.get("config", {}))})
        mlflow.set_tags({"toolgym.kind": "train", "toolgym.algorithm": "demo (warm start + grpo)",
                         "toolgym.env_id": metrics["env_id"], "toolgym.split": "train",
                         "toolgym.base_model": "embedded:SmolLM2-135M-Instruct", "toolgym.version": __version__,
                         "toolgym.output_dir": str(out.resolve()),
                         "toolgym.trajectories": str((out / "trajectories").resolve())})
        for row in grpo_steps:
            vals = {name: float(row[k]) for k, name in STEP_METRICS.items() if isinstance(row.get(k), int | float)}
            vals.update({f"toolgym/errors/{k}": float(v) for k, v in dict(row.get("errors") or {}).items()})
            mlflow.log_metrics(vals, step=int(row["step"]))
        for i, loss in enumerate(metrics.get("warmstart", {}).get("loss", []), start=1):
            mlflow.log_metric("toolgym/warmstart_loss", float(loss), step=i)
        for key, tag in _HELDOUT.items():
            s = metrics.get(key)
            if isinstance(s, Mapping):
                lo, hi = s["success_ci95"]
                step = last_step if key == "eval_after_grpo" else 0
                mlflow.log_metrics({f"toolgym/heldout/{tag}": float(s["success"]),
                                    f"toolgym/heldout/{tag}_ci95_lo": float(lo),
                                    f"toolgym/heldout/{tag}_ci95_hi": float(hi)}, step=step)
        gain = metrics.get("grpo_gain")
        if isinstance(gain, Mapping):
            mlflow.log_metrics({"toolgym/heldout/grpo_gain": float(gain["mean"]),
                                "toolgym/heldout/grpo_gain_ci95_lo": float(gain["lo"]),
                                "toolgym/heldout/grpo_gain_ci95_hi": float(gain["hi"])}, step=last_step)
        for name in ("metrics.json", "demo.png", *(n for _, n in EVAL_REPORTS.values())):
            if (out / name).is_file():
                mlflow.log_artifact(str(out / name))
        if (out / "trajectories").is_dir():
            mlflow.log_artifacts(str(out / "trajectories"), "trajectories")
    for ckpt in dict(metrics.get("checkpoints", {})).values():
        d = Path(str(ckpt))
        if d.is_dir():  # the registry's lineage: a version registered from this checkpoint names this run
            try:
                kept = json.loads((d / LINEAGE_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                kept = {}
            kept = kept if isinstance(kept, dict) else {}
            kept.update({"training_run_id": run_id, "tracking_uri": uri, "env_id": metrics["env_id"],
                         "split": "train", "base_model": "embedded:SmolLM2-135M-Instruct",
                         "toolgym_version": __version__})
            (d / LINEAGE_FILE).write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
    return run_id
