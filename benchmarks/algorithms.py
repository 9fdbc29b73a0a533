"""One comparison table: oracle SFT, RFT, DPO, GRPO and GRPO (``dr_grpo``) on Calculator-v0, from the same
warm-started checkpoint, with the same budget of generated tokens, on the same held-out test tasks.

Everything follows ``make demo`` (``trainers/configs/demo_cpu.yaml``), so the GRPO row is the demo's GRPO and the
other rows are what the same budget buys with another algorithm:

* **Warm start** (shared by every row): the demo's (3 masked-SFT steps, batch 8, lr 5e-5, on 32 oracle episodes of
  the ``train`` split) from the embedded SmolLM2-135M-Instruct, the demo's compact prompt everywhere, saved once
  under ``OUT/warm`` (or ``--warm PATH``: an existing checkpoint, e.g. ``runs/demo/warmstart``).
* **Budget = generated tokens** (not wall time): every method trains until the tokens its training episodes'
  turns took (``RolloutStats.generated_tokens``: tokens the policy sampled; for oracle SFT the oracle's action
  tokens) reach ``--budget`` (default 10,000: what the demo's 10 GRPO steps of 16 episodes generate, ~65 tokens
  per episode); it stops at the first step / round boundary past it, so the column reports what each really
  used. Every sampling method samples 16 episodes per step/round at temperature 0.5 (the demo's: at 1.0 the warm
  start solves 0/64 train samples). Evaluation tokens are not counted.

  - ``sft``: oracle episodes (train split) in rounds of 16, one masked-SFT epoch per round (lr 5e-5, the warm
    start's: ``trainers.ALGORITHMS["sft"]``, ``update: masked``);
  - ``rft``: rounds of one sampled episode for each of 16 tasks, keep reward 1, one masked-SFT epoch on them
    (rejection sampling from the model itself, iterated; ``k`` = the rounds the budget allowed);
  - ``dpo``: rounds of 4 tasks x 4 episodes, up to 2 pairs per task (reward margin 0.5), one DPO epoch
    (:mod:`trainers.dpo`: TRL ``DPOTrainer``, loss mask as ``completion_mask``; beta 0.1, lr 3e-5 = GRPO's; the
    reference model is the policy at each round's start);
  - ``grpo`` / ``grpo_dr``: the demo's GRPO (the algorithm's own trainer, :func:`trainers.grpo.build_trainer`:
    TRL ``GRPOTrainer`` through :mod:`trainers.grpo.rollout_adapter`, 4 tasks x 4 samples per step, lr 3e-5, beta 0) with
    ``loss_type`` ``grpo`` / ``dr_grpo``, stopped by a callback at the budget.

  Every row is its algorithm's own ``run`` (:data:`trainers.ALGORITHMS`, the contract): ``sft`` with
  ``update: masked`` (:func:`trainers.sft.masked_sft` after each round), ``rft``, ``dpo`` (each with
  ``max_generated_tokens`` = the budget and the method's task stream as the ``tasks=`` pool: round ``r`` takes its
  next tasks), ``grpo`` through :func:`trainers.grpo.build_trainer` (its ``run`` minus the save, plus the budget
  callback).

  No hyperparameter was chosen on the test split: the shared ones are the demo's (chosen on a validation draw of
  the train split), DPO's lr is GRPO's and its beta TRL's default.
* **Held-out**: the demo's 100 distinct Calculator-v0 ``test``-split tasks and seeds (never trained on), greedy,
  the same for every row (:func:`toolgym.evaluation.evaluate`): success with its 95% Wilson interval, the paired
  difference to the warm start with its 95% CI (:func:`toolgym.evaluation.paired_difference_ci`), tool-call rate.
* **Time**: training only (sampling + updates): wall seconds and the process's CPU seconds (both cores; less
  sensitive than wall time to other jobs on a shared machine).

Run (the table in ``docs/training.md`` came from this command)::

    python -m benchmarks.algorithms --out runs/algorithms

``--smoke`` runs a tiny version (~150 tokens per method, 5 tasks) that only checks the pipeline (add ``--base tiny``
to start from a random 3.2M-parameter model: every row then trains on nothing it can succeed at). Writes
``OUT/results.json`` and ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENV = "toolgym/Calculator-v0"
METHODS = ("sft", "rft", "dpo", "grpo", "grpo_dr")


def _tasks(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` distinct tasks of ``split`` from ``seed`` (:func:`toolgym.evaluation.tasks.draw_tasks`, as the demo draws)."""
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_tokenizer

    return draw_tasks(ENV, n, seed=seed, split=split, env_kwargs={"tokenizer": load_tokenizer()})


class TaskStream:
    """Endless distinct ``train`` tasks in a fixed order (every method sees the same sequence)."""

    def __init__(self, seed: int, n: int = 4096) -> None:
        self.rows = _tasks("train", n, seed)
        self.pos = 0

    def take(self, n: int) -> list[dict[str, Any]]:
        out = [self.rows[(self.pos + i) % len(self.rows)] for i in range(n)]
        self.pos += n
        return out


def _load(path: str | Path) -> tuple[Any, Any]:
    from toolgym.models import load_model

    return load_model(str(path))


def prompt_kwargs() -> dict[str, Any]:
    """The demo's compact prompt (env kwargs), used for every rollout and evaluation here."""
    from trainers.demo import prompt_kwargs as demo_prompt

    return demo_prompt(True)


def env_kwargs(tok: Any, split: str = "train") -> dict[str, Any]:
    return {"split": split, "tokenizer": tok, **prompt_kwargs()}


def warm_start(out: Path, a: argparse.Namespace) -> Path:
    """The demo's warm start (``a.warm_steps`` masked-SFT steps, batch 8, lr ``a.warm_lr``, on 32 oracle
    episodes) from ``a.base`` (``embedded``: SmolLM2-135M; ``tiny``: a random 3.2M-parameter Llama, for pipeline
    checks only; or a model path), saved with the compact template to ``out/warm`` (reused when present)."""
    from toolgym.checkpoint import save_checkpoint
    from toolgym.models import load_model, load_tokenizer, tiny_random_model
    from trainers import ALGORITHMS

    target = out / "warm"
    if (target / "config.json").is_file():
        return target
    import torch

    torch.manual_seed(a.seed)
    if a.base == "tiny":
        tok = load_tokenizer()
        model = tiny_random_model(tok)
    else:
        model, tok = load_model(None if a.base == "embedded" else a.base)
    sft = ALGORITHMS["sft"]  # masked SFT on oracle episodes: one round, a.warm_steps steps of 8
    conf = sft.Config(env_id=ENV, env_kwargs={k: v for k, v in env_kwargs(tok).items() if k != "tokenizer"},
                      policy="oracle", episodes=a.warm_episodes, task_seed=a.seed, num_envs=16,
                      max_turn_tokens=a.max_turn_tokens, update="masked", save_model=False,
                      trl=dict(output_dir=_tmp(a, "warm_sft"), max_steps=a.warm_steps, learning_rate=a.warm_lr,
                               per_device_train_batch_size=8, seed=a.seed, report_to=[], use_cpu=True,
                               disable_tqdm=True))
    result = sft.run(conf, model=model, tokenizer=tok, tasks=_tasks("train", a.warm_episodes, a.seed + 1))
    losses = result.metrics["loss"]
    print(f"[algorithms] warm start: {a.warm_steps} masked-SFT steps on {result.metrics['kept']} oracle episodes, "
          "loss " + " -> ".join(f"{x:.2f}" for x in losses), flush=True)
    return save_checkpoint(model, tok, target, chat_template=prompt_kwargs().get("chat_template"))


# ---------------------------------------------------------------------------------------------------------------
# The methods: each trains `model` in place until `budget` generated tokens; returns {"tokens", ...}
# ---------------------------------------------------------------------------------------------------------------


# SFT, RFT and DPO: the algorithm's own ``run`` (trainers.ALGORITHMS[name]) in rounds that end at the token budget
# (``max_generated_tokens``), each round taking the next tasks of the method's stream (the ``tasks=`` pool).
ROUNDS_CAP = 1_000_000  # rounds end at the token budget long before this


def _tmp(a: argparse.Namespace, name: str) -> str:
    return str(a.out / "tmp" / name)


def run_sft(model: Any, tok: Any, budget: int, a: argparse.Namespace, stream: TaskStream) -> dict[str, Any]:
    """Oracle episodes in rounds of ``a.round_tasks``, one masked-SFT epoch per round (``update: masked``)."""
    import torch

    from trainers import ALGORITHMS

    sft = ALGORITHMS["sft"]
    config = sft.Config(
        env_id=ENV, env_kwargs={"split": "train", **prompt_kwargs()}, policy="oracle", episodes=a.round_tasks,
        task_seed=a.seed, max_turn_tokens=a.max_turn_tokens, num_envs=16, update="masked", rounds=ROUNDS_CAP,
        max_generated_tokens=budget, save_model=False,
        trl={"output_dir": _tmp(a, "sft"), "learning_rate": a.sft_lr, "per_device_train_batch_size": a.batch_size,
             "num_train_epochs": 1.0, "seed": a.seed, "report_to": [], "max_length": None,
             "use_cpu": not torch.cuda.is_available()},
    )
    m = sft.run(config, model=model, tokenizer=tok, tasks=stream.rows).metrics
    return {"tokens": m["generated_tokens"], "rounds": m["rounds"], "episodes": m["episodes"]}


def run_rft(model: Any, tok: Any, budget: int, a: argparse.Namespace, stream: TaskStream) -> dict[str, Any]:
    """Rounds of one sampled episode for each of ``a.round_tasks`` tasks, keep reward 1, one masked-SFT epoch."""
    from trainers import ALGORITHMS

    rft = ALGORITHMS["rft"]
    config = rft.Config(
        env_id=ENV, env_kwargs=prompt_kwargs(), output_dir=_tmp(a, "rft"), split="train", tasks=a.round_tasks, k=1,
        temperature=a.temperature, threshold=1.0, rounds=ROUNDS_CAP, max_generated_tokens=budget, epochs=1.0,
        lr=a.sft_lr, batch_size=a.batch_size, max_turn_tokens=a.max_turn_tokens, num_envs=16, seed=a.seed,
        env_seed_stride=1000, sft_seed=a.seed, save=False,
    )
    res = rft.run(config, model=model, tokenizer=tok, tasks=stream.rows, log=lambda _: None)
    rounds = res.metrics["rounds"]
    return {"tokens": res.metrics["generated_tokens"], "rounds": len(rounds),
            "kept": sum(r["kept"] for r in rounds), "episodes": sum(r["sampled"] for r in rounds)}


def run_dpo(model: Any, tok: Any, budget: int, a: argparse.Namespace, stream: TaskStream) -> dict[str, Any]:
    """Rounds of ``a.round_tasks // a.dpo_samples`` tasks x ``a.dpo_samples`` episodes, up to 2 pairs per task."""
    from trainers import ALGORITHMS

    dpo = ALGORITHMS["dpo"]
    config = dpo.Config(
        env_id=ENV, env_kwargs={"split": "train", **prompt_kwargs()}, num_tasks=max(1, a.round_tasks // a.dpo_samples),
        samples_per_task=a.dpo_samples, rounds=ROUNDS_CAP, max_generated_tokens=budget, temperature=a.temperature,
        policy_seed_stride=1, max_turn_tokens=a.max_turn_tokens, num_envs=16, margin=0.5, pairs_per_task=2,
        beta=a.dpo_beta, learning_rate=a.dpo_lr, batch_size=a.batch_size, epochs=1.0, output_dir=_tmp(a, "dpo"),
        save_model=False, seed=a.seed,
    )
    m = dpo.run(config, model=model, tokenizer=tok, tasks=stream.rows).metrics
    return {"tokens": m["generated_tokens"], "rounds": len(m["rounds"]),
            "pairs": sum(r["pairs"] for r in m["rounds"]), "episodes": sum(r["episodes"] for r in m["rounds"])}


def _run_grpo(loss_type: str) -> Callable[..., dict[str, Any]]:
    def run(model: Any, tok: Any, budget: int, a: argparse.Namespace, stream: TaskStream) -> dict[str, Any]:
        import torch
        from transformers import TrainerCallback

        from trainers import ALGORITHMS

        grpo = ALGORITHMS["grpo"]
        tasks = stream.take(256)
        used = {"tokens": 0, "steps": 0, "episodes": 0}

        class Budget(TrainerCallback):
            """Counts the tokens of each new rollout (``rollout.last_stats``) and stops at the budget."""

            rollout: Any = None
            seen: Any = None

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                stats = getattr(self.rollout, "last_stats", None)
                if stats is not None and stats is not self.seen:
                    self.seen = stats
                    used["tokens"] += int(stats.generated_tokens)
                    used["episodes"] += len(self.rollout.last_trajectories)
                used["steps"] = state.global_step
                if used["tokens"] >= budget:
                    control.should_training_stop = True

        config = grpo.Config(
            env_id=ENV, env_kwargs=env_kwargs(tok), max_turn_tokens=a.max_turn_tokens, dataset_repeat=8,
            save_model=False,
            trl=dict(
                output_dir=str(a.out / "tmp"), max_steps=10_000, learning_rate=a.grpo_lr, loss_type=loss_type,
                per_device_train_batch_size=a.grpo_generations * a.grpo_prompts, num_generations=a.grpo_generations,
                max_completion_length=160, temperature=a.temperature, beta=0.0, logging_steps=1, save_strategy="no",
                report_to=[], seed=a.seed, use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
                gradient_checkpointing=False,
            ),
        )
        model.train()
        budget_cb = Budget()
        trainer, rollout = grpo.build_trainer(config, model=model, tokenizer=tok, tasks=tasks, callbacks=[budget_cb])
        budget_cb.rollout = rollout
        try:
            trainer.train()
        finally:
            rollout.close()
        model.eval()
        rewards = [round(h["reward"], 3) for h in trainer.state.log_history if "reward" in h]
        return {"tokens": used["tokens"], "steps": used["steps"], "episodes": used["episodes"],
                "train_reward": rewards}

    return run


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "sft": run_sft, "rft": run_rft, "dpo": run_dpo, "grpo": _run_grpo("grpo"), "grpo_dr": _run_grpo("dr_grpo"),
}
LABELS = {"warm": "warm start (no further training)", "sft": "oracle SFT", "rft": "RFT", "dpo": "DPO",
          "grpo": "GRPO (`loss_type=grpo`)", "grpo_dr": "GRPO (`loss_type=dr_grpo`)"}


# ---------------------------------------------------------------------------------------------------------------
# Evaluation and the table
# ---------------------------------------------------------------------------------------------------------------


def held_out(model: Any, tok: Any, tasks: Sequence[dict[str, Any]], a: argparse.Namespace) -> Any:
    from toolgym.evaluation import evaluate
    from toolgym.rollout import TransformersPolicy

    policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False)
    kw = env_kwargs(tok, "test")
    kw.pop("split")
    return evaluate(ENV, policy, list(tasks), seed=a.eval_seed, split="test", env_kwargs=kw,
                    num_envs=len(tasks), max_turn_tokens=a.max_turn_tokens)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown table of :func:`main`'s result rows."""
    head = ("| method | held-out success [95% CI] | Δ vs warm start [95% CI] | tool-call rate | train wall s "
            "| train CPU s | tokens generated | notes |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lo, hi = r["success_ci95"]
        d = r.get("delta")
        delta = "—" if d is None else f"{d['mean']:+.1%} [{d['lo']:+.1%}, {d['hi']:+.1%}]"
        lines.append(f"| {LABELS.get(r['method'], r['method'])} | {r['success']:.1%} [{lo:.1%}, {hi:.1%}] | {delta} "
                     f"| {r['tool_call_rate']:.1%} | {r['train_wall_s']:.0f} | {r.get('train_cpu_s', 0):.0f} | {r['tokens']} "
                     f"| {r.get('notes', '')} |")
    return "\n".join(lines)


def _notes(info: dict[str, Any]) -> str:
    keys = ("rounds", "steps", "episodes", "kept", "pairs")
    return ", ".join(f"{k} {info[k]}" for k in keys if k in info)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/algorithms"))
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    ap.add_argument("--budget", type=int, default=10_000, help="generated tokens per method")
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--eval-seed", type=int, default=10_000)
    ap.add_argument("--warm", default=None, help="an existing warm-start checkpoint (default: build OUT/warm)")
    ap.add_argument("--warm-steps", type=int, default=3, help="masked-SFT steps (batch 8) of the warm start")
    ap.add_argument("--warm-lr", type=float, default=5e-5)
    ap.add_argument("--warm-episodes", type=int, default=32, help="oracle episodes of the warm start")
    ap.add_argument("--base", default="embedded",
                    help="model the warm start begins from: embedded, tiny (pipeline checks only) or a path")
    ap.add_argument("--round-tasks", type=int, default=16, help="episodes per sampling round (SFT/RFT/DPO)")
    ap.add_argument("--max-turn-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--sft-lr", type=float, default=5e-5, help="SFT and RFT (masked SFT) learning rate")
    ap.add_argument("--temperature", type=float, default=0.5, help="sampling temperature of RFT, DPO and GRPO")
    ap.add_argument("--dpo-samples", type=int, default=4, help="DPO: episodes per task")
    ap.add_argument("--dpo-beta", type=float, default=0.1)
    ap.add_argument("--dpo-lr", type=float, default=3e-5)
    ap.add_argument("--grpo-lr", type=float, default=3e-5)
    ap.add_argument("--grpo-generations", type=int, default=4)
    ap.add_argument("--grpo-prompts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny run: checks the pipeline, measures nothing")
    a = ap.parse_args(argv)
    if a.smoke:
        a.budget, a.eval_tasks, a.warm_steps, a.round_tasks, a.warm_episodes = 150, 5, 1, 4, 8
        a.grpo_generations, a.grpo_prompts, a.max_turn_tokens, a.dpo_samples = 2, 1, 48, 2
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        ap.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")

    import torch

    from toolgym.evaluation import paired_difference_ci

    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    warm = Path(a.warm) if a.warm else warm_start(a.out, a)
    eval_tasks = _tasks("test", a.eval_tasks, a.eval_seed)
    results: list[dict[str, Any]] = []

    def record(method: str, model: Any, tok: Any, info: dict[str, Any], wall: float, cpu: float = 0.0) -> None:
        rep = held_out(model, tok, eval_tasks, a)
        row = {"method": method, "success": rep.success, "success_ci95": list(rep.success_ci95),
               "tool_call_rate": rep.tool_call_rate, "train_wall_s": round(wall, 1), "train_cpu_s": round(cpu, 1),
               "tokens": info.get("tokens", 0),
               "per_task_success": rep.per_task_success, "eval_wall_s": rep.wall_s, "info": info,
               "notes": _notes(info)}
        if results:
            row["delta"] = paired_difference_ci(results[0]["per_task_success"], rep.per_task_success)
        results.append(row)
        print(f"[algorithms] {method}: success {rep.success:.1%} {tuple(round(x, 3) for x in rep.success_ci95)}, "
              f"tool-call rate {rep.tool_call_rate:.1%}, {row['tokens']} tokens, train {wall:.0f} s", flush=True)
        (a.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                                        "rows": results}, indent=2, default=str))

    model, tok = _load(warm)
    record("warm", model, tok, {"tokens": 0}, 0.0)
    for m in methods:
        del model
        gc.collect()
        model, tok = _load(warm)
        torch.manual_seed(a.seed)
        s, c = time.perf_counter(), time.process_time()
        info = RUNNERS[m](model, tok, a.budget, a, TaskStream(a.seed + 7))
        record(m, model, tok, info, time.perf_counter() - s, time.process_time() - c)
    table = format_table(results)
    (a.out / "table.md").write_text(table + "\n")
    print(table)
    print(f"[algorithms] total {time.perf_counter() - t0:.0f} s; wrote {a.out / 'results.json'}, {a.out / 'table.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
