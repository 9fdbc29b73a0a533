"""GRPO with TRL through the toolgym adapter.

Launch (any accelerate config; see ``docs/training.md``)::

    accelerate launch trainers/grpo.py --config trainers/configs/demo_cpu.yaml
    accelerate launch --config_file trainers/configs/accelerate_zero3.yaml trainers/grpo.py \\
        --config trainers/configs/qwen3_4b_search_8xa100.yaml

The YAML file has a ``toolgym:`` section (:class:`ToolgymGRPOArgs`) and everything else is ``trl.GRPOConfig``
fields. Pass ``rollout_func`` alone (no ``tools``/``environment_factory``: TRL would ignore ``env_mask``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python trainers/grpo.py` / `accelerate launch trainers/grpo.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

__all__ = ["ToolgymGRPOArgs", "build_trainer", "env_tasks", "load_config", "main"]


@dataclass
class ToolgymGRPOArgs:
    """The ``toolgym:`` section of a GRPO config file.

    Attributes:
        model: model path / hub id; ``None`` = the embedded SmolLM2-135M-Instruct.
        dtype: weights dtype (``float32``, ``bfloat16``).
        env_id: toolgym env id.
        env_kwargs: forwarded to the env (e.g. ``{"split": "train"}``, a retriever URL, ``template_kwargs``).
        num_train_tasks: distinct tasks drawn from the env for the dataset (:func:`env_tasks`; all of a
            dataset-backed split when it has fewer).
        task_seed: first seed for drawing tasks.
        max_turn_tokens: tokens sampled per assistant turn.
        trajectory_dir: where the adapter appends trajectories (``None``: not saved).
        schedule: ``lockstep`` (required with several processes) or ``continuous``.
        threads: torch CPU threads per process (``0``: leave torch's default).
    """

    model: str | None = None
    dtype: str = "float32"
    env_id: str = "toolgym/Calculator-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    num_train_tasks: int = 256
    task_seed: int = 0
    max_turn_tokens: int = 128
    trajectory_dir: str | None = None
    schedule: str = "lockstep"
    threads: int = 0


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> tuple[ToolgymGRPOArgs, Any]:
    """Read a YAML config: ``(ToolgymGRPOArgs, trl.GRPOConfig)``. Unknown ``toolgym`` keys raise."""
    import yaml
    from trl import GRPOConfig

    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the config must be a YAML mapping")
    raw.update(overrides or {})
    tg = dict(raw.pop("toolgym", {}) or {})
    known = {f.name for f in fields(ToolgymGRPOArgs)}
    unknown = set(tg) - known
    if unknown:
        raise ValueError(f"{path}: unknown toolgym keys {sorted(unknown)}; known: {sorted(known)}")
    return ToolgymGRPOArgs(**tg), GRPOConfig(**raw)


def env_tasks(env_id: str, n: int, *, seed: int = 0, env_kwargs: Mapping[str, Any] | None = None) -> list[dict]:
    """``n`` distinct task rows of ``env_id`` built with ``env_kwargs``: :func:`toolgym.tasks.draw_tasks` (a seeded
    permutation of a dataset-backed split, all of it when it has fewer; distinct draws of a generated split's
    seeded task generator)."""
    from toolgym.tasks import draw_tasks

    return draw_tasks(env_id, n, seed=seed, env_kwargs=env_kwargs)


def build_trainer(
    tg: ToolgymGRPOArgs, args: Any, *, model: Any = None, tokenizer: Any = None,
    tasks: Sequence[Mapping[str, Any]] | None = None, callbacks: Sequence[Any] = (),
) -> tuple[Any, Any]:
    """A ``GRPOTrainer`` wired to a :class:`~trainers.rollout_func.ToolgymRollout`; returns ``(trainer, rollout)``."""
    import torch
    from trl import GRPOTrainer

    from toolgym.models import load_model
    from trainers.is_metrics import add_is_metrics
    from trainers.preflight import check_report_to, check_server_hosts, ensure_model_dir, needs_model_dir, num_machines
    from trainers.rollout_func import ToolgymRollout, env_reward, make_dataset
    from trainers.tracking import mlflow_callbacks

    check_report_to(args.report_to)  # a missing tracker: one clear error naming its extra, before any loading
    check_server_hosts(args, num_machines())  # several nodes: the vLLM server host must not be loopback
    if model is None:
        model, tokenizer = load_model(tg.model, dtype=getattr(torch, tg.dtype))
    if needs_model_dir(args):  # TRL reloads from _name_or_path: the reference model (beta > 0), colocated vLLM
        ensure_model_dir(model, tokenizer, Path(args.output_dir) / "base_model")
    env_kwargs = dict(tg.env_kwargs)
    env_kwargs.setdefault("tokenizer", tokenizer)
    if tasks is None:
        tasks = env_tasks(tg.env_id, tg.num_train_tasks, seed=tg.task_seed, env_kwargs=env_kwargs)
    rollout = ToolgymRollout(
        tg.env_id, tasks, env_kwargs=env_kwargs, max_turn_tokens=tg.max_turn_tokens,
        trajectory_dir=tg.trajectory_dir, schedule=tg.schedule,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, reward_funcs=[env_reward], args=args,
        train_dataset=make_dataset(tasks), rollout_func=rollout,
        callbacks=[*callbacks, *mlflow_callbacks(tg, args)],  # report_to mlflow: toolgym config, tags, lineage
    )
    add_is_metrics(trainer)  # vLLM's importance-sampling ratios as toolgym/is_ratio/* (trainers/is_metrics.py)
    return trainer, rollout


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="GRPO on a toolgym env through TRL's rollout_func")
    ap.add_argument("--config", required=True, help="YAML: a `toolgym:` section + trl.GRPOConfig fields")
    ap.add_argument("--max-steps", type=int, default=None, help="override max_steps")
    ap.add_argument("--output-dir", default=None, help="override output_dir")
    a = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    if a.max_steps is not None:
        overrides["max_steps"] = a.max_steps
    if a.output_dir is not None:
        overrides["output_dir"] = a.output_dir
    tg, args = load_config(a.config, overrides)
    if tg.threads:
        import torch

        torch.set_num_threads(tg.threads)
    trainer, rollout = build_trainer(tg, args)
    trainer.train()
    trainer.save_model(args.output_dir)
    rollout.close()
    trainer.accelerator.end_training()  # trackers, and the process group: a rank must not exit with gloo running


if __name__ == "__main__":
    main()
