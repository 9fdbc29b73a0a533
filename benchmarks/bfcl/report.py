"""The BFCL learning experiment's report, computed from the committed stage results alone
(``benchmarks/bfcl/results/``): ``python -m benchmarks.bfcl --seeds 0 1 2 --report``.

Tables, in Markdown: per seed, the leaderboard's summary columns for untrained -> warm start -> GRPO with GRPO's own
paired gain (95% CI over entries); that gain across seeds (per seed, mean, t-interval over seeds, hierarchical
bootstrap CI) and whether the protocol's goal is met; every category of every finished evaluation; what GRPO's training logged (reward
and success at the start and the end of the run, the share of groups with a success, the share of groups with no
reward spread) and what the policy did (the share of episodes that call a tool, calls per episode, completion
tokens, entropy); the commonest BFCL error types on the non-live AST entries; the wall and CPU time and peak RSS of
every stage; and the leaderboard's published numbers for small models, marked as theirs.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.bfcl.protocol import (
    NON_LIVE_AST,
    OOD_AST,
    PUBLISHED,
    eval_plan,
    grpo_config,
    ood_ids,
    protocol,
    warmstart_config,
)
from benchmarks.common.stages import Stage
from benchmarks.common.stats import across_seeds

NOWHERE = Path("/nonexistent")  # no stage directory: a stage's result is read from the results directory alone

#: the protocol's goal: GRPO's own gain on the pooled non-live AST entries, in points, with a CI above 0 on every seed
GOAL_POINTS = 10


def checkpoint_table(proto: dict[str, Any], results: Path, tag: str, parent_key: str | None) -> dict[str, Any] | None:
    """The finished categories of one checkpoint (its evaluation stages of ``proto``, read from ``results``): rows,
    per-entry verdicts (``entries``: 1.0 / 0.0) and BFCL error types, summed cost; the summary columns once every
    in-distribution category is finished."""
    from toolgym.evaluation.bfcl import summary_columns

    rows, entries, errors, cost = {}, {}, {}, {"wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0}
    plan = eval_plan(proto, tag, parent_key)
    for ev in plan:
        r = Stage(NOWHERE, ev["name"], ev["config"], results).result()
        if r is not None:
            rows[ev["config"]["category"]] = r["row"]
            for e in r["entries"]:
                key = (e["category"], str(e["id"]))
                entries[key], errors[key] = float(e["valid"]), e.get("error_type")
            cost["wall_s"] += r.get("wall_s") or 0.0
            cost["cpu_s"] += r.get("cpu_s") or 0.0
            cost["peak_rss_mb"] = max(cost["peak_rss_mb"], r.get("peak_rss_mb") or 0.0)
    if not rows:
        return None
    in_dist = {c: row for c, row in rows.items() if c in proto["categories"]}
    complete = len(rows) == len(plan)
    done = rows if complete else in_dist  # no live column from part of the live categories
    summary = summary_columns(done) if len(in_dist) == len(proto["categories"]) else {}
    return {"rows": rows, "summary": summary,
            "entries": entries, "errors": errors, "cost": cost, "stages": f"{len(rows)}/{len(plan)}",
            "complete": complete}


def collect_results(args: argparse.Namespace) -> dict[str, Any]:
    """Every finished stage's per-entry verdicts and figures, read from ``--results`` alone."""
    from toolgym.evaluation import paired_difference_ci

    results, proto = Path(args.results), protocol(args)

    def table(tag: str, parent_key: str | None) -> dict[str, Any] | None:
        return checkpoint_table(proto, results, tag, parent_key)

    def gain(a: dict[str, Any], b: dict[str, Any], cats: tuple[str, ...]) -> dict[str, float] | None:
        """The paired difference b - a over the entries of ``cats`` (``None`` until both evaluated all of them)."""
        pair = _paired(a, b, cats)
        return paired_difference_ci(*pair) if pair else None

    # the AST categories this protocol evaluates (the full protocol: all four non-live and all four live ones)
    ast = tuple(c for c in proto["categories"] if c in NON_LIVE_AST)
    ood_ast = tuple(c for c in ood_ids(proto["ood"]["ast"], proto["ood"]["irrelevance"]) if c in OOD_AST)
    out: dict[str, Any] = {"protocol": proto, "ood_ast": ood_ast, "untrained": table("untrained", None), "seeds": {}}
    for seed in args.seeds:
        ws = Stage(NOWHERE, f"warmstart-seed{seed}", warmstart_config(args, proto, seed), results)
        gr = Stage(NOWHERE, f"grpo-seed{seed}", grpo_config(args, proto, seed, ws.key), results)
        s = {"warmstart": ws.result(), "grpo": gr.result(),
             "warm_table": table(f"warmstart-seed{seed}", ws.key),
             "grpo_table": table(f"grpo-seed{seed}", gr.key)}
        u, w, g = out["untrained"], s["warm_table"], s["grpo_table"]
        if u and w:
            s["warmstart_gain_non_live_ast"] = gain(u, w, ast)
        if w and g:
            s["grpo_gain_non_live_ast"] = gain(w, g, ast)
            s["grpo_gain_irrelevance"] = gain(w, g, ("irrelevance",))
            s["grpo_gain_ood_ast"] = gain(w, g, ood_ast)
            s["grpo_gain_ood_irrelevance"] = gain(w, g, ("live_irrelevance",))
        out["seeds"][seed] = s
    out["across_seeds"] = {"non_live_ast": _across(out, ast), "ood_ast": _across(out, ood_ast)}
    return out


def _paired(a: dict[str, Any] | None, b: dict[str, Any] | None,
            cats: tuple[str, ...]) -> tuple[list[float], list[float]] | None:
    """The verdicts of checkpoints ``a`` and ``b`` on the same entries of ``cats``, in one order; ``None`` until
    both evaluated every one of ``cats``."""
    if not a or not b or not all(c in t["rows"] for c in cats for t in (a, b)):
        return None
    keys = sorted(k for k in a["entries"] if k[0] in cats and k in b["entries"])
    return ([a["entries"][k] for k in keys], [b["entries"][k] for k in keys]) if keys else None


def _across(r: dict[str, Any], cats: tuple[str, ...]) -> dict[str, Any]:
    """GRPO's own gain on ``cats`` across the seeds whose warm start and GRPO are evaluated on all of them
    (:func:`benchmarks.common.stats.across_seeds`: per-seed gains, their mean, the t-interval over seeds, the
    hierarchical bootstrap CI)."""
    pairs = {seed: p for seed, s in r["seeds"].items() if (p := _paired(s["warm_table"], s["grpo_table"], cats))}
    return across_seeds({seed: p[0] for seed, p in pairs.items()}, {seed: p[1] for seed, p in pairs.items()})


def goal(r: dict[str, Any]) -> str:
    """The protocol's goal, read from the per-seed paired gains: met when every protocol seed's GRPO gain on the
    pooled non-live AST entries is at least ``GOAL_POINTS`` with a 95% CI above 0; not met as soon as one evaluated
    seed misses it; undecided while the evaluated seeds reach it and others are not evaluated yet."""
    gains = {seed: s.get("grpo_gain_non_live_ast") for seed, s in r["seeds"].items()}
    done = {seed: g for seed, g in gains.items() if g}
    head = f"Goal (GRPO's own gain >= +{GOAL_POINTS} points on the non-live AST entries, CI above 0 on every seed): "
    # compared in whole entries (the gain is a mean of -1/0/+1 differences): rounding must not move it across the goal
    hit = [seed for seed, g in done.items() if 100 * round(g["mean"] * g["n"]) >= GOAL_POINTS * g["n"] and g["lo"] > 0]
    above = [seed for seed, g in done.items() if g["lo"] > 0]
    missing = len(gains) - len(done)
    if missing and len(hit) == len(done):
        return head + f"undecided, {len(done)} of {len(gains)} seeds evaluated."
    verdict = "met" if len(hit) == len(done) else "not met"
    rest = f" ({missing} of {len(gains)} seeds not evaluated yet)" if missing else ""
    return head + (f"{verdict}: {len(hit)} of {len(done)} evaluated seeds reach it; {len(above)} of {len(done)} have "
                   f"a CI above 0{rest}.")


def grpo_training(result: dict[str, Any], window: int = 10) -> dict[str, Any]:
    """What a GRPO stage's per-step log says: means over its first and last ``window`` steps of the reward, the
    success rate, the share of groups with at least one success (``toolgym/groups_with_success``, where logged)
    and the share of groups with no reward spread (``frac_reward_zero_std``: nothing to learn from); what the
    policy does: the share of episodes that call a tool (``tool_call_rate``), calls per episode, completion tokens
    and the sampled tokens' entropy (nats; TRL logs it only for steps that train); and the median seconds per
    step; how many steps had a group with any reward spread (``spread_steps``) and the last of them
    (``last_spread_step``, 1-based). Rates are fractions; ``None`` where the log lacks the metric."""
    steps = [row for row in result.get("log_history", []) if "reward" in row or "toolgym/success" in row]

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        xs = [row[key] for row in rows if key in row]
        return statistics.fmean(xs) if xs else None

    out: dict[str, Any] = {"steps": len(steps)}
    for key, name in (("reward", "reward"), ("toolgym/success", "success"),
                      ("toolgym/groups_with_success", "groups_with_success"),
                      ("frac_reward_zero_std", "zero_spread"), ("toolgym/tool_call_rate", "tool_call_rate"),
                      ("toolgym/calls_per_episode", "calls_per_episode"),
                      ("completions/mean_length", "completion_tokens"), ("entropy", "entropy")):
        out[name] = (mean(steps[:window], key), mean(steps[-window:], key))
    times = [row["step_time"] for row in steps if "step_time" in row]
    out["step_s"] = statistics.median(times) if times else None
    # the steps whose groups had any reward spread: the only ones with a nonzero advantage to learn from
    spread = [i + 1 for i, row in enumerate(steps) if row.get("frac_reward_zero_std", 1.0) < 1.0]
    out["spread_steps"], out["last_spread_step"] = len(spread), (spread[-1] if spread else None)
    return out


def report(args: argparse.Namespace) -> str:
    """The Markdown tables of every finished stage (``-`` where a stage has not run yet)."""
    r = collect_results(args)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    def col(t: dict[str, Any] | None, k: str) -> str:
        return "-" if t is None else pct(t["summary"].get(k))

    def ci(c: dict[str, float] | None) -> str:
        return "-" if not c else f"{100 * c['mean']:+.1f} [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]"

    def live(t: dict[str, Any] | None) -> str:
        if t is None or not all(c in t["rows"] for c in r["ood_ast"]):
            return "-"
        n = sum(t["rows"][c]["n"] for c in r["ood_ast"])
        k = sum(t["rows"][c]["correct"] for c in r["ood_ast"])
        return pct(k / n) if n else "-"

    def acc(t: dict[str, Any] | None, c: str) -> str:
        return pct(t["rows"][c]["accuracy"]) if t and c in t["rows"] else "-"

    u = r["untrained"]
    lines = ["| seed | non-live AST: untrained / warm start / GRPO | GRPO's own gain [95% CI] | irrelevance "
             "| live AST (OOD) | GRPO's own gain, live AST [95% CI] | live irrelevance (OOD) |",
             "|---|---|---|---|---|---|---|"]
    for seed, s in r["seeds"].items():
        w, g = s["warm_table"], s["grpo_table"]
        lines.append(f"| {seed} | {col(u, 'non_live_ast')} / {col(w, 'non_live_ast')} / {col(g, 'non_live_ast')} "
                     f"| {ci(s.get('grpo_gain_non_live_ast'))} "
                     f"| {' / '.join(acc(t, 'irrelevance') for t in (u, w, g))} "
                     f"| {' / '.join(live(t) for t in (u, w, g))} | {ci(s.get('grpo_gain_ood_ast'))} "
                     f"| {' / '.join(acc(t, 'live_irrelevance') for t in (u, w, g))} |")
    # GRPO's own gain across seeds: the per-seed paired gains, their mean and its intervals over seeds
    across = [(name, r["across_seeds"][k]) for name, k in (("non-live AST", "non_live_ast"),
                                                           ("live AST (OOD)", "ood_ast"))
              if len(r["across_seeds"][k]["seeds"]) >= 2]
    if across:
        lines += ["", "| GRPO's own gain, points | seeds | per seed | mean | t 95% CI over seeds "
                  "| bootstrap 95% CI | seeds above 0 |", "|---|---|---|---|---|---|---|"]
        for name, a in across:
            lines.append(f"| {name} | {', '.join(map(str, a['seeds']))} "
                         f"| {', '.join(f'{100 * d:+.1f}' for d in a['per_seed'])} | {100 * a['mean']:+.1f} "
                         f"| [{100 * a['t_lo']:+.1f}, {100 * a['t_hi']:+.1f}] "
                         f"| [{100 * a['boot_lo']:+.1f}, {100 * a['boot_hi']:+.1f}] "
                         f"| {a['positive']} of {len(a['seeds'])} |")
    lines += ["", goal(r)]

    # every category of every finished evaluation stage, accuracy in % ("-": not run yet)
    tables = [("untrained", u)] + [(f"seed {seed} {k}", s[t]) for seed, s in r["seeds"].items()
                                   for k, t in (("warm start", "warm_table"), ("GRPO", "grpo_table"))]
    cats = list(r["protocol"]["categories"]) + sorted(ood_ids(r["protocol"]["ood"]["ast"],
                                                              r["protocol"]["ood"]["irrelevance"]))
    lines += ["", "| category | " + " | ".join(name for name, _ in tables) + " |", "|---" * (len(tables) + 1) + "|"]
    for c in cats:
        lines.append(f"| {c} | " + " | ".join(acc(t, c) for _, t in tables) + " |")

    # GRPO's training log: first and last 10 steps
    trained = [(seed, grpo_training(s["grpo"])) for seed, s in r["seeds"].items() if s["grpo"]]
    if trained:
        lines += ["", "| seed | GRPO steps | reward, steps 1-10 -> last 10 | success | groups with a success "
                  "| groups with no reward spread | steps with any reward spread (the last) | s per step (median) |",
                  "|---|---|---|---|---|---|---|---|"]
        for seed, t in trained:
            pair = {k: f"{pct(t[k][0])} -> {pct(t[k][1])}" if t[k][0] is not None else "-"
                    for k in ("success", "groups_with_success", "zero_spread")}
            rw = "-" if t["reward"][0] is None else f"{t['reward'][0]:.3f} -> {t['reward'][1]:.3f}"
            sp = "-" if t["step_s"] is None else f"{t['step_s']:.0f}"
            last = "-" if t["last_spread_step"] is None else str(t["last_spread_step"])
            lines.append(f"| {seed} | {t['steps']} | {rw} | {pair['success']} | {pair['groups_with_success']} "
                         f"| {pair['zero_spread']} | {t['spread_steps']} ({last}) | {sp} |")
        # what the policy does over the same windows: calling tools (irrelevance asks for no call), how many, how
        # long, and how much its samples still differ (entropy)
        lines += ["", "| seed | episodes that call a tool, steps 1-10 -> last 10 | calls per episode "
                  "| completion tokens | entropy (nats) |", "|---|---|---|---|---|"]
        for seed, t in trained:
            def num(k: str, fmt: str, tt: dict[str, Any] = t) -> str:
                a, b = tt[k]
                return "-" if a is None and b is None else " -> ".join("-" if x is None else f"{x:{fmt}}" for x in (a, b))
            rate = "-" if t["tool_call_rate"][0] is None else \
                f"{pct(t['tool_call_rate'][0])} -> {pct(t['tool_call_rate'][1])}"
            lines.append(f"| {seed} | {rate} | {num('calls_per_episode', '.2f')} | {num('completion_tokens', '.0f')} "
                         f"| {num('entropy', '.3f')} |")

    # the commonest BFCL error types on the non-live AST entries, per finished checkpoint
    errs = [(name, Counter(e for (c, _), e in t["errors"].items() if c in NON_LIVE_AST and e))
            for name, t in tables if t and any(c in t["rows"] for c in NON_LIVE_AST)]
    if errs:
        lines += ["", "| checkpoint | non-live AST entries failed | commonest error types (entries) |", "|---|---|---|"]
        for name, counts in errs:
            top = ", ".join(f"`{e}` {n}" for e, n in counts.most_common(4))
            lines.append(f"| {name} | {sum(counts.values())} | {top} |")

    # wall and CPU time and peak RSS of every finished stage
    lines += ["", "| stage | finished | wall s | CPU s | peak RSS MB |", "|---|---|---|---|---|"]

    def cost_row(name: str, done: str, c: dict[str, Any]) -> str:
        return (f"| {name} | {done} | {c.get('wall_s') or 0:.0f} | {c.get('cpu_s') or 0:.0f} "
                f"| {c.get('peak_rss_mb') or 0:.0f} |")

    if u:
        lines.append(cost_row("untrained evaluation", u["stages"], u["cost"]))
    for seed, s in r["seeds"].items():
        for name, stage, t in ((f"seed {seed} warm start", s["warmstart"], s["warm_table"]),
                               (f"seed {seed} GRPO", s["grpo"], s["grpo_table"])):
            if stage:
                lines.append(cost_row(name, "yes", stage))
            if t:
                lines.append(cost_row(f"{name} evaluation", t["stages"], t["cost"]))
    # one seed's stages in all: what a seed costs on top of the untrained evaluation, which every seed shares
    totals = []
    for seed, s in r["seeds"].items():
        w, g = s["warm_table"], s["grpo_table"]
        if s["warmstart"] and s["grpo"] and w and g and w["complete"] and g["complete"]:
            parts = (s["warmstart"], s["grpo"], w["cost"], g["cost"])
            totals.append(f"seed {seed} {sum(c.get('wall_s') or 0 for c in parts) / 3600:.1f} h wall, "
                          f"{sum(c.get('cpu_s') or 0 for c in parts) / 3600:.1f} h CPU")
    if totals:
        lines += ["", "One seed's warm start, GRPO and their evaluations in all: " + "; ".join(totals) + "."]

    lines += ["", "For context, the leaderboard's published numbers (theirs, not measured here): " + "; ".join(
        f"{model}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in cols.items())
        for model, cols in PUBLISHED.items()) + "."]
    return "\n".join(lines)
