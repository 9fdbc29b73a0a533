"""Protocol v2's report, computed from the committed records alone (v1's ``results/`` for the stages v2 reuses,
``results/v2/`` for its own): ``python -m benchmarks.bfcl --protocol v2 --seeds 0 1 2 --report``.

Tables, in Markdown: the sweep (each arm's validation success per evaluated step, its score, the choice); per seed,
the non-live AST category mean for untrained -> warm start -> GRPO's selected checkpoint (and its last one) with
GRPO's own gain as the difference of the category means printed beside it (95% CI: per-category paired
differences, a normal interval stratified by category) and the gain pooled over entries as its own column;
irrelevance and the live (OOD) subset likewise; the selected step; the gain across seeds and the goal's verdict;
each seed's validation curve and training log (reward, groups without spread, the share of groups dynamic sampling
kept, entropy, parse rate); wall and CPU time and peak RSS of every stage.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks.bfcl.protocol import NON_LIVE_AST, OOD_AST, ood_ids, protocol, warmstart_config
from benchmarks.bfcl.protocol_v2 import (
    GRPO_V2,
    SWEEP_SEED,
    SWEEP_STEPS,
    arm_name,
    arm_score,
    choose,
    grpo_v2_config,
    results_v2,
    sweep_arms,
)
from benchmarks.bfcl.report import NOWHERE, checkpoint_table
from benchmarks.common.stages import Stage
from benchmarks.common.stats import across_seeds

__all__ = ["GOAL_POINTS", "category_mean_gain", "pooled_gain", "report_v2"]

#: the goal: GRPO's own gain on the non-live AST category mean, in points, with a CI above 0 on every seed
GOAL_POINTS = 10


def category_mean_gain(a: dict[str, Any] | None, b: dict[str, Any] | None,
                       cats: tuple[str, ...]) -> dict[str, float] | None:
    """``b - a`` on the mean over ``cats`` of each category's accuracy (the leaderboard's column), from the
    per-entry verdicts of the same entries: ``{"mean", "lo", "hi", "pooled"}`` as fractions, ``lo``/``hi`` a 95%
    normal interval whose variance is ``sum_c var_c / (n_c C^2)`` over the ``C`` categories' paired differences,
    ``pooled`` the mean difference over all entries; ``None`` until both checkpoints have every category."""
    if not a or not b or not cats or not all(c in t["rows"] for c in cats for t in (a, b)):
        return None
    means, var, every = [], 0.0, []
    for c in cats:
        keys = sorted(k for k in a["entries"] if k[0] == c and k in b["entries"])
        if not keys:
            return None
        d = [b["entries"][k] - a["entries"][k] for k in keys]
        every += d
        means.append(statistics.fmean(d))
        var += (statistics.variance(d) if len(d) > 1 else 0.0) / len(d)
    mean, half = statistics.fmean(means), 1.96 * math.sqrt(var) / len(cats)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "pooled": statistics.fmean(every)}


def _irrelevance(t: dict[str, Any] | None) -> str:
    if not t or "irrelevance" not in t["rows"]:
        return "-"
    return f"{100 * t['rows']['irrelevance']['accuracy']:.1f}"


def _pooled(t: dict[str, Any] | None, cats: tuple[str, ...]) -> float | None:
    """Accuracy over the entries of ``cats`` pooled (the leaderboard weighs the live categories by entry)."""
    if not t or not cats or not all(c in t["rows"] for c in cats):
        return None
    xs = [v for k, v in t["entries"].items() if k[0] in cats]
    return statistics.fmean(xs) if xs else None


def pooled_gain(a: dict[str, Any] | None, b: dict[str, Any] | None, cats: tuple[str, ...]) -> dict[str, float] | None:
    """``b - a`` on the entries of ``cats`` pooled, with its paired 95% CI (``{"mean", "lo", "hi", "n"}``)."""
    from toolgym.evaluation import paired_difference_ci

    if not a or not b or not cats or not all(c in t["rows"] for c in cats for t in (a, b)):
        return None
    keys = sorted(k for k in a["entries"] if k[0] in cats and k in b["entries"])
    if not keys:
        return None
    return paired_difference_ci([a["entries"][k] for k in keys], [b["entries"][k] for k in keys])


def _cat_mean(t: dict[str, Any] | None, cats: tuple[str, ...]) -> float | None:
    if not t or not all(c in t["rows"] for c in cats):
        return None
    return statistics.fmean(t["rows"][c]["accuracy"] for c in cats)


def collect_v2(args: argparse.Namespace) -> dict[str, Any]:
    """Every finished v2 stage's figures, and the v1 stages it reuses."""
    proto, res, res1 = protocol(args), results_v2(args), Path(args.results)
    ws0 = Stage(NOWHERE, f"warmstart-seed{SWEEP_SEED}", warmstart_config(args, proto, SWEEP_SEED), res1)

    def arms(first: dict[str, Any] | None) -> list[dict[str, Any]]:
        out = []
        for arm in sweep_arms(first):
            rec = Stage(NOWHERE, f"sweep-{arm_name(arm)}",
                        grpo_v2_config(proto, SWEEP_SEED, ws0.key, arm, SWEEP_STEPS, args.grpo_v2_tasks), res).result()
            out.append({"arm": arm, "record": rec,
                        "score": arm_score(rec.get("validation_history") or []) if rec else None})
        return out

    first_phase = arms(None)
    first = choose([(x["arm"], x["score"]) for x in first_phase])
    sweep = arms(first) if first else first_phase
    choice = choose([(x["arm"], x["score"]) for x in sweep]) if first else None
    r: dict[str, Any] = {"protocol": proto, "sweep": sweep, "first_choice": first, "choice": choice,
                         "untrained": checkpoint_table(proto, res1, "untrained", None), "seeds": {}}
    ast = tuple(c for c in proto["categories"] if c in NON_LIVE_AST)
    ood_ast = tuple(c for c in ood_ids(proto["ood"]["ast"], proto["ood"]["irrelevance"]) if c in OOD_AST)
    r["ast"], r["ood_ast"] = ast, ood_ast
    for seed in args.seeds:
        ws = Stage(NOWHERE, f"warmstart-seed{seed}", warmstart_config(args, proto, seed), res1)
        s: dict[str, Any] = {"warm_table": checkpoint_table(proto, res1, f"warmstart-seed{seed}", ws.key),
                             "grpo": None, "sel_table": None, "last_table": None}
        if choice is not None:
            gr = Stage(NOWHERE, f"grpo-seed{seed}",
                       grpo_v2_config(proto, seed, ws.key, choice, GRPO_V2["steps"], args.grpo_v2_tasks), res)
            s["grpo"] = rec = gr.result()
            s["sel_table"] = checkpoint_table(proto, res, f"grpo-seed{seed}", f"{gr.key}:selected")
            same = rec is not None and rec.get("selected_step") == rec.get("global_step")
            s["last_table"] = s["sel_table"] if same else checkpoint_table(proto, res, f"grpolast-seed{seed}",
                                                                           f"{gr.key}:last")
        w = s["warm_table"]
        for tag in ("sel", "last"):
            g = s[f"{tag}_table"]
            s[f"{tag}_gain"] = category_mean_gain(w, g, ast)
            s[f"{tag}_gain_ood"] = pooled_gain(w, g, ood_ast)
        r["seeds"][seed] = s
    gains = {seed: s["sel_gain"]["mean"] for seed, s in r["seeds"].items() if s["sel_gain"]}
    r["across"] = _across_category_mean(r, ast) if len(gains) >= 2 else None
    return r


def _across_category_mean(r: dict[str, Any], ast: tuple[str, ...]) -> dict[str, Any]:
    """The selected checkpoints' gains across seeds (:func:`benchmarks.common.stats.across_seeds`) on the category
    mean: each entry's verdict weighted by ``N / (C n_c)`` (``N`` entries, ``C`` categories, ``n_c`` in its
    category), so that the mean over entries is the mean of the category accuracies."""
    before, after = {}, {}
    for seed, s in r["seeds"].items():
        w, g = s["warm_table"], s["sel_table"]
        if not s["sel_gain"]:
            continue
        keys = sorted(k for k in w["entries"] if k[0] in ast and k in g["entries"])
        n_c = {c: sum(1 for k in keys if k[0] == c) for c in ast}
        weight = {k: len(keys) / (len(ast) * n_c[k[0]]) for k in keys}
        before[seed] = [w["entries"][k] * weight[k] for k in keys]
        after[seed] = [g["entries"][k] * weight[k] for k in keys]
    return across_seeds(before, after)


def goal_v2(r: dict[str, Any]) -> str:
    """The goal's verdict (GRPO's own gain >= +10 points on the non-live AST category mean with a CI above 0 on
    every seed) and the floor's (no seed's selected checkpoint below its warm start on that mean)."""
    gains = {seed: s["sel_gain"] for seed, s in r["seeds"].items()}
    done = {seed: g for seed, g in gains.items() if g}
    head = (f"Goal (GRPO's own gain >= +{GOAL_POINTS} points on the non-live AST category mean, CI above 0, on every "
            "seed): ")
    if not done:
        return head + "undecided, no seed evaluated."
    hit = [seed for seed, g in done.items() if 100 * g["mean"] >= GOAL_POINTS - 1e-9 and g["lo"] > 0]
    below = [seed for seed, g in done.items() if g["mean"] < 0]
    missing = len(gains) - len(done)
    verdict = ("undecided" if missing and len(hit) == len(done) else "met" if len(hit) == len(done) else "not met")
    rest = f" ({missing} of {len(gains)} seeds not evaluated yet)" if missing else ""
    return (head + f"{verdict}: {len(hit)} of {len(done)} evaluated seeds reach it{rest}. Floor (no seed below its "
            f"warm start): {'held' if not below else 'not held'} on {len(done) - len(below)} of {len(done)}.")


def _training(rec: dict[str, Any]) -> dict[str, Any]:
    steps = [row for row in rec.get("log_history", []) if "reward" in row or "toolgym/success" in row]

    def series(key: str) -> list[float]:
        return [row[key] for row in steps if key in row]

    def ends(key: str, window: int = 8) -> tuple[float | None, float | None]:
        xs = series(key)
        return (statistics.fmean(xs[:window]), statistics.fmean(xs[-window:])) if xs else (None, None)

    return {"steps": len(steps), "reward": ends("reward"), "zero_spread": ends("frac_reward_zero_std"),
            "kept_share": ends("toolgym/dynamic_sampling/kept_share"), "entropy": ends("entropy"),
            "skipped": sum(1 for row in steps if row.get("toolgym/no_signal_step")),
            "step_s": statistics.median(series("step_time")) if series("step_time") else None}


def report_v2(args: argparse.Namespace) -> str:
    """The Markdown tables of every finished v2 stage (``-`` where a stage has not run yet)."""
    r = collect_v2(args)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    def gain(g: dict[str, float] | None, pooled: bool = False) -> str:
        if not g:
            return "-"
        if pooled:
            return f"{100 * g['pooled']:+.1f}"
        return f"{100 * g['mean']:+.1f} [{100 * g['lo']:+.1f}, {100 * g['hi']:+.1f}]"

    lines = ["Protocol v2: sweep on the validation part (seed 0's warm start; success at each validated step)", "",
             "| arm | lr | reward | KL weight | validation success by step | score (best, mean) | wall h |",
             "|---|---|---|---|---|---|---|"]
    for x in r["sweep"]:
        arm, rec = x["arm"], x["record"]
        hist = " / ".join(f"{h['step']}: {pct(h.get('success'))}" for h in (rec or {}).get("validation_history") or [])
        sc = "-" if x["score"] is None else f"{pct(x['score'][0])}, {pct(x['score'][1])}"
        wall = "-" if not rec else f"{(rec.get('wall_s') or 0) / 3600:.2f}"
        lines.append(f"| {arm_name(arm)} | {arm['lr']:g} | {arm['reward']} | {arm['beta']:g} | {hist or '-'} | {sc} "
                     f"| {wall} |")
    lines += ["", f"Chosen: {arm_name(r['choice']) if r['choice'] else 'not yet (the sweep is not finished)'}"]

    lines += ["", "| seed | non-live AST: untrained / warm start / GRPO selected / GRPO last | GRPO's own gain, "
              "selected [95% CI] | pooled over entries | gain, last | selected step | irrelevance | live AST (OOD, pooled) "
              "| gain, live AST (pooled) |", "|---|---|---|---|---|---|---|---|---|"]
    u = r["untrained"]
    for seed, s in r["seeds"].items():
        w, g, gl = s["warm_table"], s["sel_table"], s["last_table"]
        rec = s["grpo"] or {}
        lines.append(f"| {seed} | {' / '.join(pct(_cat_mean(t, r['ast'])) for t in (u, w, g, gl))} "
                     f"| {gain(s['sel_gain'])} | {gain(s['sel_gain'], pooled=True)} | {gain(s['last_gain'])} "
                     f"| {rec.get('selected_step', '-')} of {rec.get('global_step', '-')} "
                     f"| {' / '.join(_irrelevance(t) for t in (u, w, g))} "
                     f"| {' / '.join(pct(_pooled(t, r['ood_ast'])) for t in (u, w, g))} | {gain(s['sel_gain_ood'])} |")
    a = r["across"]
    if a:
        lines += ["", "| GRPO's own gain (selected), non-live AST category mean | seeds | per seed | mean "
                  "| t 95% CI over seeds | bootstrap 95% CI |", "|---|---|---|---|---|---|",
                  f"| points | {', '.join(map(str, a['seeds']))} | {', '.join(f'{100 * d:+.1f}' for d in a['per_seed'])} "
                  f"| {100 * a['mean']:+.1f} | [{100 * a['t_lo']:+.1f}, {100 * a['t_hi']:+.1f}] "
                  f"| [{100 * a['boot_lo']:+.1f}, {100 * a['boot_hi']:+.1f}] |"]
    lines += ["", goal_v2(r)]

    curves = [(seed, s["grpo"]) for seed, s in r["seeds"].items() if s["grpo"]]
    if curves:
        lines += ["", "| seed | validation success by step | parse rate by step | reward, first 8 -> last 8 steps "
                  "| groups without spread | kept share (dynamic sampling) | entropy | no-signal steps | s per step |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for seed, rec in curves:
            hist = rec.get("validation_history") or []
            t = _training(rec)

            def pair(k: str, fmt: str = ".3f", tt: dict[str, Any] = t) -> str:
                x, y = tt[k]
                return "-" if x is None else f"{x:{fmt}} -> {y:{fmt}}"
            by_step = {k: " / ".join(f"{h['step']}: {pct(h.get(k))}" for h in hist) for k in ("success", "parse_rate")}
            step_s = "-" if t["step_s"] is None else f"{t['step_s']:.0f}"
            lines.append(f"| {seed} | {by_step['success']} | {by_step['parse_rate']} "
                         f"| {pair('reward')} | {pair('zero_spread', '.2f')} | {pair('kept_share', '.2f')} "
                         f"| {pair('entropy')} | {t['skipped']} | "
                         f"{step_s} |")

    lines += ["", "| v2 stage | wall s | CPU s | peak RSS MB |", "|---|---|---|---|"]
    for x in r["sweep"]:
        if x["record"]:
            c = x["record"]
            lines.append(f"| sweep {arm_name(x['arm'])} | {c.get('wall_s') or 0:.0f} | {c.get('cpu_s') or 0:.0f} "
                         f"| {c.get('peak_rss_mb') or 0:.0f} |")
    for seed, s in r["seeds"].items():
        for name, c in ((f"seed {seed} GRPO", s["grpo"]),
                        (f"seed {seed} selected evaluation", (s["sel_table"] or {}).get("cost")),
                        (f"seed {seed} last evaluation", (s["last_table"] or {}).get("cost")
                         if s["last_table"] is not s["sel_table"] else None)):
            if c:
                lines.append(f"| {name} | {c.get('wall_s') or 0:.0f} | {c.get('cpu_s') or 0:.0f} "
                             f"| {c.get('peak_rss_mb') or 0:.0f} |")
    lines += _rebuilds(r)
    return "\n".join(lines)


def _rebuilds(r: dict[str, Any]) -> list[str]:
    """The warm starts v2's GRPO stages trained from, where they were rebuilt from v1's record: the SFT losses'
    largest difference from the recorded run and both CPUs (v1's evaluations of a warm start are of the recorded
    run's checkpoint)."""
    rows = [(f"sweep {arm_name(x['arm'])}", x["record"]) for x in r["sweep"] if x["record"]]
    rows += [(f"seed {seed} GRPO", s["grpo"]) for seed, s in r["seeds"].items() if s["grpo"]]
    out = []
    for name, rec in rows:
        rb = rec.get("warmstart_rebuild")
        if rb:
            cpu, was = (rb.get("machine") or {}).get("cpu", "?"), (rb.get("recorded_machine") or {}).get("cpu", "?")
            out.append(f"| {name} | {cpu} | {was} | {rb.get('max_abs_loss_diff')} |")
    if not out:
        return []
    return ["", "| trained from a rebuilt warm start | rebuilt on | recorded on | SFT loss, largest abs. difference |",
            "|---|---|---|---|", *out]
