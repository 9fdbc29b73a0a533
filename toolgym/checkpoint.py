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

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# autocast_context is imported from here by toolgym.rollout.policies
from toolgym.precision import AUTOCAST_DTYPES, autocast_context, check_autocast  # noqa: F401

__all__ = ["RUN_SETTINGS_FILE", "TASK_SELECTION_KWARGS", "RunSettingsError", "episode_env_kwargs",
           "read_run_settings", "save_checkpoint", "write_run_settings"]

#: The file name inside a checkpoint directory.
RUN_SETTINGS_FILE = "toolgym_run.json"
_FORMAT = 1


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
    selection (:data:`TASK_SELECTION_KWARGS`) and without values that are not JSON (a tokenizer object, a tool).
    A ``processor`` (an object, a path, ``true``/``"auto"``) is ``true``: the checkpoint's own processor, which
    :func:`save_checkpoint` saves beside the weights (``toolgym eval --policy DIR`` loads it from ``DIR``)."""
    out: dict[str, Any] = {}
    for key, value in (env_kwargs or {}).items():
        if key in TASK_SELECTION_KWARGS:
            continue
        if key == "processor":
            if value not in (None, False):
                out[key] = True
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


def save_checkpoint(model: Any, tokenizer: Any, path: str | os.PathLike[str], *, chat_template: str | None = None,
                    run_settings: Mapping[str, Any] | None = None, main_process: bool = True,
                    processor: Any = None) -> Path:
    """Save a trained model and its tokenizer in Hugging Face format, so ``toolgym.models.load_model(path)`` loads
    both: the one save path of every trained checkpoint (every ``trainers`` algorithm, the demo, the benchmarks).

    Args:
        model: a bare model (``save_pretrained``) or a Hugging Face / TRL trainer (its ``save_model``, which
            gathers sharded weights: every process of a multi-process run must call this then).
        tokenizer: saved as is, or a copy of it with ``chat_template`` (the shared object is not mutated).
        path: the checkpoint directory (created if missing).
        chat_template: a chat template the checkpoint's tokenizer carries instead of its own.
        run_settings: keyword arguments of :func:`write_run_settings` (``env_id``, ``env_kwargs`` such as the
            system prompt and chat template, ``max_turn_tokens``, ``eval``, ``autocast``), written as
            ``toolgym_run.json`` so ``toolgym eval --policy path`` renders the prompt the model was trained on.
        main_process: whether this process writes the files (``False`` on the other ranks of a multi-process
            run: they only take part in a trainer's ``save_model``).
        processor: a vision-language model's processor, saved too (its ``save_pretrained``: the image processor's
            config, with the tokenizer written as above), so ``toolgym.processors.load_processor(path)`` and
            ``toolgym eval --policy path`` find it.

    Returns:
        The directory.
    """
    p = Path(path)
    save_model = getattr(model, "save_model", None)
    if save_model is not None:
        save_model(str(p))  # a trainer: collective, and it writes on the main process only
    if not main_process:
        return p
    p.mkdir(parents=True, exist_ok=True)
    if save_model is None:
        model.save_pretrained(str(p))
    tok = tokenizer
    if chat_template is not None:
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = chat_template
    if processor is not None:
        processor.save_pretrained(str(p))
    tok.save_pretrained(str(p))  # after the processor's: its tokenizer is the one given (chat_template included)
    if run_settings is not None:
        write_run_settings(p, **run_settings)
    return p
