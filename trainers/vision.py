"""Training on episodes with images: the forward inputs of a batch's rows, and the checks that keep it exact.

A vision-language episode (:class:`~toolgym.format.vision_conversation.VisionConversation`) holds each image as
the processor's expanded image tokens (loss mask 0) in ``prompt_ids + completion_ids`` and the images themselves,
in order, in :func:`toolgym.format.vision.episode_images`. A training forward over some of a batch's rows needs,
for exactly those rows:

* the family's per-token image marker (``mm_token_type_ids`` for the Qwen families, ``token_type_ids`` for
  Gemma 3): 1 on each image token of the padded ids, 0 elsewhere; computed from the ids themselves, so any
  padding, trimming or reordering of the rows keeps it right;
* the rows' images' tensors, concatenated in row order: Qwen's ``pixel_values`` (``sum(grid.prod())`` patch rows
  per image) with ``image_grid_thw`` (one row per image), Gemma 3's ``pixel_values`` (one ``(3, S, S)`` per image).

:func:`image_kwargs` builds them; masked SFT (:func:`trainers.sft.masked_sft`) and the GRPO adapter
(:class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`) pass them to every forward, so a row's per-token
log-probabilities are those of a plain forward of its whole conversation
(:func:`toolgym.format.vision.forward_inputs`).

Where images cannot be taken a :class:`VisionTrainingError` is raised (silently wrong log-probabilities would
follow otherwise): episodes with image tokens and no processor, or a model without a vision tower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.format.vision import VisionInputError, episode_images, vision_format
from toolgym.images import Image
from toolgym.trajectory import Trajectory

__all__ = ["VisionTrainingError", "check_counts", "check_vision_model", "has_vision_tower", "image_kwargs",
           "image_tensors", "trajectory_images"]


class VisionTrainingError(ValueError):
    """Episodes with image tokens given to a training path that cannot show the model their images (no processor,
    a model without a vision tower, TRL's ``SFTTrainer`` path): training would read the image tokens as text."""


def trajectory_images(trajectory: Trajectory | Mapping[str, Any]) -> list[Image]:
    """The images the episode's model saw as image tokens, in order (:func:`toolgym.format.vision.episode_images`);
    a JSONL row is read as a :class:`~toolgym.trajectory.Trajectory` when it has images. A text-only episode (also
    one whose images a text policy read as placeholder lines) gives ``[]``."""
    if isinstance(trajectory, Mapping):
        if not trajectory.get("images"):
            return []
        trajectory = Trajectory.from_dict(dict(trajectory))
    return episode_images(trajectory)


def has_vision_tower(model: Any) -> bool:
    """Whether ``model`` (or the model a wrapper holds) takes pixel values: its config has a ``vision_config``."""
    base = getattr(model, "module", model)
    base = base.get_base_model() if hasattr(base, "get_base_model") else base
    return getattr(getattr(base, "config", None), "vision_config", None) is not None


def check_vision_model(model: Any, processor: Any, where: str) -> None:
    """Refuse episodes with image tokens where ``processor`` is ``None`` or ``model`` has no vision tower.

    Raises:
        VisionTrainingError: naming ``where`` (the training path) and what is missing.
    """
    if processor is None:
        raise VisionTrainingError(f"{where}: the episodes hold image tokens (a vision-language env's); pass the "
                                  "model's processor (processor=...) so the forward gets the images' pixel tensors")
    if not has_vision_tower(model):
        raise VisionTrainingError(f"{where}: the episodes hold image tokens but the model "
                                  f"({type(model).__name__}) has no vision tower (no config.vision_config): it would "
                                  "read them as text. Train a vision-language model, or roll out without a processor "
                                  "(images as placeholder text)")


def check_counts(rows: Sequence[tuple[Sequence[int], Sequence[Image]]], processor: Any) -> None:
    """Each row's image-token count is what its images take.

    Raises:
        VisionInputError: naming the first row whose count differs (a cut image block, ids of another processor).
    """
    vf = vision_format(processor)
    for k, (ids, images) in enumerate(rows):
        want = sum(vf.num_tokens(img) for img in images)
        have = sum(1 for t in ids if int(t) == vf.image_token_id)
        if have != want:
            raise VisionInputError(f"episode {k}: {have} image token(s) in its ids, but its {len(images)} image(s) "
                                   f"take {want}: an image block was cut, or the ids come from another processor")


def image_tensors(images: Sequence[Sequence[Image]], processor: Any) -> dict[str, Any]:
    """The images' tensors, per row in order, concatenated on dim 0 (CPU): ``pixel_values`` (Qwen:
    ``sum(grid.prod())`` patch rows per image; Gemma 3: ``(N, 3, S, S)``), Qwen's ``image_grid_thw`` ``(N, 3)``;
    ``{}`` without images."""
    import torch

    vf = vision_format(processor)
    per_image = [vf.image_inputs(img).tensors for row in images for img in row]
    if not per_image:
        return {}
    return {key: torch.cat([t[key] for t in per_image], dim=0) for key in per_image[0]}


def image_kwargs(images: Sequence[Sequence[Image]], input_ids: Any, attention_mask: Any, processor: Any, *,
                 num_images: bool = False) -> dict[str, Any]:
    """The image inputs of a forward over padded rows.

    Args:
        images: per row, its images in order (``[]``: none).
        input_ids: ``(B, L)`` the rows' ids, padded on either side.
        attention_mask: ``(B, L)`` 1 on real tokens.
        processor: the processor (or its :class:`~toolgym.format.vision.VisionFormat`).
        num_images: add ``"num_images"`` (per row, a list of ints: TRL's GRPO forward slices by it).

    Returns:
        The family's type ids ``(B, L)`` (long, on the ids' device: 1 on each image token of a real position) and,
        when a row has an image, the images' tensors concatenated in row order (``pixel_values``; Qwen's
        ``image_grid_thw`` ``(N, 3)``), on the ids' device.
    """
    vf = vision_format(processor)
    out: dict[str, Any] = {vf.family.type_ids_key: ((input_ids == vf.image_token_id) & (attention_mask != 0)).long()}
    out.update({k: v.to(input_ids.device) for k, v in image_tensors(images, vf).items()})
    if num_images:
        out["num_images"] = [len(row) for row in images]
    return out
