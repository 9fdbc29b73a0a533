"""The BFCL learning experiment's driver: every stage of :mod:`benchmarks.bfcl.protocol` in order, each finished
one skipped, each other one run in a fresh process (:mod:`benchmarks.bfcl.compute`); then the tables
(:mod:`benchmarks.bfcl.report`). ``python -m benchmarks.bfcl --help`` lists the options."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.bfcl.compute import run_child
from benchmarks.bfcl.protocol import (
    PUBLISHED,
    apply_smoke,
    eval_plan,
    grpo_config,
    parser,
    protocol,
    warmstart_config,
    warmstart_files_needed,
)
from benchmarks.bfcl.protocol_v2 import add_arguments
from benchmarks.bfcl.report import report
from benchmarks.common.stages import Stage, write_json

__all__ = ["main", "run"]


def run(args: argparse.Namespace) -> None:
    out, results = Path(args.out), Path(args.results)
    proto = protocol(args)
    common = {"out": str(out), "results": str(results), "threads": args.threads, "num_envs": args.num_envs,
              "device": args.device}
    print(f"[bfcl] protocol: {json.dumps(proto)}", flush=True)

    def evaluate(tag: str, checkpoint: str | None, parent_key: str | None) -> None:
        plan = eval_plan(proto, tag, parent_key)
        todo = [ev for ev in plan if Stage(out, ev["name"], ev["config"], results).result() is None]
        print(f"[bfcl] {tag}: {len(plan) - len(todo)} of {len(plan)} evaluations done", flush=True)
        if todo:
            run_child("_eval_stages", {**common, "checkpoint": checkpoint, "autocast": proto["autocast"],
                                        "evals": todo})

    evaluate("untrained", None, None)
    for seed in args.seeds:
        ws_cfg = warmstart_config(args, proto, seed)
        ws = Stage(out, f"warmstart-seed{seed}", ws_cfg, results)
        gr_cfg = grpo_config(args, proto, seed, ws.key)
        gr = Stage(out, f"grpo-seed{seed}", gr_cfg, results)
        ws_evals_done = all(Stage(out, e["name"], e["config"], results).result() is not None
                            for e in eval_plan(proto, f"warmstart-seed{seed}", ws.key))
        gr_evals_done = all(Stage(out, e["name"], e["config"], results).result() is not None
                            for e in eval_plan(proto, f"grpo-seed{seed}", gr.key))
        needs_ws_files = warmstart_files_needed(ws_evals_done, gr.result() is not None, gr_evals_done,
                                                gr.files_ready())
        if ws.result() is None or (needs_ws_files and not ws.files_ready()):
            print(f"[bfcl] warm start, seed {seed}", flush=True)
            run_child("_warmstart_stage", {**common, "name": ws.name, "config": ws_cfg,
                                            "rematerialise": ws.result() is not None})
        evaluate(f"warmstart-seed{seed}", str(ws.dir / "model"), ws.key)
        if gr.result() is None or (not gr_evals_done and not gr.files_ready()):
            print(f"[bfcl] GRPO, seed {seed}", flush=True)
            run_child("_grpo_stage", {**common, "name": gr.name, "config": gr_cfg,
                                       "warmstart_checkpoint": str(ws.dir / "model"),
                                       "rematerialise": gr.result() is not None,
                                       "toolgym": {"shared_prefix": args.shared_prefix}
                                       if args.shared_prefix is not None else {}})
        evaluate(f"grpo-seed{seed}", str(gr.dir / "model"), gr.key)
    print(report(args), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = parser()
    add_arguments(p)  # protocol v2's options (docs/bfcl.md, "Protocol v2")
    args = p.parse_args(argv)
    apply_smoke(args)
    if args.protocol == "v2":
        from benchmarks.bfcl.report_v2 import report_v2
        from benchmarks.bfcl.run_v2 import run_v2

        if not args.report:
            run_v2(args)
        print(report_v2(args), flush=True)
        return
    if args.report:
        print(report(args))
        return
    t0 = time.perf_counter()
    run(args)
    write_json(Path(args.out) / "summary.json", {"wall_s": round(time.perf_counter() - t0, 1),
                                                 "published_small_models_theirs": PUBLISHED})

