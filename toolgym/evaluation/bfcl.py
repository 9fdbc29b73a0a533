"""The BFCL table: one policy on a list of BFCL categories, one row per category, the leaderboard's summary columns.

:func:`evaluate_bfcl` runs :func:`toolgym.evaluation.evaluate` on ``toolgym/BFCL-v0`` once per category (every selected
entry once, batched over ``num_envs`` episodes) and reads BFCL's verdict of every episode
(``trajectory.task["bfcl"]``). ``toolgym eval bfcl --categories ...`` prints :meth:`BFCLReport.format_table` and
writes :meth:`BFCLReport.to_dict` (the per-entry verdicts included) with ``--bfcl-out``.

Summary columns (the leaderboard's groups, over the categories evaluated):

* ``non_live_ast``: the mean of *simple*, ``multiple``, ``parallel``, ``parallel_multiple``, where *simple* is the
  mean of the ``simple_*`` categories evaluated (``simple_python``, and ``simple_java`` / ``simple_javascript`` when
  given), as BFCL averages its non-live AST group;
* ``live_ast``: the live AST categories pooled (accuracy over all their entries, as BFCL weights its live group);
* ``multi_turn``: the mean of the multi-turn categories;
* ``irrelevance``: the mean of ``irrelevance`` and ``live_irrelevance``.

A column is ``None`` when none of its categories was evaluated. Accuracies are fractions in ``[0, 1]``; CIs are
95% Wilson intervals.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.envs.bfcl.data import (
    AST_CATEGORIES,
    GROUPS,
    IRRELEVANCE_CATEGORIES,
    MULTI_TURN_CATEGORIES,
    parse_categories,
)

__all__ = ["GROUPS", "BFCLReport", "evaluate_bfcl", "parse_categories", "summary_columns"]

ENV_ID = "toolgym/BFCL-v0"


@dataclass
class BFCLReport:
    """Per-category accuracy (BFCL's verdicts), the summary columns and every entry's verdict."""

    policy: str
    split: str
    rows: dict[str, dict[str, Any]]
    summary: dict[str, float | None]
    entries: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "split": self.split, "categories": self.rows, "summary": self.summary,
                "wall_s": self.wall_s, "entries": self.entries}

    def format_table(self) -> str:
        """One line per category (entries, accuracy, 95% CI, truncated, mean process reward), then the summary."""
        head = f"{'category':<24} {'n':>5} {'accuracy':>9}  {'95% CI':<15} {'truncated':>9}"
        lines = [f"BFCL v4 ({self.split} split), policy {self.policy}", head, "-" * len(head)]
        for cat, r in self.rows.items():
            lo, hi = r["ci95"]
            lines.append(f"{cat:<24} {r['n']:>5} {r['accuracy']:>8.1%}  {lo:>6.1%} - {hi:<6.1%} {r['truncated']:>9.1%}")
        lines.append("-" * len(head))
        for k, v in self.summary.items():
            lines.append(f"{k:<24} {'':>5} {'-' if v is None else f'{v:.1%}':>9}")
        lines.append(f"wall time {self.wall_s:.1f} s")
        return "\n".join(lines)


def summary_columns(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """The leaderboard's summary columns from per-category rows (``accuracy``, ``n``, ``correct``)."""
    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    acc = {c: float(r["accuracy"]) for c, r in rows.items()}
    simple = mean([acc[c] for c in ("simple_python", "simple_java", "simple_javascript") if c in acc])
    non_live = [x for x in [simple, *(acc.get(c) for c in ("multiple", "parallel", "parallel_multiple"))]
                if x is not None]
    live = [c for c in AST_CATEGORIES if AST_CATEGORIES[c] == "live" and c in rows]
    n_live = sum(int(rows[c]["n"]) for c in live)
    return {
        "non_live_ast": mean(non_live),
        "live_ast": sum(float(rows[c]["correct"]) for c in live) / n_live if n_live else None,
        "multi_turn": mean([acc[c] for c in MULTI_TURN_CATEGORIES if c in acc]),
        "irrelevance": mean([acc[c] for c in IRRELEVANCE_CATEGORIES if c in acc]),
    }


def evaluate_bfcl(
    policy: Any, categories: Sequence[str] | str, *, split: str = "test", tasks: str | int = "all",
    num_envs: int = 16, max_turn_tokens: int = 256, seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
    policy_name: str | None = None, progress: bool = False, out: str | os.PathLike[str] | None = None,
    ids: Collection[str] | None = None,
) -> BFCLReport:
    """Evaluate ``policy`` on each category (``split``: ``all``, ``train`` or ``test``; ``tasks``: ``"all"`` or N
    entries per category drawn from ``seed``) and return the table. Entries run in order of their prompt's length
    (shortest first), ``num_envs`` at a time, so each generation batch pads little. ``out``: also write :meth:`BFCLReport.to_dict`
    there as JSON. ``env_kwargs`` go to every env (``tokenizer``, ``max_episode_tokens``, ...). ``ids``: evaluate only
    the entries with these ids (a fixed subset, e.g. a hashed sample), before ``tasks`` draws from what is left."""
    import numpy as np

    from toolgym.envs.bfcl.data import load_category
    from toolgym.evaluation import evaluate, wilson_interval

    cats = parse_categories(categories)
    rows: dict[str, dict[str, Any]] = {}
    entries: list[dict[str, Any]] = []
    wall = 0.0
    name = policy_name or (policy if isinstance(policy, str) else type(policy).__name__)
    for cat in cats:
        kw = {**dict(env_kwargs or {}), "category": cat}
        entries_of = load_category(cat, split)
        if ids is not None:
            entries_of = [e for e in entries_of if e["id"] in ids]
        if tasks != "all":
            entries_of = [entries_of[int(i)] for i in
                          sorted(np.random.default_rng(seed).permutation(len(entries_of))[: int(tasks)])]
        # entries of similar length side by side: a batch pads to its longest prompt (live entries run from ~300
        # to ~3,000 tokens); the order changes no verdict
        entries_of.sort(key=lambda r: len(json.dumps(r["tools"])) + len(json.dumps(r["question"][0])))
        rep = evaluate(ENV_ID, policy, entries_of, split=split, env_kwargs=kw, num_envs=num_envs,
                       max_turn_tokens=max_turn_tokens, seed=seed, progress=progress, policy_name=name)
        wall += rep.wall_s
        verdicts = [dict(t.task.get("bfcl") or {"valid": False, "error_type": "toolgym:no_verdict"})
                    for t in rep.trajectories]
        for t, v in zip(rep.trajectories, verdicts, strict=True):
            entries.append({"id": t.task.get("id"), "category": cat, "valid": bool(v.get("valid")),
                            "error_type": v.get("error_type"), "error": v.get("error", ""),
                            "truncated": bool(v.get("truncated")), "turn_passes": v.get("turn_passes")})
        n = len(verdicts)
        correct = sum(1 for v in verdicts if v.get("valid"))
        errors: dict[str, int] = {}
        for v in verdicts:
            if not v.get("valid"):
                errors[str(v.get("error_type"))] = errors.get(str(v.get("error_type")), 0) + 1
        rows[cat] = {"n": n, "correct": correct, "accuracy": correct / n if n else 0.0,
                     "ci95": list(wilson_interval(correct, n)),
                     "truncated": sum(1 for v in verdicts if v.get("truncated")) / n if n else 0.0,
                     "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])), "wall_s": rep.wall_s}
    report = BFCLReport(policy=str(name), split=split, rows=rows, summary=summary_columns(rows), entries=entries,
                        wall_s=round(wall, 3))
    if out is not None:  # written whole to a temporary file first, then moved over ``out``
        path = Path(out)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(report.to_dict(), indent=1))
        os.replace(tmp, path)
    return report
