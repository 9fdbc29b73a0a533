"""Reward model: a sequence scorer trained on env-labelled episodes (TRL ``RewardTrainer``), checked against the env.

Train a reward model on env-labelled trajectories and measure its agreement with the env's own reward.

* **Labels** come from the env: each trajectory's ``reward`` (the rule or tool-verified reward it earned).
  :func:`reward_pairs` turns them into Bradley-Terry pairs: a higher-reward episode (chosen) against a
  lower-reward one (rejected) whose reward is at least ``margin`` lower; across tasks by default (the model scores
  a whole sequence, prompt included, so pairs need not share a prompt: scalar labels of different tasks pair up),
  or within a task (``within_task=True``, the pairs of :func:`trainers.dpo.make_pairs`).
* **Sequences** are ``prompt_ids + completion_ids`` exactly as the env built them (tool results included: the
  reward model judges the whole episode). TRL's ``RewardTrainer`` keeps pre-tokenised ``chosen_ids`` /
  ``rejected_ids`` rows as they are; an optional ``margin`` column (``use_margin``) asks for a score gap of at
  least the reward gap.
* **Model**: ``AutoModelForSequenceClassification`` with one output over the policy's base model (a new score
  head), so it shares the policy's tokenizer; serve it with
  :class:`toolgym.rewards.RewardModelReward` (locally or behind vLLM).
* **Agreement** (:func:`agreement`): on held-out trajectories, accuracy of ``score >= threshold`` against
  ``reward >= success_threshold`` and the ROC AUC of the score for that label. The AUC is the Mann-Whitney
  statistic computed exactly over all (positive, negative) pairs (ties count one half): one formula, so no
  scikit-learn dependency.

Run (:class:`Config`, :func:`run`)::

    toolgym train reward_model --train_trajectories runs/x/train.jsonl --heldout_trajectories runs/x/test.jsonl \\
        --output_dir runs/rm [--model runs/demo/warmstart] [--max_steps 50]
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolgym.checkpoint import save_checkpoint
from toolgym.trajectory import Trajectory
from trainers.contract import BaseConfig, RunResult
from trainers.runconfig import opt

__all__ = [
    "Config",
    "agreement",
    "evaluate_agreement",
    "load_reward_base",
    "reward_pairs",
    "roc_auc",
    "run",
    "train_reward_model",
]


def _get(t: Trajectory | Mapping[str, Any], key: str) -> Any:
    return t[key] if isinstance(t, Mapping) else getattr(t, key)


def _sequence(t: Trajectory | Mapping[str, Any]) -> list[int]:
    return [int(x) for x in _get(t, "prompt_ids")] + [int(x) for x in _get(t, "completion_ids")]


# ---------------------------------------------------------------------------------------------------------------
# Pairs
# ---------------------------------------------------------------------------------------------------------------


def reward_pairs(
    trajectories: Sequence[Trajectory | Mapping[str, Any]],
    *,
    within_task: bool = False,
    margin: float = 0.5,
    max_pairs: int | None = None,
    pairs_per_task: int = 1,
    use_margin: bool = False,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Reward-model pairs from env-labelled episodes: rows ``chosen_ids`` / ``rejected_ids`` (whole sequences,
    prompt + completion) with ``chosen_reward`` / ``rejected_reward`` (and ``margin`` = their gap when
    ``use_margin``).

    Across tasks (default): episodes are sorted by reward (ties shuffled with ``seed``) and the k-th highest is
    paired with the k-th lowest while the gap is ``>= margin`` (and strictly positive); each episode in at most one
    pair. Within a task: :func:`trainers.dpo.make_pairs` with ``pairs_per_task``. ``max_pairs`` caps the total.
    """
    if within_task:
        from trainers.dpo import make_pairs

        rows = [{"chosen_ids": p["prompt_ids"] + p["chosen_ids"], "rejected_ids": p["prompt_ids"] + p["rejected_ids"],
                 "chosen_reward": p["chosen_reward"], "rejected_reward": p["rejected_reward"]}
                for p in make_pairs(trajectories, margin=margin, pairs_per_task=pairs_per_task, seed=seed)]
    else:
        rng = random.Random(seed)
        eps = [(float(_get(t, "reward")), rng.random(), t) for t in trajectories]
        eps.sort(key=lambda e: (-e[0], e[1]))
        rows = []
        lo = len(eps) - 1
        for hi in range(len(eps)):
            if hi >= lo:
                break
            (rh, _, th), (rl, _, tl) = eps[hi], eps[lo]
            if not (rh > rl and rh - rl >= margin):
                break
            rows.append({"chosen_ids": _sequence(th), "rejected_ids": _sequence(tl), "chosen_reward": rh,
                         "rejected_reward": rl})
            lo -= 1
        rng.shuffle(rows)
    if max_pairs is not None:
        rows = rows[:max_pairs]
    if use_margin:
        for r in rows:
            r["margin"] = r["chosen_reward"] - r["rejected_reward"]
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Model and training
# ---------------------------------------------------------------------------------------------------------------


def load_reward_base(name_or_path: str | None = None, *, dtype: str = "float32", seed: int = 0) -> tuple[Any, Any]:
    """``(AutoModelForSequenceClassification with num_labels=1, tokenizer)`` over a causal LM checkpoint
    (``None``: the embedded SmolLM2-135M-Instruct; ``"tiny"``: :func:`toolgym.models.tiny_random_model` seeded
    with ``seed``, for smoke tests); the score head is new, the rest is the checkpoint's."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from toolgym.models import embedded_cache_dir, load_model, load_tokenizer, tiny_random_model

    if name_or_path == "tiny":
        tok = load_tokenizer(None)
        lm = tiny_random_model(tok, seed=seed)
        lm.config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(lm.config)
        model.model.load_state_dict(lm.model.state_dict())  # the body is the tiny LM's; the score head is new
        model = model.to(getattr(torch, dtype))
        model.config.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        return model, tok
    if name_or_path is None:
        target = embedded_cache_dir() / "model"
        if not (target / ".complete").is_file():
            load_model(None)  # converts the GGUF file and fills the cache
        path, tok = str(target), load_tokenizer(None)
    else:
        path, tok = str(name_or_path), load_tokenizer(name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=getattr(torch, dtype))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.config.pad_token_id = int(pad)
    return model, tok


def train_reward_model(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[Mapping[str, Any]],
    *,
    output_dir: str | Path,
    learning_rate: float = 5e-5,
    batch_size: int = 8,
    epochs: float = 1.0,
    max_steps: int = -1,
    seed: int = 0,
    logging_steps: int = 1,
    save: bool = False,
    disable_tqdm: bool = False,
    **reward_kwargs: Any,
) -> Any:
    """Train ``model`` (a one-output sequence classifier) on ``pairs`` with TRL's ``RewardTrainer``; returns the
    trainer. ``save=True`` writes the model and tokenizer to ``output_dir``. Extra keyword arguments go to
    ``trl.RewardConfig`` (gradient checkpointing is off on CPU unless asked for)."""
    import torch
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    if not pairs:
        raise ValueError("train_reward_model: no pairs (every episode earned the same reward?)")
    cols = ["chosen_ids", "rejected_ids"] + (["margin"] if "margin" in pairs[0] else [])
    ds = Dataset.from_dict({k: [p[k] for p in pairs] for k in cols})
    args = RewardConfig(
        output_dir=str(output_dir), learning_rate=learning_rate, per_device_train_batch_size=batch_size,
        num_train_epochs=epochs, max_steps=max_steps, seed=seed, logging_steps=logging_steps, save_strategy="no",
        report_to=[], use_cpu=not torch.cuda.is_available(), disable_tqdm=disable_tqdm, max_length=None,
        **{"gradient_checkpointing": torch.cuda.is_available(), **reward_kwargs},
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    model.train()
    trainer.train()
    model.eval()
    if save:
        save_checkpoint(trainer, tokenizer, output_dir)
    return trainer


# ---------------------------------------------------------------------------------------------------------------
# Agreement with the env's reward
# ---------------------------------------------------------------------------------------------------------------


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """ROC AUC = P(score of a random positive > score of a random negative) + 0.5 P(tie); NaN without both
    classes. Exact over all pairs (O(P x N); held-out sets here are hundreds of episodes)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def agreement(
    scores: Sequence[float], rewards: Sequence[float], *, threshold: float = 0.5, success_threshold: float = 1.0,
) -> dict[str, Any]:
    """Agreement of reward-model ``scores`` with the env's ``rewards`` on the same episodes: ``accuracy`` of
    ``score >= threshold`` against ``reward >= success_threshold``, ``auc`` (:func:`roc_auc`), ``n`` and
    ``positives`` (episodes the env counts as successes). Failed scores (NaN) count as wrong and are reported in
    ``failed``."""
    if len(scores) != len(rewards):
        raise ValueError(f"{len(scores)} scores for {len(rewards)} rewards")
    labels = [r >= success_threshold for r in rewards]
    ok = [s == s for s in scores]  # not NaN
    correct = sum(o and ((s >= threshold) == y) for s, y, o in zip(scores, labels, ok, strict=True))
    kept = [(s, y) for s, y, o in zip(scores, labels, ok, strict=True) if o]
    return {
        "n": len(scores), "positives": sum(labels), "failed": len(scores) - sum(ok),
        "accuracy": correct / len(scores) if scores else float("nan"),
        "auc": roc_auc([s for s, _ in kept], [y for _, y in kept]),
    }


def evaluate_agreement(
    reward: Any, trajectories: Sequence[Trajectory | Mapping[str, Any]], **kwargs: Any,
) -> dict[str, Any]:
    """Score ``trajectories`` with a :class:`~toolgym.rewards.RewardModelReward` (or a model path / URL for one)
    and return :func:`agreement` with their env rewards (a failed score counts as NaN)."""
    from toolgym.rewards.reward_model import RewardModelError, RewardModelReward

    rm = reward if isinstance(reward, RewardModelReward) else RewardModelReward(str(reward))

    async def go() -> list[float | RewardModelError]:
        try:
            return await rm.score_many([_sequence(t) for t in trajectories])
        finally:
            await rm.aclose()

    got = asyncio.run(go())
    scores = [float("nan") if isinstance(g, RewardModelError) else float(g) for g in got]
    return agreement(scores, [float(_get(t, "reward")) for t in trajectories], **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Config and entry point
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Config(BaseConfig):
    """A reward-model run (``toolgym train reward_model``): config file keys = these fields and
    :class:`~trainers.contract.BaseConfig`'s (``model`` is the base causal LM the score head goes on)."""

    # Parameters that control the pairs
    train_trajectories: str = opt("", "trajectory JSONL file(s) with env rewards to train on (comma-separated)")
    heldout_trajectories: str | None = opt(None, "trajectory JSONL file(s) to measure agreement on (never trained on)")
    within_task: bool = opt(False, "pair episodes of the same task only (default: across tasks)")
    margin: float = opt(0.5, "a pair needs chosen reward - rejected reward >= margin")
    pairs_per_task: int = opt(1, "within_task only: most pairs per task")
    max_pairs: int | None = opt(None, "cap on the number of pairs (null: all)")
    use_margin: bool = opt(False, "pass the reward gap as TRL's `margin` column")

    # Parameters that control the training
    learning_rate: float = opt(5e-5, "learning rate")
    batch_size: int = opt(8, "pairs per device batch")
    epochs: float = opt(1.0, "epochs (ignored when max_steps > 0)")
    max_steps: int = opt(-1, "optimizer steps (-1: use epochs)")
    seed: int = opt(0, "seed")

    # Parameters that control the agreement and the output
    threshold: float = opt(0.5, "agreement: a score >= threshold predicts success")
    output_dir: str = opt("runs/reward_model", "where the model, tokenizer and rm_summary.json go")


def _read(files: str) -> list[dict[str, Any]]:
    from toolgym.rollout import read_trajectories

    return [row for f in files.split(",") if f.strip() for row in read_trajectories(f.strip())]


def run(cfg: Config, *, model: Any = None, tokenizer: Any = None) -> RunResult:
    """Train (and, with ``heldout_trajectories``, evaluate) a reward model, saved to ``output_dir``.

    ``metrics``: episodes, pairs, per-step loss and accuracy, ``heldout`` agreement (:func:`agreement`), wall time
    (also written to ``output_dir/rm_summary.json``).
    """
    from trainers.contract import prepare

    t0 = time.perf_counter()
    prepare(threads=cfg.threads, seed=cfg.seed)
    if not cfg.train_trajectories:
        raise ValueError("train_trajectories is required")
    train = _read(cfg.train_trajectories)
    pairs = reward_pairs(train, within_task=cfg.within_task, margin=cfg.margin, max_pairs=cfg.max_pairs,
                         pairs_per_task=cfg.pairs_per_task, use_margin=cfg.use_margin, seed=cfg.seed)
    print(f"[rm] {len(train)} episodes -> {len(pairs)} pairs", flush=True)
    if model is None:
        model, tokenizer = load_reward_base(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    tr = train_reward_model(model, tokenizer, pairs, output_dir=cfg.output_dir, learning_rate=cfg.learning_rate,
                            batch_size=cfg.batch_size, epochs=cfg.epochs, max_steps=cfg.max_steps, seed=cfg.seed,
                            save=True)
    summary: dict[str, Any] = {
        "config": asdict(cfg), "episodes": len(train), "pairs": len(pairs),
        "loss": [float(h["loss"]) for h in tr.state.log_history if "loss" in h],
        "train_accuracy": [float(h["accuracy"]) for h in tr.state.log_history if "accuracy" in h],
    }
    if cfg.heldout_trajectories:
        summary["heldout"] = evaluate_agreement(cfg.output_dir, _read(cfg.heldout_trajectories),
                                                threshold=cfg.threshold)
        h = summary["heldout"]
        print(f"[rm] held-out agreement on {h['n']} episodes ({h['positives']} successes): accuracy "
              f"{h['accuracy']:.3f}, AUC {h['auc']:.3f}", flush=True)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.output_dir) / "rm_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return RunResult("reward_model", cfg.output_dir, cfg.output_dir, summary,
                     {"summary": str(Path(cfg.output_dir) / "rm_summary.json")})


if __name__ == "__main__":  # `python -m trainers.reward_model ...` = `toolgym train reward_model ...`
    import sys

    from trainers.cli import main as _main

    sys.exit(_main(["reward_model", *sys.argv[1:]]))
