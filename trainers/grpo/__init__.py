"""GRPO: TRL's GRPOTrainer on the model's own multi-turn episodes (rollout_func adapter, env reward).

Run (``toolgym train grpo``; any accelerate config, see ``docs/training.md``)::

    toolgym train grpo --config trainers/configs/grpo_calculator_cpu.yaml [--max_steps 2 ...]
    accelerate launch --config_file trainers/configs/accelerate_zero3.yaml -m trainers.cli grpo \\
        --config trainers/configs/qwen3_4b_search_8xa100.yaml

In Python: ``run(Config(env_id=..., trl={"max_steps": 2, ...}))``. The config file's top-level keys are
``trl.GRPOConfig`` fields (:attr:`Config.trl`) and its ``toolgym:`` section holds the other :class:`Config` fields.
Seams for variants of GRPO: :func:`trainer_class` (which ``GRPOTrainer`` class to build, e.g. a subclass with
another advantage estimator) and :func:`build_trainer` (the trainer wired to the env). Only ``rollout_func`` is
passed to TRL (no ``tools``/``environment_factory``: TRL would ignore ``env_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.contract import RunResult
from trainers.runconfig import opt

__all__ = ["Config", "build_trainer", "lora_config", "merge_adapters", "no_autocast_weight_cache", "run",
           "trainer_class"]


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


def lora_config(fields: Mapping[str, Any]) -> Any:
    """``peft.LoraConfig(**fields)`` for a causal LM (``task_type`` defaults to ``CAUSAL_LM``); a field LoraConfig
    does not have is a ``ValueError`` naming it."""
    import dataclasses

    from peft import LoraConfig

    known = {f.name for f in dataclasses.fields(LoraConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"lora: unknown peft.LoraConfig field(s) {unknown}")
    return LoraConfig(**{"task_type": "CAUSAL_LM", **fields})


def trainer_class(config: Config) -> type:
    """The trainer class :func:`build_trainer` builds: :class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`, TRL's
    ``GRPOTrainer`` with the advantage estimator ``config.advantage`` (``outcome``: TRL's own numbers, untouched)."""
    from trainers.grpo.trainer import TurnCreditGRPOTrainer

    return TurnCreditGRPOTrainer


def build_trainer(
    config: Config, *, model: Any = None, tokenizer: Any = None,
    tasks: Sequence[Mapping[str, Any]] | None = None, callbacks: Sequence[Any] = (),
) -> tuple[Any, Any]:
    """The trainer (:func:`trainer_class`) wired to a :class:`~trainers.grpo.rollout_adapter.ToolgymRollout`; returns
    ``(trainer, rollout)``.

    ``model``/``tokenizer`` default to ``config.model`` (:func:`trainers.contract.load_policy`); ``tasks`` to
    ``config.num_train_tasks`` tasks drawn with :func:`toolgym.evaluation.tasks.draw_tasks`; ``callbacks`` go to the trainer
    before the MLflow ones (``report_to: mlflow``).
    """
    from toolgym.evaluation.tasks import draw_tasks
    from trainers.contract import load_policy
    from trainers.grpo.importance_sampling_metrics import add_is_metrics
    from trainers.grpo.preflight import (
        check_report_to,
        check_server_hosts,
        ensure_model_dir,
        needs_model_dir,
        num_machines,
    )
    from trainers.grpo.rollout_adapter import ToolgymRollout, env_reward, make_dataset
    from trainers.runconfig import trl_config
    from trainers.tracking import mlflow_callbacks

    args = trl_config("GRPOConfig", config.trl)
    check_report_to(args.report_to)  # a missing tracker: one clear error naming its extra, before any loading
    check_server_hosts(args, num_machines())  # several nodes: the vLLM server host must not be loopback
    if model is None:
        model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=args.seed)
    if needs_model_dir(args):  # TRL reloads from _name_or_path: the reference model (beta > 0), colocated vLLM
        ensure_model_dir(model, tokenizer, Path(args.output_dir) / "base_model")
    env_kwargs = dict(config.env_kwargs)
    env_kwargs.setdefault("tokenizer", tokenizer)
    if tasks is None:
        tasks = draw_tasks(config.env_id, config.num_train_tasks, seed=config.task_seed, env_kwargs=env_kwargs)
    rollout = ToolgymRollout(
        config.env_id, tasks, env_kwargs=env_kwargs, max_turn_tokens=config.max_turn_tokens,
        trajectory_dir=config.trajectory_dir, schedule=config.schedule, trim_heap=config.trim_heap,
    )
    if config.trim_heap:
        from trainers.grpo.efficiency import TrimHeapCallback

        callbacks = [*callbacks, TrimHeapCallback()]
    trainer = trainer_class(config)(
        model=model, processing_class=tokenizer, reward_funcs=[env_reward], args=args,
        train_dataset=make_dataset(tasks, repeat=config.dataset_repeat), rollout_func=rollout,
        callbacks=[*callbacks, *mlflow_callbacks(config, args)],  # report_to mlflow: toolgym config, tags, lineage
        advantage=config.advantage, gamma=config.gamma, skip_zero_advantage=config.skip_zero_advantage,
        **({"peft_config": lora_config(config.lora)} if config.lora is not None else {}),
    )
    add_is_metrics(trainer)  # vLLM's importance-sampling ratios as toolgym/is_ratio/* (trainers/grpo/importance_sampling_metrics.py)
    no_autocast_weight_cache(trainer)
    return trainer, rollout


def run(config: Config, *, model: Any = None, tokenizer: Any = None,
        tasks: Sequence[Mapping[str, Any]] | None = None, callbacks: Sequence[Any] = ()) -> RunResult:
    """Train with GRPO (:func:`build_trainer`), then save the model and tokenizer to ``trl.output_dir`` (when
    ``save_model``). ``model``/``tokenizer``/``tasks``/``callbacks``: as :func:`build_trainer` (in-process callers
    such as the demo); the model is trained in place.

    ``metrics``: ``global_step`` and TRL's ``log_history`` (per logged step: ``reward``, ``toolgym/success``, ...).
    """
    from trainers.contract import prepare

    prepare(threads=config.threads)
    # LoRA freezes every base weight: the caller's model gets its own trainable set back with the merged weights
    trainable = None if model is None or config.lora is None else {
        n: p.requires_grad for n, p in model.named_parameters()}
    trainer, rollout = build_trainer(config, model=model, tokenizer=tokenizer, tasks=tasks, callbacks=callbacks)
    args = trainer.args
    try:
        trainer.train()
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
        model_dir = str(args.output_dir)
    trainer.accelerator.end_training()  # trackers, and the process group: a rank must not exit with gloo running
    artifacts = {"trajectories": str(config.trajectory_dir)} if config.trajectory_dir else {}
    return RunResult("grpo", str(args.output_dir), model_dir,
                     {"global_step": int(trainer.state.global_step), "log_history": list(trainer.state.log_history)},
                     artifacts)


def no_autocast_weight_cache(trainer: Any) -> bool:
    """Turn off the weight cache of the autocast context Accelerate wraps the model's forward in (mixed precision),
    before ``train()`` prepares the model; returns whether it did.

    With the cache on, each forward keeps a half-precision copy of every trainable weight until it returns (the
    cache lives as long as the outermost autocast context). A training forward uses each weight once, so the cache
    saves no cast there; under gradient checkpointing it only holds ~2 bytes per trainable parameter that would
    otherwise be freed layer by layer (SmolLM2-135M: ~212 MB). The values are the same: the same cast, made at
    use. Generation keeps one cache per ``generate()`` call (:func:`trainers.grpo.rollout_adapter.TRLPolicy` runs it under
    its own context, without this wrapper). An autocast handler the caller configured is left as it is."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or not getattr(accelerator, "native_amp", False) or accelerator.autocast_handler is not None:
        return False
    from accelerate.utils import AutocastKwargs

    accelerator.autocast_handler = AutocastKwargs(cache_enabled=False)
    return True


def merge_adapters(trainer: Any) -> Any:
    """Fold the LoRA adapters of ``trainer.model`` into its base weights and remove them (``merge_and_unload``):
    the model the caller passed in is then a plain model again, with the trained weights. Returns that model, or
    ``None`` when the trainer has no adapters. TRL's fused LM head, patched onto the base model's instance, is
    dropped with them."""
    from accelerate.utils import is_peft_model

    model = trainer.accelerator.unwrap_model(trainer.model)
    if not is_peft_model(model):
        return None
    base = model.merge_and_unload()
    vars(base).pop("forward", None)
    return base


if __name__ == "__main__":  # `python -m trainers.grpo ...` = `toolgym train grpo ...`
    import sys

    from trainers.cli import main as _main

    sys.exit(_main(["grpo", *sys.argv[1:]]))
