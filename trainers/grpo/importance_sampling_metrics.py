"""Importance-sampling (IS) correction, surfaced: TRL's ratio metrics copied into the ``toolgym/*`` namespace.

With vLLM generation TRL 1.16 corrects for the sampler/trainer mismatch (``vllm_importance_sampling_correction``,
on by default) in one of four modes (``vllm_importance_sampling_mode``): ``sequence_mask`` (TRL's default: a
sequence whose ratio ``exp(sum of per-token log-ratios)`` leaves ``[clip_min, clip_max]`` gets weight 0),
``sequence_truncate`` (clamped), ``token_mask`` and ``token_truncate`` (per token). Long multi-turn completions sum
more log-ratios, so a sequence-level mask zeroes them more often, silently. TRL logs
``sampling/importance_sampling_ratio/{min,mean,max}`` and ``sampling/sampling_logp_difference/{mean,max}``; this
callback adds them as ``toolgym/is_ratio/{min,mean,max}`` and ``toolgym/logp_diff/{mean,max}`` next to the other
``toolgym/*`` metrics, plus ``toolgym/is_masked`` (1.0 when a mask mode zeroed at least one sequence or token in
the logged window: the minimum ratio is 0), and warns once when that happens.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

__all__ = ["ISRatioMetrics", "add_is_metrics", "is_metrics"]

log = logging.getLogger(__name__)

_COPIES = {
    "sampling/importance_sampling_ratio/min": "toolgym/is_ratio/min",
    "sampling/importance_sampling_ratio/mean": "toolgym/is_ratio/mean",
    "sampling/importance_sampling_ratio/max": "toolgym/is_ratio/max",
    "sampling/sampling_logp_difference/mean": "toolgym/logp_diff/mean",
    "sampling/sampling_logp_difference/max": "toolgym/logp_diff/max",
}


def is_metrics(logs: dict[str, Any], mode: str) -> dict[str, float]:
    """The ``toolgym/*`` IS metrics for one log record of TRL (``{}`` when it has none: no vLLM, or correction
    off). ``mode``: the run's ``vllm_importance_sampling_mode``."""
    out = {new: float(logs[old]) for old, new in _COPIES.items() if old in logs}
    for prefix in ("eval_",):  # evaluation records carry the same keys with a prefix
        out.update({prefix + new: float(logs[prefix + old]) for old, new in _COPIES.items() if prefix + old in logs})
    if "toolgym/is_ratio/min" in out and mode.endswith("_mask"):
        out["toolgym/is_masked"] = float(out["toolgym/is_ratio/min"] == 0.0)
    return out


class ISRatioMetrics(TrainerCallback):
    """Adds :func:`is_metrics` to every log record (before the trackers see it: :func:`add_is_metrics` puts this
    callback first) and to ``state.log_history``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.warned = False

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        extra = is_metrics(logs, self.mode)
        if not extra:
            return
        logs.update(extra)
        if state.log_history and isinstance(state.log_history[-1], dict):
            state.log_history[-1].update(extra)
        if extra.get("toolgym/is_masked") and not self.warned:
            self.warned = True
            log.warning(
                "importance sampling (%s) gave weight 0 to some %s (min ratio 0): check toolgym/is_ratio/* and "
                "toolgym/logp_diff/*; for long multi-turn completions consider vllm_importance_sampling_mode "
                "token_truncate", self.mode, "sequences" if self.mode.startswith("sequence") else "tokens",
            )


def add_is_metrics(trainer: Any) -> ISRatioMetrics | None:
    """Install :class:`ISRatioMetrics` as the trainer's first callback when it generates with vLLM and corrects
    for IS; returns it (``None`` when there is nothing to surface)."""
    args = trainer.args
    if not (getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False)):
        return None
    cb = ISRatioMetrics(str(args.vllm_importance_sampling_mode))
    trainer.callback_handler.callbacks.insert(0, cb)
    return cb
