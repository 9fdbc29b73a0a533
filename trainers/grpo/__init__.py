"""GRPO: TRL's GRPOTrainer on the model's own multi-turn episodes (TRL's ``rollout_func`` hook, env reward).

This module is the algorithm's contract (:class:`Config`, :func:`run`); the rest of the wing, in the order a run
visits it: :mod:`~trainers.grpo.build` (the trainer wired to the env), :mod:`~trainers.grpo.rollout_adapter` (TRL's
``rollout_func``: episodes through the env), :mod:`~trainers.grpo.generation` (generation with the trainer's own
model) and :mod:`~trainers.grpo.sampling`, :mod:`~trainers.grpo.trainer` (advantages, the loss) and
:mod:`~trainers.grpo.zero_advantage`, :mod:`~trainers.grpo.no_signal` (steps without signal skipped),
:mod:`~trainers.grpo.prompt_packing`, :mod:`~trainers.grpo.efficiency` (the CPU memory and speed techniques),
:mod:`~trainers.grpo.preflight` (checks before loading) and :mod:`~trainers.grpo.importance_sampling_metrics`.

Run (``toolgym train grpo``; any accelerate config, see ``docs/training.md``)::

    toolgym train grpo --config trainers/configs/grpo_calculator_cpu.yaml [--max_steps 2 ...]
    accelerate launch --config_file trainers/configs/accelerate_zero3.yaml -m trainers.cli grpo \\
        --config trainers/configs/qwen3_4b_search_8xa100.yaml

In Python: ``run(Config(env_id=..., trl={"max_steps": 2, ...}))``. The config file's top-level keys are
``trl.GRPOConfig`` fields (:attr:`Config.trl`) and its ``toolgym:`` section holds the other :class:`Config` fields.
Seams for variants of GRPO: :func:`~trainers.grpo.build.trainer_class` (which ``GRPOTrainer`` class to build, e.g.
a subclass with another advantage estimator) and :func:`~trainers.grpo.build.build_trainer` (the trainer wired to
the env; both are served from here too). Only ``rollout_func`` is
passed to TRL (no ``tools``/``environment_factory``: TRL would ignore ``env_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.checkpoint import episode_env_kwargs, save_checkpoint
from trainers.contract import EnvConfig, RunResult
from trainers.runconfig import opt

__all__ = ["Config", "build_trainer", "lora_config", "merge_adapters", "no_autocast_weight_cache", "run",
           "trainer_class"]

#: names served from the modules that import TRL/peft/accelerate, imported on first use (PEP 562)
_LAZY = {"build_trainer": "build", "lora_config": "build", "merge_adapters": "build", "trainer_class": "build",
         "no_autocast_weight_cache": "efficiency"}


@dataclass
class Config(EnvConfig):
    """A GRPO run: the toolgym fields (:class:`~trainers.contract.EnvConfig`'s and these: a config file's
    ``toolgym:`` section) and TRL's ``GRPOConfig`` (``trl``)."""

    num_train_tasks: int = opt(256, "distinct tasks drawn from the env for the dataset (toolgym.evaluation.tasks.draw_tasks; "
                                    "all of a dataset-backed split when it has fewer)")
    task_seed: int = opt(0, "seed drawing the training tasks")
    dataset_repeat: int = opt(1, "times the task list is repeated in the training dataset TRL samples prompts from "
                                 "(a longer run before an epoch ends; changes TRL's shuffled prompt order)")
    max_turn_tokens: int = opt(128, "tokens sampled per assistant turn")
    trajectory_dir: str | None = opt(None, "directory the adapter appends trajectory JSONL to (null: not saved)")
    schedule: str = opt("lockstep", "lockstep (required with several processes) or continuous")
    save_model: bool = opt(True, "save the trained model and tokenizer to trl.output_dir")
    advantage: str = opt("outcome", "credit assignment: outcome (one advantage per episode: TRL's GRPO, the "
                                    "default) | turn_return (each turn's tokens get its discounted reward-to-go "
                                    "minus a per-turn-index group baseline) | gigpo (episode advantage + a step "
                                    "advantage among turns from the same env state); trainers/grpo/trainer.py")
    gamma: float = opt(1.0, "per-turn discount of the turn_return / gigpo returns, in (0, 1]")
    lora: dict[str, Any] | None = field(default=None, metadata={
        "help": "train LoRA adapters instead of every weight: peft.LoraConfig fields, e.g. {r: 16, lora_alpha: 32, "
                "target_modules: all-linear}; null = full fine-tuning. Transformers generation runs on the merged "
                "weights; the saved model (and an in-process caller's model) has the adapters merged in"})
    trim_heap: bool = opt(False, "hand the C heap's free pages back to the OS (glibc malloc_trim) after each "
                                 "generation and each training micro-batch: a lower peak RSS on CPU, where "
                                 "generation's freed memory otherwise stays resident through the first "
                                 "backward; costs page faults (milliseconds per step)")
    skip_zero_advantage: bool = opt(True, "leave out the forward and backward of micro-batches whose advantages "
                                          "are all zero, where their gradient is exactly zero (one process, beta 0, "
                                          "no entropy bonus; trainers/grpo/zero_advantage.py): GRPO groups that all "
                                          "failed or all succeeded cost no training compute")
    skip_no_signal_steps: bool = opt(True, "skip the optimizer step when every micro-batch of it, on every "
                                           "process, has zero advantages and nothing else enters the loss (beta 0, "
                                           "no entropy bonus): its gradients are zero, yet AdamW would move the "
                                           "weights by its momentum and weight decay. The weights and optimizer "
                                           "state stay bit-identical; the learning-rate schedule still advances; "
                                           "logged as toolgym/skipped_optimizer_step(s); not under DeepSpeed "
                                           "(trainers/grpo/no_signal.py)")
    shared_prefix: bool = opt(True, "compute each GRPO group's prompt once: transformers generation prefills it "
                                    "once and copies its keys and values to the group's rows "
                                    "(toolgym/rollout/shared_prefix.py), and the loss forward and backward pack "
                                    "the rows of a micro-batch that share a prompt into one row, every completion "
                                    "attending to the prompt and to its own tokens (trainers/grpo/prompt_packing.py); "
                                    "same log-probabilities and gradients up to float rounding. The loss shares "
                                    "within a micro-batch: per_device_train_batch_size >= num_generations shares a "
                                    "whole group")
    # Dynamic sampling: train on groups with reward spread (trainers/grpo/dynamic_sampling.py)
    dynamic_sampling: bool = opt(False, "a training step rolls out more groups than it trains on and keeps those "
                                        "whose rewards differ (a non-zero advantage) until the step's quota of "
                                        "prompts is filled, drawing replacement tasks from the training tasks "
                                        "(DAPO); costs up to dynamic_sampling_max_draws times a step's rollouts. "
                                        "Several processes: per_device_train_batch_size * steps_per_generation "
                                        "must be a multiple of num_generations")
    dynamic_sampling_max_draws: int = opt(4, "rollout draws per step at most, the first (TRL's prompts) included; "
                                             "when they leave the quota short the step trains on what it kept plus "
                                             "zero-spread groups (zero advantage) and logs a warning")
    dynamic_sampling_history: bool = opt(False, "GRESO: remember each prompt's consecutive rollouts without "
                                                "spread (k) and skip it before rollout with probability "
                                                "min(0.9, 1 - (1 - dynamic_sampling_skip)^k); saved in checkpoints")
    dynamic_sampling_skip: float = opt(0.5, "the history's skip probability per zero-spread rollout, in [0, 1)")
    # Parameters that control validation and checkpoint selection (trainers/grpo/validation.py)
    validation_tasks: int = opt(0, "tasks of the training split held out by a hash of their ids "
                                   "(toolgym.evaluation.tasks.holdout_tasks), never trained on, and evaluated "
                                   "greedily at step 0, every validation_every steps and at the last step; "
                                   "0 = no validation")
    validation_every: int = opt(10, "optimizer steps between validation evaluations")
    validation_patience: int | None = opt(None, "stop training after this many evaluations in a row after the "
                                                "best that do not beat it (null: never)")
    validation_seed: int = opt(0, "hash salt choosing the validation tasks (a generated split: their drawing "
                                  "seed); episode i is reset with validation_seed + i")
    validation_metric: str = opt("success", "the validation score: success (share of episodes solved) | reward "
                                            "(mean episode reward)")
    validation_num_envs: int = opt(16, "parallel sub-envs of a validation evaluation")
    validation_reuse_dir: str | None = opt(None, "a directory shared by runs from the same starting weights (a "
                                                 "sweep): each run's step-0 evaluation is kept there, keyed by the "
                                                 "weights' SHA-256, the tasks, seed, turn budget, autocast and "
                                                 "threads, and read instead of evaluated again by a later run")
    keep_best: bool = opt(True, "with validation: save the best-scoring step's weights to <output_dir>/best/ "
                                "(ties: the earliest) and end the run with them, so the saved model is the "
                                "selected one")
    trl: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "fields of trl.GRPOConfig (in a config file: its top-level keys; on the command line: --max_steps 2 "
                "...); a trl.GRPOConfig object is accepted too", "trl_config": "GRPOConfig"})

    def __post_init__(self) -> None:
        from trainers.credit import check_estimator

        check_estimator(self.advantage)
        if not 0.0 < float(self.gamma) <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.lora is not None and not isinstance(self.lora, Mapping):
            raise ValueError(f"lora must be a mapping of peft.LoraConfig fields or null, got {self.lora!r}")
        if self.validation_tasks < 0 or self.validation_every < 1 or self.validation_num_envs < 1:
            raise ValueError("validation_tasks must be >= 0, validation_every and validation_num_envs >= 1; got "
                             f"{self.validation_tasks}, {self.validation_every}, {self.validation_num_envs}")
        if self.validation_patience is not None and self.validation_patience < 1:
            raise ValueError(f"validation_patience must be >= 1 or null, got {self.validation_patience}")
        if self.dynamic_sampling_max_draws < 1 or not 0.0 <= float(self.dynamic_sampling_skip) < 1.0:
            raise ValueError("dynamic_sampling_max_draws must be >= 1 and dynamic_sampling_skip in [0, 1); got "
                             f"{self.dynamic_sampling_max_draws}, {self.dynamic_sampling_skip}")
        if self.validation_metric not in ("success", "reward"):
            raise ValueError(f"validation_metric must be success or reward, got {self.validation_metric!r}")


def run(config: Config, *, model: Any = None, tokenizer: Any = None,
        tasks: Sequence[Mapping[str, Any]] | None = None, callbacks: Sequence[Any] = (),
        resume_from_checkpoint: str | None = None) -> RunResult:
    """Train with GRPO (:func:`build_trainer`), then save the model and tokenizer to ``trl.output_dir`` (when
    ``save_model``). ``model``/``tokenizer``/``tasks``/``callbacks``: as :func:`build_trainer` (in-process callers
    such as the demo); the model is trained in place. ``resume_from_checkpoint``: a ``checkpoint-N`` directory
    TRL saved under ``trl.output_dir`` (``save_strategy="steps"``): the run continues from step N with its
    optimizer, scheduler, RNG states and data order.

    ``metrics``: ``global_step`` and TRL's ``log_history`` (per logged step: ``reward``, ``toolgym/success``, ...);
    with validation (``validation_tasks > 0``) also ``selected_step`` (the step whose weights the run ends with),
    ``validation_history`` (one record per evaluation), ``validation_best`` and ``validation_stopped``.
    """
    from trainers.contract import prepare
    from trainers.grpo.build import build_trainer, merge_adapters

    prepare(threads=config.threads)
    # LoRA freezes every base weight: the caller's model gets its own trainable set back with the merged weights
    trainable = None if model is None or config.lora is None else {
        n: p.requires_grad for n, p in model.named_parameters()}
    trainer, rollout = build_trainer(config, model=model, tokenizer=tokenizer, tasks=tasks, callbacks=callbacks)
    args = trainer.args
    try:
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    finally:
        rollout.close()
        # TRL (its fused LM head) and Accelerate (mixed precision: autocast + float32 outputs) patched ``forward``
        # onto the model instance: an in-process caller gets the model back with its own forward, as a reload of
        # the saved weights has it (and a second trainer built on it does not wrap the wrappers)
        vars(trainer.model).pop("forward", None)
        merged = merge_adapters(trainer)
        if merged is not None and trainable is not None:
            for n, p in merged.named_parameters():
                p.requires_grad_(trainable.get(n, p.requires_grad))
    model_dir = None
    if config.save_model:
        # LoRA: the merged model, a plain checkpoint (toolgym eval / vLLM load it as any model)
        save_checkpoint(trainer if merged is None else merged, trainer.processing_class, args.output_dir,
                        main_process=trainer.accelerator.is_main_process,
                        processor=getattr(rollout, "processor", None), run_settings={
                            "env_id": config.env_id, "env_kwargs": episode_env_kwargs(config.env_kwargs),
                            "max_turn_tokens": config.max_turn_tokens,
                            "autocast": "bfloat16" if args.bf16 else None})
        model_dir = str(args.output_dir)
    trainer.accelerator.end_training()  # trackers, and the process group: a rank must not exit with gloo running
    artifacts = {"trajectories": str(config.trajectory_dir)} if config.trajectory_dir else {}
    from trainers.grpo.validation import validation_metrics

    return RunResult("grpo", str(args.output_dir), model_dir,
                     {"global_step": int(trainer.state.global_step), "log_history": list(trainer.state.log_history),
                      **validation_metrics(trainer)},  # selected_step, validation_history: trainers/grpo/validation.py
                     artifacts)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
