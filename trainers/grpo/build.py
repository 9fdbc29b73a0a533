"""Building the GRPO trainer: TRL's ``GRPOTrainer`` subclass (:mod:`trainers.grpo.trainer`) wired to the env through
the rollout adapter (:mod:`trainers.grpo.rollout_adapter`), with the run's checks (:mod:`trainers.grpo.preflight`),
metrics (:mod:`trainers.grpo.importance_sampling_metrics`, :mod:`trainers.tracking`) and CPU techniques
(:mod:`trainers.grpo.efficiency`). Imports TRL, peft and accelerate: :mod:`trainers.grpo` imports this module only
when a run starts, so reading a :class:`~trainers.grpo.Config` stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate.utils import is_peft_model
from peft import LoraConfig

from toolgym.evaluation.tasks import draw_tasks, task_id
from trainers.contract import load_policy, resolve_processor
from trainers.grpo import efficiency
from trainers.grpo.dynamic_sampling import DynamicSampler, DynamicSamplingGRPOTrainer, check_layout
from trainers.grpo.importance_sampling_metrics import add_is_metrics
from trainers.grpo.preflight import check_report_to, check_server_hosts, ensure_model_dir, needs_model_dir, num_machines
from trainers.grpo.rollout_adapter import ToolgymRollout, env_reward, make_dataset
from trainers.grpo.trainer import TurnCreditGRPOTrainer
from trainers.grpo.validation import ValidationCallback, check_disjoint, validation_split
from trainers.runconfig import trl_config
from trainers.tracking import mlflow_callbacks

if TYPE_CHECKING:
    from trainers.grpo import Config

__all__ = ["build_trainer", "lora_config", "merge_adapters", "trainer_class"]


def lora_config(fields: Mapping[str, Any]) -> Any:
    """``peft.LoraConfig(**fields)`` for a causal LM (``task_type`` defaults to ``CAUSAL_LM``); a field LoraConfig
    does not have is a ``ValueError`` naming it."""
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"lora: unknown peft.LoraConfig field(s) {unknown}")
    return LoraConfig(**{"task_type": "CAUSAL_LM", **fields})


def trainer_class(config: Config) -> type:
    """The trainer class :func:`build_trainer` builds: :class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`, TRL's
    ``GRPOTrainer`` with the advantage estimator ``config.advantage`` (``outcome``: TRL's own numbers, untouched);
    with ``config.dynamic_sampling`` its subclass :class:`trainers.grpo.dynamic_sampling.DynamicSamplingGRPOTrainer`."""
    return DynamicSamplingGRPOTrainer if config.dynamic_sampling else TurnCreditGRPOTrainer


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
    args = trl_config("GRPOConfig", config.trl)
    check_report_to(args.report_to)  # a missing tracker: one clear error naming its extra, before any loading
    check_server_hosts(args, num_machines())  # several nodes: the vLLM server host must not be loopback
    if config.dynamic_sampling:  # groups must not span processes (trainers/grpo/dynamic_sampling.py)
        check_layout(args.per_device_train_batch_size * args.steps_per_generation, args.num_generations,
                     args.world_size)
    if model is None:
        model, tokenizer = load_policy(config.model, dtype=config.dtype, seed=args.seed)
    # env_kwargs.processor (true / a directory) -> the processor object; the tokenizer is then the processor's
    env_kwargs, tokenizer = resolve_processor(dict(config.env_kwargs), config.model, model, tokenizer)
    if needs_model_dir(args):  # TRL reloads from _name_or_path: the reference model (beta > 0), colocated vLLM
        ensure_model_dir(model, tokenizer, Path(args.output_dir) / "base_model")
    env_kwargs.setdefault("tokenizer", tokenizer)
    held_out = validation_split(config.env_id, config.validation_tasks, seed=config.validation_seed,
                                env_kwargs=env_kwargs)  # [] without validation (trainers/grpo/validation.py)
    if tasks is None:
        tasks = draw_tasks(config.env_id, config.num_train_tasks, seed=config.task_seed, env_kwargs=env_kwargs,
                           exclude=[task_id(t) for t in held_out])
    check_disjoint(tasks, held_out)
    rollout = ToolgymRollout(
        config.env_id, tasks, env_kwargs=env_kwargs, max_turn_tokens=config.max_turn_tokens,
        trajectory_dir=config.trajectory_dir, schedule=config.schedule, trim_heap=config.trim_heap,
        shared_prefix=config.shared_prefix,
        dynamic_sampling=DynamicSampler(config.dynamic_sampling_max_draws, history=config.dynamic_sampling_history,
                                        skip=config.dynamic_sampling_skip) if config.dynamic_sampling else None,
    )
    callbacks = [*callbacks, *efficiency.callbacks(config.trim_heap)]
    validation = ValidationCallback.for_config(config, held_out, env_kwargs, bf16=bool(args.bf16)) if held_out else None
    callbacks = [*callbacks, *([validation] if validation is not None else [])]
    trainer = trainer_class(config)(
        model=model, processing_class=tokenizer, reward_funcs=[env_reward], args=args,
        train_dataset=make_dataset(tasks, repeat=config.dataset_repeat), rollout_func=rollout,
        callbacks=[*callbacks, *mlflow_callbacks(config, args)],  # report_to mlflow: toolgym config, tags, lineage
        advantage=config.advantage, gamma=config.gamma, skip_zero_advantage=config.skip_zero_advantage,
        skip_no_signal_steps=config.skip_no_signal_steps,
        shared_prefix=config.shared_prefix,
        **({"peft_config": lora_config(config.lora)} if config.lora is not None else {}),
    )
    add_is_metrics(trainer)  # vLLM's importance-sampling ratios as toolgym/is_ratio/* (trainers/grpo/importance_sampling_metrics.py)
    efficiency.apply(trainer)
    if validation is not None:
        validation.bind(trainer)
    return trainer, rollout


def merge_adapters(trainer: Any) -> Any:
    """Fold the LoRA adapters of ``trainer.model`` into its base weights and remove them (``merge_and_unload``):
    the model the caller passed in is then a plain model again, with the trained weights. Returns that model, or
    ``None`` when the trainer has no adapters. TRL's fused LM head, patched onto the base model's instance, is
    dropped with them."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not is_peft_model(model):
        return None
    base = model.merge_and_unload()
    vars(base).pop("forward", None)
    return base
