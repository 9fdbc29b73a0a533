"""What a checkpoint must carry so that evaluating it reproduces the run that produced it.

A model directory holds weights and a tokenizer; the tokenizer carries the chat template. What it does not carry
is how the *env* rendered the episodes the model was trained and evaluated on: the system prompt, a chat template
that overrides the tokenizer's, the per-turn token budget. A checkpoint trained on a short system prompt and
evaluated with the env's default one renders other prompts than it was trained on, and scores far lower.

:func:`write_run_settings` writes those settings next to the weights as ``toolgym_run.json``; ``toolgym eval`` and
``toolgym rollout`` read them with :func:`read_run_settings` when ``--policy`` is a model directory and use them
as defaults (an explicit ``--env-kwarg`` or ``--max-new-tokens`` wins). File layout (JSON object)::

    {"format": 1,
     "env_id": "toolgym/Calculator-v0",                 # the env it was trained on (informational)
     "env_kwargs": {"system_prompt": "...", "chat_template": "..."},   # JSON-serialisable env kwargs
     "max_turn_tokens": 64,                              # tokens per assistant turn
     "autocast": "bfloat16",                             # generation under torch.autocast in this dtype, or null
     "eval": {"split": "test", "tasks": 100, "seed": 10000,          # how the run evaluated it (informational)
              "num_envs": 100, "batch_size": 50}}                     # its batching: toolgym eval's defaults

``toolgym eval`` also takes the recorded batching as its defaults (``--num-envs``, and rows per ``generate()``
call) when ``--num-envs`` is not given: greedy decoding in bfloat16 can flip near-ties with the batch's
composition, so the same batching reproduces the run's figure to the episode.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["AUTOCAST_DTYPES", "RUN_SETTINGS_FILE", "TASK_SELECTION_KWARGS", "RunSettingsError", "autocast_context",
           "check_autocast", "episode_env_kwargs", "read_run_settings", "write_run_settings"]

#: The file name inside a checkpoint directory.
RUN_SETTINGS_FILE = "toolgym_run.json"
_FORMAT = 1


#: the ``torch.autocast`` dtypes a policy may generate in (``TransformersPolicy(autocast=...)``) and a checkpoint
#: may record (``None``: the model's own dtype, no autocast)
AUTOCAST_DTYPES: tuple[str, ...] = ("bfloat16", "float16")


def check_autocast(dtype: str | None) -> str | None:
    """``dtype`` if it is ``None`` or one of :data:`AUTOCAST_DTYPES`, else a ``ValueError`` naming the choices."""
    if dtype is not None and dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be one of {', '.join(AUTOCAST_DTYPES)} or None; got {dtype!r}")
    return dtype


def autocast_context(device_type: str, dtype: str | None, model: Any = None) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast(device_type, dtype)`` for a dtype name of :data:`AUTOCAST_DTYPES`, or a no-op context for
    ``None``. Autocast is per thread: enter it in the thread that runs the model.

    ``model`` (for generation, entered under ``torch.no_grad()``): its *frozen* float32 weights are cast once per
    context too. Autocast caches the low-precision copy of a weight only when the weight requires grad, so a frozen
    one (e.g. a tied embedding / LM head left out of training) would be cast again at every decoding step
    (``docs/training.md`` measures it). For the duration they are marked as
    requiring grad (no graph is built under ``no_grad``); the cast values, and so the tokens, are the same. With
    grad enabled, ``model`` is ignored."""
    if check_autocast(dtype) is None:
        return contextlib.nullcontext()
    import torch

    ctx = torch.autocast(device_type, dtype=getattr(torch, dtype))
    if model is None or torch.is_grad_enabled():
        return ctx
    stack = contextlib.ExitStack()
    stack.enter_context(_frozen_weights_cacheable(model))
    stack.enter_context(ctx)
    return stack


@contextlib.contextmanager
def _frozen_weights_cacheable(model: Any) -> Any:
    import torch

    frozen = [p for p in model.parameters() if not p.requires_grad and p.dtype == torch.float32]
    for p in frozen:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


class RunSettingsError(ValueError):
    """A checkpoint's ``toolgym_run.json`` exists but cannot be used (not JSON, wrong types, newer format)."""


def write_run_settings(
    checkpoint: str | os.PathLike[str],
    *,
    env_id: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    max_turn_tokens: int | None = None,
    eval: Mapping[str, Any] | None = None,  # noqa: A002 - the JSON key
    autocast: str | None = None,
    device: str | None = None,
) -> Path:
    """Write ``checkpoint/toolgym_run.json`` atomically; returns its path.

    Args:
        checkpoint: the model directory (created if missing).
        env_id: the env the model was trained on.
        env_kwargs: env kwargs that fix the prompt (``system_prompt``, ``chat_template``, ...); JSON values only
            (a tokenizer or other objects raise ``TypeError``).
        max_turn_tokens: the per-turn token budget of training and evaluation.
        eval: how the producing run evaluated the checkpoint (e.g. ``{"split", "tasks", "seed"}``).
        autocast: the dtype the run generated in under ``torch.autocast`` (``"bfloat16"``), or ``None``: greedy
            decoding in bfloat16 and in float32 can pick different tokens, so an evaluation that should reproduce
            the run's own figures must generate the same way.
        device: where the producing run's model ran, as :func:`toolgym.placement.describe` states it
            (``"model on cuda:0, float32"``); a record, not a setting evaluations follow.
    """
    check_autocast(autocast)  # ValueError before anything is written
    d = Path(checkpoint)
    d.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"format": _FORMAT, "env_id": env_id, "env_kwargs": dict(env_kwargs or {}),
                            "max_turn_tokens": max_turn_tokens, "eval": dict(eval or {}), "autocast": autocast}
    if device is not None:
        data["device"] = device
    target = d / RUN_SETTINGS_FILE
    try:  # keys another writer keeps in the same file (a tracked run's lineage) stay
        kept = json.loads(target.read_text())
    except (OSError, ValueError):
        kept = {}
    data = {**(kept if isinstance(kept, dict) else {}), **data}
    text = json.dumps(data, indent=2, sort_keys=True)  # TypeError on anything that is not JSON
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(text + "\n")
    tmp.replace(target)
    return target


#: env kwargs that choose *which* tasks a run saw, not how an episode is rendered or run: an evaluation picks its
#: own (the test split), so a checkpoint's run settings leave them out
TASK_SELECTION_KWARGS = frozenset({"split", "tasks", "task_file", "tasks_file", "seed", "num_tasks", "test_fraction"})


def episode_env_kwargs(env_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of a training run's env kwargs that an evaluation of its checkpoint must reuse: everything that
    renders or runs an episode (system prompt, chat template, template kwargs, turn limits, ...), without the task
    selection (:data:`TASK_SELECTION_KWARGS`) and without values that are not JSON (a tokenizer object, a tool)."""
    out: dict[str, Any] = {}
    for key, value in (env_kwargs or {}).items():
        if key in TASK_SELECTION_KWARGS:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def read_run_settings(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The settings :func:`write_run_settings` stored in ``checkpoint``, or ``None`` when it has none (not a
    directory, or no ``toolgym_run.json``).

    Raises:
        RunSettingsError: the file is not valid JSON, has the wrong shape, or comes from a newer format.
    """
    f = Path(checkpoint) / RUN_SETTINGS_FILE
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise RunSettingsError(f"{f}: not readable JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("env_kwargs", {}), dict):
        raise RunSettingsError(f"{f}: expected an object with an 'env_kwargs' object")
    if int(data.get("format", _FORMAT)) > _FORMAT:
        raise RunSettingsError(f"{f}: format {data['format']} is newer than this toolgym reads ({_FORMAT})")
    mtt = data.get("max_turn_tokens")
    if mtt is not None and (not isinstance(mtt, int) or mtt < 1):
        raise RunSettingsError(f"{f}: max_turn_tokens must be a positive integer, got {mtt!r}")
    try:
        check_autocast(data.setdefault("autocast", None))
    except ValueError as e:
        raise RunSettingsError(f"{f}: {e}") from None
    data.setdefault("env_kwargs", {})
    data.setdefault("eval", {})
    return data
