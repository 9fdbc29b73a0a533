"""The promotion decision of the model registry (:func:`trainers.tracking.registry.promote`), without the store: the paired
comparison of two evaluations (:func:`compare`) and the record of a promotion (:func:`decide`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from toolgym.errors import CLIError, ExitCode

__all__ = ["compare", "decide", "short_env_id"]


def short_env_id(env_id: Any) -> str:
    """``env_id`` without its namespace (``toolgym/Calculator-v0`` -> ``Calculator-v0``)."""
    return str(env_id).split("/", 1)[-1]


def compare(champion: Mapping[str, Any], challenger: Mapping[str, Any]) -> dict[str, Any]:
    """Paired comparison of two evaluations on the same env, split and task set: per-task success aligned by
    task id, ``toolgym.evaluation.paired_difference_ci(before=champion, after=challenger)``. Returns ``{"comparable":
    bool, "why": str, "mean", "lo", "hi", "n"}``; ``better`` is ``lo > 0``."""
    for key in ("env_id", "split"):
        if short_env_id(champion[key]) != short_env_id(challenger[key]):
            return {"comparable": False, "better": False,
                    "why": f"different {key}: {challenger[key]} vs the champion's {champion[key]}"}
    a = {str(t): float(s) for t, s in zip(champion["task_ids"], champion["per_task_success"], strict=True)}
    b = {str(t): float(s) for t, s in zip(challenger["task_ids"], challenger["per_task_success"], strict=True)}
    if set(a) != set(b):
        return {"comparable": False, "better": False,
                "why": f"different task sets ({len(b)} tasks, {len(set(a) & set(b))} shared with the champion's "
                       f"{len(a)}): evaluate both on the same tasks (`toolgym registry attach-eval`)"}
    from toolgym.evaluation import paired_difference_ci

    ids = sorted(a)
    ci = paired_difference_ci([a[t] for t in ids], [b[t] for t in ids])
    better = float(ci["lo"]) > 0
    return {"comparable": True, "better": better, "mean": float(ci["mean"]), "lo": float(ci["lo"]),
            "hi": float(ci["hi"]), "n": int(ci["n"]),
            "why": f"paired difference {ci['mean']:+.3f}, 95% CI [{ci['lo']:+.3f}, {ci['hi']:+.3f}] over "
                   f"{ci['n']} tasks" + ("" if better else " includes or is below 0")}


def decide(name: str, version: Any, alias: str, holder: Any, new_ev: Mapping[str, Any] | None,
           old_ev: Mapping[str, Any] | None, *, force: bool = False, reason: str | None = None) -> dict[str, Any]:
    """The promotion record of ``version`` (evaluation ``new_ev``) against the alias's ``holder`` (``None``: no
    holder; its evaluation ``old_ev``): the comparison, whether it was forced, and the reason. Raises
    :class:`~toolgym.errors.CLIError` (exit 1, the registry's refusal) when it does not beat the holder and is not
    ``force``d."""
    result: dict[str, Any]
    if holder is None:
        result = {"comparable": True, "better": new_ev is not None,
                  "why": "no current holder" if new_ev is not None else f"v{version} has no evaluation"}
    elif new_ev is None:
        result = {"comparable": False, "better": False, "why": f"v{version} has no evaluation "
                  "(`toolgym registry attach-eval`)"}
    else:
        result = (compare(old_ev, new_ev) if old_ev is not None else
                  {"comparable": False, "better": False, "why": f"the {alias} v{holder} has no evaluation"})
    if not result["better"] and not force:
        who = f"the {alias} v{holder}" if holder is not None else f"{alias}"
        raise CLIError(f"refused: {name} v{version} does not beat {who}: {result['why']} "
                       "(--force --reason TEXT to override)", ExitCode.FAILURE)
    record = {"from": None if holder is None else int(holder), "at": int(time.time()), "forced": bool(force
              and not result["better"]), **{k: v for k, v in result.items() if k != "better"}}
    if record["forced"]:
        record["reason"] = reason
    return record
