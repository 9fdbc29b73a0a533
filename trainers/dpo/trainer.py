"""The TRL side of DPO on env pairs (:mod:`trainers.dpo`): the loss-mask collator, the trainer that keeps
pre-tokenised rows, and :func:`build_dpo_trainer` / :func:`train_dpo`. Kept apart from :mod:`trainers.dpo` so that
its ``Config`` can be read without importing TRL (the classes here subclass TRL's)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

from trainers.dpo.pairs import pairs_dataset

__all__ = ["EnvDPOTrainer", "MaskedPreferenceCollator", "build_dpo_trainer", "train_dpo"]


# ---------------------------------------------------------------------------------------------------------------
# TRL: collator and trainer
# ---------------------------------------------------------------------------------------------------------------


class MaskedPreferenceCollator(DataCollatorForPreference):
    """TRL's ``DataCollatorForPreference`` with the trajectory's loss mask as ``completion_mask``.

    Rows with ``chosen_mask`` / ``rejected_mask`` get ``[0] * len(prompt_ids) + mask`` (truncated and padded like
    the ids); rows without them keep TRL's all-ones completion mask. Output keys and layout are TRL's: the first
    half of the batch is the chosen sequences, the second half the rejected ones.
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch
        from trl.trainer.utils import pad

        out = super().torch_call(examples)
        masks = []
        for side in ("chosen", "rejected"):
            for ex in examples:
                comp = ex.get(f"{side}_mask")
                ids = ex[f"{side}_ids"]
                if comp is None:
                    comp = [1] * len(ids)
                if len(comp) != len(ids):
                    raise ValueError(f"{side}_mask ({len(comp)}) and {side}_ids ({len(ids)}) differ in length")
                masks.append([0] * len(ex["prompt_ids"]) + [int(x) for x in comp])
        if self.max_length is not None:
            sl = slice(None, self.max_length) if self.truncation_mode == "keep_start" else slice(-self.max_length, None)
            masks = [m[sl] for m in masks]
        mask = pad([torch.tensor(m, dtype=torch.long) for m in masks], padding_value=0, padding_side="right",
                   pad_to_multiple_of=self.pad_to_multiple_of)
        if mask.shape != out["completion_mask"].shape:  # pragma: no cover - would mean TRL changed its layout
            raise RuntimeError(f"mask shape {tuple(mask.shape)} != TRL's {tuple(out['completion_mask'].shape)}")
        out["completion_mask"] = mask
        return out


class EnvDPOTrainer(DPOTrainer):
    """``trl.DPOTrainer`` that keeps pre-tokenised pair rows as they are.

    Only ``_prepare_dataset`` is overridden: rows that already have ``prompt_ids``, ``chosen_ids`` and
    ``rejected_ids`` skip TRL's text extraction and tokenisation (which would fail on them); rows whose prompt
    alone fills ``max_length`` are dropped as TRL does. Anything else goes to TRL unchanged.
    """

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        first = next(iter(dataset))
        if not {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(first):
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        if args.max_length is not None and args.truncation_mode == "keep_start":
            dataset = dataset.filter(lambda ex: len(ex["prompt_ids"]) < args.max_length)
        return dataset


def build_dpo_trainer(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[Mapping[str, Any]] | Any,
    *,
    output_dir: str | Path,
    ref_model: Any = None,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    learning_rate: float = 1e-5,
    batch_size: int = 4,
    gradient_accumulation_steps: int = 1,
    epochs: float = 1.0,
    max_steps: int = -1,
    max_length: int | None = None,
    seed: int = 0,
    logging_steps: int = 1,
    disable_tqdm: bool = False,
    callbacks: Sequence[Any] = (),
    **dpo_kwargs: Any,
) -> EnvDPOTrainer:
    """An :class:`EnvDPOTrainer` over ``pairs`` (rows of :func:`make_pairs` or a dataset of them) with the
    loss-mask collator. ``ref_model`` defaults to a frozen copy of ``model`` as it is now. Extra keyword arguments
    go to ``trl.DPOConfig`` (gradient checkpointing, TRL's default, is off on CPU unless asked for: it only trades
    compute for memory)."""
    import torch
    from trl import DPOConfig

    ds = pairs if hasattr(pairs, "column_names") else pairs_dataset(pairs)
    if len(ds) == 0:
        raise ValueError("train_dpo: no preference pairs (no task had two episodes whose rewards differ by the margin)")
    if ref_model is None:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    args = DPOConfig(
        output_dir=str(output_dir), beta=beta, loss_type=[loss_type], learning_rate=learning_rate,
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=gradient_accumulation_steps,
        num_train_epochs=epochs, max_steps=max_steps, max_length=max_length, seed=seed,
        logging_steps=logging_steps, save_strategy="no", report_to=[], remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(), disable_tqdm=disable_tqdm,
        **{"gradient_checkpointing": torch.cuda.is_available(), **dpo_kwargs},
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = MaskedPreferenceCollator(pad_token_id=int(pad_id), max_length=max_length,
                                        truncation_mode=args.truncation_mode)
    return EnvDPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=ds, processing_class=tokenizer,
                         data_collator=collator, callbacks=list(callbacks))


def train_dpo(model: Any, tokenizer: Any, pairs: Sequence[Mapping[str, Any]] | Any, **kwargs: Any) -> EnvDPOTrainer:
    """Build (:func:`build_dpo_trainer`) and run DPO; ``model`` is trained in place and left in eval mode."""
    trainer = build_dpo_trainer(model, tokenizer, pairs, **kwargs)
    model.train()
    trainer.train()
    model.eval()
    return trainer
