"""The policy contract: what a rollout asks for (:class:`GenerationRequest`) and gets back (:class:`Generation`).

:meth:`Generation.from_sampled` is the one post-processing path every backend uses on the ids it sampled (the
transformers policy, the OpenAI-compatible client, ``toolgym serve model``'s engine where it applies, and the TRL
adapter): cut at the first stop id, trim to the token budget, trim the logprobs to the kept ids (non-finite values
sanitised once, here), and set the finish reason.

**What a logprob means** (:data:`LogprobsMode`, named after vLLM's ``logprobs_mode``):

* ``"processed_logprobs"`` (the default everywhere in toolgym): the log-probability of the sampled token under the
  distribution it was actually sampled from, i.e. after logit bias / penalties, temperature, top-k and top-p (the
  kept set renormalised). This is what TRL 1.16's ``GRPOTrainer`` compares against for its importance-sampling
  correction: it recomputes the trainer's per-token logps as ``log_softmax(logits / temperature)`` (its fused LM
  head is built with ``temperature=args.temperature``), asks vLLM for ``logprobs_mode="processed_logprobs"`` in
  colocate mode, starts ``trl vllm-serve`` with ``--logprobs-mode processed_logprobs``, and warns when a vLLM
  server runs with another mode ("biases the importance sampling correction"). Raw logprobs at a temperature other
  than 1 would make every ratio wrong by the temperature's effect.
* ``"raw_logprobs"``: the model's own ``log_softmax(logits)``, before any processing (vLLM's default).

With greedy decoding (temperature 0) no temperature is applied, so both modes differ only by logit bias /
penalties / allowed ids.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from toolgym.images import Image
from toolgym.trajectory import Trajectory

__all__ = [
    "DEFAULT_LOGPROBS_MODE",
    "LOGPROBS_MODES",
    "BlockingPolicy",
    "EpisodeState",
    "Generation",
    "GenerationRequest",
    "LogprobsMode",
    "Policy",
    "RolloutStats",
    "check_logprobs_mode",
    "flatten_logprobs",
]

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
LOGPROBS_MODES: tuple[str, ...] = ("raw_logprobs", "processed_logprobs")
#: the one default of every backend (see the module docstring for why it matches TRL's importance ratio)
DEFAULT_LOGPROBS_MODE: LogprobsMode = "processed_logprobs"


def check_logprobs_mode(mode: str) -> LogprobsMode:
    """``mode`` if it is one of :data:`LOGPROBS_MODES`, else a ``ValueError`` naming the choices."""
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}; got {mode!r}")
    return mode  # type: ignore[return-value]


@dataclass
class EpisodeState:
    """What a policy may know about the episode a request comes from (scripted policies use it; models ignore it).

    Attributes:
        index: the episode's position in the task list given to the driver.
        task: the task row.
        turn: 0-based index of the turn being generated.
        env: the (unwrapped) sub-env running the episode; ``env.trajectory`` is the episode so far.
    """

    index: int
    task: dict[str, Any]
    turn: int
    env: Any = None

    @property
    def trajectory(self) -> Trajectory | None:
        return getattr(self.env, "trajectory", None)


@dataclass
class GenerationRequest:
    """One turn to generate.

    Attributes:
        prompt_ids: the whole context so far (prompt + completion), token ids.
        max_new_tokens: the most tokens to sample for this turn (>= 1 when it reaches a policy).
        stop_ids: token ids that end the turn (included in the output when sampled).
        episode: the episode the request belongs to (``None`` outside a driver).
        images: the images of ``prompt_ids``, in order (a vision-language episode's
            :attr:`~toolgym.format.vision_conversation.VisionConversation.images`; ``prompt_ids`` hold each one's
            image tokens expanded). Empty for text.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()
    episode: EpisodeState | None = None
    images: list[Image] = field(default_factory=list)


@dataclass
class Generation:
    """A sampled turn.

    Attributes:
        token_ids: the sampled ids, ending with a stop id if the policy stopped by itself.
        logprobs: one float per sampled id (its log-probability in the policy's ``logprobs_mode``), or ``None``.
        finish_reason: ``"stop"`` (a stop id was sampled) or ``"length"`` (``max_new_tokens`` reached).
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str = "stop"

    @property
    def stopped(self) -> bool:
        """Whether the turn ended by itself (a stop id) rather than on the budget."""
        return self.finish_reason != "length"

    @classmethod
    def from_sampled(
        cls,
        ids: Iterable[Any],
        logprobs: Any,
        stop_ids: Iterable[int],
        max_new_tokens: int,
        *,
        finish_reason: str | None = None,
        non_finite: float = 0.0,
    ) -> Generation:
        """The one post-processing of sampled ids, used by every backend.

        1. cut after the first id in ``stop_ids`` (the stop id is kept);
        2. trim to ``max_new_tokens`` (a trimmed turn did not stop by itself);
        3. logprobs: flattened (:func:`flatten_logprobs`: vLLM-style nested top-k lists keep the sampled entry),
           trimmed to the kept ids, each non-finite value (NaN, +-inf, a missing entry) replaced by ``non_finite``;
           ``None`` stays ``None``, and so do logprobs shorter than the kept ids (they cannot be aligned);
        4. ``finish_reason``: ``"stop"`` when a stop id was kept; ``"length"`` when the budget cut the turn;
           otherwise the backend's own ``finish_reason`` (e.g. a server that stopped on its end-of-sequence id),
           else ``"length"``.

        Args:
            ids: the sampled token ids (any ints: a list, a tensor row's ``tolist()``, numpy ints).
            logprobs: one float (or nested list) per sampled id, or ``None``.
            stop_ids: ids that end the turn.
            max_new_tokens: the turn's token budget (``>= 0``).
            finish_reason: what the backend said when no stop id was found and the budget did not cut.
            non_finite: the value given to non-finite logprobs (``0.0``; the TRL adapter keeps ``nan``, which
                TRL reads as "unavailable: no importance correction for this token").
        """
        row = [int(t) for t in ids]
        stops = set(stop_ids)
        stopped = False
        for j, t in enumerate(row):
            if t in stops:
                row, stopped = row[: j + 1], True
                break
        budget = max(0, int(max_new_tokens))
        trimmed = len(row) > budget
        if trimmed:
            row, stopped = row[:budget], False
        lp = flatten_logprobs(logprobs)
        if lp is not None:
            lp = lp[: len(row)] if len(lp) >= len(row) else None
        if lp is not None:
            lp = [x if math.isfinite(x) else non_finite for x in lp]
        reason = "stop" if stopped else "length" if trimmed else (finish_reason or "length")
        return cls(row, lp, reason)


def flatten_logprobs(logprobs: Any) -> list[float] | None:
    """One float per token from a policy's logprobs: plain floats stay; vLLM-style nested top-k lists
    (``[[lp_sampled, lp_2, ...], ...]``) keep their first (sampled-token) entry; ``None`` entries become NaN."""
    if logprobs is None:
        return None
    out: list[float] = []
    for lp in logprobs:
        while isinstance(lp, list | tuple):
            lp = lp[0] if lp else None
        out.append(float("nan") if lp is None else float(lp))
    return out


@runtime_checkable
class Policy(Protocol):
    """A batched token-level policy: ``await policy.agenerate(requests)`` -> one :class:`Generation` per request.

    ``concurrent``: ``True`` if separate calls may overlap (a server that batches by itself); ``False`` if the
    policy runs one batch at a time (a local model), in which case the continuous schedule micro-batches
    concurrent requests into one call.
    """

    concurrent: bool

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...


class BlockingPolicy:
    """Base of a :class:`Policy` whose generation blocks (a model in this process): subclasses implement
    :meth:`generate`; :meth:`agenerate` runs it in a worker thread so the event loop keeps running tools, and
    an empty batch is answered without a call. ``concurrent`` is ``False``: one batch at a time."""

    concurrent = False

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One :class:`Generation` per request, blocking."""
        raise NotImplementedError

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        return await asyncio.to_thread(self.generate, requests)


@dataclass
class RolloutStats:
    """Counters of one :meth:`RolloutDriver.arun` call (wall seconds, policy calls, episodes, tokens)."""

    episodes: int = 0
    wall_s: float = 0.0
    policy_calls: int = 0
    generated_tokens: int = 0
    turns: int = 0
    gen_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    live_turns: int = 0  # turns stepped so far (updated while episodes run)
    tool_calls: int = 0  # tool calls made so far

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "wall_s": round(self.wall_s, 4),
            "episodes_per_s": round(self.episodes_per_s, 4),
            "policy_calls": self.policy_calls,
            "generated_tokens": self.generated_tokens,
            "turns": self.turns,
            "gen_s": round(self.gen_s, 4),
            "tool_calls": self.tool_calls,
            "mean_batch": round(float(np.mean(self.batch_sizes)), 2) if self.batch_sizes else 0.0,
        }
