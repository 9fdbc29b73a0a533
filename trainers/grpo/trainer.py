"""Turn-level credit in TRL's GRPO: a thin ``GRPOTrainer`` subclass whose advantages are per token.

TRL 1.16 computes one advantage per sequence in ``_generate_and_score_completions`` and its ``_compute_loss``
accepts advantages of shape ``(B, T)`` ("to support subclasses that provide advantages with shape (B, T)").
:class:`TurnCreditGRPOTrainer` overrides only that method: it calls ``super()``, then

* gathers, from every process, what the estimator needs per episode (per-turn rewards, outcome reward, anchor
  state keys: the rollout extra fields ``env_turn_rewards``, ``env_outcome``, ``env_anchors`` that
  :class:`trainers.grpo.rollout_adapter.ToolgymRollout` returns and TRL merges into the inputs), because a group of
  ``num_generations`` samples can span ranks;
* computes one advantage per turn with :func:`trainers.credit.turn_advantages` (groups = TRL's: consecutive
  ``num_generations`` samples of the global batch; ``scale`` = the trainer's ``scale_rewards``);
* keeps this process's slice and spreads it over the tokens with :func:`trainers.credit.token_advantages` (each
  turn's policy tokens get that turn's advantage, env tokens and padding 0), replacing ``advantages`` by a
  ``(B, T)`` tensor.

``advantage="outcome"`` (the default) leaves TRL's output untouched, so the loss is exactly TRL's; every
estimator logs ``toolgym/turn{k}/reward`` and ``toolgym/turn{k}/advantage`` (means over the gathered batch) and,
when the rollout saves trajectories, writes each turn's advantage into the rows (``turn_advantages``).

Episodes with images (a rollout adapter with ``env_kwargs={"processor": ...}``): TRL's ``rollout_func`` path
gives its forwards no images, so every forward of the subclass (old and reference log-probabilities over the
generation batch, the loss over each micro-batch and each of TRL's ``batch_size`` chunks) gets its rows' images
itself: the output of a generation carries ``toolgym_row`` (each row's index into the adapter's
:meth:`~trainers.grpo.rollout_adapter.ToolgymRollout.row_images`), which follows the rows through TRL's shuffle and
split and :func:`~trainers.grpo.zero_advantage.regroup`; the forward gets those rows' image type ids (from the
ids), pixel tensors and grid sizes (:func:`trainers.vision.image_kwargs`). Shared-prefix packing takes no images:
such forwards compute every row's prompt (logged once).

Refused with turn-level estimators (they assume one advantage per sequence, or a reward this estimator does not
see): ``off_policy_mask_threshold`` (a per-sequence keep/drop decided by the advantage's sign), ``loss_type="vespo"``
(gamma weights chosen by the sign of a per-sequence advantage), ``multi_objective_aggregation="normalize_then_sum"``
and reward functions other than the env's own (the estimator reads the env's per-turn and outcome rewards).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from transformers.utils import logging as hf_logging
from trl import GRPOTrainer

from trainers.credit import check_estimator, token_advantages, turn_advantages
from trainers.grpo.no_signal import NoSignalSteps
from trainers.grpo.prompt_packing import ATTENTION_IMPLEMENTATIONS, pack, unpack
from trainers.grpo.zero_advantage import PARTITION_INVARIANT, all_zero, ensure_zero_grads, regroup, skippable
from trainers.vision import check_vision_model, image_kwargs

__all__ = ["NEEDED", "TurnCreditGRPOTrainer", "check_turn_credit_args", "scored_positions_only", "trim_padding"]

logger = hf_logging.get_logger(__name__)

#: rollout extra fields the estimator reads (``trainers.grpo.rollout_adapter.ToolgymRollout`` returns them)
NEEDED = ("env_turn_rewards", "env_outcome", "env_turn_spans")

#: the loss inputs laid out like the prompt (left padded) and like the completion (right padded)
PROMPT_ALIGNED = ("prompt_ids", "prompt_mask")
COMPLETION_ALIGNED = ("completion_ids", "completion_mask", "tool_mask", "old_per_token_logps",
                      "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio", "advantages")


#: widths are cut to a multiple of this many columns: a few distinct shapes, so the allocator reuses its blocks
#: (on a CPU, a new width every micro-batch fragments glibc's heap and raises GRPO's peak RSS: docs/training.md)
TRIM_MULTIPLE = 64


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def trim_padding(inputs: dict[str, Any], multiple: int = TRIM_MULTIPLE) -> dict[str, Any]:
    """One micro-batch of GRPO loss inputs without the padding columns none of its rows needs.

    TRL pads the prompts (left) and completions (right) of the whole generation batch to its longest episode, then
    slices micro-batches out of it: a micro-batch of short episodes still runs the forward/backward over the
    longest one's width (on the demo's GRPO steps, 160 completion columns for a micro-batch whose longest row has
    ~70). This drops the leading prompt columns where ``prompt_mask`` is 0 in every row and the trailing
    completion columns where ``completion_mask`` is 0 in every row, from every tensor laid out that way
    (:data:`PROMPT_ALIGNED`, :data:`COMPLETION_ALIGNED`; ``advantages`` only when it is per token ``(B, T)``),
    keeping each side's width a multiple of ``multiple`` columns (or the batch's own width) so that few distinct
    shapes reach the allocator.

    The loss is unchanged: dropped columns are masked out of attention and of every loss reduction TRL has (their
    sums run over ``mask``; ``dr_grpo`` divides by the configured ``max_completion_length``, not the width), and
    the shift of positions from dropping left padding does not change rotary attention (relative positions). Only
    float rounding may differ. When some other 2-D tensor has a prompt-, completion- or sequence-wide second
    dimension (e.g. ``token_type_ids`` of a multimodal model) the inputs are returned as they are.

    Args:
        inputs: TRL's micro-batch dict; ``prompt_mask`` ``(B, P)`` and ``completion_mask`` ``(B, C)`` int masks.

    Returns:
        A new dict (the input is not modified) whose prompt-aligned tensors are ``(B, P')`` and completion-aligned
        ones ``(B, C')``: ``P'`` = ``P`` or the prompt rows' longest length rounded up to a multiple of ``multiple``
        (at most ``P``), ``C'`` likewise for the completion rows (at least 1 column).
    """
    pm, cm = inputs.get("prompt_mask"), inputs.get("completion_mask")
    if not isinstance(pm, torch.Tensor) or not isinstance(cm, torch.Tensor) or pm.dim() != 2 or cm.dim() != 2:
        return inputs
    p_w, c_w = pm.size(1), cm.size(1)
    for k, v in inputs.items():
        if (k not in PROMPT_ALIGNED and k not in COMPLETION_ALIGNED and isinstance(v, torch.Tensor) and v.dim() >= 2
                and v.size(1) in (p_w, c_w, p_w + c_w)):
            return inputs  # a tensor this function does not know how to slice: leave the batch whole
    step = max(1, int(multiple))
    used_p, used_c = pm.ne(0).any(dim=0).nonzero(), cm.ne(0).any(dim=0).nonzero()
    # columns kept on each side: what its rows use, rounded up to a multiple of ``step``, at most the batch's own
    p_keep = min(p_w, _round_up(p_w - int(used_p[0]) if len(used_p) else p_w, step))
    c_keep = min(c_w, _round_up(int(used_c[-1]) + 1 if len(used_c) else 1, step))
    first, keep = p_w - p_keep, c_keep
    if first == 0 and keep == c_w:
        return inputs
    out = dict(inputs)
    for k in PROMPT_ALIGNED:
        v = out.get(k)
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.size(1) == p_w:
            out[k] = v[:, first:]
    for k in COMPLETION_ALIGNED:
        v = out.get(k)
        if isinstance(v, torch.Tensor) and v.dim() == 2 and v.size(1) == c_w:
            out[k] = v[:, :keep]
    return out


@contextlib.contextmanager
def scored_positions_only() -> Iterator[None]:
    """TRL's fused LM head scores only the positions with a label on a CPU too, for the duration.

    TRL 1.16's fused LM head (``add_fused_lm_head``, the GRPO loss's log-probabilities) projects only the labelled
    positions (the completion tokens) through the LM head on Triton devices; on any other device it scores every
    position of the micro-batch, prompt and padding included, "since the number of valid positions would change
    the tile shapes on every batch and trigger a recompilation" (a concern of compiled backends such as Neuron,
    not of a CPU's eager kernels). On a CPU the head's tiles (``tokens x 32,768`` float32 temporaries in its
    backward) then cover 2-4x the tokens the loss reads: time, and much of the demo's GRPO peak. This makes
    TRL's choice (``trl.trainer.utils._use_triton``, read at call time) say yes on a CPU; the gather and scatter it
    then does are plain torch ops. Each scored position's log-probability and hidden-state gradient come from the
    same row of the same products (identical losses and gradients: ``tests/test_grpo_memory.py``); only a trained LM head's weight
    gradient, which TRL accumulates in float32 over the scored rows, sums fewer (all-zero) rows, so it agrees to
    float32 rounding. Other devices keep TRL's decision."""
    import trl.trainer.utils as trl_utils

    decide = getattr(trl_utils, "_use_triton", None)
    if decide is None:  # another TRL: leave it alone
        yield
        return
    trl_utils._use_triton = lambda device: device.type == "cpu" or decide(device)
    try:
        yield
    finally:
        trl_utils._use_triton = decide


def check_turn_credit_args(args: Any, advantage: str, reward_func_names: Sequence[str], gamma: float = 1.0) -> None:
    """Raise ``ValueError`` when ``args`` (a ``trl.GRPOConfig``) and the reward functions cannot be combined with
    the ``advantage`` estimator; ``outcome`` accepts everything (it is TRL's own computation)."""
    check_estimator(advantage)
    if not 0.0 < float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if advantage == "outcome":
        return
    problems = []
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        problems.append("off_policy_mask_threshold (keeps or drops whole sequences by the sign of one advantage)")
    if getattr(args, "loss_type", None) == "vespo":
        problems.append("loss_type='vespo' (weights chosen by the sign of one advantage per sequence)")
    if getattr(args, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        problems.append("multi_objective_aggregation other than 'sum_then_normalize'")
    if list(reward_func_names) != ["env_reward"]:
        problems.append(f"reward functions {list(reward_func_names)} (turn-level estimators read the env's per-turn "
                        "and outcome rewards; use trainers.grpo.rollout_adapter.env_reward alone)")
    if problems:
        raise ValueError(f"advantage={advantage!r} gives every turn its own advantage and cannot be combined with: "
                         + "; ".join(problems) + ". Use advantage='outcome' for those.")


def _scale(trainer: Any) -> str:
    s = getattr(trainer, "scale_rewards", "group")
    if s is True:
        return "group"
    if s is False:
        return "none"
    return str(s)


class TurnCreditGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with per-turn advantages (module docstring). Extra keyword arguments:

    Args:
        advantage: one of :data:`trainers.credit.ESTIMATORS` (default ``outcome``: TRL's own advantages).
        gamma: per-turn discount of ``turn_return`` / ``gigpo`` returns, ``(0, 1]``.
        gigpo_omega: weight of GiGPO's step-level advantage.
        skip_zero_advantage: leave out the forward and backward of micro-batches whose advantages are all zero,
            where their gradient is exactly zero (:mod:`trainers.grpo.zero_advantage`; one process only).
        shared_prefix: compute each prompt once for the rows of a micro-batch that share it
            (:mod:`trainers.grpo.prompt_packing`), and lay out a fresh generation batch so that a group's rows share
            micro-batches.
        skip_no_signal_steps: skip the optimizer steps whose every micro-batch, on every process, has zero
            advantages and no other loss term (:mod:`trainers.grpo.no_signal`; not under DeepSpeed).
    """

    def __init__(self, *args: Any, advantage: str = "outcome", gamma: float = 1.0, gigpo_omega: float = 1.0,
                 skip_zero_advantage: bool = True, shared_prefix: bool = True, skip_no_signal_steps: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if skip_no_signal_steps and self.is_deepspeed_enabled:
            logger.warning("skip_no_signal_steps is off under DeepSpeed: its engine steps the optimizer inside the "
                           "backward (trainers/grpo/no_signal.py)")
        #: optimizer steps without signal are skipped (:mod:`trainers.grpo.no_signal`)
        self.no_signal = NoSignalSteps(enabled=bool(skip_no_signal_steps) and not self.is_deepspeed_enabled)
        #: pack the rows of a micro-batch that share a prompt (:mod:`trainers.grpo.prompt_packing`)
        self.shared_prefix = bool(shared_prefix)
        #: forwards computed packed, and why others were not (reason -> count)
        self.shared_prefix_forwards = 0
        self.unshared_reasons: dict[str, int] = {}
        #: leave out micro-batches whose advantages are all zero where that is exact (:mod:`trainers.grpo.zero_advantage`)
        self.skip_zero_advantage = bool(skip_zero_advantage) and skippable(self)
        #: how many micro-batches were left out so far
        self.skipped_micro_batches = 0
        check_turn_credit_args(self.args, advantage, self.reward_func_names, gamma)
        self.advantage = advantage
        self.gamma = float(gamma)
        self.gigpo_omega = float(gigpo_omega)
        self.last_turn_advantages: list[list[float]] = []
        #: per mode ("train", "eval"), per row of its last generation batch, the row's images (``None``: no image)
        self._row_images: dict[str, list[list[Any]] | None] = {}
        #: set while a generation batch is scored / while a micro-batch's loss runs (which rows a forward sees)
        self._scoring = False
        self._loss_rows: torch.Tensor | None = None
        rf = getattr(self, "rollout_func", None)
        if rf is not None and hasattr(rf, "defer_write"):
            rf.defer_write = True

    def _gather(self, rows: list[Any]) -> list[Any]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return list(gather_object(rows))

    def _rollout_images(self) -> list[list[Any]] | None:
        """The adapter's last rows' images, ``None`` when no row has one (or the rollout is not the adapter)."""
        rf = getattr(self, "rollout_func", None)
        rows = rf.row_images() if hasattr(rf, "row_images") else None
        return rows if rows and any(rows) else None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:

        self._scoring = True
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._scoring = False
        images = self._row_images["train" if self.model.training else "eval"] = self._rollout_images()
        if images is not None:  # follows each row through shuffles and splits (module docstring)
            output["toolgym_row"] = torch.arange(len(images), device=output["prompt_ids"].device)
        missing = [k for k in NEEDED if k not in inputs[0]]
        if missing:
            if self.advantage == "outcome":
                return output
            raise ValueError(f"advantage={self.advantage!r} needs the rollout extra fields {list(NEEDED)} "
                             f"(missing {missing}): use trainers.grpo.rollout_adapter.ToolgymRollout as rollout_func")
        mode = "train" if self.model.training else "eval"
        n_gen = self.num_generations if mode == "train" else self.num_generations_eval
        local = [{"r": [float(x) for x in inp["env_turn_rewards"]], "o": float(inp["env_outcome"]),
                  "a": [int(x) for x in inp.get("env_anchors") or []]} for inp in inputs]
        rows = self._gather(local)
        start = self.accelerator.process_index * len(inputs)
        if self.advantage == "outcome":  # TRL's own numbers, only spread over turns for logs and files
            seq = output["advantages"].detach().float().cpu().tolist()
            mine = [[a] * len(r["r"]) for a, r in zip(seq, local, strict=True)]
            every = self._gather(mine)
        else:
            anchors = [r["a"] for r in rows] if self.advantage == "gigpo" else None
            if anchors is not None and any(len(a) != len(r["r"]) for a, r in zip(anchors, rows, strict=True)):
                raise ValueError("advantage='gigpo' needs env_anchors with one key per turn")
            every = turn_advantages(
                [r["r"] for r in rows], [r["o"] for r in rows], [i // n_gen for i in range(len(rows))],
                estimator=self.advantage, gamma=self.gamma, anchors=anchors, scale=_scale(self),
                omega=self.gigpo_omega,
            )
            mine = every[start: start + len(inputs)]
            mask = output["completion_mask"]
            if output.get("tool_mask") is not None:
                mask = mask * output["tool_mask"]
            mask_np = mask.detach().cpu().numpy()
            width = mask_np.shape[1]
            tok = np.stack([
                token_advantages(mine[i], inputs[i]["env_turn_spans"], mask_np[i], length=width)
                for i in range(len(inputs))
            ])
            output["advantages"] = torch.as_tensor(tok, dtype=torch.float32, device=output["advantages"].device)
        self.last_turn_advantages = mine
        self._log_turns(mode, [r["r"] for r in rows], every)
        rf = getattr(self, "rollout_func", None)
        if rf is not None and hasattr(rf, "write_pending"):
            rf.write_pending(mine)
        return output

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        """TRL's, then, on a freshly generated batch, its zero-advantage rows moved into the last micro-batches
        (:func:`trainers.grpo.zero_advantage.regroup`; the step's gradient is the same sum) when they may be skipped,
        and, with ``shared_prefix``, the rows of a group next to each other, so that they share micro-batches."""
        spg = int(getattr(self.args, "steps_per_generation", 1) or 1)
        fresh = self.model.training and (self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None)
        inputs = super()._prepare_inputs(generation_batch)
        if fresh and (self.skip_zero_advantage or self.shared_prefix) and self.loss_type in PARTITION_INVARIANT:
            regrouped = regroup(self._buffered_inputs, zeros_last=self.skip_zero_advantage,
                                by_prompt=self.shared_prefix)
            if regrouped is not None:
                self._buffered_inputs = regrouped
                inputs = regrouped[self._step % spg]
        return inputs

    @property
    def skipped_optimizer_steps(self) -> int:
        """Optimizer steps skipped so far for want of signal (:mod:`trainers.grpo.no_signal`)."""
        return self.no_signal.skipped

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's; after the last micro-batch of an optimizer step, the step's gradients dropped when none of its
        micro-batches had signal (:class:`trainers.grpo.no_signal.NoSignalSteps`)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # Trainer sets it on an optimizer step's last micro-batch
            self.no_signal.end_of_step(self, model)
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, with the run's count of skipped optimizer steps on every training log."""
        if self.no_signal.enabled and self.model.training and "loss" in logs:
            logs["toolgym/skipped_optimizer_steps"] = float(self.no_signal.skipped)
        super().log(logs, start_time)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss on the micro-batch without its all-padding columns (:func:`trim_padding`), its LM head
        scoring only the completion positions (:func:`scored_positions_only`). A micro-batch whose advantages are
        all zero is not computed when its gradient is exactly zero (:mod:`trainers.grpo.zero_advantage`): a zero loss,
        and zero gradients for trainable parameters that have none yet. Every training micro-batch is recorded for
        the no-signal rule (:mod:`trainers.grpo.no_signal`)."""
        if model.training:
            self.no_signal.observe(self, inputs)
        if self.skip_zero_advantage and model.training and all_zero(inputs):
            ensure_zero_grads(model)
            self.skipped_micro_batches += 1
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        self._loss_rows = inputs.get("toolgym_row")
        try:
            with scored_positions_only():
                return super()._compute_loss(model, trim_padding(inputs))
        finally:
            self._loss_rows = None

    def _images_of(self, model: Any, rows: int) -> list[list[Any]] | None:
        """Per row of the forward being computed, its images; ``None`` when none has one."""
        table = getattr(self, "_row_images", {}).get("train" if self.model.training else "eval")
        if getattr(self, "_scoring", False):
            images = self._rollout_images()
        elif getattr(self, "_loss_rows", None) is not None and table:
            images = [table[i] for i in self._loss_rows.tolist()]
        else:
            return None
        if images is None or not any(images):
            return None
        if len(images) != rows:
            raise RuntimeError(f"GRPO forward with images: {rows} rows but images for {len(images)}")
        check_vision_model(self.accelerator.unwrap_model(model), getattr(self.rollout_func, "processor", None),
                           "GRPO training")
        return images

    def _vision_logps(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                      images: list[list[Any]], batch_size: int | None, compute_entropy: bool,
                      compute_aux_loss: bool) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """TRL's computation, one chunk of ``batch_size`` rows at a time, each with its rows' image inputs."""
        processor = self.rollout_func.processor
        chunk = batch_size or input_ids.size(0)
        logps, entropies, aux = [], [], []
        for start in range(0, input_ids.size(0), chunk):
            ids, am = input_ids[start:start + chunk], attention_mask[start:start + chunk]
            rows = images[start:start + chunk]
            kw = image_kwargs(rows, ids, am, processor, num_images=True)
            if not any(rows):  # type ids (all 0) only: no image tensors for a chunk without images
                kw = {k: v for k, v in kw.items() if k in ("mm_token_type_ids", "token_type_ids")}
            lp, ent, al = super()._get_per_token_logps_and_entropies(
                model, ids, am, logits_to_keep, compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss,
                **kw)
            logps.append(lp)
            entropies.append(ent)
            aux.append(al)
        return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None)

    def _unshared(self, reason: str) -> None:
        if reason not in self.unshared_reasons:
            logger.warning("shared-prefix GRPO: this forward computes every row's prompt (%s)", reason)
        self.unshared_reasons[reason] = self.unshared_reasons.get(reason, 0) + 1

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, compute_aux_loss: bool = False,
                                           **multimodal: Any) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
        """TRL's per-token log-probabilities ``(B, C)`` (and entropies ``(B, C)``) of the completion tokens, with
        the rows that share a prompt packed into one row (:mod:`trainers.grpo.prompt_packing`) when
        ``shared_prefix`` is on; with the rows' images (:meth:`_vision_logps`) when the episodes have images. TRL's
        own computation where packing does not apply: a multimodal batch, images in the episodes, an MoE
        auxiliary loss, an attention implementation that takes no custom 4-D mask, or no prompt that two rows
        of a chunk share (logged once per reason)."""
        unshared = (model, input_ids, attention_mask, logits_to_keep)
        kwargs = dict(batch_size=batch_size, compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss,
                      **multimodal)
        images = None if any(v is not None for v in multimodal.values()) else self._images_of(model, input_ids.size(0))
        if images is not None:
            if self.shared_prefix:
                self._unshared("images in the episodes")
            return self._vision_logps(model, input_ids, attention_mask, logits_to_keep, images, batch_size,
                                      compute_entropy, compute_aux_loss)
        if not self.shared_prefix:
            return super()._get_per_token_logps_and_entropies(*unshared, **kwargs)
        base = self.accelerator.unwrap_model(model)
        impl = getattr(getattr(base, "config", None), "_attn_implementation", None)
        reason = None
        if any(v is not None for v in multimodal.values()):
            reason = "multimodal inputs"
        elif compute_aux_loss:
            reason = "MoE auxiliary loss"
        elif impl not in ATTENTION_IMPLEMENTATIONS:
            reason = f"attention implementation {impl!r} takes no custom 4-D mask"
        if reason is not None:
            self._unshared(reason)
            return super()._get_per_token_logps_and_entropies(*unshared, **kwargs)
        chunk = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), chunk):
            ids, am = input_ids[start:start + chunk], attention_mask[start:start + chunk]
            packed = pack(ids, am, logits_to_keep, attn_implementation=impl,
                          mask_dtype=base.get_input_embeddings().weight.dtype)
            if packed is None:
                self._unshared("no prompt shared by two rows of the micro-batch")
                lp, ent, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, am, logits_to_keep, compute_entropy=compute_entropy)
            else:
                self.shared_prefix_forwards += 1
                with self.accelerator.autocast():
                    out = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                                position_ids=packed.position_ids, shift_labels=packed.shift_labels,
                                fused_lm_head=True)
                lp = unpack(out.log_probs, packed)
                ent = unpack(out.entropy, packed) if compute_entropy else None
            logps.append(lp)
            entropies.append(ent)
        return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None, None)

    def _log_turns(self, mode: str, rewards: list[list[float]], advs: list[list[float]]) -> None:
        kmax = max((len(r) for r in rewards), default=0)
        for k in range(kmax):
            rk = [r[k] for r in rewards if len(r) > k]
            ak = [a[k] for a in advs if len(a) > k]
            self._metrics[mode][f"toolgym/turn{k}/reward"].append(float(np.mean(rk)))
            self._metrics[mode][f"toolgym/turn{k}/advantage"].append(float(np.mean(ak)))
            self._metrics[mode][f"toolgym/turn{k}/advantage_abs"].append(float(np.mean(np.abs(ak))))
        self._metrics[mode]["toolgym/process_reward"].append(float(np.mean([sum(r) for r in rewards] or [0.0])))
