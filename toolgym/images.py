"""Images in tasks and tool results: the :class:`Image` content type, its limits and its checks.

An :class:`Image` is encoded bytes (PNG, JPEG, WebP or GIF) with their MIME type, pixel size and SHA-256. Every
image that enters an episode (a task's ``images``, an MCP ``ImageContent`` block, a ``@tool`` returning a PIL image,
bytes with a MIME type, or a list mixing text and images) is checked here against :class:`ImageLimits`: a value
that is not an image, a corrupt file, a MIME type outside :data:`MIME_TYPES`, bytes that do not match their declared
MIME type, too many pixels or too many bytes each raise :class:`ImageError` with its :class:`ImageProblem`; the
executor turns those into an ``invalid_image`` error observation (never a crash).

Text-only policies read an image as its placeholder text, :func:`placeholder` (``[image: image/png, 1234 bytes]``).
:func:`split_parts` gives a text with placeholders back as ordered text and image parts: the seam where a renderer
that knows a vision-language processor replaces each placeholder with the processor's image tokens.

Pillow is imported only when an image is decoded or encoded; without it those calls raise ``ImportError`` naming
the package to install.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_IMAGE_LIMITS",
    "MIME_TYPES",
    "Image",
    "ImageError",
    "ImageLimits",
    "ImageProblem",
    "MixedContent",
    "as_image",
    "has_images",
    "mixed_content",
    "placeholder",
    "ref_placeholder",
    "split_parts",
    "task_images",
]

#: the MIME types an image may have, and Pillow's format name for each
MIME_TYPES: dict[str, str] = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
_FORMAT_MIME = {fmt: mime for mime, fmt in MIME_TYPES.items()}


class ImageProblem(StrEnum):
    """Why a value was refused as an image (the value is the name used in messages)."""

    NOT_AN_IMAGE = "not_an_image"  #: the bytes are no image format Pillow knows (or bad base64)
    CORRUPT = "corrupt"  #: the header reads, the pixel data does not (a truncated or damaged file)
    UNKNOWN_MIME_TYPE = "unknown_mime_type"  #: a MIME type outside :data:`MIME_TYPES`
    MIME_MISMATCH = "mime_mismatch"  #: the bytes are another format than their declared MIME type
    TOO_MANY_PIXELS = "too_many_pixels"  #: width x height above ``max_pixels``
    TOO_LARGE = "too_large"  #: more encoded bytes than ``max_bytes``
    TOO_MANY = "too_many"  #: more images in one turn than ``max_per_turn``
    HASH_MISMATCH = "hash_mismatch"  #: stored bytes whose SHA-256 is not the one recorded with them


class ImageError(ValueError):
    """A value refused as an image; ``problem`` says why, the message says what it was."""

    def __init__(self, problem: ImageProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


@dataclass(frozen=True)
class ImageLimits:
    """What an image may be.

    Attributes:
        max_pixels: width x height of one image (default 4096 x 4096); checked from the header before the pixel
            data is decoded, so a decompression bomb costs nothing.
        max_bytes: encoded bytes of one image (default 20 MiB).
        max_per_turn: images shown to the model per turn, all tool results of the turn together (default 8); the
            env answers the results past it with ``invalid_image``.
        mime_types: the MIME types accepted (default: all of :data:`MIME_TYPES`).
    """

    max_pixels: int = 4096 * 4096
    max_bytes: int = 20 * 2**20
    max_per_turn: int = 8
    mime_types: frozenset[str] = field(default_factory=lambda: frozenset(MIME_TYPES))


DEFAULT_IMAGE_LIMITS = ImageLimits()


def placeholder(mime_type: str, nbytes: int) -> str:
    """The text a text-only policy reads for an image: ``[image: <MIME type>, <bytes> bytes]``."""
    return f"[image: {mime_type}, {nbytes} bytes]"


def _pil() -> Any:
    try:
        import PIL.Image
    except ImportError as e:  # pragma: no cover - Pillow ships with the project's dependencies
        raise ImportError("images need Pillow: pip install pillow") from e
    return PIL.Image


def _is_pil(value: Any) -> bool:
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(value).__mro__)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _without_bad_ancillary_chunks(data: bytes) -> bytes | None:
    """A PNG without its ancillary chunks (colour profile, text, EXIF ...) whose CRC is wrong, as libpng and browsers
    skip them; ``None`` when ``data`` is no PNG, has no such chunk, or has a damaged critical chunk."""
    if not data.startswith(_PNG_SIGNATURE):
        return None
    out, at, dropped = [_PNG_SIGNATURE], len(_PNG_SIGNATURE), False
    while at < len(data):
        if at + 12 > len(data):
            return None
        n = int.from_bytes(data[at : at + 4], "big")
        end = at + 12 + n
        if end > len(data):
            return None
        kind, body, crc = data[at + 4 : at + 8], data[at + 8 : at + 8 + n], data[at + 8 + n : end]
        if binascii.crc32(kind + body).to_bytes(4, "big") == crc:
            out.append(data[at:end])
        elif kind[0] & 0x20:  # ancillary (lower-case first letter): skipped
            dropped = True
        else:
            return None
        at = end
    return b"".join(out) if dropped else None


@dataclass(frozen=True)
class Image:
    """An encoded image: checked bytes with their MIME type and size. Build one with :meth:`from_bytes`,
    :meth:`from_pil`, :meth:`from_base64` or :func:`as_image` (each checks it); the constructor trusts its fields.

    Attributes:
        mime_type: one of :data:`MIME_TYPES`.
        data: the encoded bytes, as a tool or task gave them (never re-encoded; the one change: a PNG's ancillary
            chunks with a wrong CRC, which libpng and browsers skip, are left out, so that Pillow reads the bytes).
        width, height: the size in pixels.
    """

    mime_type: str
    data: bytes = field(repr=False)
    width: int
    height: int

    @cached_property
    def sha256(self) -> str:
        """The hex SHA-256 of :attr:`data` (the image's identity in trajectory files)."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def placeholder(self) -> str:
        """The text a text-only policy reads for this image (:func:`placeholder`)."""
        return placeholder(self.mime_type, len(self.data))

    @classmethod
    def from_bytes(cls, data: bytes, mime_type: str | None = None, limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> Image:
        """Check ``data`` and wrap it. ``mime_type``: the declared type (``None``: the type the bytes are).

        Raises:
            ImageError: unknown MIME type, too many bytes, not an image, bytes of another format than
                ``mime_type``, too many pixels, or pixel data that does not decode.
        """
        data = bytes(data)
        if mime_type is not None and mime_type not in limits.mime_types:
            raise ImageError(ImageProblem.UNKNOWN_MIME_TYPE,
                             f"MIME type {mime_type!r} is not one of {', '.join(sorted(limits.mime_types))}")
        if len(data) > limits.max_bytes:
            raise ImageError(ImageProblem.TOO_LARGE, f"{len(data)} bytes, above the limit of {limits.max_bytes}")
        pil = _pil()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", pil.DecompressionBombWarning)  # max_pixels below decides
                img = pil.open(io.BytesIO(data))
        except pil.DecompressionBombError as e:
            raise ImageError(ImageProblem.TOO_MANY_PIXELS, str(e)) from None
        except Exception as e:  # noqa: BLE001 - Pillow raises UnidentifiedImageError, SyntaxError, ValueError ...
            repaired = _without_bad_ancillary_chunks(data)
            if repaired is not None:
                return cls.from_bytes(repaired, mime_type, limits)
            raise ImageError(ImageProblem.NOT_AN_IMAGE,
                             f"not an image ({len(data)} bytes): {type(e).__name__}: {e}") from None
        with img:
            actual = _FORMAT_MIME.get(img.format or "")
            if actual is None or actual not in limits.mime_types:
                raise ImageError(ImageProblem.UNKNOWN_MIME_TYPE,
                                 f"the bytes are {img.format or 'an unknown'} image, not one of "
                                 f"{', '.join(sorted(limits.mime_types))}")
            if mime_type is not None and actual != mime_type:
                raise ImageError(ImageProblem.MIME_MISMATCH, f"declared {mime_type}, but the bytes are {actual}")
            w, h = img.size
            if w * h > limits.max_pixels:
                raise ImageError(ImageProblem.TOO_MANY_PIXELS,
                                 f"{w}x{h} = {w * h} pixels, above the limit of {limits.max_pixels}")
            try:
                img.load()
            except Exception as e:  # noqa: BLE001 - truncated or damaged pixel data
                raise ImageError(ImageProblem.CORRUPT, f"{actual} {w}x{h}: {type(e).__name__}: {e}") from None
        return cls(actual, data, w, h)

    @classmethod
    def from_base64(cls, text: str, mime_type: str | None = None,
                    limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> Image:
        """:meth:`from_bytes` of base64 ``text`` (as MCP's ``ImageContent.data`` carries it); bad base64 is
        ``not_an_image``."""
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError(ImageProblem.NOT_AN_IMAGE, f"not base64: {e}") from None
        return cls.from_bytes(data, mime_type, limits)

    @classmethod
    def from_pil(cls, img: Any, format: str = "PNG", limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> Image:  # noqa: A002
        """Encode a PIL image (``format``: ``"PNG"`` by default, lossless) after checking its pixel count."""
        w, h = img.size
        if w * h > limits.max_pixels:
            raise ImageError(ImageProblem.TOO_MANY_PIXELS,
                             f"{w}x{h} = {w * h} pixels, above the limit of {limits.max_pixels}")
        mime = _FORMAT_MIME.get(format.upper())
        if mime is None or mime not in limits.mime_types:
            raise ImageError(ImageProblem.UNKNOWN_MIME_TYPE, f"cannot encode as {format!r}")
        buf = io.BytesIO()
        img.save(buf, format=format.upper())
        data = buf.getvalue()
        if len(data) > limits.max_bytes:
            raise ImageError(ImageProblem.TOO_LARGE, f"{len(data)} bytes, above the limit of {limits.max_bytes}")
        return cls(mime, data, w, h)

    def to_pil(self) -> Any:
        """The decoded image (a ``PIL.Image.Image``, loaded)."""
        img = _pil().open(io.BytesIO(self.data))
        img.load()
        return img

    def ref(self) -> dict[str, Any]:
        """The image without its bytes, as results and tasks in trajectory files name it:
        ``{"sha256", "mime_type", "width", "height", "bytes"}``."""
        return {"sha256": self.sha256, "mime_type": self.mime_type, "width": self.width, "height": self.height,
                "bytes": len(self.data)}

    def to_json(self) -> dict[str, Any]:
        """:meth:`ref` plus ``"data"``: the bytes in base64 (an entry of a trajectory row's ``images`` table)."""
        return {**self.ref(), "data": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Image:
        """The image of a :meth:`to_json` entry; its bytes must have the recorded SHA-256 (``hash_mismatch``)."""
        try:
            data = base64.b64decode(row["data"], validate=True)
        except (binascii.Error, ValueError, TypeError, KeyError) as e:
            raise ImageError(ImageProblem.NOT_AN_IMAGE, f"no base64 image data: {e}") from None
        img = cls(str(row["mime_type"]), data, int(row["width"]), int(row["height"]))
        if "sha256" in row and row["sha256"] != img.sha256:
            raise ImageError(ImageProblem.HASH_MISMATCH,
                             f"the data's SHA-256 is {img.sha256}, the entry says {row['sha256']}")
        return img


def _block_image(block: Mapping[str, Any], limits: ImageLimits) -> Image:
    """An image content block: ``{"type": "image", "data": bytes | base64 str, "mime_type": ...}`` (MCP's
    ``ImageContent`` shape, ``mimeType`` accepted) or ``{"type": "image", "image": PIL | Image | bytes}`` (TRL's)."""
    mime = block.get("mime_type", block.get("mimeType"))
    if "image" in block:
        return as_image(block["image"], limits, mime_type=mime)
    data = block.get("data")
    if isinstance(data, str):
        return Image.from_base64(data, mime, limits)
    if isinstance(data, bytes | bytearray | memoryview):
        return Image.from_bytes(bytes(data), mime, limits)
    raise ImageError(ImageProblem.NOT_AN_IMAGE, f"an image block needs 'data' or 'image', got keys {sorted(block)}")


def as_image(value: Any, limits: ImageLimits = DEFAULT_IMAGE_LIMITS, *, mime_type: str | None = None) -> Image:
    """``value`` as a checked :class:`Image`: an :class:`Image` (its limits checked again), a PIL image (encoded as
    PNG), ``bytes`` (with ``mime_type`` or the type the bytes are), an image content block (see
    :func:`has_images`), a ``data:`` URI, or a path to an image file (``str`` or ``Path``, relative to the current
    directory). Raises :class:`ImageError`."""
    if isinstance(value, Image):
        return Image.from_bytes(value.data, value.mime_type, limits)
    if _is_pil(value):
        return Image.from_pil(value, limits=limits)
    if isinstance(value, bytes | bytearray | memoryview):
        return Image.from_bytes(bytes(value), mime_type, limits)
    if isinstance(value, Mapping) and value.get("type") == "image":
        return _block_image(value, limits)
    if isinstance(value, str) and value.startswith("data:"):
        head, _, body = value.partition(",")
        if not head.endswith(";base64"):
            raise ImageError(ImageProblem.NOT_AN_IMAGE, "a data: URI image must be base64 (data:<mime>;base64,...)")
        return Image.from_base64(body, head[5:-7] or None, limits)
    if isinstance(value, str | Path):
        try:
            data = Path(value).read_bytes()
        except OSError as e:
            raise ImageError(ImageProblem.NOT_AN_IMAGE, f"cannot read image file {str(value)!r}: {e}") from None
        return Image.from_bytes(data, mime_type, limits)
    raise ImageError(ImageProblem.NOT_AN_IMAGE, f"expected an image, got {type(value).__name__}")


def _is_image_value(x: Any) -> bool:
    return isinstance(x, Image) or _is_pil(x) or (isinstance(x, Mapping) and x.get("type") == "image")


def _is_text_block(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, Mapping) and x.get("type") == "text" and isinstance(x.get("text"), str))


def has_images(value: Any) -> bool:
    """Whether a tool's return value carries images: an :class:`Image`, a PIL image, an image content block
    (``{"type": "image", ...}``), or a list/tuple of text (``str`` or ``{"type": "text", "text": ...}``) and images
    with at least one image. Any other value (a plain list included) is text, as ``str(value)``."""
    if _is_image_value(value):
        return True
    if isinstance(value, list | tuple) and value:
        return (any(_is_image_value(x) for x in value)
                and all(_is_image_value(x) or _is_text_block(x) for x in value))
    return False


@dataclass
class MixedContent:
    """A tool result with images, as the model is shown it.

    Attributes:
        text: the text parts joined by newlines, each image as its :func:`placeholder` where it stood.
        images: the checked images, in order (each one's placeholder is in ``text``).
        problems: one line per part refused as an image (its position, what it was and why); the images and text
            around it are kept.
    """

    text: str
    images: list[Image] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        mime = value.get("mime_type", value.get("mimeType"))
        data = value.get("data", value.get("image"))
        size = f", {len(data)} {'base64 characters' if isinstance(data, str) else 'bytes'}" \
            if isinstance(data, str | bytes) else ""
        return f"{mime or 'no MIME type'}{size}"
    if _is_pil(value):
        return f"PIL image {value.size[0]}x{value.size[1]}"
    return type(value).__name__


def mixed_content(value: Any, limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> MixedContent:
    """Check every image of a tool's return value (one for which :func:`has_images` holds) and render the text a
    text-only policy reads; a refused image leaves its problem in :attr:`MixedContent.problems`, never an
    exception."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    texts: list[str] = []
    images: list[Image] = []
    problems: list[str] = []
    for i, item in enumerate(items):
        if _is_text_block(item):
            texts.append(item if isinstance(item, str) else item["text"])
            continue
        try:
            img = as_image(item, limits)
        except ImageError as e:
            problems.append(f"part {i + 1} ({_describe(item)}): {e.problem.value}: {e.message}")
            continue
        images.append(img)
        texts.append(img.placeholder)
    return MixedContent("\n".join(texts), images, problems)


def split_parts(text: str, images: Sequence[Image]) -> list[str | Image]:
    """``text`` as ordered parts: the text between images, and each image of ``images`` where its placeholder
    stands (found in order, each after the previous one). An image whose placeholder is not in ``text`` (cut by an
    observation limit) is left out. The seam for a processor-aware renderer: it turns each :class:`Image` part
    into the model's image tokens and leaves the text parts as they are."""
    parts: list[str | Image] = []
    pos = 0
    for img in images:
        ph = img.placeholder
        at = text.find(ph, pos)
        if at < 0:
            continue
        if at > pos:
            parts.append(text[pos:at])
        parts.append(img)
        pos = at + len(ph)
    if pos < len(text):
        parts.append(text[pos:])
    return parts


def ref_placeholder(ref: Mapping[str, Any]) -> str:
    """The placeholder of an image named by its :meth:`Image.ref`."""
    return placeholder(str(ref["mime_type"]), int(ref["bytes"]))


def task_images(task: dict[str, Any], limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> list[Image]:
    """The checked images of a task row's ``"images"`` (a list of anything :func:`as_image` takes: a PIL image, an
    :class:`Image`, bytes, an image block, a ``data:`` URI, a file path); the row's ``"images"`` is replaced by their
    :meth:`Image.ref` (JSON, no bytes). A row without images gives ``[]`` and is left as it is.

    Raises:
        ImageError: an image is refused; the message names the task id and the image's index.
    """
    raw = task.get("images")
    if raw is None or (isinstance(raw, list | tuple) and not raw):
        return []
    items = list(raw) if isinstance(raw, list | tuple) else [raw]
    images: list[Image] = []
    for i, value in enumerate(items):
        try:
            images.append(as_image(value, limits))
        except ImageError as e:
            raise ImageError(e.problem, f"task {task.get('id', '?')!r}: images[{i}]: {e.problem.value}: "
                             f"{e.message}") from None
    task["images"] = [img.ref() for img in images]
    return images
