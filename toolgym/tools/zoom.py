"""``zoom``: a tool that shows a region of an image enlarged, as an image (a tool result that carries pixels).

The model sees an image of ``width x height`` pixels (the *shown* image). The tool holds a *source* image
``scale`` times larger on each side (the shown image is the source downscaled by ``scale``; ``scale=1``: the shown
image itself). ``zoom(x, y, width, height)`` names a region in shown pixels and answers with the source's pixels of
that region, ``scale * width x scale * height``, each enlarged by the integer factor ``zoom_factor(...)``
(nearest neighbour, so every source pixel becomes a ``k x k`` block and nothing is resampled) so that the longer
side is as large as possible but at most ``max_side`` pixels (256 by default).

Bad arguments are answered, never raised: a region outside the image, a zero or negative size, a region whose
source pixels exceed ``max_side`` (it cannot be shown at 1x or more), a non-integer are ``invalid_arguments``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PIL import Image as PILImage

from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = ["ZoomTool", "zoom_factor"]

#: default longest side of a zoom's answer, in pixels
MAX_SIDE = 256


def zoom_factor(width: int, height: int, scale: int, max_side: int = MAX_SIDE) -> int:
    """The integer enlargement of a ``width x height`` region (shown pixels) of a source ``scale`` times larger:
    the largest ``k >= 1`` with ``scale * max(width, height) * k <= max_side``; 0 when even ``k = 1`` is too large."""
    return max_side // (scale * max(width, height))


def _int_arg(arguments: Mapping[str, Any], name: str) -> int:
    v = arguments.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise ToolError(f"zoom: {name} must be an integer number of pixels, got {v!r}",
                        kind=ToolErrorKind.INVALID_ARGUMENTS)
    return int(v)


class ZoomTool(Tool):
    """Show a region of an image enlarged.

    Args:
        source: the full-resolution image (``None``: a tool that only lends its schema; every call is refused with
            ``exception``, e.g. the executor's copy of a tool built per episode).
        scale: source pixels per shown pixel on each side (the shown image is ``source.size / scale``).
        max_side: the longest side of an answer's image, in pixels.
        name: the tool's name.

    Each call answers ``[text, PIL image]``: a line naming the region and its enlargement, then the region's
    pixels, ``source.crop((x, y, x + width, y + height) * scale)`` enlarged ``zoom_factor(...)`` times (nearest
    neighbour). The crop and enlargement of at most ``max_side**2`` pixels run inline (microseconds); the
    executor encodes the image on its worker thread.
    """

    description = (
        "Show a rectangular region of the image enlarged, to read details too small to see. Coordinates are pixels "
        "of the image as shown to you, from its top-left corner."
    )
    cacheable = False  # an image answer is never cached; the source differs per episode

    def __init__(self, source: PILImage.Image | None = None, *, scale: int = 1, max_side: int = MAX_SIDE,
                 name: str = "zoom") -> None:
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ValueError(f"scale must be a positive integer, got {scale!r}")
        if max_side < scale:
            raise ValueError(f"max_side ({max_side}) must be at least scale ({scale})")
        self.source, self.scale, self.max_side, self.name = source, scale, int(max_side), name
        if source is not None and (source.width % scale or source.height % scale):
            raise ValueError(f"the source's size {source.size} is not a multiple of scale {scale}")
        most = max_side // scale
        self.parameters = {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "description": "left edge of the region, in pixels from the left"},
                "y": {"type": "integer", "description": "top edge of the region, in pixels from the top"},
                "width": {"type": "integer", "description": f"width of the region in pixels (1 to {most})"},
                "height": {"type": "integer", "description": f"height of the region in pixels (1 to {most})"},
            },
            "required": ["x", "y", "width", "height"],
        }

    @property
    def shown_size(self) -> tuple[int, int]:
        """``(width, height)`` of the image the model sees, in pixels."""
        if self.source is None:
            return (0, 0)
        return (self.source.width // self.scale, self.source.height // self.scale)

    def region(self, arguments: Mapping[str, Any]) -> tuple[tuple[int, int, int, int], int]:
        """``((x, y, width, height), factor)`` of a call's arguments, checked.

        Raises:
            ToolError (invalid_arguments): a missing or non-integer argument, a zero or negative size, a region
                not inside the shown image, or one too large to show at ``max_side`` pixels.
        """
        extra = sorted(set(arguments) - {"x", "y", "width", "height"})
        if extra:
            raise ToolError(f"zoom: unknown argument(s) {', '.join(extra)}; it takes x, y, width, height",
                            kind=ToolErrorKind.INVALID_ARGUMENTS)
        x, y, w, h = (_int_arg(arguments, k) for k in ("x", "y", "width", "height"))
        if w < 1 or h < 1:
            raise ToolError(f"zoom: width and height must be at least 1 pixel, got {w}x{h}",
                            kind=ToolErrorKind.INVALID_ARGUMENTS)
        sw, sh = self.shown_size
        if x < 0 or y < 0 or x + w > sw or y + h > sh:
            raise ToolError(f"zoom: the region x={x} y={y} width={w} height={h} is not inside the image, which is "
                            f"{sw}x{sh} pixels (x + width <= {sw}, y + height <= {sh})",
                            kind=ToolErrorKind.INVALID_ARGUMENTS)
        factor = zoom_factor(w, h, self.scale, self.max_side)
        if factor < 1:
            most = self.max_side // self.scale
            raise ToolError(f"zoom: the region {w}x{h} is too large to zoom into; width and height may be at most "
                            f"{most} pixels", kind=ToolErrorKind.INVALID_ARGUMENTS)
        return (x, y, w, h), factor

    def crop(self, x: int, y: int, width: int, height: int, factor: int) -> PILImage.Image:
        """The source pixels of the shown region, each enlarged to a ``factor x factor`` block."""
        assert self.source is not None
        s = self.scale
        part = self.source.crop((x * s, y * s, (x + width) * s, (y + height) * s))
        if factor == 1:
            return part
        return part.resize((part.width * factor, part.height * factor), PILImage.Resampling.NEAREST)

    async def acall(self, arguments: Mapping[str, Any]) -> Any:
        if self.source is None:
            raise ToolError("zoom: there is no image to zoom into in this episode")
        (x, y, w, h), factor = self.region(arguments)
        img = self.crop(x, y, w, h, factor)
        return [f"x={x} y={y} width={w} height={h}, enlarged {self.scale * factor}x to {img.width}x{img.height} "
                "pixels:", img]
