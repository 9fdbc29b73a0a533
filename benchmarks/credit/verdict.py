"""The credit experiment's statistics and the rule that turns them into its verdict (docs/credit.md): per estimator
against ``outcome``, paired per seed and pooled, and across seeds (:func:`benchmarks.common.stats.across_seeds`)."""

from __future__ import annotations

from typing import Any

from benchmarks.common.stats import across_seeds

__all__ = ["MID_MARGIN", "broken_baseline", "summarize", "validation_choice", "verdict"]

#: non-inferiority margin of the "reaches outcome's final success in 60% of the budget" criterion (success points)
MID_MARGIN = 0.05


def verdict(summary: dict[str, Any], est: str) -> str:
    """The protocol's one-sentence answer for ``est`` from :func:`summarize`'s across-seed statistics."""
    s = summary.get(est) or {}
    final, mid = s.get("final_vs_outcome_across_seeds") or {}, s.get("mid_vs_outcome_final_across_seeds") or {}
    if not final.get("seeds"):
        return f"{est}: no paired seeds yet"
    n = len(final["seeds"])
    beats = final["t_lo"] > 0 and final["boot_lo"] > 0
    reaches = bool(mid.get("seeds")) and mid["mean"] >= 0 and mid["boot_lo"] > -MID_MARGIN
    if beats or reaches:
        how = []
        if reaches:
            how.append(f"reaches outcome-only GRPO's final held-out success at 60% of the budget "
                       f"({mid['mean']:+.1%}, bootstrap CI [{mid['boot_lo']:+.1%}, {mid['boot_hi']:+.1%}])")
        if beats:
            how.append(f"beats it at equal budget ({final['mean']:+.1%}, t CI [{final['t_lo']:+.1%}, "
                       f"{final['t_hi']:+.1%}], bootstrap CI [{final['boot_lo']:+.1%}, {final['boot_hi']:+.1%}])")
        return f"{est} helps across {n} seeds: it " + " and ".join(how) + "."
    return (f"{est} does not help across {n} seeds: at equal budget {final['mean']:+.1%} (t CI [{final['t_lo']:+.1%}, "
            f"{final['t_hi']:+.1%}], bootstrap CI [{final['boot_lo']:+.1%}, {final['boot_hi']:+.1%}]), at 60% of the "
            f"budget vs outcome's final {mid.get('mean', float('nan')):+.1%}.")


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per estimator: held-out success per seed; vs ``outcome``: paired differences per seed and pooled, and the
    across-seed statistics of the final and the 60%-budget evaluations (:func:`across_seeds`)."""
    from toolgym.evaluation import paired_difference_ci

    arms = results["arms"]
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for a in arms.values():
        by.setdefault(a["estimator"], {})[a["seed"]] = a
    out: dict[str, Any] = {}
    base = by.get("outcome", {})
    for est, seeds in by.items():
        s: dict[str, Any] = {"seeds": sorted(seeds), "success": {k: v["eval"]["success"] for k, v in seeds.items()},
                             "steps_reached": {k: v["eval"]["steps_reached"] for k, v in seeds.items()},
                             "tokens": {k: v["tokens"] for k, v in seeds.items()}}
        if est != "outcome":
            common = sorted(set(seeds) & set(base))
            s["vs_outcome_per_seed"] = {k: paired_difference_ci(base[k]["eval"]["wins"], seeds[k]["eval"]["wins"])
                                        for k in common}
            if common:
                n = len(base[common[0]]["eval"]["wins"])
                mean_b = [sum(base[k]["eval"]["wins"][i] for k in common) / len(common) for i in range(n)]
                mean_e = [sum(seeds[k]["eval"]["wins"][i] for k in common) / len(common) for i in range(n)]
                s["vs_outcome_pooled"] = paired_difference_ci(mean_b, mean_e)
                pb = [sum(base[k]["eval"]["per_task_progress"][i] for k in common) / len(common) for i in range(n)]
                pe = [sum(seeds[k]["eval"]["per_task_progress"][i] for k in common) / len(common) for i in range(n)]
                s["steps_reached_vs_outcome_pooled"] = paired_difference_ci(pb, pe)
            base_wins = {k: base[k]["eval"]["wins"] for k in common}
            s["final_vs_outcome_across_seeds"] = across_seeds(base_wins, {k: seeds[k]["eval"]["wins"] for k in common})
            mids = {k: seeds[k]["mid_eval"]["wins"] for k in common if seeds[k].get("mid_eval")}
            s["mid_vs_outcome_final_across_seeds"] = across_seeds(base_wins, mids)
        out[est] = s
    return out


def validation_choice(results: dict[str, Any]) -> dict[str, Any]:
    """The validation run's decisions, by the rules fixed in docs/credit.md: does outcome-only GRPO learn (its
    validation success above the warm start's, the paired 95% CI over tasks above 0), and gamma = the candidate
    whose turn_return arm has the highest validation success (ties: the larger gamma)."""
    from toolgym.evaluation import paired_difference_ci

    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("wins")
    arms = list(results["arms"].values())
    outcome = next((a for a in arms if a["estimator"] == "outcome"), None)
    learns = None
    if ws is not None and outcome is not None:
        d = paired_difference_ci(ws, outcome["eval"]["wins"])
        learns = {"warmstart": sum(ws) / len(ws), "outcome": outcome["eval"]["success"], "diff": d,
                  "learns": d["lo"] > 0}
    tr = [a for a in arms if a["estimator"] == "turn_return"]
    best = max(tr, key=lambda a: (a["eval"]["success"], a.get("gamma", 1.0)), default=None)
    return {"outcome_learns": learns, "gamma": best.get("gamma") if best else None,
            "turn_return_success_by_gamma": {str(a.get("gamma")): a["eval"]["success"] for a in tr}}


def broken_baseline(results: dict[str, Any]) -> str | None:
    """The protocol's broken-baseline rule: a sentence when ``outcome`` ends below the warm start's held-out
    success on most of its seeds (the comparison is then inconclusive), else ``None``."""
    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("success")
    outs = [a["eval"]["success"] for a in results["arms"].values() if a["estimator"] == "outcome"]
    below = sum(o < ws for o in outs) if ws is not None else 0
    if ws is None or not outs or 2 * below <= len(outs):
        return None
    return (f"outcome-only GRPO ends below the warm start ({ws:.0%}) on {below} of {len(outs)} seeds: a broken "
            "baseline, not a win for credit")

