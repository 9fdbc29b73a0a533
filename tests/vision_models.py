"""Offline processors and tiny random vision-language models of three families, for the vision tests.

Nothing is downloaded: the tokenizers are the npm ones of :mod:`tests.tokenizers` (the Qwen3 vocabulary holds the
Qwen-VL image tokens; Gemma 3's tokenizer is rebuilt with its ``extra_special_tokens`` so ``Gemma3Processor``
finds ``boi_token`` / ``image_token``); the processors are the image-only ones (the Qwen-VL processors' video
processor imports torchvision: :func:`processor` leaves it out with
:func:`toolgym.processors.image_only_processor`); the models are built from configs with 2 layers
of width 16 (a few million parameters) and seeded weights.

* ``qwen2_5_vl``: patch 14, merge 2 (a 100x60 image: 8 image tokens);
* ``qwen3_vl``: patch 16, merge 2 (100x60: 6 tokens);
* ``gemma3``: images resized to 32x32, 4 image tokens each (``image_seq_length=4``).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from transformers import PreTrainedTokenizerFast

from tests.tokenizers import _npm_files

__all__ = ["FAMILY_NAMES", "processor", "tiny_model", "tokenizer"]

FAMILY_NAMES: tuple[str, ...] = ("qwen2_5_vl", "qwen3_vl", "gemma3")


@functools.cache
def tokenizer(family: str) -> Any:
    """A fresh tokenizer of ``family``'s text model (not the shared npm instance: the processor owns it)."""
    name = "gemma3" if family == "gemma3" else "qwen3"
    d = _npm_files(name)
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in cfg.items()
               if k in ("bos_token", "eos_token", "pad_token", "unk_token") and v}
    extra = cfg.get("extra_special_tokens") if family == "gemma3" else None
    tok = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), clean_up_tokenization_spaces=False,
                                  **special, **({"extra_special_tokens": extra} if extra else {}))
    if tok.pad_token is None:
        tok.pad_token = "<|endoftext|>"
    return tok


@functools.cache
def processor(family: str) -> Any:
    """The image-only processor of ``family`` over :func:`tokenizer` (no torchvision)."""
    if family == "gemma3":
        from transformers import Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        return Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer(family), image_seq_length=4)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from toolgym.processors import image_only_processor

    base = "Qwen3VLProcessor" if family == "qwen3_vl" else "Qwen2_5_VLProcessor"
    patch = 16 if family == "qwen3_vl" else 14
    return image_only_processor(base, Qwen2VLImageProcessorPil(patch_size=patch), tokenizer(family))


_TEXT = {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2}


@functools.cache
def tiny_model(family: str) -> Any:
    """A tiny random model of ``family`` (seeded; eval mode, float32). Shared per process: do not train it."""
    import torch

    torch.manual_seed(0)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        cfg = Qwen2_5_VLConfig(
            text_config={**_TEXT, "vocab_size": 151936, "rope_parameters": {"rope_type": "default",
                                                                             "mrope_section": [1, 1, 0]}},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                           "out_hidden_size": 16, "fullatt_block_indexes": [1], "window_size": 56})
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    elif family == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        cfg = Qwen3VLConfig(
            text_config={**_TEXT, "vocab_size": 151936, "head_dim": 4,
                         "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 0],
                                             "mrope_interleaved": True}},
            vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                           "out_hidden_size": 16, "deepstack_visual_indexes": [1], "patch_size": 16,
                           "num_position_embeddings": 64})
        model = Qwen3VLForConditionalGeneration(cfg)
    else:
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        cfg = Gemma3Config(
            text_config={**_TEXT, "vocab_size": 262208, "head_dim": 4},
            vision_config={"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32,
                           "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
            mm_tokens_per_image=4)
        model = Gemma3ForConditionalGeneration(cfg)
    return model.eval()


def pil(w: int, h: int, seed: int = 0) -> Any:
    """A ``w`` x ``h`` RGB image of random pixels drawn from ``seed``."""
    import numpy as np
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    return PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _snap(width: int, height: int) -> list:
    """Photograph the scene.

    Args:
        width: pixels across.
        height: pixels down.
    """
    return [f"a {width}x{height} photo:", pil(width, height, width + height)]


def snap_tool() -> Any:
    """The ``snap`` tool: a caption and a ``width`` x ``height`` photo."""
    from toolgym import tool

    return tool(name="snap")(_snap)
