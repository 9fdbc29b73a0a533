"""A learning result on BFCL: the embedded SmolLM2-135M, untrained -> masked-SFT warm start -> GRPO, held out.

Per seed: evaluate the untrained model on the ``test`` split of the single-turn AST categories and irrelevance
(``--categories``, default the four non-live AST categories + ``irrelevance``) and on the live categories as an
out-of-distribution check (never trained on); warm-start with masked SFT on oracle episodes (BFCL's ground truth)
of the ``train`` split; evaluate; train with GRPO through the TRL adapter on the ``train`` split of the same
categories (one env, a category mixture: ``toolgym/BFCL-v0`` with ``category="a,b,..."``); evaluate. Every
evaluation is greedy on the same entries, so gains are paired per entry (``toolgym.evaluation.paired_difference_ci``).

    python benchmarks/bfcl.py --seeds 0 1 2 --out runs/bfcl_bench

``--tasks N`` evaluates N test entries per category (``all``: every one); ``--smoke`` runs a tiny version (a few
entries and steps) to check the pipeline. Writes ``OUT/metrics.json`` (per seed: the three tables with every
entry's verdict, the paired gains, wall times) and prints the summary.

For context, the leaderboard's published numbers for small models (theirs, BFCL v4 leaderboard, not measured here):
Qwen3-0.6B (FC) simple 64.2, multiple 86.0, parallel 67.5, parallel-multiple 69.5, multi-turn 3.6;
Llama-3.2-1B-Instruct non-live AST 38.4.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

TRAIN_CATEGORIES = "simple_python,multiple,parallel,parallel_multiple,irrelevance"
OOD_CATEGORIES = "live_simple,live_multiple,live_parallel,live_parallel_multiple,live_irrelevance"
ENV_ID = "toolgym/BFCL-v0"
#: the leaderboard's published figures (theirs), shown beside ours
PUBLISHED = {
    "Qwen3-0.6B (FC)": {"simple": 64.2, "multiple": 86.0, "parallel": 67.5, "parallel_multiple": 69.5,
                        "multi_turn": 3.6},
    "Llama-3.2-1B-Instruct": {"non_live_ast": 38.4},
}


def _per_entry(report: Any, categories: list[str]) -> list[float]:
    by = {(e["category"], e["id"]): float(e["valid"]) for e in report.entries}
    return [by[k] for k in sorted(by) if k[0] in categories]


def run_seed(seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One seed: three evaluations (in and out of distribution), warm start, GRPO; returns its metrics."""
    import torch

    import toolgym  # noqa: F401 - registers the envs
    from toolgym.evaluation import draw_tasks, oracle_policy, paired_difference_ci
    from toolgym.evaluation.bfcl import evaluate_bfcl, parse_categories
    from toolgym.models import load_model
    from toolgym.rollout import TransformersPolicy
    from trainers import ALGORITHMS
    from trainers.sft import collect, masked_sft

    torch.manual_seed(seed)
    cats, ood = parse_categories(args.categories), parse_categories(args.ood_categories)
    model, tok = load_model()
    env_kwargs = {"tokenizer": tok, "max_episode_tokens": args.max_episode_tokens}
    tasks: Any = "all" if args.tasks == "all" else int(args.tasks)

    def evaluate(tag: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False)
        rep_in = evaluate_bfcl(policy, cats, split="test", tasks=tasks, num_envs=args.num_envs,
                               max_turn_tokens=args.max_turn_tokens, seed=0, env_kwargs=env_kwargs, policy_name=tag)
        rep_ood = evaluate_bfcl(policy, ood, split="test", tasks=tasks, num_envs=args.num_envs,
                                max_turn_tokens=args.max_turn_tokens, seed=0, env_kwargs=env_kwargs, policy_name=tag)
        print(rep_in.format_table(), "\n", rep_ood.format_table(), flush=True)
        return {"in": rep_in, "ood": rep_ood, "wall_s": round(time.perf_counter() - t0, 1)}

    t_seed = time.perf_counter()
    before = evaluate("untrained")
    # -- warm start: masked SFT on oracle episodes of the train split ---------------------------------------------
    t0 = time.perf_counter()
    mixture = ",".join(cats)
    train_kw = {"category": mixture, "split": "train", "tokenizer": tok, "max_episode_tokens": args.max_episode_tokens}
    ws_tasks = draw_tasks(ENV_ID, args.warmstart_episodes, seed=seed + 1, split="train", env_kwargs=train_kw)
    kept, _ = collect(ENV_ID, oracle_policy(), ws_tasks, seeds=seed, num_envs=16, max_turn_tokens=args.max_turn_tokens,
                      env_kwargs=train_kw)
    losses = masked_sft(model, kept, steps=args.warmstart_steps, lr=args.warmstart_lr, batch_size=8, seed=seed)
    ws_wall = round(time.perf_counter() - t0, 1)
    warm = evaluate("warm start")
    # -- GRPO through the TRL adapter on the train split ----------------------------------------------------------
    t0 = time.perf_counter()
    grpo = ALGORITHMS["grpo"]
    bs = args.grpo_num_generations * args.grpo_prompts_per_step
    cfg = grpo.Config(
        env_id=ENV_ID, env_kwargs={k: v for k, v in train_kw.items() if k != "tokenizer"},
        max_turn_tokens=args.max_turn_tokens, save_model=False,
        trl=dict(output_dir=str(out / f"grpo_seed{seed}"), max_steps=args.grpo_steps, learning_rate=args.grpo_lr,
                 per_device_train_batch_size=bs, generation_batch_size=bs, gradient_accumulation_steps=1,
                 num_generations=args.grpo_num_generations, max_completion_length=args.max_turn_tokens,
                 temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[], seed=seed,
                 use_cpu=not torch.cuda.is_available(), disable_tqdm=True),
    )
    grpo_tasks = draw_tasks(ENV_ID, args.grpo_tasks, seed=seed + 2, split="train", env_kwargs=train_kw)
    model.train()
    grpo.run(cfg, model=model, tokenizer=tok, tasks=grpo_tasks)
    model.eval()
    grpo_wall = round(time.perf_counter() - t0, 1)
    after = evaluate("GRPO")

    def gain(a: dict[str, Any], b: dict[str, Any], key: str, categories: list[str]) -> dict[str, float]:
        return paired_difference_ci(_per_entry(a[key], categories), _per_entry(b[key], categories))

    non_live = [c for c in cats if c in ("simple_python", "multiple", "parallel", "parallel_multiple")]
    return {
        "seed": seed,
        "untrained": {k: before[k].to_dict() for k in ("in", "ood")},
        "warm_start": {k: warm[k].to_dict() for k in ("in", "ood")},
        "grpo": {k: after[k].to_dict() for k in ("in", "ood")},
        "warmstart": {"episodes": len(kept), "loss": losses, "wall_s": ws_wall},
        "grpo_wall_s": grpo_wall,
        # entries pooled over the non-live AST categories (the summary column is their mean; with equal sizes per
        # category under --tasks N the two agree)
        "grpo_gain_non_live_ast": gain(warm, after, "in", non_live),
        "warmstart_gain_non_live_ast": gain(before, warm, "in", non_live),
        "grpo_gain_ood": gain(warm, after, "ood", ood),
        "wall_s": round(time.perf_counter() - t_seed, 1),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--categories", default=TRAIN_CATEGORIES, help="trained on (train split) and evaluated (test)")
    p.add_argument("--ood-categories", default=OOD_CATEGORIES, help="evaluated only (test split)")
    p.add_argument("--tasks", default="all", help="test entries per category: 'all' or N")
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--max-turn-tokens", type=int, default=128)
    p.add_argument("--max-episode-tokens", type=int, default=4096)
    p.add_argument("--warmstart-episodes", type=int, default=256)
    p.add_argument("--warmstart-steps", type=int, default=40)
    p.add_argument("--warmstart-lr", type=float, default=1e-4)
    p.add_argument("--grpo-steps", type=int, default=40)
    p.add_argument("--grpo-tasks", type=int, default=320)
    p.add_argument("--grpo-prompts-per-step", type=int, default=4)
    p.add_argument("--grpo-num-generations", type=int, default=8)
    p.add_argument("--grpo-lr", type=float, default=1e-5)
    p.add_argument("--smoke", action="store_true", help="a tiny run: 4 entries per category, 2 SFT and 1 GRPO step")
    p.add_argument("--out", default="runs/bfcl_bench")
    args = p.parse_args(argv)
    if args.smoke:
        args.tasks, args.warmstart_episodes, args.warmstart_steps = "4", 16, 2
        args.grpo_steps, args.grpo_tasks, args.grpo_prompts_per_step, args.grpo_num_generations = 1, 4, 2, 2
        args.num_envs = 8
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    seeds = [run_seed(s, args, out) for s in args.seeds]
    metrics = {"config": vars(args), "seeds": seeds, "published_small_models_theirs": PUBLISHED,
               "wall_s": round(time.perf_counter() - t0, 1)}
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=1, default=str))
    tmp.replace(out / "metrics.json")
    print("\nseed  non-live AST: untrained -> warm start -> GRPO   GRPO's own gain [95% CI]   live AST (OOD)")
    for s in seeds:
        u, w, g = (s[k]["in"]["summary"]["non_live_ast"] for k in ("untrained", "warm_start", "grpo"))
        lo, hi, m = s["grpo_gain_non_live_ast"]["lo"], s["grpo_gain_non_live_ast"]["hi"], s["grpo_gain_non_live_ast"]["mean"]
        ood = [s[k]["ood"]["summary"]["live_ast"] for k in ("untrained", "warm_start", "grpo")]
        print(f"{s['seed']:>4}  {u:.1%} -> {w:.1%} -> {g:.1%}   {m:+.1%} [{lo:+.1%}, {hi:+.1%}]   "
              + " -> ".join("-" if x is None else f"{x:.1%}" for x in ood))
    print("context (the leaderboard's published numbers, theirs):", json.dumps(PUBLISHED))
    print(f"wrote {out / 'metrics.json'}; total {metrics['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
