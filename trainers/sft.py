"""SFT: fine-tune on env episodes above a reward threshold (the env's oracle by default), env tokens masked.

Roll out a policy, keep the episodes whose reward clears a threshold, fine-tune on them with the env's loss mask
(only tokens the policy sampled are trained).

The fine-tuning itself is TRL's ``SFTTrainer`` on a pre-tokenised dataset: ``input_ids`` = prompt + completion
and ``assistant_masks`` = 0 on the prompt, then the trajectory's ``loss_mask`` (TRL turns mask-0 positions into
label -100). Nothing is re-tokenised: the ids are the env's.

The algorithm (:class:`Config`, :func:`run`; oracle episodes, TRL ``SFTTrainer``)::

    toolgym train sft --config trainers/configs/sft_calculator_cpu.yaml [--toolgym.episodes 32 --max_steps 8]

The pieces are shared: :func:`collect` (rejection sampling), :func:`masked_sft` (the fast masked-SFT loop of RFT,
the demo's warm start and the benchmarks), :func:`train_sft` (``SFTTrainer`` on trajectories).

Episodes with images (a vision-language env's, images as the processor's image tokens): :func:`masked_sft` with
``processor=`` gives every micro-batch's forward its rows' pixel tensors, grid sizes and image type ids
(:func:`trainers.vision.image_kwargs`); TRL's ``SFTTrainer`` path (:func:`sft_dataset`, :func:`train_sft`,
``update: trl``) takes token ids alone and refuses them (:class:`trainers.vision.VisionTrainingError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgym.checkpoint import episode_env_kwargs, save_checkpoint
from toolgym.precision import autocast_context
from toolgym.resources import trim_heap as toolgym_trim_heap
from toolgym.rollout import Policy, RolloutDriver, summarize
from toolgym.trajectory import Trajectory
from trainers.contract import EnvConfig, RunResult
from trainers.runconfig import opt
from trainers.vision import check_counts, check_vision_model, image_kwargs, trajectory_images

__all__ = [
    "OPTIMIZERS",
    "Config",
    "collect",
    "make_optimizer",
    "masked_sft",
    "masked_sft_loss",
    "pad_sft_batch",
    "run",
    "sft_dataset",
    "train_sft",
]


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
    then the loss mask: 1 only on tokens the policy sampled). Accepts trajectories or their JSONL dicts.

    Raises:
        VisionTrainingError: an episode holds image tokens (TRL's ``SFTTrainer`` would train on them without their
            images); use :func:`masked_sft` with ``processor=``.
    """
    from datasets import Dataset

    if any(trajectory_images(t) for t in trajectories):
        from trainers.vision import VisionTrainingError

        raise VisionTrainingError("sft_dataset: the episodes hold image tokens and TRL's SFTTrainer path takes token "
                                  "ids alone; train them with trainers.sft.masked_sft(..., processor=...) "
                                  "(toolgym train sft: update: masked)")

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


def masked_sft_loss(model: Any, ids: Any, attention_mask: Any, target: Any, **image_inputs: Any) -> Any:
    """Mean cross-entropy over the positions where ``target`` is True (the policy's own tokens), a scalar tensor.

    ``ids``, ``attention_mask``, ``target``: ``(B, L)``. The transformer body runs on the whole sequence but the
    LM head only on the targeted positions: with a 49,152-token vocabulary the head over all ~100-300 positions
    is most of the cost, which this path avoids. Position ``p`` predicts token ``p + 1``. Needs a model with
    ``.model`` (body) and ``.lm_head`` (Llama/Qwen/Mistral-style causal LMs, and the vision-language models
    whose body takes the images); others fall back to full logits. ``image_inputs``: the rows' image inputs
    (:func:`trainers.vision.image_kwargs`: type ids ``(B, L)``, ``pixel_values``, ``image_grid_thw``), passed to
    the forward.
    """
    import torch.nn.functional as F

    sel = target[:, 1:]
    labels = ids[:, 1:][sel]
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if body is not None and head is not None:
        hidden = body(input_ids=ids, attention_mask=attention_mask, **image_inputs).last_hidden_state  # (B, L, H)
        logits = head(hidden[:, :-1][sel])  # (targets, V)
    else:  # pragma: no cover - models without the body/head split
        logits = model(input_ids=ids, attention_mask=attention_mask, **image_inputs).logits[:, :-1][sel]
    import torch

    # half-precision logits are scored in float32; float32 and float64 ones as they are
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)


#: the optimizers :func:`make_optimizer` builds, by their ``transformers.TrainingArguments.optim`` names
OPTIMIZERS: tuple[str, ...] = ("adamw_torch", "adamw_bnb_8bit")


def make_optimizer(params: Sequence[Any], name: str, *, lr: float) -> Any:
    """An AdamW optimizer (no weight decay) over ``params``, named as ``transformers.TrainingArguments.optim``
    names it, so one config value means the same optimizer here and in TRL's trainers: ``"adamw_torch"``
    (``torch.optim.AdamW``, two float32 moments: 8 bytes per parameter) or ``"adamw_bnb_8bit"``
    (``bitsandbytes.optim.AdamW8bit``, block-wise 8-bit moments: ~2 bytes per parameter; it runs on CPUs too)."""
    import torch

    if name == "adamw_torch":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "adamw_bnb_8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ImportError("optim 'adamw_bnb_8bit' needs bitsandbytes: pip install 'toolgym[train]'") from None
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)
    raise ValueError(f"unknown optim {name!r} (one of {', '.join(OPTIMIZERS)})")


def make_scheduler(opt: Any, schedule: str, *, lr: float, steps: int) -> Any:
    """The learning-rate schedule of :func:`masked_sft` over ``steps`` optimizer steps: ``"linear"`` (decay to 0),
    ``"constant"`` or ``"onecycle"`` (10% warm-up to ``lr``, cosine down)."""
    import torch

    if schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    if schedule == "linear":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1.0 - k / steps))
    if schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    raise ValueError(f"masked_sft: unknown schedule {schedule!r} (linear, constant, onecycle)")


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
    optim: str = "adamw_torch",
    autocast: str | None = None,
    trim_heap: bool = False,
    processor: Any = None,
) -> list[float]:
    """Fine-tune ``model`` in place on the trajectories' policy tokens (``loss_mask`` 1) for ``steps`` steps;
    returns the loss per step. The shared fast path of :func:`train_sft`-style SFT, RFT (:mod:`trainers.rft`)
    and ``benchmarks/rollout.py``.

    Each step draws ``batch_size`` trajectories without replacement (a seeded permutation, reshuffled per epoch),
    takes one AdamW step (no weight decay) on :func:`masked_sft_loss`, clips the gradient norm to
    ``max_grad_norm``; ``schedule``: :func:`make_scheduler`'s. ``on_step(step, loss)`` is called after each step.
    ``micro_batch_size``: run each step's forward/backward in chunks of this many trajectories and accumulate the
    gradient (each chunk's loss weighted by its share of the step's policy tokens, so the step's loss and gradient
    are those of the whole batch up to float rounding); bounds activation memory. ``None``: the whole batch.
    ``optim``: the optimizer, by its ``transformers.TrainingArguments.optim`` name (:func:`make_optimizer`).
    ``autocast``: run forward and backward under ``torch.autocast`` in this dtype (``"bfloat16"``); weights,
    gradients and the optimizer stay in the model's dtype. ``trim_heap``: hand the heap's free pages back to the OS
    after every micro-batch (:func:`toolgym.resources.trim_heap`), so the next one's transient memory does not
    stack on the last one's leftovers. ``processor``: the vision-language model's processor, needed when
    episodes hold image tokens: each micro-batch's forward gets its rows' images (:mod:`trainers.vision`), so the
    loss is that of a plain forward of each whole conversation; image tokens have loss mask 0 and are never
    targets.

    Raises:
        VisionTrainingError: episodes hold image tokens and there is no ``processor`` or the model has no vision
            tower.
        VisionInputError: an episode's image-token count is not what its images take (a cut image block).
    """
    import torch

    if steps <= 0:
        return []
    if not trajectories:
        raise ValueError("masked_sft: no trajectories (did any episode clear the reward threshold?)")
    ids, attn, target = pad_sft_batch(trajectories)
    images = [trajectory_images(t) for t in trajectories]
    vision = any(images)
    if vision:
        check_vision_model(model, processor, "masked_sft")
        check_counts([(ids[i, : int(attn[i].sum())].tolist(), images[i]) for i in range(len(images))], processor)
    gen = torch.Generator().manual_seed(seed)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], optim, lr=lr)
    device = next(model.parameters()).device
    sched = make_scheduler(opt, schedule, lr=lr, steps=steps)
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
                mb_ids, mb_attn = ids[mb, :width].to(device), attn[mb, :width].to(device)
                extra = image_kwargs([images[i] for i in mb], mb_ids, mb_attn, processor) if vision else {}
                with autocast_context(device.type, autocast):
                    loss = masked_sft_loss(model, mb_ids, mb_attn, target[mb, :width].to(device), **extra) * share
                loss.backward()
                loss_total += float(loss.item())
                del loss
                if trim_heap:
                    toolgym_trim_heap()
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
        save_checkpoint(trainer, tokenizer, output_dir)
    return trainer


# ---------------------------------------------------------------------------------------------------------------
# The algorithm: Config and run
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Config(EnvConfig):
    """An SFT run: roll out a policy (by default the env's oracle), keep the episodes whose reward clears
    ``threshold``, fine-tune on them with TRL's ``SFTTrainer`` and the env's loss mask. The toolgym fields
    (:class:`~trainers.contract.EnvConfig`'s and these) are a config file's ``toolgym:`` section; its top-level keys
    are ``trl.SFTConfig`` fields (``trl``)."""

    # Parameters that control the episodes
    policy: str = opt("oracle", "who collects the episodes: 'oracle' (the env's oracle) or 'model' (the model)")
    episodes: int = opt(64, "episodes to roll out (tasks drawn with seeds task_seed ...)")
    task_seed: int = opt(0, "first task seed")
    threshold: float = opt(1.0, "keep episodes with reward >= this")
    max_turn_tokens: int = opt(128, "tokens sampled per assistant turn")
    num_envs: int = opt(16, "episodes run at once")
    temperature: float = opt(1.0, "sampling temperature of policy: model")
    trajectory_path: str | None = opt(None, "JSONL the kept episodes are written to (null: "
                                            "<output_dir>/sft_trajectories.jsonl)")

    # Parameters that control the training
    update: str = opt("trl", "how the model learns: 'trl' = one TRL SFTTrainer run (the trl fields) on the kept "
                             "episodes; 'masked' = trainers.sft.masked_sft after each round: "
                             "trl's max_steps AdamW steps when > 0, else "
                             "max(1, ceil(num_train_epochs * kept / per_device_train_batch_size)), with "
                             "trl's learning_rate (linear decay), max_grad_norm and seed")
    rounds: int = opt(1, "collect -> fine-tune rounds of `episodes` episodes each (> 1 needs update: masked; with "
                         "max_generated_tokens: the most rounds)")
    max_generated_tokens: int = opt(0, "token budget (update: masked): no new round once the policy tokens (loss "
                                       "mask 1) of the collected episodes reach this; 0: no budget")
    micro_batch_size: int = opt(0, "update: masked: each step's forward and backward in chunks of this many episodes, "
                                   "the gradient accumulated (the step's loss and gradient unchanged; bounds "
                                   "activation memory); 0: the whole batch at once")
    autocast: str | None = opt(None, "update: masked: forward and backward under torch.autocast in this dtype "
                                     "('bfloat16'); weights, gradients and optimizer stay in the model's dtype")
    checkpoint_activations: bool = opt(False, "update: masked: recompute activations in the backward (the same "
                                              "gradient, less memory)")
    trim_heap: bool = opt(False, "update: masked: hand the C heap's free pages back to the OS (glibc malloc_trim) "
                                 "after every micro-batch")
    save_model: bool = opt(True, "save the trained model and tokenizer to trl.output_dir")
    trl: dict[str, Any] = field(default_factory=lambda: {"max_length": None}, metadata={
        "help": "fields of trl.SFTConfig (in a config file: its top-level keys; on the command line: --max_steps 2 "
                "...); a trl.SFTConfig object is accepted too", "trl_config": "SFTConfig"})

    def __post_init__(self) -> None:
        if self.policy not in ("oracle", "model"):
            raise ValueError(f"policy must be 'oracle' or 'model', got {self.policy!r}")
        if self.update not in ("trl", "masked"):
            raise ValueError(f"update must be 'trl' or 'masked', got {self.update!r}")
        if self.update == "trl" and (self.rounds != 1 or self.max_generated_tokens):
            raise ValueError("rounds != 1 and max_generated_tokens need update: masked")


def _run_settings(config: Config, *, autocast: str | None) -> dict[str, Any]:
    """``toolgym_run.json`` beside the saved model: ``toolgym eval`` of it then renders and budgets its episodes
    as this run did."""
    return {"env_id": config.env_id, "env_kwargs": episode_env_kwargs(config.env_kwargs),
            "max_turn_tokens": config.max_turn_tokens, "autocast": autocast}


def run(config: Config, *, model: Any = None, tokenizer: Any = None,
        tasks: Sequence[Mapping[str, Any]] | None = None) -> RunResult:
    """Collect ``episodes`` episodes (oracle or model), keep those above ``threshold``, fine-tune with the loss
    mask (TRL ``SFTTrainer``), save to ``trl.output_dir``. ``model``/``tokenizer`` default to ``config.model``.
    With ``update: masked``: ``rounds`` rounds of collect -> :func:`masked_sft` (fewer when
    ``max_generated_tokens`` is reached first).

    ``tasks``: a pool of task rows instead of tasks drawn from the env seeds: round ``r`` takes the next
    ``n = min(episodes, len(pool))`` rows (``pool[(r * n + i) % len(pool)]``); every round's env seeds start at
    ``task_seed``.

    ``metrics``: ``episodes``, ``kept``, the rollout ``summary``, ``global_step``, ``loss`` (per logged step),
    ``rounds``, ``generated_tokens`` (policy tokens, loss mask 1, of the collected episodes).

    Raises:
        ConfigError: no episode cleared the threshold (exit code 1: nothing to train on).
    """
    from trl import SFTTrainer

    from toolgym.evaluation import oracle_policy
    from toolgym.evaluation.tasks import round_tasks
    from toolgym.rollout import TransformersPolicy
    from trainers.contract import load_policy, prepare, resolve_processor
    from trainers.runconfig import trl_config

    args = trl_config("SFTConfig", config.trl)
    prepare(threads=config.threads, seed=args.seed)
    if model is None:
        model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=args.seed)
    # env_kwargs.processor (true / a directory) -> the processor object (a vision-language model's image tokens)
    env_kwargs, tokenizer = resolve_processor(dict(config.env_kwargs), config.model, model, tokenizer)
    processor = env_kwargs.get("processor")
    policy: Policy = (oracle_policy() if config.policy == "oracle"
                      else TransformersPolicy(model, tokenizer, temperature=config.temperature, seed=args.seed,
                                              processor=processor))
    env_kwargs = {"tokenizer": tokenizer, **env_kwargs}

    def collect_round(r: int) -> tuple[list[Trajectory], list[Trajectory]]:
        rows: list[Mapping[str, Any] | None] = ([None] * config.episodes if tasks is None
                                                else list(round_tasks(tasks, config.episodes, r)))
        return collect(config.env_id, policy, rows, threshold=config.threshold, seeds=config.task_seed,
                       max_turn_tokens=config.max_turn_tokens, num_envs=config.num_envs, env_kwargs=env_kwargs)

    if config.update == "masked":
        return _run_masked(config, args, model, tokenizer, collect_round, processor)
    kept, alltr = collect_round(0)
    print(f"[sft] {len(alltr)} episodes, kept {len(kept)} (reward >= {config.threshold}): {summarize(alltr)}")
    out, traj_path = _write_kept(config, args, kept)
    trainer = SFTTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=sft_dataset(kept))
    trainer.train()
    model.eval()
    if config.save_model:
        save_checkpoint(trainer, tokenizer, out,
                        run_settings=_run_settings(config, autocast="bfloat16" if args.bf16 else None))
    metrics = {"episodes": len(alltr), "kept": len(kept), "summary": summarize(alltr),
               "global_step": int(trainer.state.global_step),
               "loss": [float(h["loss"]) for h in trainer.state.log_history if "loss" in h],
               "rounds": 1, "generated_tokens": _policy_tokens(alltr)}
    return _result(config, out, traj_path, metrics, f"{trainer.state.global_step} steps")


def _write_kept(config: Config, args: Any, kept: Sequence[Trajectory]) -> tuple[Path, Path]:
    """Create ``args.output_dir`` and write the kept episodes' JSONL; returns ``(output dir, JSONL path)``.

    Raises:
        ConfigError: nothing was kept (exit code 1: nothing to train on).
    """
    from toolgym.errors import ConfigError
    from toolgym.rollout import write_trajectories

    if not kept:
        raise ConfigError("no episode cleared the threshold: nothing to train on", code=1)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    traj_path = Path(config.trajectory_path or out / "sft_trajectories.jsonl")
    write_trajectories(traj_path, kept)
    return out, traj_path


def _result(config: Config, out: Path, traj_path: Path, metrics: dict[str, Any], done: str) -> RunResult:
    """Print what was done (and where the model went) and wrap it as the run's :class:`RunResult`."""
    print(f"[sft] {done}" + (f", model saved to {out}" if config.save_model else ""))
    return RunResult("sft", str(out), str(out) if config.save_model else None, metrics,
                     {"trajectories": str(traj_path)})


def _policy_tokens(trajectories: Sequence[Trajectory]) -> int:
    """Tokens the policy wrote (loss mask 1) in ``trajectories``."""
    return int(sum(sum(t.loss_mask) for t in trajectories))


def _run_masked(config: Config, args: Any, model: Any, tokenizer: Any,
                collect_round: Callable[[int], tuple[list[Trajectory], list[Trajectory]]],
                processor: Any = None) -> RunResult:
    """``run`` with ``update: masked``: rounds of ``collect_round(r)`` -> :func:`masked_sft` on the kept episodes
    until ``config.rounds`` rounds or ``config.max_generated_tokens`` policy tokens; ``processor`` (a
    vision-language model's) gives the forwards their images and is saved with the model."""
    import math

    kept_all: list[Trajectory] = []
    every: list[Trajectory] = []
    losses: list[float] = []
    rounds = tokens = 0
    for r in range(config.rounds):
        if 0 < config.max_generated_tokens <= tokens:
            break
        kept, alltr = collect_round(r)
        tokens += _policy_tokens(alltr)
        every += alltr
        kept_all += kept
        if kept:
            bs = int(args.per_device_train_batch_size)
            steps = args.max_steps if args.max_steps > 0 else max(1, math.ceil(args.num_train_epochs * len(kept) / bs))
            if config.checkpoint_activations:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            try:
                losses += masked_sft(model, kept, steps=steps, lr=args.learning_rate, batch_size=bs, seed=args.seed,
                                     max_grad_norm=args.max_grad_norm, micro_batch_size=config.micro_batch_size or None,
                                     autocast=config.autocast, trim_heap=config.trim_heap,
                                     processor=processor)
            finally:
                if config.checkpoint_activations:
                    model.gradient_checkpointing_disable()
        rounds += 1
    print(f"[sft] {rounds} rounds, {len(every)} episodes, kept {len(kept_all)} (reward >= {config.threshold}): "
          f"{summarize(every)}")
    out, traj_path = _write_kept(config, args, kept_all)
    if config.save_model:
        save_checkpoint(model, tokenizer, out, run_settings=_run_settings(config, autocast=config.autocast),
                        processor=processor)
    metrics = {"episodes": len(every), "kept": len(kept_all), "summary": summarize(every),
               "global_step": len(losses), "loss": losses, "rounds": rounds, "generated_tokens": tokens}
    return _result(config, out, traj_path, metrics, f"{len(losses)} masked-SFT steps")


if __name__ == "__main__":  # `python -m trainers.sft ...` = `toolgym train sft ...`
    import sys

    from trainers.cli import main as _main

    sys.exit(_main(["sft", *sys.argv[1:]]))
