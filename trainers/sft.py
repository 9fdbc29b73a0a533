"""RFT / SFT on trajectories: roll out (any policy, including a scripted oracle), keep the episodes whose reward
clears a threshold, and fine-tune on them with the env's loss mask (only tokens the policy sampled are trained).

The fine-tuning itself is TRL's ``SFTTrainer`` on a pre-tokenised dataset: ``input_ids`` = prompt + completion
and ``assistant_masks`` = 0 on the prompt, then the trajectory's ``loss_mask`` (TRL turns mask-0 positions into
label -100). Nothing is re-tokenised: the ids are the env's.

CLI (RFT with the oracle on Calculator-v0, then save)::

    python -m trainers.sft --env toolgym/Calculator-v0 --episodes 64 --output-dir runs/sft
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.rollout import EpisodeState, Policy, RolloutDriver, ScriptedPolicy, summarize
from toolgym.trajectory import Trajectory

__all__ = [
    "ORACLES",
    "calculator_oracle",
    "collect",
    "masked_sft",
    "masked_sft_loss",
    "oracle_policy",
    "pad_sft_batch",
    "sft_dataset",
    "train_sft",
]


# ---------------------------------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------------------------------


def env_oracle(state: EpisodeState) -> str:
    """The episode env's own oracle: ``state.env.oracle(state)`` (every built-in env defines one; see
    :meth:`toolgym.envs.base.ToolEnv.oracle`)."""
    return state.env.oracle(state)


def calculator_oracle(state: EpisodeState) -> str:
    """Calculator-v0 oracle (kept for compatibility): :meth:`toolgym.envs.calculator.CalculatorEnv.oracle`."""
    from toolgym.envs.calculator import CalculatorEnv

    return CalculatorEnv.oracle(state.env, state)


#: env id -> oracle script (``fn(EpisodeState) -> str``); the built-in envs delegate to their ``env.oracle``.
#: Add an entry only to override an env's own oracle; any other env id falls back to ``env.oracle``.
ORACLES: dict[str, Callable[[EpisodeState], str]] = {
    "toolgym/Calculator-v0": calculator_oracle,
    "toolgym/Search-v0": env_oracle,
    "toolgym/SQL-v0": env_oracle,
    "toolgym/Python-v0": env_oracle,
    "toolgym/MCP-v0": env_oracle,
}


def oracle_policy(env_id: str | None = None) -> ScriptedPolicy:
    """A :class:`~toolgym.rollout.ScriptedPolicy` running the oracle of ``env_id`` (from :data:`ORACLES`), or the
    env's own ``oracle(state)`` method when ``env_id`` is ``None`` or not listed. An env without an oracle raises
    ``NotImplementedError`` (naming the env) on the first turn."""
    return ScriptedPolicy(ORACLES.get(env_id or "", env_oracle))


# ---------------------------------------------------------------------------------------------------------------
# Rejection sampling and SFT
# ---------------------------------------------------------------------------------------------------------------


def collect(
    env: Any,
    policy: Policy,
    tasks: Sequence[Mapping[str, Any] | None],
    *,
    threshold: float = 1.0,
    seeds: Sequence[int | None] | int | None = 0,
    schedule: str = "lockstep",
    max_turn_tokens: int = 128,
    num_envs: int = 16,
    env_kwargs: Mapping[str, Any] | None = None,
    trajectory_path: str | Path | None = None,
) -> tuple[list[Trajectory], list[Trajectory]]:
    """Roll out one episode per task and keep those with ``reward >= threshold`` (rejection sampling).

    Returns ``(kept, all)``. ``env`` is a vector env or an env id (built with ``num_envs`` / ``env_kwargs``).
    """
    driver = RolloutDriver(
        env, policy, schedule=schedule, max_turn_tokens=max_turn_tokens,  # type: ignore[arg-type]
        num_envs=num_envs, env_kwargs=env_kwargs,
    )
    trajs = driver.run(tasks, seeds=seeds, trajectory_path=trajectory_path)
    return [t for t in trajs if t.reward >= threshold], trajs


def _episode_rows(trajectories: Sequence[Trajectory | Mapping[str, Any]]) -> list[tuple[list, list, list]]:
    """``(prompt_ids, completion_ids, loss_mask)`` lists of each trajectory (or its JSONL dict), lengths checked."""
    rows = []
    for t in trajectories:
        get = (lambda k, t=t: t[k]) if isinstance(t, Mapping) else (lambda k, t=t: getattr(t, k))
        p, c, m = list(get("prompt_ids")), list(get("completion_ids")), list(get("loss_mask"))
        if len(c) != len(m):
            raise ValueError(f"completion_ids ({len(c)}) and loss_mask ({len(m)}) differ in length")
        rows.append((p, c, m))
    return rows


def sft_dataset(trajectories: Sequence[Trajectory | Mapping[str, Any]]) -> Any:
    """A ``datasets.Dataset`` with ``input_ids`` (prompt + completion) and ``assistant_masks`` (0 on the prompt,
    then the loss mask: 1 only on tokens the policy sampled). Accepts trajectories or their JSONL dicts."""
    from datasets import Dataset

    ids, masks = [], []
    for p, c, m in _episode_rows(trajectories):
        ids.append(p + c)
        masks.append([0] * len(p) + [int(x) for x in m])
    return Dataset.from_dict({"input_ids": ids, "assistant_masks": masks})


def pad_sft_batch(trajectories: Sequence[Trajectory | Mapping[str, Any]]) -> tuple[Any, Any, Any]:
    """Right-padded ``(ids, attention, target)`` tensors, each ``(N, L)``; ``target`` is True at the completion
    positions whose ``loss_mask`` is 1 (tokens the policy wrote)."""
    import torch

    rows = _episode_rows(trajectories)
    width = max(len(p) + len(c) for p, c, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    target = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, c, m) in enumerate(rows):
        n = len(p) + len(c)
        ids[i, :n] = torch.tensor(p + c, dtype=torch.long)
        attn[i, :n] = 1
        target[i, len(p) : n] = torch.tensor([bool(x) for x in m], dtype=torch.bool)
    return ids, attn, target


def masked_sft_loss(model: Any, ids: Any, attention_mask: Any, target: Any) -> Any:
    """Mean cross-entropy over the positions where ``target`` is True (the policy's own tokens), a scalar tensor.

    ``ids``, ``attention_mask``, ``target``: ``(B, L)``. The transformer body runs on the whole sequence but the
    LM head only on the targeted positions: with a 49,152-token vocabulary the head over all ~100-300 positions
    is most of the cost (measured with the benchmark's tiny model on one shared core: TRL's ``SFTTrainer`` ~7 s
    per batch of 8, this path ~0.3 s). Position ``p`` predicts token ``p + 1``. Needs a model with
    ``.model`` (body) and ``.lm_head`` (Llama/Qwen/Mistral-style causal LMs); others fall back to full logits.
    """
    import torch.nn.functional as F

    sel = target[:, 1:]
    labels = ids[:, 1:][sel]
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is not None and head is not None:
        hidden = body(input_ids=ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
        logits = head(hidden[:, :-1][sel])  # (targets, V)
    else:  # pragma: no cover - models without the body/head split
        logits = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1][sel]
    return F.cross_entropy(logits.float(), labels)


def masked_sft(
    model: Any,
    trajectories: Sequence[Trajectory | Mapping[str, Any]],
    *,
    steps: int,
    lr: float = 1e-4,
    batch_size: int = 8,
    seed: int = 0,
    schedule: str = "linear",
    max_grad_norm: float = 1.0,
    on_step: Callable[[int, float], None] | None = None,
    micro_batch_size: int | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on the trajectories' policy tokens (``loss_mask`` 1) for ``steps`` steps;
    returns the loss per step. The shared fast path of :func:`train_sft`-style SFT, RFT (:mod:`trainers.rft`)
    and ``benchmarks/rollout.py``.

    Each step draws ``batch_size`` trajectories without replacement (a seeded permutation, reshuffled per epoch),
    takes one AdamW step (no weight decay) on :func:`masked_sft_loss`, clips the gradient norm to
    ``max_grad_norm``. ``schedule``: ``"linear"`` (decay to 0, like ``transformers``' default), ``"constant"``,
    or ``"onecycle"`` (10% warm-up, cosine down). ``on_step(step, loss)`` is called after each step.
    ``micro_batch_size``: run each step's forward/backward in chunks of this many trajectories and accumulate the
    gradient (each chunk's loss weighted by its share of the step's policy tokens, so the step's loss and gradient
    are those of the whole batch up to float rounding); bounds activation memory. ``None``: the whole batch.
    """
    import torch

    if steps <= 0:
        return []
    if not trajectories:
        raise ValueError("masked_sft: no trajectories (did any episode clear the reward threshold?)")
    ids, attn, target = pad_sft_batch(trajectories)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    if schedule == "onecycle":
        sched: Any = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    elif schedule == "linear":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1.0 - k / steps))
    elif schedule == "constant":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    else:
        raise ValueError(f"masked_sft: unknown schedule {schedule!r} (linear, constant, onecycle)")
    model.train()
    losses: list[float] = []
    order: list[int] = []
    try:
        for k in range(steps):
            if len(order) < min(batch_size, len(ids)):
                order += torch.randperm(len(ids), generator=gen).tolist()
            b, order = order[:batch_size], order[batch_size:]
            opt.zero_grad()
            mbs = micro_batch_size or len(b)
            n_all = int(target[b, 1:].sum())
            loss_total = 0.0
            for j in range(0, len(b), mbs):
                mb = b[j : j + mbs]
                width = int(attn[mb].sum(dim=1).max())
                share = int(target[mb, 1:width].sum()) / max(1, n_all)
                if share == 0:
                    continue
                loss = masked_sft_loss(model, ids[mb, :width], attn[mb, :width], target[mb, :width]) * share
                loss.backward()
                loss_total += float(loss.item())
                del loss
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            opt.step()
            sched.step()
            losses.append(loss_total)
            if on_step is not None:
                on_step(k + 1, losses[-1])
    finally:
        opt.zero_grad(set_to_none=True)  # the last step's gradients (one copy of the weights) are not kept
        model.eval()
    return losses


def train_sft(
    model: Any,
    tokenizer: Any,
    trajectories: Sequence[Trajectory | Mapping[str, Any]],
    *,
    output_dir: str | Path,
    epochs: float = 1.0,
    max_steps: int = -1,
    learning_rate: float = 5e-5,
    batch_size: int = 4,
    gradient_accumulation_steps: int = 1,
    seed: int = 0,
    logging_steps: int = 5,
    save: bool = False,
    disable_tqdm: bool | None = None,
    **sft_kwargs: Any,
) -> Any:
    """Fine-tune ``model`` on ``trajectories`` with the env's loss mask (TRL ``SFTTrainer``); returns the trainer.

    ``model`` is trained in place. ``save=True`` writes it (and the tokenizer) to ``output_dir``.
    Extra keyword arguments go to ``trl.SFTConfig``.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    if not trajectories:
        raise ValueError("train_sft: no trajectories (did any episode clear the reward threshold?)")
    ds = sft_dataset(trajectories)
    args = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        max_steps=max_steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        max_length=None,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=disable_tqdm if disable_tqdm is not None else False,
        **sft_kwargs,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    trainer.train()
    model.eval()
    if save:
        trainer.save_model(str(output_dir))
        tokenizer.save_pretrained(str(output_dir))
    return trainer


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="RFT/SFT on toolgym trajectories")
    ap.add_argument("--env", default="toolgym/Calculator-v0")
    ap.add_argument("--model", default=None, help="model path/id (default: the embedded SmolLM2-135M)")
    ap.add_argument("--policy", choices=["oracle", "model"], default="oracle", help="who collects the episodes")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=1.0)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/sft")
    a = ap.parse_args(argv)

    import torch

    from toolgym.models import load_model
    from toolgym.rollout import TransformersPolicy, write_trajectories

    torch.manual_seed(a.seed)
    model, tok = load_model(a.model)
    policy: Policy = oracle_policy(a.env) if a.policy == "oracle" else TransformersPolicy(model, tok, seed=a.seed)
    kept, alltr = collect(a.env, policy, [None] * a.episodes, threshold=a.threshold, seeds=a.seed,
                          env_kwargs={"tokenizer": tok})
    print(f"collected {len(alltr)} episodes, kept {len(kept)} (reward >= {a.threshold}): {summarize(alltr)}")
    os.makedirs(a.output_dir, exist_ok=True)
    write_trajectories(Path(a.output_dir) / "sft_trajectories.jsonl", kept)
    train_sft(model, tok, kept, output_dir=a.output_dir, epochs=a.epochs, learning_rate=a.lr,
              batch_size=a.batch_size, seed=a.seed, save=True)
    print(f"saved to {a.output_dir}")


if __name__ == "__main__":
    main()
