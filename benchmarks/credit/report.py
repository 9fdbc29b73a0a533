"""The credit experiment's results assembled from its stage records alone, its Markdown report and its plot."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common.stages import write_json
from benchmarks.credit.protocol import ENV_ID, CreditBenchConfig, default_results_dir, plan
from benchmarks.credit.stages import load_done
from benchmarks.credit.verdict import broken_baseline, summarize, validation_choice, verdict

__all__ = ["collect_results", "plot", "report_markdown", "write_outputs"]


def collect_results(cfg: CreditBenchConfig, validate: bool = False,
                    results_dir: str | Path | None = None) -> dict[str, Any]:
    """The run's results assembled from its stage records (``RESULTS/<stage>-<key>.json``) alone: the arms
    finished so far, the warm start's evaluation, the summary statistics. What ``--report`` prints."""
    p = plan(cfg, validate)
    rdir = Path(results_dir) if results_dir is not None else default_results_dir(cfg)
    out = Path(cfg.output_dir)
    results: dict[str, Any] = {"config": asdict(cfg), "env_id": ENV_ID,
                               "eval_split": "validation (train split)" if validate else "test",
                               "results_dir": str(rdir), "arms": {}, "warmstart": None}
    ws_rec = load_done(p.warmstart, out, rdir)
    wse_rec = load_done(p.warmstart_eval, out, rdir)
    if ws_rec or wse_rec:
        results["warmstart"] = {**{k: (ws_rec or {}).get(k) for k in ("episodes", "loss", "wall_s", "digest")},
                                "eval": (wse_rec or {}).get("eval")}
    for name, stage, *_ in p.arms:
        rec = load_done(stage, out, rdir)
        if rec is not None:
            results["arms"][name] = rec
            results.setdefault("eval_task_ids", rec.get("eval_task_ids"))
    if wse_rec:
        results.setdefault("eval_task_ids", wse_rec.get("eval_task_ids"))
    for name, rec in [*results["arms"].items(), ("warm start", wse_rec or {})]:
        if rec.get("eval_task_ids") not in (None, results.get("eval_task_ids")):  # paired statistics need one task set
            raise ValueError(f"{name}: evaluated on other tasks than the other records in {rdir}")
    results["summary"] = summarize(results)
    results["total_wall_s"] = round(sum(a.get("train_s", 0) + a["eval"]["wall_s"] for a in results["arms"].values()), 1)
    return results


def write_outputs(results: dict[str, Any], out: Path) -> None:
    write_json(out / "results.json", results)
    if results["arms"]:
        plot(results, out / "credit.png")


def report_markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per finished arm) plus the paired comparisons available."""
    lines = ["| arm | GRPO steps | policy tokens | held-out success [95% CI] | chain steps reached | train s | eval s |",
             "|---|---|---|---|---|---|---|"]
    for name, a in results["arms"].items():
        ev = a["eval"]
        lo, hi = ev["success_ci95"]
        lines.append(f"| {name} | {a['steps']} | {a['tokens']} | {ev['success']:.0%} [{lo:.0%}, {hi:.0%}] | "
                     f"{ev['steps_reached']:.1%} | {a['train_s']:.0f} | {ev['wall_s']:.0f} |")
    summary = results.get("summary") or {}
    lines += _per_seed_tables(results, summary)
    for est, s in summary.items():
        if est == "outcome":
            continue
        for key, label in (("vs_outcome_pooled", "success"), ("steps_reached_vs_outcome_pooled", "steps reached")):
            d = s.get(key)
            if d:
                lines.append(f"\n{est} - outcome, {label} (paired over {d['n']} tasks, seeds {s['seeds']}): "
                             f"{d['mean']:+.3f} [95% CI {d['lo']:+.3f}, {d['hi']:+.3f}]")
        if not str(results.get("eval_split", "test")).startswith("validation"):
            planned, done = len(results["config"]["seeds"]), len(s.get("seeds") or ())
            label = "Verdict" if done >= planned else f"Provisional verdict ({done} of {planned} seeds finished)"
            lines.append(f"\n{label}: {verdict(summary, est)}")
    broken = broken_baseline(results)
    if broken and not str(results.get("eval_split", "")).startswith("validation"):
        lines.append(f"\nInconclusive: {broken}")
    if str(results.get("eval_split", "")).startswith("validation"):
        lines.append(f"\nValidation decisions: {json.dumps(validation_choice(results), default=str)}")
    return "\n".join(lines)


def _per_seed_tables(results: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Held-out success per seed (one column per estimator, and its 60%-budget evaluation for a turn-level one) and
    the across-seed statistics of each turn-level estimator against ``outcome``'s final success (the verdict's
    inputs: the per-seed differences in points, their mean, the t-interval and the bootstrap CI); the warm start's
    success and the arms' summed wall time under them. Empty for a validation run."""
    if str(results.get("eval_split", "test")).startswith("validation") or not results["arms"]:
        return []
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for a in results["arms"].values():
        by.setdefault(a["estimator"], {})[a["seed"]] = a
    ests = [e for e in ("outcome", "turn_return", "gigpo") if e in by]
    cols = [(e, "eval") for e in ests if e == "outcome"] + [(e, k) for e in ests if e != "outcome"
                                                             for k in ("mid_eval", "eval")]
    head = [f"{e} (60% of the budget)" if k == "mid_eval" else e for e, k in cols]
    lines = ["", "| seed | " + " | ".join(head) + " |", "|---" * (len(cols) + 1) + "|"]
    for seed in sorted({k for seeds in by.values() for k in seeds}):
        cells = []
        for e, k in cols:
            ev = (by[e].get(seed) or {}).get(k)
            cells.append("-" if not ev else f"{ev['success']:.0%}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    stats = [(e, label, (summary.get(e) or {}).get(key) or {}) for e in ests if e != "outcome"
             for key, label in (("final_vs_outcome_across_seeds", "final - outcome's final"),
                                ("mid_vs_outcome_final_across_seeds", "at 60% of the budget - outcome's final"))]
    stats = [x for x in stats if x[2].get("seeds")]
    if stats:
        lines += ["", "| estimator | held-out success, points | per seed | mean | t 95% CI | bootstrap 95% CI "
                  "| seeds above 0 |", "|---|---|---|---|---|---|---|"]
        for e, label, d in stats:
            per = ", ".join(f"{100 * x:+.0f}" for x in d["per_seed"])
            lines.append(f"| {e} | {label} | {per} | {100 * d['mean']:+.1f} | [{100 * _num(d['t_lo']):+.1f}, "
                         f"{100 * _num(d['t_hi']):+.1f}] | [{100 * d['boot_lo']:+.1f}, {100 * d['boot_hi']:+.1f}] "
                         f"| {d['positive']} of {len(d['seeds'])} |")
    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("success")
    lines.append("")
    lines.append(("" if ws is None else f"Warm start: {ws:.0%} held-out success. ")
                 + f"The {len(results['arms'])} arms took {results['total_wall_s'] / 3600:.1f} h of training and "
                 "evaluation in all "
                 "(`train s` includes a turn-level arm's 60%-budget evaluation).")
    return lines


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def plot(results: dict[str, Any], path: Path) -> None:
    """Learning curves (training success and training process reward vs generated tokens, one line per arm,
    colour per estimator) and the held-out result per estimator (success and chain steps reached: mean over seeds,
    each seed a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"outcome": "#777", "turn_return": "#2f6db5", "gigpo": "#d9822b"}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    seen = set()
    for a in results["arms"].values():
        est = a["estimator"]
        xs = [c["tokens"] for c in a["curve"]]
        label = None if est in seen else est
        ax1.plot(xs, [_num(c["success"]) for c in a["curve"]], "o-", color=colors.get(est, "k"), alpha=0.6, ms=3,
                 label=label)
        ax2.plot(xs, [_num(c["process_reward"]) for c in a["curve"]], "o-", color=colors.get(est, "k"), alpha=0.6, ms=3,
                 label=label)
        seen.add(est)
    for ax, what in ((ax1, "success"), (ax2, "process reward (max 0.5)")):
        ax.set_xlabel("generated policy tokens")
        ax.set_ylabel(f"training {what}, per step")
        ax.legend(fontsize=8)
    ax1.set_ylim(-0.05, 1.05)
    ax2.set_ylim(-0.02, 0.52)
    ax1.set_title("GRPO learning curves, train split (line = seed)", fontsize=10)
    ax2.set_title("verified intermediate steps, train split", fontsize=10)
    ests = [e for e in ("outcome", "turn_return", "gigpo") if any(a["estimator"] == e for a in results["arms"].values())]
    ws = (results.get("warmstart") or {}).get("eval") or {}
    for i, est in enumerate(ests):
        arms = [a for a in results["arms"].values() if a["estimator"] == est]
        for off, key, alpha in ((-0.2, "success", 0.8), (0.2, "steps_reached", 0.4)):
            vals = [a["eval"][key] for a in arms]
            ax3.bar(i + off, sum(vals) / len(vals), width=0.38, color=colors.get(est, "k"), alpha=alpha)
            ax3.plot([i + off] * len(vals), vals, "ko", ms=4)
    if ws:
        ax3.axhline(ws["success"], color="k", ls=":", lw=1, label=f"warm start: success {ws['success']:.0%}")
        ax3.axhline(ws["steps_reached"], color="k", ls="--", lw=1,
                    label=f"warm start: steps reached {ws['steps_reached']:.0%}")
        ax3.legend(fontsize=8)
    ax3.set_xticks(range(len(ests)), [f"{e}\n(success | steps)" for e in ests])
    ax3.set_ylim(0, 1.05)
    n = len(results.get("eval_task_ids", []))
    ax3.set_title(f"held-out: {n} test chains, greedy (dots = seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

