"""Protocol v2's driver (:mod:`benchmarks.bfcl.protocol_v2`): the sweep's arms on the validation part, then, with
the chosen arm, each seed's GRPO and the evaluations of its selected and last checkpoints; every finished stage
skipped, every other one run in a fresh process (:mod:`benchmarks.bfcl.compute`). The stages v2 shares with v1
(the untrained evaluations, the warm starts and their evaluations) are v1's: run where their records are missing,
and a warm start's checkpoint rebuilt from its recorded configuration where a v2 stage needs it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.bfcl.compute import run_child
from benchmarks.bfcl.protocol import eval_plan, protocol, warmstart_config
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
from benchmarks.common.stages import Stage, free_first

__all__ = ["chosen_arm", "run_v2", "sweep_stages"]


def _steps(args: argparse.Namespace, full: int) -> int:
    return 1 if args.smoke else full


def sweep_stages(args: argparse.Namespace, proto: dict[str, Any], ws_key: str,
                 first_choice: dict[str, Any] | None) -> list[tuple[dict[str, Any], Stage]]:
    """The sweep's ``(arm, stage)`` pairs (the second phase's only with ``first_choice``)."""
    out, res = Path(args.out), results_v2(args)
    arms = sweep_arms(first_choice)
    if args.smoke:  # the pipeline only: one arm
        arms = arms[:1]
    return [(arm, Stage(out, f"sweep-{arm_name(arm)}", _config(args, proto, SWEEP_SEED, ws_key, arm,
                                                                _steps(args, SWEEP_STEPS)), res))
            for arm in arms]


def _config(args: argparse.Namespace, proto: dict[str, Any], seed: int, ws_key: str, arm: dict[str, Any],
            steps: int) -> dict[str, Any]:
    cfg = grpo_v2_config(proto, seed, ws_key, arm, steps, args.grpo_v2_tasks)
    if args.smoke:
        cfg.update(prompts_per_step=1, num_generations=2, validation_tasks=2, validation_every=1, save_steps=1,
                   tasks=4)
    return cfg


def chosen_arm(args: argparse.Namespace, proto: dict[str, Any], ws_key: str) -> tuple[dict[str, Any] | None,
                                                                                       dict[str, Any] | None]:
    """``(first phase's choice, final choice)`` from the sweep's records (``None`` while an arm is missing)."""

    def scored(pairs: list[tuple[dict[str, Any], Stage]]) -> list[tuple[dict[str, Any], Any]]:
        return [(arm, None if (r := st.result()) is None else arm_score(r.get("validation_history") or []))
                for arm, st in pairs]

    first = choose(scored(sweep_stages(args, proto, ws_key, None)))
    if first is None or args.smoke:
        return first, first
    return first, choose(scored(sweep_stages(args, proto, ws_key, first)))


def _warmstart(args: argparse.Namespace, proto: dict[str, Any], common: dict[str, Any], seed: int) -> Stage:
    """Seed ``seed``'s v1 warm start, its checkpoint on disk (rebuilt from its record when missing), evaluated."""
    out, results = Path(args.out), Path(args.results)
    cfg = warmstart_config(args, proto, seed)
    ws = Stage(out, f"warmstart-seed{seed}", cfg, results)
    if ws.result() is None or not ws.files_ready():
        print(f"[bfcl v2] warm start, seed {seed}" + (" (rebuilt from its record)" if ws.result() else ""),
              flush=True)
        run_child("_warmstart_stage", {**common, "results": str(results), "name": ws.name, "config": cfg,
                                       "rematerialise": ws.result() is not None})
    _evaluate(proto, common, results, f"warmstart-seed{seed}", str(ws.dir / "model"), ws.key)
    return ws


def _evaluate(proto: dict[str, Any], common: dict[str, Any], results: Path, tag: str, checkpoint: str | None,
              parent_key: str | None) -> None:
    out = Path(common["out"])
    todo = [ev for ev in eval_plan(proto, tag, parent_key) if Stage(out, ev["name"], ev["config"], results).result()
            is None]
    if todo:
        run_child("_eval_stages", {**common, "results": str(results), "checkpoint": checkpoint,
                                   "autocast": proto["autocast"], "evals": todo})


def _done(out: Path, results: Path, plan: list[dict[str, Any]]) -> bool:
    return all(Stage(out, e["name"], e["config"], results).result() is not None for e in plan)


def _grpo(common: dict[str, Any], stage: Stage, ws: Stage, *, sweep: bool, toolgym: dict[str, Any]) -> None:
    assert stage.results is not None  # v2's stages always have a results directory
    run_child("_grpo_v2_stage", {**common, "results": str(stage.results.parent), "name": stage.name,
                                 "config": stage.config, "warmstart_checkpoint": str(ws.dir / "model"),
                                 "rematerialise": stage.result() is not None, "sweep": sweep, "toolgym": toolgym})


def run_v2(args: argparse.Namespace) -> None:
    """Run (or resume) protocol v2's part ``args.v2_part``."""
    out, res = Path(args.out), results_v2(args)
    proto = protocol(args)
    common = {"out": str(out), "threads": args.threads, "num_envs": args.num_envs, "device": args.device}
    toolgym = {"shared_prefix": args.shared_prefix} if args.shared_prefix is not None else {}
    print(f"[bfcl v2] protocol: {json.dumps(proto)}; GRPO: {json.dumps(GRPO_V2)}", flush=True)
    ws0 = None
    if args.v2_part in ("sweep", "all"):
        ws0 = _warmstart(args, proto, common, SWEEP_SEED)
        # the first phase, then (its choice known) the whole sweep: the first phase's arms are finished by then
        for phase in ("first", "second"):
            first = None if phase == "first" else chosen_arm(args, proto, ws0.key)[0]
            if phase == "second" and (first is None or args.smoke):
                break
            pairs = sweep_stages(args, proto, ws0.key, first)
            arms = {stage.name: arm for arm, stage in pairs}
            for stage in free_first(stage for _, stage in pairs):  # drivers sharing --out run different arms side by side
                print(f"[bfcl v2] sweep arm {arm_name(arms[stage.name])}", flush=True)
                _grpo(common, stage, ws0, sweep=True, toolgym=toolgym)
    if args.v2_part == "sweep":
        return
    ws_key0 = Stage(out, f"warmstart-seed{SWEEP_SEED}", warmstart_config(args, proto, SWEEP_SEED),
                    Path(args.results)).key
    _, arm = chosen_arm(args, proto, ws_key0)
    if arm is None:
        raise SystemExit("[bfcl v2] the sweep is not finished: run --v2-part sweep (or all) first")
    print(f"[bfcl v2] chosen arm: {arm_name(arm)}", flush=True)
    _evaluate(proto, common, Path(args.results), "untrained", None, None)
    for seed in args.seeds:
        ws = Stage(out, f"warmstart-seed{seed}", warmstart_config(args, proto, seed), Path(args.results))
        gr = Stage(out, f"grpo-seed{seed}", _config(args, proto, seed, ws.key, arm, _steps(args, GRPO_V2["steps"])),
                   res)
        sel_plan = eval_plan(proto, f"grpo-seed{seed}", f"{gr.key}:selected")
        last_plan = eval_plan(proto, f"grpolast-seed{seed}", f"{gr.key}:last")
        rec = gr.result()
        needs_last = rec is None or rec.get("selected_step") != rec.get("global_step")
        evaluated = rec is not None and _done(out, res, sel_plan) and (not needs_last or _done(out, res, last_plan))
        if rec is None or (not evaluated and not gr.files_ready()):
            ws = _warmstart(args, proto, common, seed)
            print(f"[bfcl v2] GRPO, seed {seed}", flush=True)
            _grpo(common, gr, ws, sweep=False, toolgym=toolgym)
            rec = gr.result() or {}
            needs_last = rec.get("selected_step") != rec.get("global_step")
        _evaluate(proto, common, res, f"grpo-seed{seed}", str(gr.dir / "model"), f"{gr.key}:selected")
        if needs_last:
            _evaluate(proto, common, res, f"grpolast-seed{seed}", str(gr.dir / "last"), f"{gr.key}:last")
