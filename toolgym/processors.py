"""Loading a vision-language model's Hugging Face processor offline, with an image-only fallback.

:func:`load_processor` reads a processor from a local directory (or a hub id already in the local cache; nothing
is downloaded). The Qwen-VL processors (``Qwen2VLProcessor``, ``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``)
require a video processor whose module imports torchvision; where torchvision is missing or broken (its PyPI build
on a CPU-only torch fails to load its operators), the full processor cannot be built and :func:`load_processor`
builds the family's image-only processor (:func:`image_only_processor`: images and text, no video) from the same
directory, saying so in a log line. :func:`is_vision_checkpoint` tells a vision-language checkpoint (its config has
``vision_config``) from a text one; :func:`toolgym.models.load_model` loads the former with
``AutoModelForImageTextToText`` and this processor's tokenizer.

transformers is imported only inside the functions.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = [
    "IMAGE_ONLY_FAMILIES",
    "ProcessorNotFoundError",
    "UnsupportedProcessorError",
    "image_only_processor",
    "is_vision_checkpoint",
    "load_processor",
]

log = logging.getLogger(__name__)


class ProcessorNotFoundError(OSError):
    """No processor to load: not a local directory (nor a hub id in the local cache), or a directory without a
    processor config (``processor_config.json`` / ``preprocessor_config.json``)."""


class UnsupportedProcessorError(ValueError):
    """A processor config that cannot be built here: the full processor fails (e.g. its video processor needs
    torchvision) and its family has no image-only processor (:data:`IMAGE_ONLY_FAMILIES`)."""


#: processor classes whose image-only variant (no video processor, hence no torchvision) :func:`load_processor`
#: builds when the full processor cannot be built
IMAGE_ONLY_FAMILIES: frozenset[str] = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor"})
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@functools.cache
def _image_only_class(base: type) -> type:
    class ImageOnly(base):  # type: ignore[misc, valid-type]
        """``base`` without its video processor: images and text only."""

        @classmethod
        def get_attributes(cls) -> list[str]:
            return ["image_processor", "tokenizer"]

    ImageOnly.__name__ = base.__name__  # save_pretrained records the family's class, which AutoProcessor knows
    ImageOnly.__qualname__ = f"ImageOnly{base.__name__}"
    return ImageOnly


def image_only_processor(processor_class: str | type, image_processor: Any, tokenizer: Any, **kwargs: Any) -> Any:
    """A processor of ``processor_class`` (a class or its name, one of :data:`IMAGE_ONLY_FAMILIES`) over an image
    processor and a tokenizer, without the video processor the Qwen-VL processors require (whose module imports
    torchvision). ``kwargs`` go to the processor (``chat_template=...``). Its class is a subclass of the family's,
    named as it (``family_of`` and ``save_pretrained`` see the family).

    Raises:
        UnsupportedProcessorError: another class.
    """
    import transformers

    name = processor_class if isinstance(processor_class, str) else processor_class.__name__
    if name not in IMAGE_ONLY_FAMILIES:
        raise UnsupportedProcessorError(f"no image-only processor for {name}; supported: "
                                        f"{', '.join(sorted(IMAGE_ONLY_FAMILIES))}")
    base = processor_class if isinstance(processor_class, type) else getattr(transformers, name)
    return _image_only_class(base)(image_processor=image_processor, tokenizer=tokenizer, **kwargs)


def _processor_class_name(d: Path) -> str | None:
    """The ``processor_class`` a processor directory records (its processor or preprocessor config)."""
    for name in (*_PROCESSOR_FILES, "tokenizer_config.json"):
        try:
            value = json.loads((d / name).read_text(encoding="utf-8")).get("processor_class")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str):
            return value
    return None


def load_processor(name_or_path: str | os.PathLike[str]) -> Any:
    """A vision-language model's Hugging Face processor, from a local directory (or a hub id already in the local
    cache): nothing is downloaded. Memoised per argument, like :func:`load_tokenizer`: every call with the same
    path returns **the same object** (so its tokenizer is the one :func:`load_model` returns for that path).

    ``AutoProcessor.from_pretrained`` first; when that fails (the Qwen-VL processors require a video processor,
    whose module imports torchvision, which may be missing or broken) and the directory records a family of
    :data:`IMAGE_ONLY_FAMILIES`, the image-only processor of that family (:func:`image_only_processor`) over the
    directory's image processor and tokenizer, with a log line (``toolgym.models``, INFO) saying so.

    Raises:
        ProcessorNotFoundError: no such directory (nor cached hub id), or no processor config in it.
        UnsupportedProcessorError: the full processor fails and the family has no image-only processor (the
            message names the family and the failure).
    """
    return _load_processor_cached(str(Path(name_or_path).expanduser()) if Path(name_or_path).expanduser().exists()
                                  else str(name_or_path))


@functools.lru_cache(maxsize=8)
def _load_processor_cached(name: str) -> Any:
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    d = Path(name)
    if not d.is_dir():
        try:  # a hub id already downloaded
            from huggingface_hub import snapshot_download

            d = Path(snapshot_download(name, local_files_only=True))
        except Exception:  # noqa: BLE001 - not a repo id, or not cached
            raise ProcessorNotFoundError(f"processor {name!r}: no such directory, and not a model in the local "
                                         "Hugging Face cache (nothing is downloaded)") from None
    if not any((d / f).is_file() for f in _PROCESSOR_FILES):
        raise ProcessorNotFoundError(f"processor {name!r}: {d} has no {' or '.join(_PROCESSOR_FILES)} (a "
                                     "text-only checkpoint, or a vision-language one saved without its processor)")
    try:
        return AutoProcessor.from_pretrained(str(d), local_files_only=True)
    except (OSError, ImportError, ValueError, TypeError, KeyError) as e:
        failure = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    family = _processor_class_name(d)
    if family not in IMAGE_ONLY_FAMILIES:
        raise UnsupportedProcessorError(f"processor {name!r} ({family or 'no processor_class recorded'}): "
                                        f"{failure}; an image-only fallback exists for "
                                        f"{', '.join(sorted(IMAGE_ONLY_FAMILIES))}")
    template = d / "chat_template.jinja"
    kwargs = {"chat_template": template.read_text(encoding="utf-8")} if template.is_file() else {}
    proc = image_only_processor(family, AutoImageProcessor.from_pretrained(str(d), local_files_only=True),
                                AutoTokenizer.from_pretrained(str(d), local_files_only=True), **kwargs)
    log.info("processor %s: the full %s cannot be built (%s); using its image-only processor (images and text, "
             "no video)", name, family, failure)
    return proc


def is_vision_checkpoint(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether a model directory (or a cached hub id) is a vision-language model: its config has a
    ``vision_config``. ``False`` for anything unreadable (a ``.gguf`` file, an unknown name)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        try:
            return "vision_config" in json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError):
            return False
    if path.suffix == ".gguf" or path.exists():
        return False
    try:
        from transformers import AutoConfig

        return getattr(AutoConfig.from_pretrained(str(name_or_path), local_files_only=True), "vision_config",
                       None) is not None
    except Exception:  # noqa: BLE001 - not cached: a hub causal LM as before
        return False
