"""What each stage of the BFCL learning experiment computes, each in a fresh process (its peak RSS is its own):
the evaluations of one checkpoint, the warm start (``trainers.ALGORITHMS["sft"]``, masked SFT on oracle
episodes) and GRPO (``trainers.ALGORITHMS["grpo"]``); every checkpoint is saved by
:func:`toolgym.checkpoint.save_checkpoint`."""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bfcl.protocol import ENV_ID
from benchmarks.common.stages import Stage, claim_each, machine, read_json, write_json

__all__ = ["rebuild_fidelity", "run_child"]


def _load(path: str | None, device: str | None = "auto") -> tuple[Any, Any]:
    """The model (float32 weights, on ``device``: ``auto`` = the GPU when torch sees one) and its tokenizer."""
    from toolgym.models import load_model
    from toolgym.placement import resolve_device

    model, tok = load_model(path)
    return model.to(resolve_device(device)), tok


def _eval_stages(spec: dict[str, Any]) -> None:
    """Evaluate one checkpoint on every category of ``spec["evals"]`` whose stage is not finished."""
    import torch

    import toolgym  # noqa: F401 - registers the envs
    from toolgym.evaluation.bfcl import evaluate_bfcl
    from toolgym.rollout import TransformersPolicy

    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    model, tok = _load(spec["checkpoint"], spec["device"])
    policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False, autocast=spec["autocast"])
    stages = [Stage(Path(spec["out"]), ev["name"], ev["config"], Path(spec["results"])) for ev in spec["evals"]]
    for stage in claim_each(stages, Stage.lock):  # other processes on the same checkpoint share its categories
        if stage.result() is not None:  # finished, possibly by another process
            continue
        stage.start()
        cfg = stage.config
        rep = evaluate_bfcl(policy, [cfg["category"]], split="test", tasks="all", ids=cfg["ids"],
                            num_envs=spec["num_envs"], max_turn_tokens=cfg["max_turn_tokens"], seed=0,
                            env_kwargs={"tokenizer": tok, "max_episode_tokens": cfg["max_episode_tokens"]},
                            policy_name=stage.name)
        row = rep.rows[cfg["category"]]
        print(f"[bfcl] {stage.name}: {row['accuracy']:.1%} of {row['n']} ({rep.wall_s:.0f} s)", flush=True)
        stage.finish({"row": row, "entries": rep.entries})


def _locked(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Run a training stage function under its stage's lock, and not at all when the stage is finished by the time
    the lock is held (another process finished it, or, for a checkpoint rebuilt on this machine, left its files)."""
    @functools.wraps(fn)
    def run(spec: dict[str, Any]) -> None:
        stage = _stage_of(spec)
        with stage.lock():
            if stage.result() is not None:
                print(f"[bfcl] {spec['name']}: finished by another process", flush=True)
                return
            fn(spec)
    return run


def _stage_of(spec: dict[str, Any]) -> Stage:
    """A training stage (warm start, GRPO) from its child spec: a rebuilt checkpoint (``rematerialise``) is
    finished when its files are here, so its committed result is not consulted."""
    return Stage(Path(spec["out"]), spec["name"], spec["config"],
                 None if spec["rematerialise"] else Path(spec["results"]))


@_locked
def _warmstart_stage(spec: dict[str, Any]) -> None:
    """Masked SFT on oracle episodes of the train split (``trainers.ALGORITHMS["sft"]``, ``update: masked``: one
    round of ``episodes`` oracle episodes kept at reward 1, then ``steps`` masked-SFT steps); the checkpoint goes to
    ``STAGE/model``."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.checkpoint import save_checkpoint
    from toolgym.evaluation import draw_tasks
    from trainers import ALGORITHMS

    cfg = spec["config"]
    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    stage = _stage_of(spec)
    d = stage.start()
    torch.manual_seed(cfg["seed"])
    model, tok = _load(None, spec["device"])
    kw = {"category": ",".join(cfg["categories"]), "split": "train", "max_episode_tokens": cfg["max_episode_tokens"]}
    tasks = draw_tasks(ENV_ID, cfg["episodes"], seed=cfg["seed"] + 1, split="train", env_kwargs={**kw, "tokenizer": tok})
    sft = ALGORITHMS["sft"]
    conf = sft.Config(
        env_id=ENV_ID, env_kwargs=kw, policy="oracle", episodes=cfg["episodes"], task_seed=cfg["seed"],
        max_turn_tokens=cfg["max_turn_tokens"], num_envs=16, update="masked", save_model=False,
        micro_batch_size=cfg["micro_batch_size"], autocast=cfg["autocast"],
        # memory only (the same gradient): activations recomputed in the backward, so long BFCL prompts fit the
        # RSS budget, and freed heap pages handed back to the OS after each micro-batch
        checkpoint_activations=True, trim_heap=True,
        trl=dict(output_dir=str(d / "sft"), max_steps=cfg["steps"], learning_rate=cfg["lr"],
                 per_device_train_batch_size=cfg["batch_size"], seed=cfg["seed"], report_to=[],
                 use_cpu=model.device.type == "cpu", disable_tqdm=True),
    )
    result = sft.run(conf, model=model, tokenizer=tok, tasks=tasks)
    save_checkpoint(model, tok, d / "model", run_settings=_run_settings(cfg))
    loss = [round(x, 5) for x in result.metrics["loss"]]
    if spec["rematerialise"]:  # how close the rebuild came to the recorded run (another CPU's kernels may differ)
        write_json(d / "rebuild.json", rebuild_fidelity(Stage(Path(spec["out"]), spec["name"], cfg,
                                                              Path(spec["results"])).result() or {}, loss))
    stage.finish({"train_ids": [t.get("id") for t in tasks], "kept_episodes": result.metrics["kept"], "loss": loss})


def rebuild_fidelity(recorded: dict[str, Any], loss: list[float]) -> dict[str, Any]:
    """A rebuilt warm start beside its record: both runs' SFT losses per step, the largest absolute difference and
    both machines (the rebuild's checkpoint is what later stages train from; the record's evaluations are of the
    recorded run's checkpoint)."""
    ref = recorded.get("loss") or []
    diffs = [abs(a - b) for a, b in zip(loss, ref, strict=False)]
    return {"loss": loss, "recorded_loss": ref, "max_abs_loss_diff": round(max(diffs), 5) if diffs else None,
            "machine": machine(), "recorded_machine": recorded.get("machine")}


def _run_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation of a stage's checkpoint reuses (``toolgym_run.json``): the env, the turn budget and the
    autocast it generated in."""
    return {"env_id": ENV_ID, "env_kwargs": {}, "max_turn_tokens": cfg["max_turn_tokens"], "autocast": cfg["autocast"]}


def _grpo_trl(cfg: dict[str, Any], trl_dir: Path, model: Any, **fields: Any) -> dict[str, Any]:
    """TRL's GRPO fields of a stage: ``num_generations`` samples of ``prompts_per_step`` prompts a step (one group a
    micro-batch, gradients accumulated over the prompts), a save every ``save_steps``, plus ``fields``."""
    g, p = cfg["num_generations"], cfg["prompts_per_step"]
    return dict(output_dir=str(trl_dir), max_steps=cfg["steps"], learning_rate=cfg["lr"],
                per_device_train_batch_size=g, gradient_accumulation_steps=p, generation_batch_size=g * p,
                num_generations=g, max_completion_length=cfg["max_turn_tokens"],
                bf16=cfg["autocast"] == "bfloat16", gradient_checkpointing=True, logging_steps=1,
                save_strategy="steps", save_steps=cfg["save_steps"], save_total_limit=1, report_to=[],
                seed=cfg["seed"], use_cpu=model.device.type == "cpu", disable_tqdm=True, **fields)


def _last_save(trl_dir: Path, name: str) -> str | None:
    """The last ``checkpoint-N`` TRL saved under ``trl_dir`` (a killed stage resumes from it), or ``None``."""
    saves = sorted(trl_dir.glob("checkpoint-*"), key=lambda q: int(q.name.split("-")[1])) if trl_dir.is_dir() else []
    if saves:
        print(f"[bfcl] {name}: resuming from {saves[-1]}", flush=True)
    return str(saves[-1]) if saves else None


@_locked
def _grpo_stage(spec: dict[str, Any]) -> None:
    """GRPO from the warm-start checkpoint, saving every ``save_steps``; resumes from the last save."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.checkpoint import save_checkpoint
    from toolgym.evaluation import draw_tasks
    from trainers import ALGORITHMS

    cfg = spec["config"]
    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    stage = _stage_of(spec)
    d = stage.start()
    model, tok = _load(spec["warmstart_checkpoint"], spec["device"])
    kw = {"category": ",".join(cfg["categories"]), "split": "train", "max_episode_tokens": cfg["max_episode_tokens"]}
    tasks = draw_tasks(ENV_ID, cfg["tasks"], seed=cfg["seed"] + 2, split="train", env_kwargs={**kw, "tokenizer": tok})
    grpo = ALGORITHMS["grpo"]
    trl_dir = d / "trl"
    conf = grpo.Config(
        env_id=ENV_ID, env_kwargs=kw, max_turn_tokens=cfg["max_turn_tokens"], save_model=False,
        num_train_tasks=cfg["tasks"], task_seed=cfg["seed"] + 2,
        # memory only (not in the key): freed heap pages go back to the OS after each generation and micro-batch
        **{"trim_heap": True, **spec["toolgym"]},
        trl=_grpo_trl(cfg, trl_dir, model, temperature=1.0, beta=0.0),
    )
    resume = _last_save(trl_dir, spec["name"])
    model.train()
    result = grpo.run(conf, model=model, tokenizer=tok, tasks=tasks, resume_from_checkpoint=resume)
    model.eval()
    save_checkpoint(model, tok, d / "model", run_settings=_run_settings(cfg))
    logs = [{k: v for k, v in row.items() if isinstance(v, int | float)} for row in result.metrics["log_history"]]
    stage.finish({"train_ids": [t.get("id") for t in tasks], "global_step": result.metrics["global_step"],
                  "resumed_from": resume, "log_history": logs})


@_locked
def _grpo_v2_stage(spec: dict[str, Any]) -> None:
    """Protocol v2's GRPO from the warm-start checkpoint (:mod:`benchmarks.bfcl.protocol_v2`): dynamic sampling, the
    no-signal rule, the arm's KL weight and reward, validation every ``validation_every`` steps on the held-out
    part of ``train`` with the best step kept. A seed's stage saves the selected weights to ``STAGE/model`` and,
    when the last step is another one, the last weights to ``STAGE/last``; a sweep arm (``spec["sweep"]``) keeps
    its records only. Resumes from the last TRL save."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.checkpoint import save_checkpoint
    from toolgym.evaluation import draw_tasks
    from toolgym.evaluation.tasks import holdout_tasks, task_id
    from trainers import ALGORITHMS

    cfg = spec["config"]
    torch.set_num_threads(spec["threads"]) if spec["threads"] else None
    stage = _stage_of(spec)
    d = stage.start()
    model, tok = _load(spec["warmstart_checkpoint"], spec["device"])
    kw = {"category": ",".join(cfg["categories"]), "split": "train", "max_episode_tokens": cfg["max_episode_tokens"],
          **({"partial_credit": cfg["partial_credit"]} if cfg["partial_credit"] else {})}
    held = holdout_tasks(ENV_ID, cfg["validation_tasks"], seed=cfg["validation_seed"], env_kwargs={**kw, "tokenizer": tok})
    tasks = draw_tasks(ENV_ID, cfg["tasks"], seed=cfg["seed"] + 2, split="train", env_kwargs={**kw, "tokenizer": tok},
                       exclude=[task_id(t) for t in held])
    grpo = ALGORITHMS["grpo"]
    trl_dir = d / "trl"
    conf = grpo.Config(
        env_id=ENV_ID, env_kwargs=kw, max_turn_tokens=cfg["max_turn_tokens"], save_model=False,
        num_train_tasks=cfg["tasks"], task_seed=cfg["seed"] + 2,
        dynamic_sampling=True, dynamic_sampling_max_draws=cfg["dynamic_sampling_max_draws"],
        skip_no_signal_steps=True, validation_tasks=cfg["validation_tasks"],
        validation_every=cfg["validation_every"], validation_seed=cfg["validation_seed"], keep_best=True,
        # wall time only (not in the key): the arms of the sweep share their warm start's step-0 validation
        validation_reuse_dir=str(Path(spec["out"]) / "validation0"),
        # memory only (not in the key): freed heap pages go back to the OS after each generation and micro-batch
        **{"trim_heap": True, **spec["toolgym"]},
        trl=_grpo_trl(cfg, trl_dir, model, temperature=cfg["temperature"], beta=cfg["beta"],
                      lr_scheduler_type=cfg["lr_scheduler"]),
    )
    resume = _last_save(trl_dir, spec["name"])
    model.train()
    result = grpo.run(conf, model=model, tokenizer=tok, tasks=tasks, resume_from_checkpoint=resume)
    model.eval()
    m = result.metrics
    selected, last = m.get("selected_step"), int(m["global_step"])
    if not spec.get("sweep"):
        save_checkpoint(model, tok, d / "model", run_settings=_run_settings(cfg))
        if selected is not None and int(selected) != last:
            last_model, _ = _load(str(trl_dir / f"checkpoint-{last}"), spec["device"])
            save_checkpoint(last_model, tok, d / "last", run_settings=_run_settings(cfg))
    logs = [{k: v for k, v in row.items() if isinstance(v, int | float)} for row in m["log_history"]]
    rebuild = read_json(Path(spec["warmstart_checkpoint"]).parent / "rebuild.json")
    stage.finish({"train_ids": [t.get("id") for t in tasks], "validation_ids": [task_id(t) for t in held],
                  "global_step": last, "selected_step": selected, "validation_history": m.get("validation_history"),
                  "resumed_from": resume, "log_history": logs, "warmstart_rebuild": rebuild})


def _child(fn_name: str, spec: dict[str, Any]) -> None:
    globals()[fn_name](spec)


def run_child(fn_name: str, spec: dict[str, Any]) -> None:
    """Run a stage function in a fresh process (its own peak RSS, nothing left behind in this one)."""
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(fn_name, spec))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"[bfcl] stage {spec.get('name', fn_name)} failed (exit {proc.exitcode})")
