"""DPO on env preference pairs, with TRL's ``DPOTrainer`` and the env's loss mask.

1. **Pairs from rollouts** (:func:`make_pairs`): episodes of the same task that share the same prompt ids are
   grouped; within a group a higher-reward episode (chosen) is paired with a lower-reward one (rejected) when
   ``chosen.reward - rejected.reward >= margin`` (always strictly greater), at most ``pairs_per_task`` pairs per
   group, each episode in at most one pair, widest reward gap first. A pair row carries ``prompt_ids``,
   ``chosen_ids`` / ``rejected_ids`` (the trajectories' ``completion_ids``), ``chosen_mask`` / ``rejected_mask``
   (their ``loss_mask``: 1 = a token the policy sampled, 0 = a token the env wrote), the two rewards and the task
   id. :func:`save_pairs` writes them as a ``datasets.Dataset`` (``datasets.load_from_disk`` reads it back).
2. **Only policy tokens count.** TRL 1.16's ``DataCollatorForPreference`` sets ``completion_mask`` to 1 on the whole
   completion, and ``DPOTrainer._compute_loss`` turns ``completion_mask == 0`` into label ``-100``, whose per-token
   log-probability its fused LM head leaves at 0 before summing the sequence log-probability (also for the
   reference model and every ``loss_type``; read from ``trl/trainer/dpo_trainer.py``). :class:`MaskedPreferenceCollator`
   passes the trajectory's loss mask as that ``completion_mask``, so tool results and chat framing the env wrote
   are context, not terms of the DPO log-ratio. (An env token still conditions the policy tokens after it, as it
   did when they were sampled.) ``DPOConfig.remove_unused_columns`` is set to ``False`` so the mask columns reach
   the collator.
3. **Pre-tokenised rows.** ``DPOTrainer._prepare_dataset`` always re-derives the prompt from text columns
   (``extract_prompt`` raises ``KeyError: 'chosen'`` on id-only rows); :class:`EnvDPOTrainer` overrides only that
   method to keep already tokenised rows as they are (the env's ids are never re-tokenised). Loss, reference model
   and optimisation are TRL's, unmodified.

Offline: pairs from a saved trajectory JSONL (``trajectories: FILE``). Online: each round samples
``samples_per_task`` episodes per task from the current model, pairs them and trains (the reference model is the
policy at the start of the round). Run (:class:`Config`, :func:`run`)::

    toolgym train dpo --config trainers/configs/dpo_calculator_cpu.yaml [--field value ...]

The TRL classes (:class:`~trainers.dpo.trainer.MaskedPreferenceCollator`, :class:`~trainers.dpo.trainer.EnvDPOTrainer`,
:func:`~trainers.dpo.trainer.train_dpo`) are in :mod:`trainers.dpo.trainer`, so this module imports without TRL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolgym.trajectory import Trajectory
from trainers.contract import EnvConfig, RunResult
from trainers.dpo.pairs import load_pairs, make_pairs, pairs_dataset, save_pairs
from trainers.runconfig import opt

__all__ = [
    "Config",
    "load_pairs",
    "make_pairs",
    "pairs_dataset",
    "run",
    "sample_pairs",
    "save_pairs",
]

# ---------------------------------------------------------------------------------------------------------------
# Sampling pairs from a model (online)
# ---------------------------------------------------------------------------------------------------------------


def sample_pairs(
    env_id: str,
    policy: Any,
    tasks: Sequence[Mapping[str, Any]],
    *,
    samples_per_task: int = 4,
    margin: float = 0.5,
    pairs_per_task: int = 1,
    seed: int = 0,
    max_turn_tokens: int = 64,
    num_envs: int = 16,
    env_kwargs: Mapping[str, Any] | None = None,
    trajectory_path: str | Path | None = None,
) -> tuple[list[dict[str, Any]], list[Trajectory], dict[str, Any]]:
    """Roll out ``samples_per_task`` episodes of every task with ``policy`` and pair them (:func:`make_pairs`).

    Returns ``(pairs, trajectories, rollout_stats)`` (``rollout_stats``: :class:`~toolgym.rollout.RolloutStats`
    as a dict, e.g. ``generated_tokens``).
    """
    from toolgym.rollout import RolloutDriver

    if samples_per_task < 2:
        raise ValueError("samples_per_task must be >= 2 to form pairs")
    rows = [dict(t) for t in tasks for _ in range(samples_per_task)]
    driver = RolloutDriver(env_id, policy, max_turn_tokens=max_turn_tokens, num_envs=min(num_envs, len(rows)),
                           env_kwargs=env_kwargs)
    try:
        trajs = driver.run(rows, seeds=seed, trajectory_path=trajectory_path)
    finally:
        driver.venv.close()
    pairs = make_pairs(trajs, margin=margin, pairs_per_task=pairs_per_task, seed=seed)
    return pairs, trajs, driver.stats.to_dict()


# ---------------------------------------------------------------------------------------------------------------
# Config and entry point
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Config(EnvConfig):
    """A DPO run (``toolgym train dpo``): config file keys = these fields and
    :class:`~trainers.contract.EnvConfig`'s. Episodes come from the env's ``train`` split unless ``env_kwargs``
    names a split."""

    # Parameters that control the pairs
    trajectories: str | None = opt(None, "offline: pair the episodes of this trajectory JSONL file (no sampling)")
    num_tasks: int = opt(32, "online: tasks drawn from the env (seeds task_seed ... task_seed + n - 1)")
    task_seed: int = opt(0, "online: first seed for drawing tasks")
    samples_per_task: int = opt(4, "online: episodes sampled per task and round (>= 2)")
    rounds: int = opt(1, "online: sample-pair-train rounds (the reference model is the policy at each round start; "
                         "with max_generated_tokens: the most rounds)")
    max_generated_tokens: int = opt(0, "online: token budget: no new round once the tokens sampled so far reach "
                                       "this (it ends after the round that crosses it; 0: no budget)")
    temperature: float = opt(1.0, "online: sampling temperature")
    policy_seed_stride: int = opt(7919, "online: round r samples with policy seed seed + policy_seed_stride * r")
    max_turn_tokens: int = opt(64, "online: tokens sampled per assistant turn")
    num_envs: int = opt(16, "online: parallel sub-envs for sampling")
    margin: float = opt(0.5, "a pair needs chosen reward - rejected reward >= margin (and strictly greater)")
    pairs_per_task: int = opt(1, "most pairs per task (and prompt); each episode is used at most once")

    # Parameters that control the training
    beta: float = opt(0.1, "DPO beta (strength of the KL to the reference model)")
    loss_type: str = opt("sigmoid", "TRL DPO loss_type (sigmoid, ipo, hinge, ...)")
    learning_rate: float = opt(1e-5, "learning rate")
    batch_size: int = opt(4, "pairs per device batch")
    gradient_accumulation_steps: int = opt(1, "gradient accumulation steps")
    epochs: float = opt(1.0, "epochs over each round's pairs (ignored when max_steps > 0)")
    max_steps: int = opt(-1, "optimizer steps per round (-1: use epochs)")
    max_length: int | None = opt(None, "truncate prompt + completion to this many tokens (null: no limit)")
    seed: int = opt(0, "seed (sampling, pairing, training)")

    # Parameters that control the output
    output_dir: str = opt("runs/dpo", "where the pairs (pairs/ or pairs_round{k}/), trajectories and model go")
    save_model: bool = opt(True, "save the trained model and tokenizer to output_dir")


def run(cfg: Config, *, model: Any = None, tokenizer: Any = None,
        tasks: Sequence[Mapping[str, Any]] | None = None) -> RunResult:
    """Offline (``cfg.trajectories``) or online DPO. ``model``/``tokenizer`` default to ``cfg.model``.

    ``tasks`` (online): a pool of task rows instead of drawing ``cfg.num_tasks`` of them: round ``r`` takes the
    next ``n = min(cfg.num_tasks, len(pool))`` rows (``pool[(r * n + i) % len(pool)]``; the drawn default is a
    pool of at most ``cfg.num_tasks`` rows, i.e. the same tasks every round).

    ``metrics``: pairs, losses, generated tokens and wall time per round (also written to
    ``output_dir/dpo_summary.json``); ``artifacts``: the pairs datasets and trajectories it wrote.
    """
    from toolgym.evaluation.tasks import draw_tasks, round_tasks
    from toolgym.rollout import TransformersPolicy, read_trajectories, summarize
    from trainers.contract import load_policy, prepare
    from trainers.dpo.trainer import train_dpo

    t0 = time.perf_counter()
    prepare(threads=cfg.threads, seed=cfg.seed)
    if model is None:
        model, tokenizer = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = {"split": "train", **cfg.env_kwargs}
    env_kwargs.setdefault("tokenizer", tokenizer)
    summary: dict[str, Any] = {"config": asdict(cfg), "rounds": [], "generated_tokens": 0}
    train_kw = dict(beta=cfg.beta, loss_type=cfg.loss_type, learning_rate=cfg.learning_rate,
                    batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                    epochs=cfg.epochs, max_steps=cfg.max_steps, max_length=cfg.max_length, seed=cfg.seed)
    if cfg.trajectories:
        pairs = make_pairs(read_trajectories(cfg.trajectories), margin=cfg.margin,
                           pairs_per_task=cfg.pairs_per_task, seed=cfg.seed)
        save_pairs(pairs, out / "pairs")
        print(f"[dpo] {len(pairs)} pairs from {cfg.trajectories} -> {out / 'pairs'}", flush=True)
        tr = train_dpo(model, tokenizer, pairs, output_dir=out, **train_kw)
        summary["rounds"].append({"pairs": len(pairs), "loss": _losses(tr)})
    else:
        pool = (list(tasks) if tasks is not None
                else draw_tasks(cfg.env_id, cfg.num_tasks, seed=cfg.task_seed, env_kwargs=env_kwargs))
        for r in range(cfg.rounds):
            if 0 < cfg.max_generated_tokens <= summary["generated_tokens"]:
                break
            policy = TransformersPolicy(model, tokenizer, temperature=cfg.temperature,
                                        seed=cfg.seed + cfg.policy_seed_stride * r, return_logprobs=False)
            pairs, trajs, stats = sample_pairs(
                cfg.env_id, policy, round_tasks(pool, cfg.num_tasks, r), samples_per_task=cfg.samples_per_task, margin=cfg.margin,
                pairs_per_task=cfg.pairs_per_task, seed=cfg.seed + 1_000 * r, max_turn_tokens=cfg.max_turn_tokens,
                num_envs=cfg.num_envs, env_kwargs=env_kwargs, trajectory_path=out / f"trajectories_round{r}.jsonl",
            )
            save_pairs(pairs, out / f"pairs_round{r}")
            s = summarize(trajs)
            summary["generated_tokens"] += int(stats["generated_tokens"])
            row: dict[str, Any] = {"round": r, "episodes": len(trajs), "pairs": len(pairs),
                                   "success": s["success"], "reward": s["reward"], "rollout": stats}
            print(f"[dpo] round {r}: {len(trajs)} episodes (success {s['success']:.1%}), {len(pairs)} pairs",
                  flush=True)
            if pairs:
                tr = train_dpo(model, tokenizer, pairs, output_dir=out, **train_kw)
                row["loss"] = _losses(tr)
            summary["rounds"].append(row)
    if cfg.save_model:
        from toolgym.checkpoint import episode_env_kwargs, save_checkpoint

        save_checkpoint(model, tokenizer, out, run_settings={
            "env_id": cfg.env_id, "env_kwargs": episode_env_kwargs(cfg.env_kwargs),
            "max_turn_tokens": cfg.max_turn_tokens})
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "dpo_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"[dpo] done in {summary['wall_s']} s: {sum(r['pairs'] for r in summary['rounds'])} pairs, "
          f"output in {out}", flush=True)
    artifacts = {"summary": str(out / "dpo_summary.json")}
    artifacts.update({p.name: str(p) for p in sorted(out.glob("pairs*"))})
    artifacts.update({p.stem: str(p) for p in sorted(out.glob("trajectories_round*.jsonl"))})
    return RunResult("dpo", str(out), str(out) if cfg.save_model else None, summary, artifacts)


def _losses(trainer: Any) -> list[float]:
    return [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
