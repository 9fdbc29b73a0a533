"""An in-process vLLM engine as a policy: :class:`VLLMEnginePolicy`, text and images.

vLLM takes token-id prompts (``{"prompt_token_ids": ids}``) and, for a vision-language model, the images beside
them (``"multi_modal_data": {"image": [PIL images]}``). It expands each image placeholder itself, so a prompt of
toolgym's expanded ids would be expanded twice: each run of image tokens is collapsed to one token first
(:func:`toolgym.format.vision.vllm_prompt`, as verl does), the images sent in the order their runs stand.

This module never imports vLLM: the caller builds the engine (``vllm.LLM(model=...)``) and the sampling parameters
(``make_sampling_params(request) -> vllm.SamplingParams``), and the policy only calls ``llm.generate``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolgym.rollout.types import BlockingPolicy, Generation, GenerationRequest

__all__ = ["VLLMEnginePolicy"]


class VLLMEnginePolicy(BlockingPolicy):
    """A ``vllm.LLM`` as a batched policy (one ``generate`` call per batch, in a worker thread).

    Args:
        llm: the engine (anything with vLLM's ``generate(prompts, sampling_params=..., use_tqdm=...)``).
        make_sampling_params: ``fn(request) -> SamplingParams`` for one request, e.g.
            ``lambda r: SamplingParams(max_tokens=r.max_new_tokens, stop_token_ids=list(r.stop_ids), logprobs=0,
            temperature=1.0)`` (``logprobs=0``: the sampled token's log-probability; start the engine with
            ``logprobs_mode="processed_logprobs"`` for toolgym's default meaning).
        processor: the vision-language model's processor (:mod:`toolgym.format.vision`), needed when requests carry
            images.

    Attributes:
        last_prompts: the prompts of the last ``generate`` call, as sent to the engine.
    """

    def __init__(self, llm: Any, make_sampling_params: Callable[[GenerationRequest], Any], *,
                 processor: Any = None) -> None:
        self.llm = llm
        self.make_sampling_params = make_sampling_params
        self.processor = processor
        self.calls = 0
        self.last_prompts: list[dict[str, Any]] = []

    def prompt(self, request: GenerationRequest) -> dict[str, Any]:
        """The engine's prompt for ``request``: its ids (each image's run collapsed to one image token) and its
        images (:func:`~toolgym.format.vision.vllm_prompt`)."""
        if not request.images:
            return {"prompt_token_ids": [int(t) for t in request.prompt_ids]}
        if self.processor is None:
            raise ValueError("a generation request carries images: build VLLMEnginePolicy(..., processor=...)")
        from toolgym.format.vision import vllm_prompt

        return vllm_prompt(request.prompt_ids, request.images, self.processor)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Blocking :meth:`agenerate`."""
        if not requests:
            return []
        self.calls += 1
        prompts = [self.prompt(r) for r in requests]
        self.last_prompts = prompts
        outs = self.llm.generate(prompts, sampling_params=[self.make_sampling_params(r) for r in requests],
                                 use_tqdm=False)
        gens = []
        for r, out in zip(requests, outs, strict=True):
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = None
            if c.logprobs:  # one {token_id: Logprob} per sampled token
                lps = [float(d[t].logprob) if t in d else float("nan") for d, t in zip(c.logprobs, ids, strict=False)]
            gens.append(Generation.from_sampled(ids, lps, r.stop_ids, r.max_new_tokens,
                                                finish_reason=getattr(c, "finish_reason", None)))
        return gens
