"""Sampling a token without ``torch.multinomial`` on a CPU: the same distribution, ~40x cheaper per step.

transformers' ``generate()`` samples each decoding step with ``torch.multinomial(probs, 1)``. On a CPU that call
draws one exponential variate per vocabulary entry (it is ``argmax(probs / Exp(1))``): for 16 rows of SmolLM2's
49,152-token vocabulary, a noticeable share of a GRPO decoding step of the 135M model. Inverse-CDF sampling (a
cumulative sum, one uniform variate per row and a binary search) draws from the same distribution at a small
fraction of that cost (``docs/benchmarks.md`` times both).

:func:`inverse_cdf_sampling` runs one ``generate()`` call that way: the call's own warpers (temperature, top-k,
top-p, min-p, in transformers' order) and the sampling move into one logits processor, :class:`InverseCDFSampler`,
appended after the caller's processors (where transformers applies its warpers), which leaves only the sampled
token possible; ``generate()`` then runs greedily and picks it. Random numbers come from torch's default generator,
as ``torch.multinomial``'s do (so a seeded run is reproducible, with other draws than transformers' own). A call
that asks for scores or logits, beams, or a warper this module does not rebuild (typical-p, epsilon / eta cutoffs,
top-h, watermarking, renormalised logits) is left to transformers. GRPO's transformers generation uses it on a CPU
(:mod:`trainers.grpo.rollout_adapter`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

__all__ = ["InverseCDFSampler", "inverse_cdf_sampling", "sampling_warpers"]


class InverseCDFSampler:
    """A logits processor that applies ``warpers`` to the scores, samples one token per row by inverse CDF (float64
    cumulative sum of the softmax, ``u`` uniform in ``(0, total]``, the first index whose cumulative mass reaches
    ``u``: a zero-probability token is never chosen) and returns scores that are ``0`` for that token and ``-inf``
    elsewhere. ``scores``: ``(B, V)`` float; returns ``(B, V)``."""

    def __init__(self, warpers: Any = (), generator: Any = None) -> None:
        self.warpers = list(warpers)
        self.generator = generator

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        warped = scores
        for w in self.warpers:
            warped = w(input_ids, warped)
        cdf = torch.softmax(warped.float(), dim=-1).double().cumsum(dim=-1)  # (B, V)
        u = torch.rand((cdf.shape[0], 1), dtype=torch.float64, device=cdf.device, generator=self.generator)
        u = (1.0 - u) * cdf[:, -1:]  # (0, total]
        chosen = torch.searchsorted(cdf, u).clamp_(max=cdf.shape[1] - 1)  # (B, 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, chosen, 0.0)


def sampling_warpers(config: Any) -> list[Any] | None:
    """transformers' sampling warpers for a ``GenerationConfig`` (temperature, top-k, top-p, min-p, in the order
    ``generate()`` applies them), or ``None`` when the config needs one this module does not rebuild."""
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    unsupported = (
        (getattr(config, "typical_p", None) is not None and config.typical_p < 1.0)
        or (getattr(config, "epsilon_cutoff", None) or 0.0) > 0.0
        or (getattr(config, "eta_cutoff", None) or 0.0) > 0.0
        or getattr(config, "top_h", None) is not None
        or getattr(config, "watermarking_config", None) is not None
        or getattr(config, "renormalize_logits", False)
    )
    if unsupported:
        return None
    warpers: list[Any] = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    if getattr(config, "min_p", None) is not None:
        warpers.append(MinPLogitsWarper(min_p=config.min_p))
    return warpers


@contextlib.contextmanager
def inverse_cdf_sampling(model: Any) -> Iterator[None]:
    """For the duration, ``model.generate(..., generation_config=config)`` samples with :class:`InverseCDFSampler`
    when ``config`` samples (``do_sample``, one beam, no scores or logits returned, warpers of
    :func:`sampling_warpers`) and the model is on a CPU; any other call goes to ``generate`` unchanged. The
    instance's previous ``generate`` attribute (e.g. another wrapper) is restored afterwards."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        yield
        return
    previous = vars(model).get("generate")
    bound = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        warpers = None
        if (config is not None and config.do_sample and (config.num_beams or 1) == 1
                and not (config.output_scores or config.output_logits) and "logits_processor" not in kwargs):
            warpers = sampling_warpers(config)
        if warpers is None:
            return bound(*args, **kwargs)
        greedy = copy.deepcopy(config)
        greedy.do_sample = False
        greedy.temperature, greedy.top_k, greedy.top_p, greedy.min_p = None, None, None, None
        from transformers import LogitsProcessorList

        kwargs["generation_config"] = greedy
        kwargs["logits_processor"] = LogitsProcessorList([InverseCDFSampler(warpers)])
        return bound(*args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        if previous is not None:
            model.generate = previous
        else:
            vars(model).pop("generate", None)
