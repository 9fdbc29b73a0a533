"""GRPO: TRL's GRPOTrainer on the model's own multi-turn episodes (TRL's ``rollout_func`` hook, env reward).

This module is the algorithm's contract (:class:`Config`, :func:`run`); the rest of the wing, in the order a run
visits it: :mod:`~trainers.grpo.build` (the trainer wired to the env), :mod:`~trainers.grpo.rollout_adapter` (TRL's
``rollout_func``: episodes through the env), :mod:`~trainers.grpo.generation` (generation with the trainer's own
model) and :mod:`~trainers.grpo.sampling`, :mod:`~trainers.grpo.trainer` (advantages, the loss) and
:mod:`~trainers.grpo.zero_advantage`, :mod:`~trainers.grpo.shared_prefix`, :mod:`~trainers.grpo.efficiency` (the CPU memory and speed techniques),
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

from toolgym.checkpoint import episode_env_kwargs, write_run_settings
from trainers.contract import RunResult
from trainers.runconfig import opt

__all__ = ["Config", "build_trainer", "lora_config", "merge_adapters", "no_autocast_weight_cache", "run",
           "trainer_class"]

#: names served from the modules that import TRL/peft/accelerate, imported on first use (PEP 562)
_LAZY = {"build_trainer": "build", "lora_config": "build", "merge_adapters": "build", "trainer_class": "build",
         "no_autocast_weight_cache": "efficiency"}


@dataclass
class Config:
    """A GRPO run: the toolgym fields (a config file's ``toolgym:`` section) and TRL's ``GRPOConfig`` (``trl``)."""

    model: str | None = opt(None, "model path / hub id; null = the embedded SmolLM2-135M-Instruct; "
                                  "'tiny' = a tiny random model (smoke tests)")
    dtype: str = opt("float32", "weights dtype (float32, bfloat16)")
    env_id: str = opt("toolgym/Calculator-v0", "toolgym env id")
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the env, e.g. {split: train}, a retriever URL, template_kwargs"})
    num_train_tasks: int = opt(256, "distinct tasks drawn from the env for the dataset (toolgym.evaluation.tasks.draw_tasks; "
                                    "all of a dataset-backed split when it has fewer)")
    task_seed: int = opt(0, "seed drawing the training tasks")
    dataset_repeat: int = opt(1, "times the task list is repeated in the training dataset TRL samples prompts from "
                                 "(a longer run before an epoch ends; changes TRL's shuffled prompt order)")
    max_turn_tokens: int = opt(128, "tokens sampled per assistant turn")
    trajectory_dir: str | None = opt(None, "directory the adapter appends trajectory JSONL to (null: not saved)")
    schedule: str = opt("lockstep", "lockstep (required with several processes) or continuous")
    threads: int = opt(0, "torch CPU threads per process (0: torch's default)")
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
    shared_prefix: bool = opt(True, "compute each GRPO group's prompt once: transformers generation prefills it "
                                    "once and copies its keys and values to the group's rows "
                                    "(toolgym/rollout/shared_prefix.py), and the loss forward and backward pack "
                                    "the rows of a micro-batch that share a prompt into one row, every completion "
                                    "attending to the prompt and to its own tokens (trainers/grpo/shared_prefix.py); "
                                    "same log-probabilities and gradients up to float rounding. The loss shares "
                                    "within a micro-batch: per_device_train_batch_size >= num_generations shares a "
                                    "whole group")
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


def run(config: Config, *, model: Any = None, tokenizer: Any = None,
        tasks: Sequence[Mapping[str, Any]] | None = None, callbacks: Sequence[Any] = (),
        resume_from_checkpoint: str | None = None) -> RunResult:
    """Train with GRPO (:func:`build_trainer`), then save the model and tokenizer to ``trl.output_dir`` (when
    ``save_model``). ``model``/``tokenizer``/``tasks``/``callbacks``: as :func:`build_trainer` (in-process callers
    such as the demo); the model is trained in place. ``resume_from_checkpoint``: a ``checkpoint-N`` directory
    TRL saved under ``trl.output_dir`` (``save_strategy="steps"``): the run continues from step N with its
    optimizer, scheduler, RNG states and data order.

    ``metrics``: ``global_step`` and TRL's ``log_history`` (per logged step: ``reward``, ``toolgym/success``, ...).
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
        if merged is None:
            trainer.save_model(args.output_dir)
        elif trainer.accelerator.is_main_process:  # a plain checkpoint: toolgym eval / vLLM load it as any model
            merged.save_pretrained(args.output_dir)
        if trainer.accelerator.is_main_process:
            trainer.processing_class.save_pretrained(args.output_dir)
            write_run_settings(args.output_dir, env_id=config.env_id, env_kwargs=episode_env_kwargs(config.env_kwargs),
                               max_turn_tokens=config.max_turn_tokens, autocast="bfloat16" if args.bf16 else None)
        model_dir = str(args.output_dir)
    trainer.accelerator.end_training()  # trackers, and the process group: a rank must not exit with gloo running
    artifacts = {"trajectories": str(config.trajectory_dir)} if config.trajectory_dir else {}
    return RunResult("grpo", str(args.output_dir), model_dir,
                     {"global_step": int(trainer.state.global_step), "log_history": list(trainer.state.log_history)},
                     artifacts)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
