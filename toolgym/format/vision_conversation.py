"""One episode's tokens with images: :class:`VisionConversation`, a :class:`~toolgym.format.conversation.Conversation`
whose images become the processor's image tokens (:mod:`toolgym.format.vision`).

* **The prompt**: each task image whose placeholder line stands in a system or user message becomes an image part
  of that message (``{"type": "image"}`` where the placeholder stood), rendered by the chat template as the
  family's image token and expanded to the processor's count.
* **Observations**: a message of the env's answer may carry ``"images"`` (:class:`~toolgym.images.Image` objects;
  :meth:`toolgym.envs.base.ToolEnv.env_response` gives each tool result's). Where the family renders tool-turn
  images (``tool_images="tool"``, Qwen3-VL) they become image parts of the tool message; elsewhere (``"user"``,
  Qwen2.5-VL, Gemma 3) the tool message keeps its text with each image's placeholder, and the step's images go,
  in order, in one user message after the tool messages. A user message of the answer always holds its images.
* Every image token and its wrappers are env tokens: loss mask 0, never policy tokens.
* **Drift**: :meth:`VisionConversation.encode_rendered` gives the whole conversation's ids from the processor itself
  (``processor(text=rendering, images=all images)``) when no outside string spells a control token, so the drift
  check compares the incremental ids with the processor's own.

The images the model saw are :attr:`VisionConversation.images`, in order (the prompt's, then each observation's);
each message that shows images names them in ``"image_refs"`` (:meth:`~toolgym.images.Image.ref`), so a saved
trajectory gives them back in the same order (:func:`toolgym.format.vision.episode_images`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.format.chat import ChatFormat
from toolgym.format.conversation import Conversation
from toolgym.format.vision import VisionFormat, vision_format
from toolgym.images import Image, split_parts

__all__ = ["VisionConversation"]


def _content(parts: Sequence[str | Image]) -> list[dict[str, Any]]:
    return [{"type": "image"} if isinstance(p, Image) else {"type": "text", "text": p} for p in parts]


class VisionConversation(Conversation):
    """A :class:`Conversation` with images as image tokens.

    Args:
        fmt: the family's :class:`ChatFormat` (its chat template renders image parts).
        vision: the processor or its :class:`~toolgym.format.vision.VisionFormat`.
        messages: the opening messages; the placeholder line of each of ``images`` marks where it stands.
        tools: tool specs shown in the prompt.
        images: the task's images (:attr:`toolgym.trajectory.Trajectory.prompt_images`).

    Attributes:
        images: the images the model was shown, in order.
    """

    def __init__(self, fmt: ChatFormat, vision: VisionFormat | Any, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] = (), images: Sequence[Image] = ()) -> None:
        self.fmt = fmt
        self.vision = vision_format(vision)
        self.tools = list(tools)
        fmt.parser.set_tools(self.tools)
        self.messages: list[dict[str, Any]] = fmt.with_tools_listed(messages, self.tools)
        self.template_messages: list[dict[str, Any]] = []
        self.images: list[Image] = []
        left = list(images)
        for m in self.messages:
            content = m.get("content")
            if left and m.get("role") in ("system", "user") and isinstance(content, str):
                parts = split_parts(content, left)
                shown = [p for p in parts if isinstance(p, Image)]
                if shown:
                    left = [i for i in left if not any(i is s for s in shown)]
                    self.images += shown
                    m["image_refs"] = [img.ref() for img in shown]
                    self.template_messages.append({**_plain(m), "content": _content(parts)})
                    continue
            self.template_messages.append(_plain(m))
        self.prompt_text, spans = fmt.render_outside(self.template_messages, self.tools, add_generation_prompt=True)
        self.prompt_ids: list[int] = self.vision.encode(fmt, self.prompt_text, spans, self.images)
        self.completion_ids: list[int] = []
        self.loss_mask: list[int] = []
        self._turns = 0
        self._pending_obs = False

    # -- observations -----------------------------------------------------------------------------
    def _vision_messages(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]]
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Image]]:
        """``(messages kept, template messages, images shown in order)`` for the env's answer ``results``."""
        kept: list[dict[str, Any]] = []
        tmpl: list[dict[str, Any]] = []
        shown: list[Image] = []
        after: list[Image] = []  # tool-result images that go in a user turn after the tool turns
        for r in results:
            m = dict(r) if isinstance(r, Mapping) else self.fmt.tool_message(*r)
            imgs = list(m.pop("images", None) or [])
            parts = split_parts(str(m.get("content", "")), imgs) if imgs else []
            found = [p for p in parts if isinstance(p, Image)]
            if found and (self.vision.family.tool_images == "tool" or m.get("role") == "user"):
                kept.append({**m, "image_refs": [img.ref() for img in found]})
                tmpl.append({**m, "content": _content(parts)})
                shown += found
                continue
            kept.append(m)
            tmpl.append(dict(m))
            after += found
        if after:
            kept.append({"role": "user", "content": "\n".join(img.placeholder for img in after),
                         "image_refs": [img.ref() for img in after]})
            tmpl.append({"role": "user", "content": _content(after)})
            shown += after
        return kept, tmpl, shown

    def observation(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]]) -> list[int]:
        """Token ids of the observation for the env's answer (not yet appended), each image shown expanded to its
        processor count (mask 0 once appended)."""
        _, tmpl, shown = self._vision_messages(results)
        text, spans = self.fmt.tool_delta_spans(tmpl)
        return self.vision.encode(self.fmt, text, spans, shown)

    def add_observation(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]],
                        ids: Sequence[int] | None = None) -> tuple[int, int]:
        """Append the observation for ``results`` (as :meth:`observation`; mask 0), its messages and its images;
        returns its ``[start, end)`` span."""
        kept, tmpl, shown = self._vision_messages(results)
        if ids is None:
            text, spans = self.fmt.tool_delta_spans(tmpl)
            ids = self.vision.encode(self.fmt, text, spans, shown)
        start = len(self.completion_ids)
        self.completion_ids.extend(map(int, ids))
        self.loss_mask.extend([0] * len(ids))
        self.messages.extend(kept)
        self.template_messages.extend(tmpl)
        self.images += shown
        self._pending_obs = True
        return start, len(self.completion_ids)

    # -- drift ------------------------------------------------------------------------------------
    def encode_rendered(self, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        """The whole conversation's ids: the processor's own (its tokenizer and expansion over all images at once)
        when no outside string spells a control token; else toolgym's expansion, control tokens spelled in outside
        strings encoded as text."""
        images = self.images[: len(self.vision.image_positions(text, spans))]
        if not spans:
            return self.vision.processor_ids(text, images)
        return self.vision.encode(self.fmt, text, spans, images)


def _plain(m: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message without toolgym's bookkeeping keys (what the chat template is given)."""
    return {k: v for k, v in m.items() if k != "image_refs"}
