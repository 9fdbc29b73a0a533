"""What every algorithm of :data:`trainers.ALGORITHMS` shares: the fields every ``Config`` extends
(:class:`BaseConfig`; :class:`EnvConfig` for the algorithms that run episodes), :class:`RunResult` (what ``run``
returns) and the run preamble (:func:`prepare`: threads and seed; :func:`load_policy`: the model and tokenizer;
:func:`resolve_processor`: a vision-language model's processor named in ``env_kwargs``).
Every trained checkpoint is saved by :func:`toolgym.checkpoint.save_checkpoint`.

The rest of the preamble is elsewhere, once: TRL's log silencing is set in ``trainers/__init__.py`` (it runs
before any algorithm module), ``sys.path`` for script launches in ``trainers/cli.py`` (the one script entry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainers.runconfig import opt

__all__ = ["BaseConfig", "EnvConfig", "RunResult", "load_policy", "prepare", "resolve_processor"]


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
        "help": "keyword arguments of the env, e.g. {split: train}, {max_turns: 3}, a retriever URL, template_kwargs; "
                "processor: true (the model's own processor) or a processor directory trains a vision-language "
                "model on images as its image tokens"})


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


#: ``env_kwargs.processor`` values meaning "the model's own processor"
OWN_PROCESSOR = (True, "auto", "true", "model")


def resolve_processor(env_kwargs: dict[str, Any], model_name: str | None, model: Any,
                      tokenizer: Any) -> tuple[dict[str, Any], Any]:
    """``(env_kwargs, tokenizer)`` with ``env_kwargs["processor"]`` as the processor object a run's envs and
    trainers take (docs/multimodal.md): ``true`` / ``"auto"`` = the model's own (:func:`toolgym.processors.
    load_processor` of ``model_name``), a string = a processor directory, an object = as it is; absent,
    ``null`` or ``false``: no processor (text episodes, ``env_kwargs`` unchanged). With a processor, the tokenizer
    is the processor's (the env's and the trainer's ids are the processor's).

    Raises:
        ConfigError: a processor for a model without a vision tower (no ``config.vision_config``: a text
            checkpoint, ``model: tiny``, the embedded model), ``true`` without a model directory, or a processor
            that cannot be loaded (no processor config, an unsupported family; exit code 3).
    """
    from toolgym.errors import ConfigError
    from toolgym.processors import ProcessorNotFoundError, UnsupportedProcessorError, load_processor

    value = env_kwargs.get("processor")
    if value is None or value is False:
        return {k: v for k, v in env_kwargs.items() if k != "processor"}, tokenizer
    name = model_name if model_name not in (None, "tiny") else "the embedded model" if model_name is None else "tiny"
    if getattr(getattr(model, "config", None), "vision_config", None) is None:
        raise ConfigError(f"env_kwargs.processor: model {name} is text-only (its config has no vision_config); "
                          "a processor needs a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL, Gemma 3)")
    if not isinstance(value, str) and value not in OWN_PROCESSOR:
        return dict(env_kwargs), getattr(value, "tokenizer", tokenizer)
    source = model_name if value in OWN_PROCESSOR else value
    if source in (None, "tiny"):
        raise ConfigError(f"env_kwargs.processor: {value!r} names the model's own processor, but model is {name}")
    try:
        processor = load_processor(source)
    except (ProcessorNotFoundError, UnsupportedProcessorError) as e:
        raise ConfigError(f"env_kwargs.processor: {e}", code=3) from None
    return {**env_kwargs, "processor": processor}, processor.tokenizer
