"""Images as the tokens a vision-language model consumes: a Hugging Face processor's own expansion, kept exact.

A :class:`VisionFormat` wraps a processor (``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``, ``Gemma3Processor``, or
another whose images render as one template token the processor expands). For each image it runs the processor
once (cached by the image's SHA-256) and keeps:

* the **replacement text** the processor puts where the chat template wrote the image's token
  (``processor.image_token``: ``<|image_pad|>`` for the Qwen families, ``<start_of_image>`` for Gemma 3), e.g.
  ``<|image_pad|>`` x 8 for a 100x60 image on Qwen2.5-VL, ``\\n\\n<start_of_image>`` + ``<image_soft_token>`` x 256
  + ``<end_of_image>\\n\\n`` on Gemma 3;
* its **token count** (the processor's, equal to ``processor._get_num_multimodal_tokens``);
* its **tensors** (``pixel_values``, ``image_grid_thw``, ...), concatenated per batch by :func:`forward_inputs`.

A rendered chat text becomes ids by :meth:`VisionFormat.encode`: each image token the template wrote (outside
the strings a tool or a task supplied) is replaced by its image's replacement text, then the text is encoded as
every toolgym rendering is (:meth:`~toolgym.format.chat.ChatFormat.encode_outside`): the ids the processor gives
for the same text and images (the drift check of :class:`~toolgym.format.vision_conversation.VisionConversation`
compares both).

:data:`FAMILIES` says, per family, where a tool result's images go (``"tool"``: inside the tool turn, where the
template renders them, Qwen3-VL; ``"user"``: in a user turn after the tool turn, Qwen2.5-VL and Gemma 3, whose
templates render images only there), the tool-call parser and the chat template shipped in
``toolgym/format/templates/``. torch is imported only when tensors are built.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolgym.images import Image

__all__ = [
    "FAMILIES",
    "ImageInputs",
    "VisionFamily",
    "VisionFormat",
    "VisionInputError",
    "collapse_image_runs",
    "episode_images",
    "family_of",
    "forward_inputs",
    "image_blocks",
    "vision_format",
    "vllm_prompt",
]

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: per-image tensors kept for the forward (the processor's other outputs are per text)
_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"})


class VisionInputError(ValueError):
    """Ids and images that do not match: a chat template that rendered fewer or more image tokens than the
    images it was given, or an episode whose ids hold another number of image tokens than its images need."""


@dataclass(frozen=True)
class VisionFamily:
    """How a vision-language family frames images in a tool conversation.

    Attributes:
        name: the family's name (``"qwen3_vl"``, ``"qwen2_5_vl"``, ``"gemma3"``).
        tool_images: ``"tool"``: a tool result's images render inside its tool turn; ``"user"``: they go in a user
            turn after the tool turns of that step (the template renders images only in user turns).
        parser: the tool-call parser of the family's text model (a :func:`toolgym.format.parsers.get_parser` name).
        template: the file under ``toolgym/format/templates/`` holding the chat template (tools and images).
        wrappers: the tokens around an image's tokens that belong to its block (never split by a budget).
        type_ids_key: the forward's per-token image marker: ``"mm_token_type_ids"`` (Qwen) or ``"token_type_ids"``
            (Gemma 3); 1 on each image token, 0 elsewhere.
        vllm_collapse: whether collapsing each run of image tokens to one gives the prompt vLLM expands itself
            (Qwen); Gemma 3's expanded block also holds wrapper and newline tokens that vLLM's expansion adds again.
    """

    name: str
    tool_images: Literal["tool", "user"]
    parser: str
    template: str
    wrappers: tuple[str, ...]
    type_ids_key: str
    vllm_collapse: bool = True

    def chat_template(self) -> str:
        """The text of the family's chat template."""
        return (TEMPLATES / self.template).read_text(encoding="utf-8")


_QWEN_WRAPPERS = ("<|vision_start|>", "<|vision_end|>")
FAMILIES: dict[str, VisionFamily] = {
    "qwen3_vl": VisionFamily("qwen3_vl", "tool", "hermes", "qwen3_vl.jinja", _QWEN_WRAPPERS, "mm_token_type_ids"),
    "qwen2_5_vl": VisionFamily("qwen2_5_vl", "user", "hermes", "qwen2_5_vl_tools.jinja", _QWEN_WRAPPERS,
                               "mm_token_type_ids"),
    "gemma3": VisionFamily("gemma3", "user", "pythonic", "gemma3_tools.jinja", ("<start_of_image>", "<end_of_image>"),
                           "token_type_ids", vllm_collapse=False),
}
_BY_PROCESSOR = {"Qwen3VLProcessor": "qwen3_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl", "Qwen2VLProcessor": "qwen2_5_vl",
                 "Gemma3Processor": "gemma3"}


def family_of(processor: Any) -> VisionFamily:
    """The :class:`VisionFamily` of ``processor``, from its class (a subclass counts as its base).

    Raises:
        ValueError: no supported family (the message names them).
    """
    for cls in type(processor).__mro__:
        name = _BY_PROCESSOR.get(cls.__name__)
        if name is not None:
            return FAMILIES[name]
    raise ValueError(f"no vision family for processor {type(processor).__name__}; supported: "
                     f"{', '.join(sorted(_BY_PROCESSOR))} (pass family= for another processor whose images render as "
                     "one template token)")


@dataclass(frozen=True)
class ImageInputs:
    """One image as its processor sees it.

    Attributes:
        text: the replacement text for the template's image token (e.g. ``<|image_pad|>`` x n).
        ids: that text's token ids.
        num_tokens: the image tokens among them (what the model's vision tower fills).
        tensors: per-image tensors for the forward, each with the image on dim 0 (``pixel_values``: Qwen
            ``(patches, C*T*P*P)``, Gemma 3 ``(1, 3, S, S)``; ``image_grid_thw``: ``(1, 3)``).
    """

    text: str
    ids: tuple[int, ...]
    num_tokens: int
    tensors: Mapping[str, Any]


class VisionFormat:
    """A processor's image expansion, with a per-image cache.

    Args:
        processor: a Hugging Face multimodal processor (its ``tokenizer`` must be the env's tokenizer).
        family: a :class:`VisionFamily` or a name in :data:`FAMILIES` (``None``: :func:`family_of`).
        cache_size: images whose processed inputs are kept (by SHA-256).

    Attributes:
        image_token: the text the chat template writes per image (``processor.image_token``).
        image_token_id: the id of the expanded image token (1 in the type ids; what the vision tower fills).
        block_ids: the image token and its wrappers (an image block is a run of these).
    """

    def __init__(self, processor: Any, family: VisionFamily | str | None = None, *, cache_size: int = 256) -> None:
        self.processor = processor
        self.family = FAMILIES[family] if isinstance(family, str) else family or family_of(processor)
        tok = processor.tokenizer
        self.tokenizer = tok
        self.image_token: str = str(processor.image_token)
        ids = getattr(processor, "image_token_ids", None)  # Gemma 3: the soft token, not the template's boi
        self.image_token_id: int = int(ids[0]) if ids else int(processor.image_token_id)
        wrappers = [tok.convert_tokens_to_ids(w) for w in self.family.wrappers]
        self.block_ids: frozenset[int] = frozenset([self.image_token_id, *(w for w in wrappers if w is not None)])
        self.cache_size = cache_size
        self._cache: OrderedDict[str, ImageInputs] = OrderedDict()
        self._lock = threading.Lock()

    # -- one image --------------------------------------------------------------------------------
    def image_inputs(self, image: Image) -> ImageInputs:
        """The processor's view of ``image`` (cached by SHA-256): one processor call on the template's image token
        alone gives the replacement ids (decoded back to its text) and the image's tensors."""
        with self._lock:
            hit = self._cache.get(image.sha256)
            if hit is not None:
                self._cache.move_to_end(image.sha256)
                return hit
        out = self.processor(text=[self.image_token], images=[image.to_pil().convert("RGB")], return_tensors="pt",
                             add_special_tokens=False)
        ids = tuple(int(i) for i in out["input_ids"][0].tolist())
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        tensors = {k: v for k, v in out.items() if k not in _TEXT_KEYS}
        got = ImageInputs(text, ids, sum(1 for i in ids if i == self.image_token_id), tensors)
        with self._lock:
            self._cache[image.sha256] = got
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return got

    def num_tokens(self, image: Image) -> int:
        """Image tokens the model consumes for ``image`` (the processor's own count)."""
        return self.image_inputs(image).num_tokens

    # -- text with images -------------------------------------------------------------------------
    def image_positions(self, text: str, spans: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Where the chat template wrote :attr:`image_token` in ``text``, outside the ``spans`` of outside strings
        (a tool result spelling the token is text, not an image)."""
        out, at, tok = [], text.find(self.image_token), self.image_token
        while at >= 0:
            if not any(a <= at < b for a, b in spans):
                out.append(at)
            at = text.find(tok, at + len(tok))
        return out

    def expand(self, text: str, spans: Sequence[tuple[int, int]], images: Sequence[Image]
               ) -> tuple[str, list[tuple[int, int]]]:
        """``text`` with each template image token replaced by its image's replacement text (in order), and the
        ``spans`` moved to match.

        Raises:
            VisionInputError: the template wrote another number of image tokens than ``len(images)``.
        """
        at = self.image_positions(text, spans)
        if len(at) != len(images):
            raise VisionInputError(f"the chat template wrote {len(at)} image token(s) {self.image_token!r} for "
                                   f"{len(images)} image(s): this template does not render images where toolgym "
                                   f"puts them (family {self.family.name!r}, tool images in {self.family.tool_images!r} "
                                   "turns)")
        pieces, deltas, pos = [], [], 0
        for p, img in zip(at, images, strict=True):
            rep = self.image_inputs(img).text
            pieces += [text[pos:p], rep]
            deltas.append((p, len(rep) - len(self.image_token)))
            pos = p + len(self.image_token)
        pieces.append(text[pos:])
        moved = [(a + s, b + s) for a, b in spans for s in [sum(d for p, d in deltas if p < a)]]
        return "".join(pieces), moved

    def encode(self, fmt: Any, text: str, spans: Sequence[tuple[int, int]], images: Sequence[Image]) -> list[int]:
        """Token ids of rendered ``text`` with its images expanded (:meth:`expand`), outside strings encoded as text
        (``fmt``: the env's :class:`~toolgym.format.chat.ChatFormat`)."""
        full, moved = self.expand(text, spans, images)
        return fmt.encode_outside(full, moved)

    def processor_ids(self, text: str, images: Sequence[Image]) -> list[int]:
        """The processor's own ids for ``text`` and ``images`` in one call (no special tokens added)."""
        out = self.processor(text=[text], images=[img.to_pil().convert("RGB") for img in images] or None,
                             add_special_tokens=False)
        return [int(i) for i in out["input_ids"][0]]


_FORMATS: weakref.WeakKeyDictionary[Any, VisionFormat] = weakref.WeakKeyDictionary()


def vision_format(processor: Any) -> VisionFormat:
    """``processor`` as a :class:`VisionFormat` (a :class:`VisionFormat` is returned as is; one per processor
    object, so that its image cache is shared)."""
    if isinstance(processor, VisionFormat):
        return processor
    try:
        got = _FORMATS.get(processor)
        if got is None:
            got = _FORMATS[processor] = VisionFormat(processor)
        return got
    except TypeError:  # not weakly referenceable
        return VisionFormat(processor)


def image_blocks(ids: Sequence[int], vision: VisionFormat | Any) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of image and wrapper tokens in ``ids``: the blocks a budget never splits."""
    block = vision_format(vision).block_ids
    out: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(ids):
        if int(t) in block:
            start = i if start is None else start
        elif start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(ids)))
    return out


# -- the forward -------------------------------------------------------------------------------------
def episode_images(trajectory: Any) -> list[Image]:
    """The images an episode's model saw, in order (a repeated image once per showing): the ``"image_refs"`` of
    its messages (:class:`~toolgym.format.vision_conversation.VisionConversation` writes them), looked up in
    :attr:`~toolgym.trajectory.Trajectory.images`. A text-only episode gives ``[]``.

    Raises:
        KeyError: a message names an image the trajectory does not hold.
    """
    table = {img.sha256: img for img in trajectory.images}
    return [table[ref["sha256"]] for m in trajectory.messages for ref in m.get("image_refs") or ()]


def _episode(ep: Any) -> tuple[list[int], list[Image]]:
    if isinstance(ep, tuple):
        ids, images = ep
        return [int(i) for i in ids], list(images)
    return [int(i) for i in ep.prompt_ids] + [int(i) for i in ep.completion_ids], episode_images(ep)


def forward_inputs(episodes: Sequence[Any], processor: Any, *, pad_id: int | None = None,
                   padding_side: Literal["right", "left"] = "right") -> dict[str, Any]:
    """The model's forward kwargs for one or several episodes with images.

    Args:
        episodes: :class:`~toolgym.trajectory.Trajectory` objects (ids ``prompt_ids + completion_ids``, images
            :func:`episode_images`) or ``(ids, images)`` pairs.
        processor: the processor (or its :class:`VisionFormat`).
        pad_id: the padding id (``None``: the tokenizer's pad id, else 0).
        padding_side: where rows shorter than the longest are padded.

    Returns:
        ``input_ids`` and ``attention_mask`` ``(B, L)`` int64; the family's type ids (``mm_token_type_ids`` or
        ``token_type_ids``, ``(B, L)``: 1 on each image token); the images' tensors in episode order, images in
        order within an episode, concatenated on dim 0 (``pixel_values``; ``image_grid_thw`` ``(N, 3)`` for Qwen).
        No image in any episode: no image keys.

    Raises:
        VisionInputError: an episode's image tokens are not the count its images need (a cut image block, or
            ids from another processor).
    """
    import torch

    vf = vision_format(processor)
    rows, per_image = [], []
    for k, ep in enumerate(episodes):
        ids, images = _episode(ep)
        want = sum(vf.num_tokens(img) for img in images)
        have = sum(1 for t in ids if t == vf.image_token_id)
        if have != want:
            raise VisionInputError(f"episode {k}: {have} image token(s) in its ids, but its {len(images)} image(s) "
                                   f"take {want}: an image block was cut, or the ids come from another processor")
        rows.append(ids)
        per_image += [vf.image_inputs(img).tensors for img in images]
    if pad_id is None:
        pad_id = getattr(vf.tokenizer, "pad_token_id", None)
        pad_id = 0 if pad_id is None else int(pad_id)
    width = max((len(r) for r in rows), default=0)
    ids_t = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(0, len(r)) if padding_side == "right" else slice(width - len(r), width)
        ids_t[i, sl] = torch.tensor(r, dtype=torch.long)
        attn[i, sl] = 1
    out: dict[str, Any] = {"input_ids": ids_t, "attention_mask": attn,
                           vf.family.type_ids_key: (ids_t == vf.image_token_id).long() * attn}
    if per_image:
        for key in per_image[0]:
            out[key] = torch.cat([t[key] for t in per_image], dim=0)
    return out


# -- vLLM -----------------------------------------------------------------------------------------
def collapse_image_runs(ids: Sequence[int], image_token_id: int) -> list[int]:
    """``ids`` with each run of ``image_token_id`` reduced to one token: what vLLM expands again itself (it would
    expand an already expanded run once more)."""
    out: list[int] = []
    for t in ids:
        t = int(t)
        if t == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(t)
    return out


def vllm_prompt(ids: Sequence[int], images: Sequence[Image], processor: Any) -> dict[str, Any]:
    """A vLLM ``TokensPrompt`` dict for expanded ``ids`` and their ``images``: ``{"prompt_token_ids": ids with one
    image token per image, "multi_modal_data": {"image": [PIL images in order]}}`` (no ``multi_modal_data``
    without images). Exact for the Qwen families (the collapsed prompt is what their template renders).

    Raises:
        VisionInputError: the ids hold another number of image runs than ``len(images)``, or images for a family
            whose collapsed ids vLLM would not expand to the same block (Gemma 3: :attr:`VisionFamily.vllm_collapse`).
    """
    vf = vision_format(processor)
    if images and not vf.family.vllm_collapse:
        raise VisionInputError(f"vLLM prompts with images are not built for {vf.family.name}: its expanded image "
                               "block keeps wrapper and newline tokens that vLLM's own expansion adds again; "
                               "generate with TransformersPolicy(processor=...)")
    out = collapse_image_runs(ids, vf.image_token_id)
    runs = sum(1 for t in out if t == vf.image_token_id)
    if runs != len(images):
        raise VisionInputError(f"{runs} image run(s) in the prompt for {len(images)} image(s)")
    prompt: dict[str, Any] = {"prompt_token_ids": out}
    if images:
        prompt["multi_modal_data"] = {"image": [img.to_pil().convert("RGB") for img in images]}
    return prompt
