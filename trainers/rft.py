"""RFT: rejection-sampling fine-tuning on the model's **own** episodes (not an oracle's).

Each round: sample ``k`` episodes per training task from the current model (temperature > 0), keep those whose
reward clears ``threshold`` (optionally only the best per task), fine-tune on the kept episodes with the env's
loss mask (:func:`trainers.sft.masked_sft`: only tokens the model sampled are trained), repeat. Oracle SFT
(:mod:`trainers.sft` with :func:`toolgym.evaluation.oracle_policy`) is behaviour cloning; RFT only ever
trains on what the model itself wrote, so it needs a model that sometimes succeeds (e.g. after a short warm start).

Per round it reports: sampled episodes, mean sampled reward, the share of tasks with at least one kept sample,
kept episodes, SFT steps and loss, and (``eval_tasks > 0``) held-out greedy success on the ``eval_split``.

Run (:class:`Config`, :func:`run`)::

    toolgym train rft --model runs/demo/warmstart --rounds 2 --tasks 64 --k 4 --output_dir runs/rft
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.contract import EnvConfig, RunResult
from trainers.runconfig import opt

__all__ = ["Config", "rft_round", "run", "select_samples"]


@dataclass
class Config(EnvConfig):
    """Rejection-sampling fine-tuning (``toolgym train rft``): config file keys = these fields and
    :class:`~trainers.contract.EnvConfig`'s."""

    # Parameters that control the tasks
    split: str = opt("train", "split the training tasks are drawn from (never the eval split)")
    tasks: int = opt(64, "number of distinct training tasks per round")
    task_seed: int = opt(1, "seed drawing the training tasks (toolgym.evaluation.tasks.draw_tasks)")

    # Parameters that control sampling
    k: int = opt(4, "samples per task per round")
    temperature: float = opt(1.0, "sampling temperature (> 0)")
    threshold: float = opt(1.0, "keep samples whose episode reward is >= this")
    best_per_task: bool = opt(False, "keep at most one sample per task (the highest reward)")
    max_turn_tokens: int = opt(64, "tokens sampled per assistant turn")
    num_envs: int = opt(64, "episodes sampled in parallel")
    env_seed_stride: int = opt(0, "env seeds of round r's episodes: 0 = (seed + r) * 1000003 + i; > 0 = seed + "
                                  "env_seed_stride * r + i (i: the episode's index in the round)")

    # Parameters that control the training
    rounds: int = opt(2, "sample -> filter -> fine-tune rounds (with max_generated_tokens: the most rounds)")
    max_generated_tokens: int = opt(0, "token budget: no new round once the tokens sampled so far reach this "
                                       "(it ends after the round that crosses it; 0: no budget, `rounds` rounds)")
    epochs: float = opt(1.0, "passes over the kept episodes per round (steps = ceil(epochs * kept / batch))")
    max_steps: int = opt(0, "cap on SFT steps per round (0: no cap)")
    lr: float = opt(5e-5, "AdamW learning rate (linear decay within a round)")
    batch_size: int = opt(8, "episodes per SFT step")
    seed: int = opt(0, "seed of sampling and SFT batch order")
    sft_seed: int | None = opt(None, "seed of the SFT batch order (null: seed + r in round r)")

    # Parameters that control the held-out evaluation
    eval_split: str = opt("test", "held-out split for per-round evaluation")
    eval_tasks: int = opt(0, "held-out tasks evaluated (greedy) after each round; 0 = no evaluation")
    eval_seed: int = opt(10_000, "seed drawing the held-out tasks, and their first env seed (same every round)")

    # Parameters that control the output
    output_dir: str = opt("runs/rft", "where the model, rft_log.json and trajectories are written")
    save: bool = opt(True, "save the final model (Hugging Face format) to output_dir")


def select_samples(trajectories: Sequence[Any], threshold: float, *, best_per_task: bool = False) -> list[Any]:
    """The samples to train on: reward ``>= threshold``; with ``best_per_task`` only the highest-reward one per
    task id (ties: the first sampled). Order follows ``trajectories``."""
    kept = [t for t in trajectories if t.reward >= threshold]
    if not best_per_task:
        return kept
    best: dict[str, Any] = {}
    for t in kept:
        key = str(t.task.get("id"))
        if key not in best or t.reward > best[key].reward:
            best[key] = t
    chosen = {id(t) for t in best.values()}
    return [t for t in kept if id(t) in chosen]


def rft_round(
    model: Any,
    tokenizer: Any,
    env: Any,
    tasks: Sequence[Mapping[str, Any]],
    *,
    k: int,
    threshold: float,
    temperature: float = 1.0,
    best_per_task: bool = False,
    epochs: float = 1.0,
    max_steps: int = 0,
    lr: float = 5e-5,
    batch_size: int = 8,
    max_turn_tokens: int = 64,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int = 64,
    env_seeds: int | Sequence[int] | None = None,
    sft_seed: int | None = None,
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """One RFT round: sample ``k`` episodes per task from ``model`` (temperature ``temperature``), keep
    :func:`select_samples`, fine-tune ``model`` in place on them (:func:`trainers.sft.masked_sft`).

    ``env``: an env id or a vector env. ``env_seeds``: the episodes' env seeds (an int ``s``: ``s + i``; default
    ``seed * 1000003 + i``); ``sft_seed``: the SFT batch order's seed (default ``seed``). Returns
    ``(kept, sampled, stats)``; ``stats`` has ``sampled``, ``sample_reward``, ``tasks_with_kept`` (share of tasks
    with >= 1 kept sample), ``kept``, ``sft_steps``, ``loss`` (per step), ``generated_tokens`` (tokens the model
    sampled) and ``wall_s``.
    """
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from trainers.sft import masked_sft

    if temperature <= 0:
        raise ValueError("RFT samples from the model: temperature must be > 0")
    t0 = time.perf_counter()
    policy = TransformersPolicy(model, tokenizer, temperature=temperature, seed=seed, return_logprobs=False)
    rows = [dict(t) for t in tasks for _ in range(k)]
    driver = RolloutDriver(env, policy, max_turn_tokens=max_turn_tokens, num_envs=min(num_envs, len(rows)),
                           env_kwargs={"tokenizer": tokenizer, **dict(env_kwargs or {})})
    if env_seeds is None:
        env_seeds = [seed * 1_000_003 + i for i in range(len(rows))]
    try:
        sampled = driver.run(rows, seeds=env_seeds)
    finally:
        if isinstance(env, str):  # the driver built this vector env: close it
            driver.venv.close()
    kept = select_samples(sampled, threshold, best_per_task=best_per_task)
    steps = math.ceil(epochs * len(kept) / batch_size) if kept else 0
    if max_steps > 0:
        steps = min(steps, max_steps)
    sft_seed = seed if sft_seed is None else sft_seed
    losses = masked_sft(model, kept, steps=steps, lr=lr, batch_size=batch_size, seed=sft_seed) if steps else []
    ids = {str(t["id"]) for t in tasks}
    stats = {
        "sampled": len(sampled),
        "sample_reward": sum(t.reward for t in sampled) / max(1, len(sampled)),
        "tasks_with_kept": len({str(t.task.get("id")) for t in kept} & ids) / max(1, len(ids)),
        "kept": len(kept),
        "sft_steps": steps,
        "loss": losses,
        "generated_tokens": int(driver.stats.generated_tokens),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    return kept, sampled, stats


def run(cfg: Config, *, model: Any = None, tokenizer: Any = None,
        log: Callable[[str], None] = print, tasks: Sequence[Mapping[str, Any]] | None = None) -> RunResult:
    """Run ``cfg.rounds`` RFT rounds (fewer when ``cfg.max_generated_tokens`` is reached first).
    ``model``/``tokenizer`` override ``cfg.model``; the model is trained in place.

    ``tasks``: a pool of training task rows instead of drawing ``cfg.tasks`` of them: round ``r`` takes the next
    ``n = min(cfg.tasks, len(pool))`` rows (``pool[(r * n + i) % len(pool)]``; the drawn default is a pool of at
    most ``cfg.tasks`` rows, i.e. the same tasks every round).

    ``metrics``: ``{"config", "rounds": [stats...], "generated_tokens", "eval_before"?}`` (also written to
    ``output_dir/rft_log.json``); ``artifacts``: ``kept_round{r}`` (each round's kept episodes, JSONL) and ``log``.
    """
    from toolgym.evaluation.tasks import draw_tasks, round_tasks
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from toolgym.trajectory import summarize, write_trajectories
    from trainers.contract import load_policy, prepare

    if cfg.split == cfg.eval_split and cfg.eval_tasks > 0:
        raise ValueError(f"RFT trains on split {cfg.split!r} and evaluates on it: use a held-out eval_split")
    prepare(threads=cfg.threads, seed=cfg.seed)
    if model is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = {"split": cfg.split, **cfg.env_kwargs}
    eval_kwargs = {"tokenizer": tokenizer, "split": cfg.eval_split, **cfg.env_kwargs}
    # the tasks come from the very envs the episodes run in (the env kwargs' split wins, as for the episodes)
    pool = list(tasks) if tasks is not None else draw_tasks(cfg.env_id, cfg.tasks, seed=cfg.task_seed,
                                                            env_kwargs={"tokenizer": tokenizer, **env_kwargs})
    eval_tasks = (draw_tasks(cfg.env_id, cfg.eval_tasks, seed=cfg.eval_seed, env_kwargs=eval_kwargs)
                  if cfg.eval_tasks > 0 else [])

    def evaluate() -> dict[str, Any]:
        driver = RolloutDriver(cfg.env_id, TransformersPolicy(model, tokenizer, do_sample=False,
                                                              return_logprobs=False),
                               max_turn_tokens=cfg.max_turn_tokens, num_envs=min(cfg.num_envs, len(eval_tasks)),
                               env_kwargs=eval_kwargs)
        s = summarize(driver.run(eval_tasks, seeds=list(range(cfg.eval_seed, cfg.eval_seed + len(eval_tasks)))))
        return {"success": s["success"], "tool_call_rate": s["tool_call_rate"], "n_tasks": s["episodes"]}

    result: dict[str, Any] = {"config": dataclasses.asdict(cfg), "rounds": [], "generated_tokens": 0}
    artifacts: dict[str, str] = {}
    if eval_tasks:
        result["eval_before"] = evaluate()
        log(f"[rft] held-out before: success {result['eval_before']['success']:.1%}")
    for r in range(cfg.rounds):
        if 0 < cfg.max_generated_tokens <= result["generated_tokens"]:
            break
        kept, sampled, stats = rft_round(
            model, tokenizer, cfg.env_id, round_tasks(pool, cfg.tasks, r), k=cfg.k, threshold=cfg.threshold,
            temperature=cfg.temperature, best_per_task=cfg.best_per_task, epochs=cfg.epochs,
            max_steps=cfg.max_steps, lr=cfg.lr, batch_size=cfg.batch_size, max_turn_tokens=cfg.max_turn_tokens,
            seed=cfg.seed + r, env_kwargs=env_kwargs, num_envs=cfg.num_envs,
            env_seeds=cfg.seed + cfg.env_seed_stride * r if cfg.env_seed_stride > 0 else None,
            sft_seed=cfg.sft_seed,
        )
        result["generated_tokens"] += stats["generated_tokens"]
        write_trajectories(out / f"round{r}_kept.jsonl", kept)
        artifacts[f"kept_round{r}"] = str(out / f"round{r}_kept.jsonl")
        stats["round"] = r + 1
        if eval_tasks:
            stats["eval"] = evaluate()
        result["rounds"].append(stats)
        loss = f"{stats['loss'][0]:.3f} -> {stats['loss'][-1]:.3f}" if stats["loss"] else "-"
        ev = f"  held-out success {stats['eval']['success']:.1%}" if "eval" in stats else ""
        log(f"[rft] round {r + 1}/{cfg.rounds}: sampled {stats['sampled']} (mean reward "
            f"{stats['sample_reward']:.2f}), tasks with >= 1 kept {stats['tasks_with_kept']:.0%}, kept "
            f"{stats['kept']}, {stats['sft_steps']} SFT steps (loss {loss}){ev}  ({stats['wall_s']:.0f} s)")
    model_dir = None
    if cfg.save:
        from toolgym.checkpoint import episode_env_kwargs, save_checkpoint

        save_checkpoint(model, tokenizer, out, run_settings={
            "env_id": cfg.env_id, "env_kwargs": episode_env_kwargs(cfg.env_kwargs),
            "max_turn_tokens": cfg.max_turn_tokens})
        model_dir = str(out)
    (out / "rft_log.json").write_text(json.dumps(result, indent=2, default=str))
    return RunResult("rft", str(out), model_dir, result, {**artifacts, "log": str(out / "rft_log.json")})


if __name__ == "__main__":  # `python -m trainers.rft ...` = `toolgym train rft ...`
    import sys

    from trainers.cli import main as _main

    sys.exit(_main(["rft", *sys.argv[1:]]))
