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
policy at the start of the round). Run::

    python -m trainers.dpo --config trainers/configs/dpo_calculator_cpu.yaml [--field value ...]
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python trainers/dpo.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer  # noqa: E402

from toolgym.trajectory import Trajectory  # noqa: E402
from trainers.runconfig import config_from_argv, opt  # noqa: E402  (config_from_argv: re-exported)

__all__ = [
    "DPORunConfig",
    "EnvDPOTrainer",
    "MaskedPreferenceCollator",
    "build_dpo_trainer",
    "config_from_argv",
    "load_pairs",
    "main",
    "make_pairs",
    "pairs_dataset",
    "run_dpo",
    "sample_pairs",
    "save_pairs",
    "train_dpo",
]

PAIR_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids", "chosen_mask", "rejected_mask",
                "chosen_reward", "rejected_reward", "task_id")


# ---------------------------------------------------------------------------------------------------------------
# Pairs
# ---------------------------------------------------------------------------------------------------------------


def _get(t: Trajectory | Mapping[str, Any], key: str) -> Any:
    return t[key] if isinstance(t, Mapping) else getattr(t, key)


def _task_id(t: Trajectory | Mapping[str, Any]) -> str:
    task = _get(t, "task") or {}
    return str(task.get("id", ""))


def make_pairs(
    trajectories: Sequence[Trajectory | Mapping[str, Any]],
    *,
    margin: float = 0.5,
    pairs_per_task: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Preference pairs from episodes (``Trajectory`` objects or their JSONL dicts).

    Episodes are grouped by task id **and** prompt ids (a pair always shares its prompt). In each group, candidate
    pairs ``(hi, lo)`` with ``reward(hi) - reward(lo) >= margin`` and ``reward(hi) > reward(lo)`` are taken widest
    gap first (ties in a seeded random order), each episode in at most one pair, up to ``pairs_per_task``.

    Returns:
        rows with ``prompt_ids``, ``chosen_ids``, ``rejected_ids`` (token ids), ``chosen_mask``, ``rejected_mask``
        (the loss masks, one int per completion token), ``chosen_reward``, ``rejected_reward``, ``task_id``.
    """
    if pairs_per_task < 1:
        raise ValueError(f"pairs_per_task must be >= 1, got {pairs_per_task}")
    if not (margin >= 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be a finite number >= 0, got {margin}")
    groups: dict[tuple[str, tuple[int, ...]], list[Trajectory | Mapping[str, Any]]] = {}
    for t in trajectories:
        c, m = _get(t, "completion_ids"), _get(t, "loss_mask")
        if len(c) != len(m):
            raise ValueError(f"completion_ids ({len(c)}) and loss_mask ({len(m)}) differ in length")
        groups.setdefault((_task_id(t), tuple(int(x) for x in _get(t, "prompt_ids"))), []).append(t)
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for (task_id, prompt), eps in groups.items():
        rewards = [float(_get(t, "reward")) for t in eps]
        cands = [(rewards[i] - rewards[j], rng.random(), i, j) for i in range(len(eps)) for j in range(len(eps))
                 if rewards[i] > rewards[j] and rewards[i] - rewards[j] >= margin]
        cands.sort(key=lambda c: (-c[0], c[1]))
        used: set[int] = set()
        n = 0
        for _, _, i, j in cands:
            if n >= pairs_per_task:
                break
            if i in used or j in used:
                continue
            used.update((i, j))
            n += 1
            hi, lo = eps[i], eps[j]
            rows.append({
                "prompt_ids": list(prompt),
                "chosen_ids": [int(x) for x in _get(hi, "completion_ids")],
                "rejected_ids": [int(x) for x in _get(lo, "completion_ids")],
                "chosen_mask": [int(x) for x in _get(hi, "loss_mask")],
                "rejected_mask": [int(x) for x in _get(lo, "loss_mask")],
                "chosen_reward": rewards[i],
                "rejected_reward": rewards[j],
                "task_id": task_id,
            })
    return rows


def pairs_dataset(pairs: Sequence[Mapping[str, Any]]) -> Any:
    """A ``datasets.Dataset`` of pair rows: the :data:`PAIR_COLUMNS` present in the first row (``prompt_ids``,
    ``chosen_ids`` and ``rejected_ids`` are required; an empty list gives an empty dataset with every column)."""
    from datasets import Dataset, Features, Sequence, Value

    ids = Sequence(Value("int64"))
    types = {"prompt_ids": ids, "chosen_ids": ids, "rejected_ids": ids, "chosen_mask": Sequence(Value("int8")),
             "rejected_mask": Sequence(Value("int8")), "chosen_reward": Value("float64"),
             "rejected_reward": Value("float64"), "task_id": Value("string")}
    cols = [k for k in PAIR_COLUMNS if not pairs or k in pairs[0]]
    missing = {"prompt_ids", "chosen_ids", "rejected_ids"} - set(cols)
    if missing:
        raise ValueError(f"pair rows lack {sorted(missing)}")
    return Dataset.from_dict({k: [p[k] for p in pairs] for k in cols}, features=Features({k: types[k] for k in cols}))


def save_pairs(pairs: Sequence[Mapping[str, Any]] | Any, path: str | Path) -> Path:
    """Write pairs as a Hugging Face dataset directory (``datasets.load_from_disk(path)`` reads it)."""
    ds = pairs if hasattr(pairs, "save_to_disk") else pairs_dataset(pairs)
    ds.save_to_disk(str(path), num_shards=1 if len(ds) == 0 else None)  # 0 shards would not load back
    return Path(path)


def load_pairs(path: str | Path) -> Any:
    """The pairs dataset saved by :func:`save_pairs`."""
    from datasets import load_from_disk

    return load_from_disk(str(path))


# ---------------------------------------------------------------------------------------------------------------
# TRL: collator and trainer
# ---------------------------------------------------------------------------------------------------------------


class MaskedPreferenceCollator(DataCollatorForPreference):
    """TRL's ``DataCollatorForPreference`` with the trajectory's loss mask as ``completion_mask``.

    Rows with ``chosen_mask`` / ``rejected_mask`` get ``[0] * len(prompt_ids) + mask`` (truncated and padded like
    the ids); rows without them keep TRL's all-ones completion mask. Output keys and layout are TRL's: the first
    half of the batch is the chosen sequences, the second half the rejected ones.
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch
        from trl.trainer.utils import pad

        out = super().torch_call(examples)
        masks = []
        for side in ("chosen", "rejected"):
            for ex in examples:
                comp = ex.get(f"{side}_mask")
                ids = ex[f"{side}_ids"]
                if comp is None:
                    comp = [1] * len(ids)
                if len(comp) != len(ids):
                    raise ValueError(f"{side}_mask ({len(comp)}) and {side}_ids ({len(ids)}) differ in length")
                masks.append([0] * len(ex["prompt_ids"]) + [int(x) for x in comp])
        if self.max_length is not None:
            sl = slice(None, self.max_length) if self.truncation_mode == "keep_start" else slice(-self.max_length, None)
            masks = [m[sl] for m in masks]
        mask = pad([torch.tensor(m, dtype=torch.long) for m in masks], padding_value=0, padding_side="right",
                   pad_to_multiple_of=self.pad_to_multiple_of)
        if mask.shape != out["completion_mask"].shape:  # pragma: no cover - would mean TRL changed its layout
            raise RuntimeError(f"mask shape {tuple(mask.shape)} != TRL's {tuple(out['completion_mask'].shape)}")
        out["completion_mask"] = mask
        return out


class EnvDPOTrainer(DPOTrainer):
    """``trl.DPOTrainer`` that keeps pre-tokenised pair rows as they are.

    Only ``_prepare_dataset`` is overridden: rows that already have ``prompt_ids``, ``chosen_ids`` and
    ``rejected_ids`` skip TRL's text extraction and tokenisation (which would fail on them); rows whose prompt
    alone fills ``max_length`` are dropped as TRL does. Anything else goes to TRL unchanged.
    """

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        first = next(iter(dataset))
        if not {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(first):
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        if args.max_length is not None and args.truncation_mode == "keep_start":
            dataset = dataset.filter(lambda ex: len(ex["prompt_ids"]) < args.max_length)
        return dataset


def build_dpo_trainer(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[Mapping[str, Any]] | Any,
    *,
    output_dir: str | Path,
    ref_model: Any = None,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    learning_rate: float = 1e-5,
    batch_size: int = 4,
    gradient_accumulation_steps: int = 1,
    epochs: float = 1.0,
    max_steps: int = -1,
    max_length: int | None = None,
    seed: int = 0,
    logging_steps: int = 1,
    disable_tqdm: bool = False,
    callbacks: Sequence[Any] = (),
    **dpo_kwargs: Any,
) -> EnvDPOTrainer:
    """An :class:`EnvDPOTrainer` over ``pairs`` (rows of :func:`make_pairs` or a dataset of them) with the
    loss-mask collator. ``ref_model`` defaults to a frozen copy of ``model`` as it is now. Extra keyword arguments
    go to ``trl.DPOConfig`` (gradient checkpointing, TRL's default, is off on CPU unless asked for: it only trades
    compute for memory)."""
    import torch
    from trl import DPOConfig

    ds = pairs if hasattr(pairs, "column_names") else pairs_dataset(pairs)
    if len(ds) == 0:
        raise ValueError("train_dpo: no preference pairs (no task had two episodes whose rewards differ by the margin)")
    if ref_model is None:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    args = DPOConfig(
        output_dir=str(output_dir), beta=beta, loss_type=[loss_type], learning_rate=learning_rate,
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=gradient_accumulation_steps,
        num_train_epochs=epochs, max_steps=max_steps, max_length=max_length, seed=seed,
        logging_steps=logging_steps, save_strategy="no", report_to=[], remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(), disable_tqdm=disable_tqdm,
        **{"gradient_checkpointing": torch.cuda.is_available(), **dpo_kwargs},
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = MaskedPreferenceCollator(pad_token_id=int(pad_id), max_length=max_length,
                                        truncation_mode=args.truncation_mode)
    return EnvDPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=ds, processing_class=tokenizer,
                         data_collator=collator, callbacks=list(callbacks))


def train_dpo(model: Any, tokenizer: Any, pairs: Sequence[Mapping[str, Any]] | Any, **kwargs: Any) -> EnvDPOTrainer:
    """Build (:func:`build_dpo_trainer`) and run DPO; ``model`` is trained in place and left in eval mode."""
    trainer = build_dpo_trainer(model, tokenizer, pairs, **kwargs)
    model.train()
    trainer.train()
    model.eval()
    return trainer


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
class DPORunConfig:
    """A DPO run (YAML keys = field names; every field is also a ``--field value`` flag)."""

    model: str | None = opt(None, "model path or hub id; null = the embedded SmolLM2-135M-Instruct")
    env_id: str = opt("toolgym/Calculator-v0", "toolgym env id")
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"split": "train"}, metadata={
        "help": "keyword arguments of the env (JSON on the command line)"})
    trajectories: str | None = opt(None, "offline: pair the episodes of this trajectory JSONL file (no sampling)")
    num_tasks: int = opt(32, "online: tasks drawn from the env (seeds task_seed ... task_seed + n - 1)")
    task_seed: int = opt(0, "online: first seed for drawing tasks")
    samples_per_task: int = opt(4, "online: episodes sampled per task and round (>= 2)")
    rounds: int = opt(1, "online: sample-pair-train rounds (the reference model is the policy at each round start)")
    temperature: float = opt(1.0, "online: sampling temperature")
    max_turn_tokens: int = opt(64, "online: tokens sampled per assistant turn")
    num_envs: int = opt(16, "online: parallel sub-envs for sampling")
    margin: float = opt(0.5, "a pair needs chosen reward - rejected reward >= margin (and strictly greater)")
    pairs_per_task: int = opt(1, "most pairs per task (and prompt); each episode is used at most once")
    beta: float = opt(0.1, "DPO beta (strength of the KL to the reference model)")
    loss_type: str = opt("sigmoid", "TRL DPO loss_type (sigmoid, ipo, hinge, ...)")
    learning_rate: float = opt(1e-5, "learning rate")
    batch_size: int = opt(4, "pairs per device batch")
    gradient_accumulation_steps: int = opt(1, "gradient accumulation steps")
    epochs: float = opt(1.0, "epochs over each round's pairs (ignored when max_steps > 0)")
    max_steps: int = opt(-1, "optimizer steps per round (-1: use epochs)")
    max_length: int | None = opt(None, "truncate prompt + completion to this many tokens (null: no limit)")
    output_dir: str = opt("runs/dpo", "where the pairs (pairs/ or pairs_round{k}/), trajectories and model go")
    save_model: bool = opt(True, "save the trained model and tokenizer to output_dir")
    seed: int = opt(0, "seed (sampling, pairing, training)")
    threads: int = opt(0, "torch CPU threads (0: torch's default)")


def run_dpo(cfg: DPORunConfig, *, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Offline (``cfg.trajectories``) or online DPO; returns a summary (pairs, losses, generated tokens, wall
    time), also written to ``output_dir/dpo_summary.json``. ``model``/``tokenizer`` default to ``cfg.model``."""
    import torch

    from toolgym.rollout import TransformersPolicy, read_trajectories, summarize
    from trainers.grpo import env_tasks

    t0 = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if model is None:
        from toolgym.models import load_model

        model, tokenizer = load_model(cfg.model)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = dict(cfg.env_kwargs)
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
        tasks = env_tasks(cfg.env_id, cfg.num_tasks, seed=cfg.task_seed, env_kwargs=env_kwargs)
        for r in range(cfg.rounds):
            policy = TransformersPolicy(model, tokenizer, temperature=cfg.temperature, seed=cfg.seed + 7919 * r,
                                        return_logprobs=False)
            pairs, trajs, stats = sample_pairs(
                cfg.env_id, policy, tasks, samples_per_task=cfg.samples_per_task, margin=cfg.margin,
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
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "dpo_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _losses(trainer: Any) -> list[float]:
    return [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m trainers.dpo --config FILE [--field value ...]`` (fields: :class:`DPORunConfig`)."""
    cfg = config_from_argv(DPORunConfig, argv, "DPO on toolgym env preference pairs (TRL DPOTrainer, loss-masked)")
    summary = run_dpo(cfg)
    print(f"[dpo] done in {summary['wall_s']} s: {sum(r['pairs'] for r in summary['rounds'])} pairs, "
          f"output in {cfg.output_dir}")


if __name__ == "__main__":
    main()
