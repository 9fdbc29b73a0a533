"""Watching and selecting: GRPO evaluated greedily on held-out tasks of its own split every N steps, and the
best-scoring weights kept as the run's result (:class:`ValidationCallback`, a ``transformers.TrainerCallback``).

The validation set is ``Config.validation_tasks`` tasks of the training split set apart by a hash of their ids
(:func:`toolgym.evaluation.tasks.holdout_tasks`; a generated split: a seeded draw) and excluded from the tasks GRPO
trains on (:func:`validation_split`). The model before any GRPO step is step 0 (evaluated at train begin); then
every ``validation_every`` optimizer steps and at the last step. Each evaluation is one record::

    {"step": 3, "score": 0.4, "success": 0.4, "reward": 0.41, "parse_rate": 0.9, "tool_call_rate": 0.8,
     "truncated": 0.0, "n_tasks": 20, "wall_s": 12.3, "entropy": 0.09, "frac_reward_zero_std": 0.5}

``score`` is ``success`` or ``reward`` (``Config.validation_metric``); ``parse_rate`` is, among the episodes that
wrote at least one tool call, the share whose every call parsed (:func:`parse_rate`; ``None`` when none called);
``entropy`` and ``frac_reward_zero_std`` are TRL's training metrics of the latest step (``None`` at step 0).
Rates are fractions in [0, 1], ``wall_s`` seconds. The best record is the highest score, the earliest step on ties
(:func:`best_record`). With ``keep_best`` its weights are saved to ``<output_dir>/best/`` (``trainer.save_model``:
a model directory, or the adapters with LoRA) and loaded back into the model when training ends, so the run's
saved model is the selected one. ``validation_patience`` K stops training after K evaluations in a row after the
best that do not beat it.

State: ``<output_dir>/toolgym_validation.json`` (written atomically after every evaluation; the history, the best,
the selected step), a copy in every TRL checkpoint (``checkpoint-N/toolgym_validation.json``) with the best
weights hard-linked beside it (``checkpoint-N/toolgym_best/``). A run resumed from ``checkpoint-N`` takes the
history up to step N from that copy (records of later steps, made on the branch that is trained again, move to
``superseded``), restores ``best/`` from the checkpoint when a later branch replaced it, and evaluates no step it
already has.

Processes: the evaluation runs on the main process only, on its whole copy of the weights; the other processes
wait at a barrier and receive the record by broadcast, so every process takes the same decisions (best, stop).
Weights sharded across processes (DeepSpeed ZeRO-3, FSDP) are refused (:meth:`ValidationCallback.bind`). The wait
counts against the process group's timeout (``ddp_timeout``, 1800 s by default): size the validation set to it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from toolgym.evaluation.tasks import holdout_tasks, task_id

__all__ = [
    "BEST_DIR", "CHECKPOINT_BEST_DIR", "METRICS", "STATE_FILE", "ValidationCallback", "best_record", "check_disjoint",
    "evaluations_since_best", "initial_key", "parse_rate", "read_state", "should_stop", "validation_metrics", "validation_split",
]

#: the validation state's file name, in ``output_dir`` and in each ``checkpoint-N``
STATE_FILE = "toolgym_validation.json"
#: the best weights' directory under ``output_dir``
BEST_DIR = "best"
#: the best weights hard-linked into a TRL checkpoint
CHECKPOINT_BEST_DIR = "toolgym_best"
#: the marker inside a best directory: ``{"step", "score", "metric"}`` of the weights it holds
_BEST_MARKER = "toolgym_best.json"
#: the scores ``Config.validation_metric`` may name
METRICS = ("success", "reward")
#: TRL training metrics copied into each record (the latest value)
_TRL_KEYS = ("entropy", "frac_reward_zero_std")


# ---------------------------------------------------------------------------------------------------------------
# The tasks
# ---------------------------------------------------------------------------------------------------------------


def validation_split(env_id: str, n: int, *, seed: int, env_kwargs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``n`` validation tasks of ``env_id``'s split (the one ``env_kwargs`` build): ``holdout_tasks``; ``[]``
    when ``n`` is 0. The trainer draws its training tasks with their ids as ``exclude``."""
    if n < 0:
        raise ValueError(f"validation_tasks must be >= 0, got {n}")
    return holdout_tasks(env_id, n, seed=seed, env_kwargs=env_kwargs) if n else []


def check_disjoint(train: Sequence[Mapping[str, Any]], validation: Sequence[Mapping[str, Any]]) -> None:
    """``ValueError`` naming the shared ids when a training task is also a validation task."""
    held = {task_id(t) for t in validation}
    shared = sorted({task_id(t) for t in train} & held)
    if shared:
        raise ValueError(f"{len(shared)} training task(s) are validation tasks ({', '.join(shared[:3])}"
                         f"{', ...' if len(shared) > 3 else ''}): pass tasks without them, or validation_tasks: 0")


def parse_rate(trajectories: Sequence[Any]) -> float | None:
    """Among the episodes that wrote at least one tool call, the share whose every call parsed (no call with
    ``parse_error``: an unclosed JSON object, a call without a name, ...); ``None`` when no episode wrote one."""
    calling = [t for t in trajectories if t.num_tool_calls > 0]
    if not calling:
        return None
    return sum(all(c.parse_error is None for c in t.tool_calls) for t in calling) / len(calling)


# ---------------------------------------------------------------------------------------------------------------
# Selection (pure functions of the history)
# ---------------------------------------------------------------------------------------------------------------


def _score(record: Mapping[str, Any]) -> float | None:
    s = record.get("score")
    return None if s is None or (isinstance(s, float) and math.isnan(s)) else float(s)


def best_record(history: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The record with the highest ``score`` (the earliest step among equal scores); ``None`` when no record has
    a score."""
    scored = [r for r in history if _score(r) is not None]
    if not scored:
        return None
    return dict(max(scored, key=lambda r: (_score(r), -int(r["step"]))))


def evaluations_since_best(history: Sequence[Mapping[str, Any]]) -> int:
    """How many evaluations came after the best one (none of them beat it)."""
    best = best_record(history)
    return 0 if best is None else sum(1 for r in history if int(r["step"]) > int(best["step"]))


def should_stop(history: Sequence[Mapping[str, Any]], patience: int | None) -> bool:
    """Whether ``patience`` evaluations in a row after the best did not beat it (``None``: never)."""
    return patience is not None and evaluations_since_best(history) >= patience


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


def _write_json(path: Path, obj: Any) -> None:
    """``path`` replaced atomically by ``obj`` as JSON (a temporary file, fsync, ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, allow_nan=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The validation state at ``path`` (a file, or a directory holding :data:`STATE_FILE`); ``None`` if absent.
    Raises ``ValueError`` for a file that is not a JSON object with a ``history`` list."""
    p = Path(path)
    if p.is_dir():
        p = p / STATE_FILE
    if not p.is_file():
        return None
    try:
        state = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a JSON validation state ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("history"), list):
        raise ValueError(f"{p}: a validation state needs a 'history' list")
    return state


def _marker_step(directory: Path) -> int | None:
    try:
        return int(json.loads((directory / _BEST_MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` (replaced) holding ``src``'s files as hard links (copies across file systems)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=_link_or_copy)
    _replace_dir(tmp, dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _replace_dir(tmp: Path, target: Path) -> None:
    """``target`` replaced by the complete directory ``tmp`` (renames: ``target`` is never half written)."""
    old = target.with_name(f".{target.name}.{os.getpid()}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# The evaluation
# ---------------------------------------------------------------------------------------------------------------


def greedy_evaluation(trainer: Any, venv: Any, tasks: Sequence[Mapping[str, Any]], *, seed: int,
                      max_turn_tokens: int, processor: Any = None) -> dict[str, Any]:
    """One greedy evaluation of the trainer's current weights on ``tasks`` (:func:`toolgym.evaluation.evaluate`
    with a :class:`~toolgym.rollout.TransformersPolicy`, ``do_sample=False``): the model in eval mode, LoRA
    adapters merged, without Accelerate's mixed-precision forward wrapper (autocast in the trainer's half dtype
    instead), all restored after; ``processor``: a vision-language model's (its images generated as image
    tokens), else ``None``. Returns the record's evaluation fields."""
    from toolgym.evaluation.runner import evaluate
    from toolgym.rollout import TransformersPolicy
    from trainers.grpo.generation import _merged_adapters, _without_amp_wrapper

    model = trainer.accelerator.unwrap_model(trainer.model)
    args = trainer.args
    autocast = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
    training = model.training
    model.eval()
    try:
        with _merged_adapters(trainer), _without_amp_wrapper(model):
            policy = TransformersPolicy(model, trainer.processing_class, do_sample=False, return_logprobs=False,
                                        autocast=autocast, processor=processor)
            report = evaluate(venv, policy, list(tasks), seed=seed, max_turn_tokens=max_turn_tokens,
                              policy_name="greedy")
    finally:
        model.train(training)
    return {"success": report.success, "reward": report.reward, "parse_rate": parse_rate(report.trajectories),
            "tool_call_rate": report.tool_call_rate, "truncated": report.truncated, "n_tasks": report.n_tasks,
            "wall_s": report.wall_s}


def _latest_trl(trainer: Any, state: Any) -> dict[str, float | None]:
    """TRL's ``entropy`` / ``frac_reward_zero_std`` of the latest step: this step's values not yet logged, else
    the last logged ones, else ``None``."""
    pending = getattr(trainer, "_metrics", {}).get("train", {})
    out: dict[str, float | None] = {}
    for key in _TRL_KEYS:
        vals = [v for v in pending.get(key, []) if not math.isnan(v)]
        if vals:
            out[key] = float(sum(vals) / len(vals))
            continue
        out[key] = next((float(e[key]) for e in reversed(state.log_history)
                         if isinstance(e.get(key), int | float)), None)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The callback
# ---------------------------------------------------------------------------------------------------------------


def initial_key(model: Any, tasks: Sequence[Mapping[str, Any]], seed: int, max_turn_tokens: int,
                autocast: str | None) -> str:
    """The key of a step-0 evaluation: SHA-256 (first 16 hex digits) over the model's parameters (names, dtypes,
    shapes, bytes), the task ids, ``seed``, ``max_turn_tokens``, ``autocast`` and torch's thread count (a greedy
    decode's reductions follow the threads)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    h.update(json.dumps({"tasks": [task_id(t) for t in tasks], "seed": int(seed), "max_turn_tokens": int(max_turn_tokens),
                         "autocast": autocast, "threads": torch.get_num_threads()}, sort_keys=True).encode())
    with torch.no_grad():
        for name, t in model.state_dict().items():
            t = t.detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


class ValidationCallback(TrainerCallback):
    """Validation every ``every`` steps, best-checkpoint keeping and patience (the module docstring); built by
    :func:`trainers.grpo.build.build_trainer` from ``Config.validation_*`` / ``keep_best``, then :meth:`bind`-ed to
    the trainer.

    Args:
        tasks: the validation task rows (:func:`validation_split`).
        env_id, env_kwargs: the env the evaluation runs (the training env's kwargs, tokenizer included).
        every: evaluate every this many optimizer steps (>= 1), besides step 0 and the last step.
        patience: stop after this many evaluations after the best that do not beat it (``None``: never).
        metric: ``"success"`` or ``"reward"``: the score.
        seed: episode ``i`` is reset with ``seed + i`` (the same every evaluation).
        keep_best: save the best weights to ``<output_dir>/best/`` and end training with them.
        num_envs: parallel sub-envs of the evaluation.
        max_turn_tokens: tokens per assistant turn (the training budget).
        run_settings: ``toolgym_run.json`` fields written into ``best/`` (:func:`toolgym.checkpoint.write_run_settings`).
        reuse_dir: a directory shared by runs that start from the same weights (a sweep's arms): the step-0
            evaluation is kept there under a key of the starting weights' SHA-256, the task ids, seed, turn budget,
            autocast and torch threads (:func:`initial_key`), and a later run with the same key reads it instead of
            evaluating again (``None``: every run evaluates step 0).
        evaluator: ``fn(trainer) -> {"success", "reward", ...}`` in place of :func:`greedy_evaluation` (fault
            injection in tests).
    """

    def __init__(self, tasks: Sequence[Mapping[str, Any]], *, env_id: str, env_kwargs: Mapping[str, Any],
                 every: int, patience: int | None = None, metric: str = "success", seed: int = 0,
                 keep_best: bool = True, num_envs: int = 16, max_turn_tokens: int = 128,
                 run_settings: Mapping[str, Any] | None = None,
                 evaluator: Callable[[Any], Mapping[str, Any]] | None = None,
                 reuse_dir: str | Path | None = None) -> None:
        if not tasks:
            raise ValueError("ValidationCallback needs at least one validation task")
        if every < 1:
            raise ValueError(f"validation_every must be >= 1, got {every}")
        if patience is not None and patience < 1:
            raise ValueError(f"validation_patience must be >= 1 or null, got {patience}")
        if metric not in METRICS:
            raise ValueError(f"validation_metric must be one of {METRICS}, got {metric!r}")
        self.tasks = [dict(t) for t in tasks]
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.every, self.patience, self.metric, self.seed = int(every), patience, metric, int(seed)
        self.keep_best, self.num_envs, self.max_turn_tokens = bool(keep_best), int(num_envs), int(max_turn_tokens)
        self.run_settings = dict(run_settings or {})
        self.evaluator = evaluator
        self.reuse_dir = Path(reuse_dir) if reuse_dir else None
        self.trainer: Any = None
        self.state: dict[str, Any] = {}
        self._venv: Any = None

    # -- setup ----------------------------------------------------------------------------------------------------

    @classmethod
    def for_config(cls, config: Any, tasks: Sequence[Mapping[str, Any]], env_kwargs: Mapping[str, Any], *,
                   bf16: bool = False) -> ValidationCallback:
        """The callback of a :class:`trainers.grpo.Config` (its ``validation_*`` and ``keep_best`` fields) on
        ``tasks`` in the env built with ``env_kwargs``; ``bf16``: the run generates under bfloat16 autocast (its
        ``toolgym_run.json`` says so)."""
        from toolgym.checkpoint import episode_env_kwargs

        return cls(tasks, env_id=config.env_id, env_kwargs=env_kwargs, every=config.validation_every,
                   patience=config.validation_patience, metric=config.validation_metric, seed=config.validation_seed,
                   keep_best=config.keep_best, num_envs=config.validation_num_envs,
                   max_turn_tokens=config.max_turn_tokens, reuse_dir=config.validation_reuse_dir,
                   run_settings={"env_id": config.env_id, "env_kwargs": episode_env_kwargs(config.env_kwargs),
                                 "max_turn_tokens": config.max_turn_tokens, "autocast": "bfloat16" if bf16 else None})

    def bind(self, trainer: Any) -> ValidationCallback:
        """Attach the trainer (its model, accelerator, ``save_model``). ``ValueError`` when its weights are sharded
        across processes (DeepSpeed ZeRO-3, FSDP): the main process could not evaluate them alone."""
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if getattr(trainer, "is_fsdp_enabled", False) or (getattr(trainer, "is_deepspeed_enabled", False)
                                                          and is_deepspeed_zero3_enabled()):
            raise ValueError("validation_tasks > 0 needs every process to hold the whole model: not with "
                             "DeepSpeed ZeRO-3 or FSDP (validate the saved checkpoints with toolgym eval instead)")
        self.trainer = trainer
        return self

    def _fresh_state(self) -> dict[str, Any]:
        return {"format": 1, "metric": self.metric, "every": self.every, "patience": self.patience,
                "seed": self.seed, "task_ids": [task_id(t) for t in self.tasks], "history": [], "superseded": [],
                "best": None, "best_dir": None, "selected_step": None, "stopped": None}

    @property
    def output_dir(self) -> Path:
        return Path(self.trainer.args.output_dir)

    @property
    def _main(self) -> bool:
        return bool(self.trainer.accelerator.is_main_process)

    def _broadcast(self, obj: Any) -> Any:
        """``obj`` of the main process, on every process."""
        if self.trainer.accelerator.num_processes == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]

    def _load(self, step: int) -> dict[str, Any]:
        """The state to continue at ``step``: fresh at step 0; on resume the checkpoint's copy (else the output
        directory's), its records after ``step`` moved to ``superseded``."""
        fresh = self._fresh_state()
        if step == 0:
            return fresh
        ckpt = self.output_dir / f"checkpoint-{step}"
        saved = read_state(ckpt) or read_state(self.output_dir)
        if saved is None:
            return fresh
        if saved.get("task_ids") != fresh["task_ids"] or saved.get("metric") != self.metric:
            raise ValueError(f"the validation state in {self.output_dir} was made with other validation tasks or "
                             "metric: resume with the run's own validation_tasks / validation_seed / "
                             "validation_metric, or start a new output_dir")
        latest = read_state(self.output_dir) or saved
        kept = [r for r in saved["history"] if int(r["step"]) <= step]
        later = [r for r in latest["history"] if int(r["step"]) > step]
        state = {**fresh, "history": kept, "superseded": [*saved.get("superseded", []), *later],
                 "stopped": None}
        best = best_record(kept)
        state["best"] = None if best is None else {"step": int(best["step"]), "score": _score(best)}
        if self.keep_best and best is not None:
            state["best_dir"] = self._restore_best(int(best["step"]), ckpt)
        return state

    def _restore_best(self, step: int, ckpt: Path) -> str | None:
        """``best/`` holding the weights of ``step`` (from the checkpoint's hard links when a later branch replaced
        them); the directory's name, or ``None`` (with a warning) when no copy of those weights is left."""
        best = self.output_dir / BEST_DIR
        if _marker_step(best) == step:
            return BEST_DIR
        kept = ckpt / CHECKPOINT_BEST_DIR
        if _marker_step(kept) == step:
            if self._main:
                _link_tree(kept, best)
            self.trainer.accelerator.wait_for_everyone()
            return BEST_DIR
        if self._main:
            print(f"[validation] the weights of the best step {step} are not in {best} or {kept}: the run ends "
                  "with the weights it trains last unless a later evaluation beats the best", flush=True)
        return None

    # -- events ---------------------------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            raise RuntimeError("ValidationCallback: bind(trainer) before training")
        self.state = self._load(int(state.global_step))
        if not self.state["history"]:  # step 0: the model before any GRPO step
            self._validate(state, control, log_now=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        due = step % self.every == 0 or step >= int(state.max_steps or 0) > 0
        if due and all(int(r["step"]) != step for r in self.state["history"]):
            self._validate(state, control, log_now=False)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if self._main and ckpt.is_dir():
            best = self.output_dir / BEST_DIR
            if self.state.get("best_dir") and best.is_dir():
                _link_tree(best, ckpt / CHECKPOINT_BEST_DIR)
            _write_json(ckpt / STATE_FILE, self.state)
        self.trainer.accelerator.wait_for_everyone()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._venv is not None:
            self._venv.close()
            self._venv = None
        best = self.state.get("best")
        selected = int(state.global_step)
        if self.keep_best and best is not None and self.state.get("best_dir"):
            selected = int(best["step"])
            if selected != int(state.global_step):
                model = self.trainer.accelerator.unwrap_model(self.trainer.model)
                self.trainer._load_from_checkpoint(str(self.output_dir / BEST_DIR), model=model)
        self.state["selected_step"] = selected
        if self._main:
            _write_json(self.output_dir / STATE_FILE, self.state)
            print(f"[validation] the run's model is step {selected}"
                  + (f" ({self.metric} {best['score']:.3f})" if best else ""), flush=True)

    # -- one evaluation -------------------------------------------------------------------------------------------

    def _evaluate(self) -> dict[str, Any]:
        if self.evaluator is not None:
            return dict(self.evaluator(self.trainer))
        if self._venv is None:
            from toolgym.envs.registration import make_vector_env

            self._venv = make_vector_env(self.env_id, max(1, min(self.num_envs, len(self.tasks))), self.env_kwargs)
        processor = self.env_kwargs.get("processor")
        return greedy_evaluation(self.trainer, self._venv, self.tasks, seed=self.seed,
                                 max_turn_tokens=self.max_turn_tokens,
                                 processor=processor if hasattr(processor, "image_processor") else None)

    def _initial_or_evaluate(self, step: int) -> dict[str, Any]:
        """The evaluation of ``step``: at step 0 with a ``reuse_dir``, the one kept under the same
        :func:`initial_key` (marked ``"reused": true``), else evaluated and kept there."""
        if step != 0 or self.reuse_dir is None:
            return self._evaluate()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        args = self.trainer.args
        autocast = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
        path = self.reuse_dir / f"validation0-{initial_key(model, self.tasks, self.seed, self.max_turn_tokens, autocast)}.json"
        if path.is_file():
            kept = json.loads(path.read_text(encoding="utf-8"))
            print(f"[validation] step 0: the evaluation of these weights kept in {path}", flush=True)
            return {**kept, "reused": True}
        out = self._evaluate()
        self.reuse_dir.mkdir(parents=True, exist_ok=True)
        _write_json(path, out)
        return out

    def _validate(self, state: Any, control: Any, *, log_now: bool) -> None:
        step = int(state.global_step)
        record = None
        if self._main:
            t0 = time.perf_counter()
            record = {"step": step, **self._initial_or_evaluate(step)}
            record["score"] = float(record[self.metric])
            record.setdefault("wall_s", round(time.perf_counter() - t0, 3))
            record.update(_latest_trl(self.trainer, state))
        record = self._broadcast(record)
        history = [*self.state["history"], record]
        best = best_record(history)
        improved = best is not None and int(best["step"]) == step
        self.state["history"] = history
        if improved:
            self.state["best"] = {"step": step, "score": _score(best)}
            if self.keep_best:
                self._save_best(step, record["score"])
        stop = should_stop(history, self.patience)
        if stop:
            self.state["stopped"] = {"step": step, "reason": f"{self.patience} evaluations without beating "
                                                             f"step {self.state['best']['step']}"}
            control.should_training_stop = True
        if self._main:
            _write_json(self.output_dir / STATE_FILE, self.state)
            b = self.state["best"]
            pr = record.get("parse_rate")
            print(f"[validation] step {step}: {self.metric} {record['score']:.3f}, parse "
                  f"{'-' if pr is None else f'{pr:.0%}'} (best {b['score']:.3f} at step {b['step']})"
                  + (" - stopping" if stop else ""), flush=True)
        self._log(record, log_now)
        self.trainer.accelerator.wait_for_everyone()

    def _save_best(self, step: int, score: float) -> None:
        """``best/`` replaced by the current weights (``trainer.save_model`` on every process; the main process
        writes and renames)."""
        tmp = self.output_dir / f".{BEST_DIR}.tmp"
        if self._main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.trainer.accelerator.wait_for_everyone()
        self.trainer.save_model(str(tmp), _internal_call=True)  # not pushed to a hub
        if self._main:
            processor = self.env_kwargs.get("processor")
            if hasattr(processor, "image_processor"):  # a vision-language run: best/ reloads with its processor
                processor.save_pretrained(str(tmp))
                self.trainer.processing_class.save_pretrained(str(tmp))  # as save_checkpoint: the tokenizer last
            if self.run_settings:
                from toolgym.checkpoint import write_run_settings

                write_run_settings(tmp, **self.run_settings)
            _write_json(tmp / _BEST_MARKER, {"step": step, "score": score, "metric": self.metric})
            _replace_dir(tmp, self.output_dir / BEST_DIR)
        self.state["best_dir"] = BEST_DIR

    def _log(self, record: Mapping[str, Any], now: bool) -> None:
        """The record's numbers as ``toolgym/validation/*`` training metrics: logged at once at train begin, else
        with the step's own TRL log (``trainer._metrics``, which TRL averages and clears at each log)."""
        values = {f"toolgym/validation/{k}": float(record[k]) for k in
                  ("score", "success", "reward", "parse_rate", "tool_call_rate") if record.get(k) is not None}
        values["toolgym/validation/best_score"] = float(self.state["best"]["score"])
        if now:
            self.trainer.log(values)
            return
        metrics = getattr(self.trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:
            for k, v in values.items():
                metrics["train"][k] = [v]


def validation_metrics(trainer: Any) -> dict[str, Any]:
    """``RunResult.metrics`` entries of the trainer's :class:`ValidationCallback`: ``selected_step``,
    ``validation_history``, ``validation_best``, ``validation_stopped`` (``{}`` without validation)."""
    cb = next((c for c in trainer.callback_handler.callbacks if isinstance(c, ValidationCallback)), None)
    if cb is None or not cb.state:
        return {}
    return {"selected_step": cb.state.get("selected_step"), "validation_history": list(cb.state["history"]),
            "validation_best": cb.state.get("best"), "validation_stopped": cb.state.get("stopped")}
