"""``toolgym/Chart-v0``: questions about a bar chart shown as an image, whose numbers are readable only by zooming.

Each task is a bar chart rendered with Pillow from the seed (no plotting library): 4-6 consecutive months, one bar
each, every bar labelled with its 3-digit value, month names under the bars, a title. The question needs the exact
values of some bars and arithmetic on them: *the sum of the two tallest bars*, *how much larger March is than May*,
*the total of all bars*, *how much the tallest bar exceeds the shortest*. The answer is ``<answer>NUMBER</answer>``;
the reward is 1.0 for the exact number, else 0.0 (:class:`~toolgym.rewards.rules.NumericMatch`, ``exact_number``).

**Why the zoom is needed.** The chart is drawn on a 1280x960 *source* canvas with Pillow's default bitmap font
(digits 6 pixels wide, 7 pixels of ink high). The model is shown the source downscaled 4x (box filter) to 320x240:
a label becomes a smear about 5x2 pixels, unreadable, while bar heights stay visible (which bar is tallest, roughly
how tall). The ``zoom(x, y, width, height)`` tool (:class:`~toolgym.tools.zoom.ZoomTool`) answers with the source
pixels of a region of the shown image (at most 64x64 shown pixels), enlarged by an integer factor by nearest
neighbour to at most 256x256: there the digits are exact bitmap glyphs. The ``calculator`` tool does the arithmetic.
Every value differs from the others by at least 20 (about 4 shown pixels of bar height), so "the tallest" is visible.

**The oracle reads the pixels.** :meth:`ChartEnv.oracle` zooms on the label of every bar the question needs (the
task row's ``label_boxes``, where a vision model would look), reads each number from the zoomed image by matching
the bitmap font's glyphs (:func:`read_number`), sends the expression to ``calculator`` and answers with its
result: its answer comes from the tool results, never from the task's values. The same reading of the shown image
(no zoom) finds no number.

Splits: ``train`` / ``test`` are disjoint by a hash of the task's chart and question (10% ``test``), like
Calculator-v0. The task row is JSON (the chart's title, first month and values); the env renders the images at
``reset`` and gives the row ``"images": [the shown chart]``, which the trajectory keeps inline.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image as PILImage
from PIL import ImageDraw, ImageFont

from toolgym.envs.base import ToolEnv
from toolgym.rewards.rules import NumericMatch
from toolgym.tools.base import Tool, ToolCall, ToolResult
from toolgym.tools.calculator import calculator_tool
from toolgym.tools.zoom import ZoomTool, zoom_factor

__all__ = ["SCALE", "SHOWN_SIZE", "ChartEnv", "ChartImages", "generate_task", "label_boxes", "read_number", "render_chart"]

#: the shown chart, (width, height) in pixels
SHOWN_SIZE = (320, 240)
#: source pixels per shown pixel, on each side
SCALE = 4
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December")
TITLES = ("Monthly sales (units)", "Website visitors (thousands)", "Orders shipped", "Rainfall (mm x 10)",
          "Support tickets", "New subscribers")
QUESTIONS = ("sum_top2", "difference", "total", "range")
MIN_GAP = 20  # smallest difference between two values of a chart
#: zoom calls the oracle writes per turn (3 calls fit in 128 tokens, the default turn budget of ``toolgym eval``)
ORACLE_ZOOMS_PER_TURN = 3

# the source canvas layout, in source pixels
_LEFT, _RIGHT, _TOP, _BASE = 64, 1248, 96, 880
_PX_PER_UNIT = 0.74  # bar height per unit of value (999 -> 739 px)
_LABEL_GAP = 10  # ink-free rows between a value's text box and its bar
_DIGIT_W, _DIGIT_INK = 6, (2, 9)  # the bitmap font's digit advance, and the rows of its digits' ink
_COLOURS = ((76, 114, 176), (221, 132, 82), (85, 168, 104), (196, 78, 82), (129, 114, 179), (147, 120, 96))

SYSTEM_PROMPT = (
    "You answer questions about a bar chart image. The chart is 320x240 pixels and its numbers are too small to "
    "read at that size: call the zoom tool on a region (x, y, width, height in pixels of the chart, at most 64x64) "
    "to see it enlarged, and read each value you need from the zoomed image. Use the calculator tool for the "
    "arithmetic. Reply with the final number only, inside answer tags, for example <answer>123</answer>."
)


@functools.cache
def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default_imagefont()


@dataclass(frozen=True)
class ChartImages:
    """A rendered chart: ``source`` (1280x960 RGB, what ``zoom`` crops) and ``shown`` (320x240 RGB, the source
    downscaled ``SCALE`` times with a box filter: what the model sees)."""

    source: PILImage.Image
    shown: PILImage.Image


def _layout(values: Sequence[int]) -> list[dict[str, Any]]:
    """Per bar, in source pixels: the bar's box, its value text's origin, its month text's centre."""
    n = len(values)
    slot = (_RIGHT - _LEFT) / n
    out = []
    for i, v in enumerate(values):
        centre = _LEFT + slot * (i + 0.5)
        half = int(slot * 0.25)
        top = _BASE - round(v * _PX_PER_UNIT)
        text_w = _DIGIT_W * len(str(v))
        out.append({"bar": (int(centre) - half, top, int(centre) + half, _BASE),
                    "text": (int(centre) - text_w // 2, top - _LABEL_GAP - 11), "text_w": text_w,
                    "centre": int(centre)})
    return out


def label_boxes(values: Sequence[int]) -> list[list[int]]:
    """``[x, y, width, height]`` per bar, in shown pixels: the bar's value text with a pixel of margin on every
    side (never reaching the bar): the region a reader zooms into."""
    boxes = []
    for b in _layout(values):
        tx, ty = b["text"]
        x0, y0 = tx // SCALE - 1, ty // SCALE - 1
        x1, y1 = math.ceil((tx + b["text_w"]) / SCALE) + 1, math.ceil((ty + 11) / SCALE) + 1
        boxes.append([x0, y0, x1 - x0, y1 - y0])
    return boxes


def render_chart(chart: Mapping[str, Any]) -> ChartImages:
    """Draw ``chart`` (``{"title", "start_month" (0-11), "values"}``) deterministically: the same dict gives the
    same pixels. Bars on a white canvas with light gridlines at 250, 500 and 750, black axes, each value above
    its bar and each month's abbreviation under it, in Pillow's bitmap font."""
    values = [int(v) for v in chart["values"]]
    font = _font()
    w, h = SHOWN_SIZE[0] * SCALE, SHOWN_SIZE[1] * SCALE
    img = PILImage.new("RGB", (w, h), (255, 255, 255))
    d = ImageDraw.Draw(img)
    d.text((_LEFT, 40), str(chart["title"]), font=font, fill=(0, 0, 0))
    for g in (250, 500, 750):
        y = _BASE - round(g * _PX_PER_UNIT)
        d.line([(_LEFT, y), (_RIGHT, y)], fill=(225, 225, 225), width=2)
    start = int(chart["start_month"])
    for i, (v, b) in enumerate(zip(values, _layout(values), strict=True)):
        d.rectangle(b["bar"], fill=_COLOURS[i % len(_COLOURS)])
        d.text(b["text"], str(v), font=font, fill=(0, 0, 0))
        month = MONTHS[(start + i) % 12]
        d.text((b["centre"] - _DIGIT_W * len(month) // 2, _BASE + 12), month, font=font, fill=(0, 0, 0))
    d.line([(_LEFT, _BASE), (_RIGHT, _BASE)], fill=(0, 0, 0), width=3)
    d.line([(_LEFT, _TOP), (_LEFT, _BASE)], fill=(0, 0, 0), width=3)
    shown = img.resize(SHOWN_SIZE, PILImage.Resampling.BOX)
    return ChartImages(source=img, shown=shown)


@functools.cache
def _glyphs() -> dict[bytes, str]:
    """The bitmap font's digits as ink masks (7 rows x 6 columns each) -> the digit."""
    img = PILImage.new("L", (_DIGIT_W * 10, 11), 255)
    ImageDraw.Draw(img).text((0, 0), "0123456789", font=_font(), fill=0)
    ink = np.asarray(img)[_DIGIT_INK[0]:_DIGIT_INK[1]] < 128
    glyphs = {ink[:, _DIGIT_W * k:_DIGIT_W * (k + 1)].tobytes(): str(k) for k in range(10)}
    assert len(glyphs) == 10, "the bitmap font's digits are not distinct"
    return glyphs


def read_number(image: Any, factor: int = 1) -> int | None:
    """The number written in ``image`` (a PIL image or :class:`toolgym.images.Image`) in the bitmap font, each
    font pixel a ``factor x factor`` block, black ink on a light background; ``None`` when the dark pixels are not
    exactly a row of digit glyphs (nothing written, something else in the picture, or a picture too coarse).

    Reading: one pixel per block, pixels darker than 128 are ink; the ink must span the digits' 7 rows; the
    columns are cut into 6-pixel cells at each of the 6 possible offsets until every cell is a known glyph."""
    pil = image.to_pil() if hasattr(image, "to_pil") else image
    ink = np.asarray(pil.convert("L"))[::factor, ::factor] < 128
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if len(rows) == 0 or rows[-1] - rows[0] + 1 != _DIGIT_INK[1] - _DIGIT_INK[0]:
        return None
    ink = ink[rows[0]:rows[-1] + 1]
    glyphs = _glyphs()
    for offset in range(_DIGIT_W):
        start = int(cols[0]) - offset
        n = math.ceil((int(cols[-1]) + 1 - start) / _DIGIT_W)
        padded = np.zeros((ink.shape[0], n * _DIGIT_W), dtype=bool)
        lo = max(start, 0)
        hi = min(start + n * _DIGIT_W, ink.shape[1])
        padded[:, lo - start:hi - start] = ink[:, lo:hi]
        digits = [glyphs.get(padded[:, _DIGIT_W * k:_DIGIT_W * (k + 1)].tobytes()) for k in range(n)]
        if all(digits):
            return int("".join(digits))  # type: ignore[arg-type]
    return None


def _split_of(key: str) -> str:
    return "test" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10 == 0 else "train"


def generate_task(rng: np.random.Generator, split: str = "train") -> dict[str, Any]:
    """One task row drawn from ``rng`` (redrawn until it falls in ``split``): ``{"id", "prompt", "answer",
    "split", "question", "chart": {"title", "start_month", "values"}, "needed", "operator", "label_boxes"}``.

    ``needed`` are the bar indices whose values the answer needs, in the order of the expression
    ``needed[0] <operator> needed[1] ...`` (``+`` or ``-``, larger value first); ``label_boxes`` are every bar's
    value label region ``[x, y, width, height]`` in shown pixels. Values: distinct 3-digit integers, at least
    ``MIN_GAP`` apart."""
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    while True:
        n = int(rng.integers(4, 7))
        start = int(rng.integers(0, 12 - n + 1))
        values = [int(v) for v in rng.choice(np.arange(100, 1000), size=n, replace=False)]
        if min(np.diff(sorted(values))) < MIN_GAP:
            continue
        title = str(rng.choice(TITLES))
        kind = str(rng.choice(QUESTIONS))
        months = [MONTH_NAMES[start + i] for i in range(n)]
        order = sorted(range(n), key=lambda i: -values[i])
        if kind == "sum_top2":
            needed, op, question = order[:2], "+", "What is the sum of the values of the two tallest bars?"
        elif kind == "total":
            needed, op, question = list(range(n)), "+", "What is the total of all the bars?"
        elif kind == "range":
            needed, op, question = [order[0], order[-1]], "-", "By how much does the tallest bar exceed the shortest?"
        else:
            a, b = (int(i) for i in rng.choice(n, size=2, replace=False))
            needed, op = sorted([a, b], key=lambda i: -values[i]), "-"
            question = f"How much larger is the value for {months[needed[0]]} than for {months[needed[1]]}?"
        chart = {"title": title, "start_month": start, "values": values}
        key = json.dumps([chart, kind, needed], sort_keys=True)
        if _split_of(key) != split:
            continue
        picked = [values[i] for i in needed]
        answer = sum(picked) if op == "+" else picked[0] - picked[1]
        prompt = (f"The chart shows {title.lower()} for {n} months, {months[0]} to {months[-1]}, one bar per "
                  f"month from left to right. {question}")
        return {
            "id": "chart-" + hashlib.sha256(key.encode()).hexdigest()[:12],
            "prompt": prompt,
            "answer": str(answer),
            "split": split,
            "question": kind,
            "chart": chart,
            "needed": needed,
            "operator": op,
            "label_boxes": label_boxes(values),
        }


class ChartEnv(ToolEnv):
    """Bar-chart questions over an image, with a ``zoom`` tool that answers with images and a ``calculator``.
    ``split`` selects the train or the held-out test charts.

    Each episode gets its own ``zoom`` over its chart's source canvas (the executor's ``zoom`` only lends the
    schema), run by the env's executor under its caps and timeouts (:meth:`run_calls`). Extra kwargs go to
    :class:`~toolgym.envs.base.ToolEnv` (tokenizer, max_turns, ...).
    """

    def __init__(self, split: str = "train", max_turns: int = 5, max_episode_tokens: int = 2048,
                 **kwargs: Any) -> None:
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        kwargs.setdefault("reward", NumericMatch("answer", exact=True))  # the exact number, name "exact_number"
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        self._source: PILImage.Image | None = None
        self.zoom = ZoomTool(None, scale=SCALE)
        self.episode_zoom = self.zoom  # replaced at each reset by a zoom over the episode's chart
        super().__init__(lambda rng: generate_task(rng, split), [self.zoom, calculator_tool()],
                         max_turns=max_turns, max_episode_tokens=max_episode_tokens, **kwargs)

    def _with_chart(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """``task`` with ``"images"`` = its rendered chart (shown size); the source is kept for the episode's zoom."""
        images = render_chart(task["chart"])
        self._source = images.source
        return {**task, "images": [images.shown]}

    def sample_task(self) -> dict[str, Any]:
        return self._with_chart(super().sample_task())

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode (see :meth:`ToolEnv.reset`); the chart of the task is rendered here (a given row's
        ``"images"`` are replaced by its chart)."""
        if options and options.get("task") is not None:
            options = {**options, "task": self._with_chart(options["task"])}
        obs, info = super().reset(seed=seed, options=options)
        self.episode_zoom = ZoomTool(self._source, scale=SCALE, name=self.zoom.name)
        return obs, info

    async def run_calls(self, calls: Sequence[ToolCall], tools: Mapping[str, Tool] | None = None, *,
                        in_order: bool = False) -> list[ToolResult]:
        """:meth:`ToolEnv.run_calls` with ``zoom`` on this episode's chart (the env's default
        :meth:`~ToolEnv.env_response` runs each turn's calls through it)."""
        if tools is None:
            tools = {**self.executor.tools, self.zoom.name: self.episode_zoom}
        return await super().run_calls(calls, tools, in_order=in_order)

    def oracle(self, state: Any) -> str:
        """Zoom on the value label of every bar the question needs (at most ``ORACLE_ZOOMS_PER_TURN`` calls a
        turn), read each number from the zoomed pixels (:func:`read_number`), call ``calculator`` with the
        expression, then answer with the number it returned. A zoom that fails or does not read is repeated, as is
        a failed calculator call, while turns remain."""
        task = state.task
        last = self.last_results(state)
        calc = [r for r in last if r.ok and r.call.name == "calculator"]
        if calc:
            return f"<answer>{calc[0].content.strip()}</answer>"
        turns = state.trajectory.turns if state.trajectory is not None else []
        read: dict[tuple[int, ...], int] = {}
        for r in (r for t in turns for r in t.results):
            if r.ok and r.call.name == self.zoom.name and r.images:
                args = r.call.arguments
                box = (int(args["x"]), int(args["y"]), int(args["width"]), int(args["height"]))
                value = read_number(r.images[0], zoom_factor(box[2], box[3], SCALE))
                if value is not None:
                    read[box] = value
        boxes = [tuple(task["label_boxes"][i]) for i in task["needed"]]
        missing = [b for b in boxes if b not in read]
        if not missing and state.turn < self.max_turns - 1:
            expression = f" {task['operator']} ".join(str(read[b]) for b in boxes)
            return self.format.parser.format_calls([("calculator", {"expression": expression})])
        if missing and state.turn < self.max_turns - 2:
            keys = ("x", "y", "width", "height")
            return self.format.parser.format_calls([(self.zoom.name, dict(zip(keys, b, strict=True)))
                                                    for b in list(dict.fromkeys(missing))[:ORACLE_ZOOMS_PER_TURN]])
        return "<answer></answer>"
