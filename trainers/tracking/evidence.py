"""What the registry checks before it creates anything: that a directory is a whole model, that an evaluation file
is a ``toolgym eval --json`` report, and that the evaluation is evidence for the checkpoint it is registered with
(the weights hash it records is the checkpoint's); and the tags and metrics an evaluation becomes.
:mod:`trainers.tracking.registry` re-exports these.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.errors import CLIError, ExitCode
from toolgym.weights import WeightsError, check_weights
from trainers.tracking import LINEAGE_FILE
from trainers.tracking.promotion import short_env_id

__all__ = ["EVAL_KEYS", "RegistryError", "check_eval_weights", "eval_metrics", "eval_tags", "load_eval",
           "task_set_hash", "validate_checkpoint"]

EVAL_KEYS = ("env_id", "split", "n_tasks", "success", "task_ids", "per_task_success")
"""Keys a ``toolgym eval --json`` file must have to be attached to a version."""

_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class RegistryError(CLIError):
    """A registry failure with the ``toolgym`` exit code to return."""


def validate_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check that ``path`` is a loadable model directory (``config.json`` with a ``model_type`` or an adapter
    config, whole weights (:func:`toolgym.weights.check_weights`), a tokenizer); returns its lineage: the checkpoint's ``toolgym_run.json`` when present, else
    what ``config.json`` says (``base_model`` from ``_name_or_path``), unknown fields ``None``.

    Raises:
        RegistryError (exit 3): not a directory, not a model, or a missing / truncated weights file (named).
    """
    d = Path(path).expanduser()
    if not d.is_dir():
        raise RegistryError(f"{path}: not a directory (give a saved model directory)", ExitCode.INPUT)
    cfg_file = d / ("config.json" if (d / "config.json").is_file() else "adapter_config.json")
    try:
        cfg = json.loads(cfg_file.read_text())
    except FileNotFoundError:
        raise RegistryError(f"{path}: not a model directory (no config.json)", ExitCode.INPUT) from None
    except (OSError, ValueError) as e:
        raise RegistryError(f"{cfg_file}: unreadable model config: {e}", ExitCode.INPUT) from None
    if not isinstance(cfg, dict) or not (cfg.get("model_type") or cfg.get("peft_type")):
        raise RegistryError(f"{cfg_file}: not a transformers model config (no model_type)", ExitCode.INPUT)
    try:
        check_weights(d)  # whole, not just present: a truncated file is refused here, naming it
    except WeightsError as e:
        raise RegistryError(e.message, ExitCode.INPUT) from None
    if not any((d / t).is_file() for t in _TOKENIZER):
        raise RegistryError(f"{path}: no tokenizer files (save the tokenizer with the model)", ExitCode.INPUT)
    lineage: dict[str, Any] = {"training_run_id": None, "env_id": None, "split": None, "config_hash": None,
                               "base_model": cfg.get("_name_or_path") or cfg.get("base_model_name_or_path") or None,
                               "model_type": cfg.get("model_type") or cfg.get("peft_type")}
    lf = d / LINEAGE_FILE
    if lf.is_file():
        try:
            recorded = json.loads(lf.read_text())
        except (OSError, ValueError) as e:
            raise RegistryError(f"{lf}: unreadable lineage file: {e}", ExitCode.INPUT) from None
        lineage.update({k: v for k, v in recorded.items() if v is not None})
    return lineage


def task_set_hash(task_ids: Sequence[Any]) -> str:
    """12 hex digits identifying a set of task ids (order-free)."""
    return hashlib.sha256("\n".join(sorted(map(str, task_ids))).encode()).hexdigest()[:12]


def load_eval(path: str | Path, *, env_id: str | None = None) -> dict[str, Any]:
    """Read and check a ``toolgym eval --json`` file (:data:`EVAL_KEYS`, aligned ``task_ids`` /
    ``per_task_success``); with ``env_id``, it must be that env's evaluation.

    Raises:
        RegistryError (exit 3): unreadable, malformed, or for a different env.
    """
    try:
        ev = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise RegistryError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}", ExitCode.INPUT) from None
    except ValueError as e:
        raise RegistryError(f"{path}: not JSON ({e})", ExitCode.INPUT) from None
    if not isinstance(ev, dict):
        raise RegistryError(f"{path}: not a `toolgym eval --json` summary (not an object)", ExitCode.INPUT)
    missing = [k for k in EVAL_KEYS if k not in ev]
    if missing:
        raise RegistryError(f"{path}: not a `toolgym eval --json` summary (missing {', '.join(missing)})",
                            ExitCode.INPUT)
    ids, per = ev["task_ids"], ev["per_task_success"]
    if not isinstance(ids, list) or not isinstance(per, list) or len(ids) != len(per) or not ids:
        raise RegistryError(f"{path}: task_ids and per_task_success must be non-empty lists of equal length",
                            ExitCode.INPUT)
    if len(set(map(str, ids))) != len(ids):
        raise RegistryError(f"{path}: task_ids has duplicates", ExitCode.INPUT)
    if env_id and short_env_id(ev["env_id"]) != short_env_id(env_id):
        raise RegistryError(f"{path}: an evaluation of {ev['env_id']}, but the checkpoint was trained on {env_id}",
                            ExitCode.INPUT)
    return ev


def check_eval_weights(ev: Mapping[str, Any], eval_path: str | Path, weights_sha256: str, what: str, *,
                       unverified: bool = False) -> bool:
    """Check that an evaluation is of the weights ``weights_sha256`` (:func:`toolgym.weights.weights_hash` of
    ``what``, a checkpoint or a version): its ``evaluated`` record (``toolgym eval --json``) must name a checkpoint
    with that hash. A report without the record (from an older ``toolgym eval``) passes only with ``unverified``.
    Returns whether the evaluation was verified.

    Raises:
        RegistryError (exit 3): an evaluation of other weights, of a policy that is not a checkpoint (the oracle, a
            server, ``tiny``, ``embedded``), or without the record and not ``unverified``.
    """
    rec = ev.get("evaluated")
    if rec is None:
        if unverified:
            return False
        raise RegistryError(f"{eval_path}: does not record which weights it evaluated (an older `toolgym eval`); "
                            "evaluate the checkpoint again with `toolgym eval --json`, or pass --unverified-eval to "
                            "attach it anyway", ExitCode.INPUT)
    if not isinstance(rec, Mapping) or rec.get("kind") != "checkpoint" or not rec.get("weights_sha256"):
        kind = rec.get("kind") if isinstance(rec, Mapping) else rec
        raise RegistryError(f"{eval_path}: an evaluation of the policy {ev.get('policy')!r} ({kind}), not of a "
                            f"checkpoint: it is no evidence for {what}", ExitCode.INPUT)
    if rec["weights_sha256"] != weights_sha256:
        raise RegistryError(f"{eval_path}: evaluates other weights ({rec.get('path')}, sha256 "
                            f"{str(rec['weights_sha256'])[:12]}) than {what} (sha256 {weights_sha256[:12]})",
                            ExitCode.INPUT)
    return True


def eval_tags(ev: Mapping[str, Any]) -> dict[str, str]:
    """The version tags (``eval.*``) that summarise an evaluation."""
    ci = ev.get("success_ci95")
    tags = {"eval.env_id": str(ev["env_id"]), "eval.split": str(ev["split"]), "eval.n_tasks": str(ev["n_tasks"]),
            "eval.task_set": task_set_hash(ev["task_ids"]), "eval.success": f"{float(ev['success']):.4f}",
            "eval.policy": str(ev.get("policy", ""))[:500]}
    if ci:
        tags["eval.success_ci95"] = f"{float(ci[0]):.4f},{float(ci[1]):.4f}"
    for key in ("k", "seed", "pass_at_k", "reward", "tool_call_rate"):
        if ev.get(key) is not None and not isinstance(ev[key], dict | list):
            tags[f"eval.{key}"] = str(ev[key])
    return tags


def eval_metrics(ev: Mapping[str, Any]) -> dict[str, float]:
    """The registration run's metrics (``eval/*``) from an evaluation's scores."""
    out = {}
    for key in ("success", "pass_at_k", "mean_at_k", "reward", "tool_call_rate"):
        if isinstance(ev.get(key), int | float) and not isinstance(ev.get(key), bool):
            out[f"eval/{key}"] = float(ev[key])
    ci = ev.get("success_ci95")
    if ci:
        out["eval/success_ci95_lo"], out["eval/success_ci95_hi"] = float(ci[0]), float(ci[1])
    return out
