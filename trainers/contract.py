"""What every algorithm of :data:`trainers.ALGORITHMS` shares: the fields every ``Config`` extends
(:class:`BaseConfig`; :class:`EnvConfig` for the algorithms that run episodes), :class:`RunResult` (what ``run``
returns) and the run preamble (:func:`prepare`: threads and seed; :func:`load_policy`: the model and tokenizer).
Every trained checkpoint is saved by :func:`toolgym.checkpoint.save_checkpoint`.

The rest of the preamble is elsewhere, once: TRL's log silencing is set in ``trainers/__init__.py`` (it runs
before any algorithm module), ``sys.path`` for script launches in ``trainers/cli.py`` (the one script entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainers.runconfig import opt

__all__ = ["BaseConfig", "EnvConfig", "RunResult", "load_policy", "prepare"]


@dataclass
class BaseConfig:
    """The fields every algorithm's ``Config`` has, as TRL's configs share ``_BaseConfig``: an algorithm's
    ``Config`` subclasses this (or :class:`EnvConfig`) and declares only its own fields, grouped under
    ``# Parameters that control ...`` comments. Dataclass inheritance puts these fields first."""

    # Parameters that control the model
    model: str | None = opt(None, "the model: a directory, hub id or .gguf file; null = the embedded "
                                  "SmolLM2-135M-Instruct; 'tiny' = a tiny random model (smoke tests)")
    dtype: str = opt("float32", "weights dtype (float32, bfloat16)")

    # Parameters that control the machine
    threads: int = opt(0, "torch CPU threads per process (0: torch's default)")


@dataclass
class EnvConfig(BaseConfig):
    """:class:`BaseConfig` plus the env the episodes run in: the ``Config`` of every algorithm that rolls out
    (GRPO, SFT, RFT, DPO) subclasses this."""

    # Parameters that control the env
    env_id: str = opt("toolgym/Calculator-v0", "toolgym env id the episodes run in")
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "keyword arguments of the env, e.g. {split: train}, {max_turns: 3}, a retriever URL, template_kwargs"})


@dataclass
class RunResult:
    """What an algorithm's ``run(config)`` returns.

    Attributes:
        algorithm: the name in :data:`trainers.ALGORITHMS` (``grpo``, ``sft``, ...).
        output_dir: the directory the run wrote to.
        model_dir: where the trained model (and tokenizer) was saved; ``None`` when not saved.
        metrics: the run's summary, JSON-serialisable (per algorithm: steps, losses, rewards, pairs, held-out
            success ...; also written to a JSON file under ``output_dir`` where the algorithm documents one).
        artifacts: other files it wrote, by kind (e.g. ``{"trajectories": "runs/x/sft_trajectories.jsonl"}``).
    """

    algorithm: str
    output_dir: str
    model_dir: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)


def prepare(*, threads: int = 0, seed: int | None = None) -> None:
    """The run preamble: ``torch.set_num_threads(threads)`` when ``threads > 0`` and ``torch.manual_seed(seed)``
    when ``seed`` is not ``None``."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if seed is not None:
        torch.manual_seed(seed)


def load_policy(model: str | None, *, dtype: str = "float32", seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a config's ``model`` field: ``None`` = the embedded SmolLM2-135M-Instruct,
    ``"tiny"`` = a tiny random model (:func:`toolgym.models.tiny_random_model`, for smoke tests, seeded with
    ``seed``), else a path / hub id / ``.gguf`` (:func:`toolgym.models.load_model`, weights in ``dtype``)."""
    import torch

    from toolgym.models import load_model, load_tokenizer, tiny_random_model

    if model == "tiny":
        tok = load_tokenizer(None)
        return tiny_random_model(tok, seed=seed), tok
    return load_model(model, dtype=getattr(torch, dtype))
