"""Rollout: run token-level tool episodes with a policy (``from toolgym.rollout import ...``).

* :mod:`toolgym.rollout.types`: the policy contract (:class:`Policy`, :class:`GenerationRequest`,
  :class:`Generation` with the one post-processing path :meth:`Generation.from_sampled`, the logprob meaning
  :data:`LogprobsMode`);
* :mod:`toolgym.rollout.policies`: :class:`TransformersPolicy`, :class:`OpenAIPolicy`, :class:`ScriptedPolicy`;
* :mod:`toolgym.rollout.driver`: :class:`RolloutDriver` (lock-step and continuous schedules);
* :mod:`toolgym.rollout.padding`: :func:`left_pad`, shared with ``toolgym serve model``;
* :mod:`toolgym.rollout.turn_cache`: :class:`TurnCache`, an episode's keys and values kept between its turns.

``read_trajectories``, ``write_trajectories`` and ``summarize`` are :mod:`toolgym.trajectory`'s (the one place that
owns trajectory files), re-exported here for existing imports.

This package never imports ``trainers/``, TRL or vLLM; torch and transformers are imported lazily.
"""

from toolgym.rollout.driver import RolloutDriver, Schedule, attach_logprobs
from toolgym.rollout.padding import left_pad
from toolgym.rollout.policies import OpenAIPolicy, ScriptedPolicy, TransformersPolicy
from toolgym.rollout.turn_cache import TurnCache
from toolgym.rollout.types import (
    DEFAULT_LOGPROBS_MODE,
    LOGPROBS_MODES,
    EpisodeState,
    Generation,
    GenerationRequest,
    LogprobsMode,
    Policy,
    RolloutStats,
    flatten_logprobs,
)
from toolgym.trajectory import read_trajectories, summarize, write_trajectories

__all__ = [
    "DEFAULT_LOGPROBS_MODE",
    "LOGPROBS_MODES",
    "EpisodeState",
    "Generation",
    "GenerationRequest",
    "LogprobsMode",
    "OpenAIPolicy",
    "Policy",
    "RolloutDriver",
    "RolloutStats",
    "Schedule",
    "ScriptedPolicy",
    "TransformersPolicy",
    "TurnCache",
    "attach_logprobs",
    "flatten_logprobs",
    "left_pad",
    "read_trajectories",
    "summarize",
    "write_trajectories",
]
