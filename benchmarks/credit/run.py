"""The credit experiment's command line: run (or resume) the comparison or the validation run, or ``--report`` the
table, statistics and verdict from the records alone (``python -m benchmarks.credit``; the protocol:
:mod:`benchmarks.credit`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.credit.protocol import SMOKE, CreditBenchConfig, default_results_dir, plan
from benchmarks.credit.report import collect_results, plot, report_markdown, write_outputs
from benchmarks.credit.stages import load_done

__all__ = ["main", "run"]


def run(cfg: CreditBenchConfig, *, validate: bool = False, results_dir: str | Path | None = None) -> dict[str, Any]:
    """Run (or resume) the comparison, or with ``validate`` the validation run on train-split tasks; returns the
    results (also ``OUT/results.json``).

    Every finished stage is skipped and read back from its record (:mod:`benchmarks.credit.stages`); an arm cut
    short resumes from its last complete GRPO checkpoint (every ``save_steps`` steps and at its last step)."""
    t_start = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rdir = Path(results_dir) if results_dir is not None else default_results_dir(cfg)
    p = plan(cfg, validate)
    todo = []
    for name, stage, est, seed, gamma in p.arms:
        if load_done(stage, out, rdir) is not None:
            print(f"[credit] skip {name}: finished ({stage.record_path(rdir)})", flush=True)
        else:
            todo.append((name, stage, est, seed, gamma))
    need_ws_eval = cfg.eval_warmstart and load_done(p.warmstart_eval, out, rdir) is None
    if todo or need_ws_eval:
        from benchmarks.credit.train import run_stages  # torch, TRL: only when something is left to train

        run_stages(cfg, p, todo, need_ws_eval, out, rdir, validate)
    results = collect_results(cfg, validate, rdir)
    write_outputs(results, out)
    print(json.dumps(results["summary"], indent=1), flush=True)
    print(f"[credit] {len(results['arms'])}/{len(p.arms)} arms finished ({time.perf_counter() - t_start:.0f} s)",
          flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="turn-level credit vs outcome-only GRPO on CalculatorChain-v0")
    ap.add_argument("--output-dir", default=None,
                    help="working files: one directory per stage (checkpoints, trajectories), results.json, credit.png")
    ap.add_argument("--results-dir", default=None,
                    help="one small JSON record per finished stage (default benchmarks/credit/results; with "
                         "--model tiny OUTPUT/results)")
    ap.add_argument("--smoke", action="store_true", help="a ~2-minute end-to-end run (1 seed, 1 step, 4 tasks)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default 0 1 2 3 4)")
    ap.add_argument("--estimators", nargs="+", default=None, help="default: outcome turn_return gigpo")
    ap.add_argument("--token-budget", type=int, default=None, help="generated policy tokens per arm")
    ap.add_argument("--max-steps", type=int, default=None, help="GRPO steps per arm at most")
    ap.add_argument("--save-steps", type=int, default=None, help="a GRPO checkpoint every this many steps")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--report", action="store_true",
                    help="the table, statistics and verdict from the results records alone; redraws OUTPUT/credit.png")
    ap.add_argument("--model", default=None, help="model path; default the embedded SmolLM2-135M ('tiny': tests)")
    ap.add_argument("--validate", action="store_true",
                    help="the validation run: outcome and turn_return at each candidate gamma, one seed, evaluated on "
                         "train-split tasks no arm trains on (chooses gamma; checks that outcome GRPO learns)")
    ap.add_argument("--gamma", type=float, default=None, help="turn_return / gigpo discount (from --validate)")
    ap.add_argument("--lr", type=float, default=None,
                    help="GRPO learning rate of every arm (default 1e-5; 3e-5 reproduces the first validation round)")
    a = ap.parse_args(argv)
    cfg = CreditBenchConfig()
    if a.smoke:
        cfg = replace(cfg, output_dir="runs/credit-smoke", **SMOKE)  # type: ignore[arg-type]
    if a.output_dir:
        cfg.output_dir = a.output_dir
    for name in ("token_budget", "max_steps", "save_steps", "threads", "model", "gamma", "lr"):
        if getattr(a, name) is not None:
            setattr(cfg, name, getattr(a, name))
    if a.seeds:
        cfg.seeds = tuple(a.seeds)
    if a.estimators:
        cfg.estimators = tuple(a.estimators)
    if a.validate and not a.output_dir:
        cfg.output_dir += "-validation"
    rdir = a.results_dir or (str(Path(cfg.output_dir) / "results") if a.smoke else None)  # a smoke run: not committed
    if a.report:
        results = collect_results(cfg, a.validate, rdir)
        if results["arms"]:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            plot(results, Path(cfg.output_dir) / "credit.png")
        print(f"{len(results['arms'])}/{len(plan(cfg, a.validate).arms)} arms finished "
              f"(records in {results['results_dir']})\n")
        print(report_markdown(results))
        return 0
    run(cfg, validate=a.validate, results_dir=rdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
