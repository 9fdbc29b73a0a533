"""Rollout: run token-level tool episodes with a policy (``from toolgym.rollout import ...``).

* :mod:`toolgym.rollout.types`: the policy contract (:class:`Policy`, :class:`GenerationRequest`,
  :class:`Generation` with the one post-processing path :meth:`Generation.from_sampled`, the logprob meaning
  :data:`LogprobsMode`);
* :mod:`toolgym.rollout.policies`: :class:`TransformersPolicy`, :class:`OpenAIPolicy`, :class:`ScriptedPolicy`;
* :mod:`toolgym.rollout.vllm_engine`: :class:`VLLMEnginePolicy`, an in-process vLLM engine (text and images);
* :mod:`toolgym.rollout.driver`: :class:`RolloutDriver` (lock-step and continuous schedules);
* :mod:`toolgym.rollout.padding`: :func:`left_pad`, shared with ``toolgym serve model``;
* :mod:`toolgym.rollout.turn_cache`: :class:`TurnCache`, an episode's keys and values kept between its turns.

``read_trajectories``, ``write_trajectories`` and ``summarize`` are :mod:`toolgym.trajectory`'s (the one place that
owns trajectory files), re-exported here for existing imports.

This package never imports ``trainers/``, TRL or vLLM (the vLLM policy is handed an engine); torch and transformers are imported lazily.
"""

from toolgym.rollout import driver as _driver
from toolgym.rollout import padding as _padding
from toolgym.rollout import policies as _policies
from toolgym.rollout import turn_cache as _turn_cache
from toolgym.rollout import types as _types
from toolgym.rollout import vllm_engine as _vllm_engine
from toolgym.rollout.driver import *  # noqa: F403
from toolgym.rollout.padding import *  # noqa: F403
from toolgym.rollout.policies import *  # noqa: F403
from toolgym.rollout.turn_cache import *  # noqa: F403
from toolgym.rollout.types import *  # noqa: F403
from toolgym.rollout.vllm_engine import *  # noqa: F403
from toolgym.trajectory import read_trajectories as read_trajectories
from toolgym.trajectory import summarize as summarize
from toolgym.trajectory import write_trajectories as write_trajectories

__all__ = sorted({*_driver.__all__, *_padding.__all__, *_policies.__all__, *_turn_cache.__all__, *_types.__all__,
                  *_vllm_engine.__all__, "read_trajectories", "summarize", "write_trajectories"})
