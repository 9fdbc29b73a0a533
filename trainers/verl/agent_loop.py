"""toolgym envs as a verl agent loop (verl 0.9.x, ``verl.experimental.agent_loop``): ``agent_name: toolgym``.

What verl does with it (read from verl 0.9.1's ``experimental/agent_loop/agent_loop.py`` and
``trainer/ppo/v1/agent_loop_tq.py``):

* An ``AgentLoopWorker`` (a Ray actor; several per node) instantiates the loop class registered under the row's
  ``agent_name`` once **per sample** (``hydra.utils.instantiate``; extra keys of the registry entry become keyword
  arguments) and awaits ``run(sampling_params, **row)``, where ``row`` is the dataset row's non-tensor fields
  (``raw_prompt``, ``extra_info``, ``index``, ``uid``, ...). Many samples run concurrently on the worker's event
  loop; generation goes through ``self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``
  (vLLM or SGLang servers, load-balanced, sticky per ``request_id``) and returns a ``TokenOutput`` (``token_ids``,
  ``log_probs``, ``extra_fields`` with the weights' ``global_steps``).
* ``run`` returns an ``AgentLoopOutput``: ``prompt_ids``, ``response_ids`` (every completion token, env output
  included), ``response_mask`` (1 = the policy sampled it), ``response_logprobs``, ``reward_score``, ...

What this loop does: it plays one toolgym episode with toolgym's own :class:`~toolgym.rollout.RolloutDriver` (a
one-env :class:`~toolgym.envs.vector.ToolVectorEnv` built with verl's tokenizer) and a :class:`VerlServerPolicy` that
generates each turn through the server manager. The env renders the prompt and every observation, so the tokens
verl trains on are exactly the episode's (no re-tokenisation; ``response_mask`` is the trajectory's loss mask).

**Rewards reach GAE per turn.** verl writes a scalar ``reward_score`` on the last response token, which in a
toolgym episode may be env output (a turn cut by its budget ends with a mask-0 end-of-turn token), where verl's
GAE ignores it. The loop returns a :class:`ToolgymAgentLoopOutput` carrying the per-token rewards of
:func:`trainers.verl.rewards.token_rewards` (each turn's reward on its last policy token), and they become verl's
``rm_scores`` (then ``token_level_scores`` / ``token_level_rewards``):

* verl's default (v1) trainer stores each output's :meth:`AgentLoopOutput.as_dict` (``AgentLoopWorkerTQ``):
  :meth:`ToolgymAgentLoopOutput.as_dict` writes the per-token ``rm_scores`` there; nothing else is needed;
* the legacy trainer (``trainer.use_v1=false``) pads outputs in ``AgentLoopWorker._postprocess``, which only knows
  the scalar: set ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
  trainers.verl.agent_loop.ToolgymAgentLoopManager`` (its worker, :class:`ToolgymAgentLoopWorker`, replaces that
  ``rm_scores`` with the per-token one).

``reward_score`` stays the episode's total (``Trajectory.reward``, the sum of the per-token rewards), so verl's
reward manager is skipped (it only scores outputs without one) and its metrics see the right total.

**Which env and task.** ``extra_info`` of the dataset row (see :func:`trainers.verl.launch.make_rows`):
``toolgym_env`` (an env id, e.g. ``"toolgym/CalculatorChain-v0"``), ``toolgym_task`` (the task row, a dict or
its JSON), ``toolgym_seed`` (an int; the task is drawn from it when no task is given), ``toolgym_env_kwargs``
(a dict or JSON of env keyword arguments), ``toolgym_max_turn_tokens`` (tokens per assistant turn; 0 = default). The registry entry can give defaults: ``env_id``, ``env_kwargs``,
``max_turn_tokens``. The env's prompt replaces the row's ``raw_prompt`` (kept by verl for logging only).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import uuid4

import torch
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    register,
)

from toolgym.rollout import Generation, GenerationRequest, RolloutDriver
from toolgym.trajectory import Trajectory
from trainers.verl.rewards import token_rewards

__all__ = [
    "AGENT_NAME",
    "ToolgymAgentLoop",
    "ToolgymAgentLoopManager",
    "ToolgymAgentLoopOutput",
    "ToolgymAgentLoopWorker",
    "VerlServerPolicy",
    "episode_output",
]

#: the ``agent_name`` this loop is registered under (the dataset rows' ``agent_name`` column)
AGENT_NAME = "toolgym"
#: the extra field that carries the per-token rewards through the legacy worker
TOKEN_REWARDS_FIELD = "toolgym_token_rewards"


class VerlServerPolicy:
    """A :class:`toolgym.rollout.Policy` that generates through a verl agent loop's ``server_manager``.

    Each request becomes one ``server_manager.generate`` call with the row's sampling parameters plus the turn's
    token budget (``max_tokens``) and the env's end-of-turn ids (``stop_token_ids``); the sampled ids go through
    :meth:`Generation.from_sampled`, the one post-processing every toolgym backend uses. All turns of an episode
    share one ``request_id`` (verl routes a request id to the same server: its prefix cache holds the episode).

    Attributes:
        calls: generate calls made; ``num_preempted``: the servers' preemption count (``-1`` when none reported);
        extra_fields: the first call's ``TokenOutput.extra_fields``, with ``max_global_steps`` from the last call
            (verl's staleness tags read ``min_global_steps``/``max_global_steps`` from them).
    """

    concurrent = True

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any], request_id: str | None = None) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id or uuid4().hex
        self.calls = 0
        self.num_preempted = -1
        self.extra_fields: dict[str, Any] = {}

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, req: GenerationRequest) -> Generation:
        params = dict(self.sampling_params)
        params["max_tokens"] = int(req.max_new_tokens)
        if req.stop_ids:
            params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or ()) | set(req.stop_ids))
        out = await self.server_manager.generate(
            request_id=self.request_id, prompt_ids=list(req.prompt_ids), sampling_params=params
        )
        self.calls += 1
        if out.num_preempted is not None:
            self.num_preempted = max(self.num_preempted, 0) + int(out.num_preempted)
        extra = dict(out.extra_fields or {})
        if not self.extra_fields:
            self.extra_fields = extra
        elif extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]
        return Generation.from_sampled(out.token_ids, out.log_probs or None, req.stop_ids, req.max_new_tokens)


class ToolgymAgentLoopOutput(AgentLoopOutput):
    """An ``AgentLoopOutput`` with one reward per response token (``token_rewards``), which :meth:`as_dict` (what
    verl's v1 worker stores) writes as ``rm_scores`` instead of verl's scalar-on-the-last-token."""

    token_rewards: list[float] | None = None
    """Per response token: each turn's reward on its last policy token, 0 elsewhere."""

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        rewards = out.pop("token_rewards", None)
        if rewards is not None:
            out["rm_scores"] = torch.tensor(rewards, dtype=torch.float32)
        return out


def _json_or(value: Any, default: Any) -> Any:
    """``value`` as a Python object: a JSON string is parsed, ``None`` or ``""`` gives ``default``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, str):
        return json.loads(value)
    return value


def episode_output(
    trajectory: Trajectory,
    *,
    response_length: int,
    with_logprobs: bool,
    metrics: Mapping[str, Any] | None = None,
    extra_fields: Mapping[str, Any] | None = None,
) -> ToolgymAgentLoopOutput:
    """The verl output of one finished (and clipped) toolgym episode.

    Args:
        trajectory: the episode; its completion must already fit ``response_length`` tokens.
        response_length: verl's ``rollout.response_length`` (checked).
        with_logprobs: return the sampled logprobs (0.0 on env tokens) as ``response_logprobs``.
        metrics: ``AgentLoopMetrics`` fields (seconds).
        extra_fields: copied into ``extra_fields`` (e.g. the server's ``global_steps``).
    """
    n = len(trajectory.completion_ids)
    if n > response_length:
        raise ValueError(f"episode has {n} completion tokens, more than rollout.response_length={response_length}")
    rewards = token_rewards(trajectory)
    logprobs = trajectory.logprobs if with_logprobs else None
    turns = trajectory.turns
    fields: dict[str, Any] = dict(extra_fields or {})
    fields.update({
        # ToolAgentLoop's schema: one score per assistant turn (here each turn's reward, outcome on the last)
        "turn_scores": [float(t.reward) for t in turns[:-1]] + (
            [float(turns[-1].reward) + float(trajectory.outcome_reward)] if turns else []),
        "tool_rewards": [],
        "toolgym_outcome": float(trajectory.outcome_reward),
        "toolgym_tool_calls": int(trajectory.num_tool_calls),
        "toolgym_errors": list(trajectory.error_kinds),
        "toolgym_truncated": bool(trajectory.truncated),
        "toolgym_task_id": str(trajectory.task.get("id", "")),
    })
    return ToolgymAgentLoopOutput(
        prompt_ids=[int(t) for t in trajectory.prompt_ids],
        response_ids=[int(t) for t in trajectory.completion_ids],
        response_mask=[int(m) for m in trajectory.loss_mask],
        response_logprobs=None if logprobs is None else [float(x) for x in logprobs],
        reward_score=float(sum(rewards)),
        # verl counts chat messages: the user's, each assistant turn, each tool answer
        num_turns=1 + len(turns) + sum(1 for t in turns if t.obs_end > t.obs_start),
        metrics=AgentLoopMetrics(**dict(metrics or {})),
        extra_fields=fields,
        token_rewards=rewards,
    )


@register(AGENT_NAME)
class ToolgymAgentLoop(AgentLoopBase):
    """One toolgym episode per verl sample (see the module docstring for the row fields and the rewards).

    Args (besides verl's): ``env_id``, ``env_kwargs`` (defaults for rows that name none), ``max_turn_tokens``
    (tokens sampled per assistant turn; default: the whole ``rollout.response_length``).
    """

    def __init__(
        self,
        *args: Any,
        env_id: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turn_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.response_length = int(self.rollout_config.response_length)
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.max_turn_tokens = int(max_turn_tokens) if max_turn_tokens else self.response_length

    def make_env(self, env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
        """A one-env :class:`~toolgym.envs.vector.ToolVectorEnv` for ``env_id`` with verl's tokenizer."""
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        import toolgym  # noqa: F401  (registers the envs)

        kwargs = dict(env_kwargs)
        kwargs.setdefault("tokenizer", self.tokenizer)
        return gym.make_vec(env_id, num_envs=1, autoreset_mode=AutoresetMode.DISABLED, **kwargs)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> ToolgymAgentLoopOutput:
        info = _json_or(kwargs.get("extra_info"), {})
        env_id = info.get("toolgym_env") or self.env_id
        if not env_id:
            raise ValueError("toolgym agent loop: no env: set extra_info.toolgym_env in the dataset rows "
                             "(trainers.verl.launch.make_rows) or env_id in the agent loop config")
        env_kwargs = {**self.env_kwargs, **_json_or(info.get("toolgym_env_kwargs"), {})}
        task = _json_or(info.get("toolgym_task"), None)
        seed = info.get("toolgym_seed")
        seed = None if seed is None else int(seed)
        turn_tokens = int(info.get("toolgym_max_turn_tokens") or 0) or self.max_turn_tokens
        policy = VerlServerPolicy(self.server_manager, sampling_params)
        t0 = time.perf_counter()
        venv = self.make_env(str(env_id), env_kwargs)
        try:
            driver = RolloutDriver(
                venv, policy, schedule="lockstep",
                max_turn_tokens=min(turn_tokens, self.response_length),
                max_completion_tokens=self.response_length,
            )
            traj = (await driver.arun([task], seeds=[seed]))[0]
        finally:
            venv.close()
        driver.clip(traj)
        if len(traj.prompt_ids) > self.prompt_length:
            raise ValueError(
                f"toolgym env {env_id!r} rendered a prompt of {len(traj.prompt_ids)} tokens, more than "
                f"rollout.prompt_length={self.prompt_length}: raise data.max_prompt_length (cutting the prompt "
                "would train on tokens the policy never saw)")
        wall = time.perf_counter() - t0
        metrics = {"generate_sequences": driver.stats.gen_s, "tool_calls": max(0.0, wall - driver.stats.gen_s),
                   "num_preempted": policy.num_preempted}
        return episode_output(traj, response_length=self.response_length,
                              with_logprobs=bool(sampling_params.get("logprobs")), metrics=metrics,
                              extra_fields=policy.extra_fields)


def token_reward_tensor(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """``(len(rows), width)`` float32: each row's per-token rewards, right-padded with 0 (verl's layout)."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        r = list(r)[:width]
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


class ToolgymAgentLoopWorker(AgentLoopWorker):
    """verl's ``AgentLoopWorker`` (legacy trainer path) whose batch ``rm_scores`` are the per-token rewards of
    toolgym outputs (every output of the batch must be one; otherwise verl's own ``rm_scores`` stay)."""

    async def _agent_loop_postprocess(self, output: Any, validate: Any, **kwargs: Any) -> Any:
        rewards = getattr(output, "token_rewards", None)
        if rewards is not None:
            output.extra_fields[TOKEN_REWARDS_FIELD] = list(rewards)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    def _postprocess(self, inputs: list[Any], input_non_tensor_batch: dict | None = None, validate: bool = False):
        out = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)
        rows = [i.extra_fields.get(TOKEN_REWARDS_FIELD) for i in inputs]
        if rows and all(r is not None for r in rows):
            out.batch["rm_scores"] = token_reward_tensor(rows, int(out.batch["responses"].shape[1]))
        out.non_tensor_batch.pop(TOKEN_REWARDS_FIELD, None)
        return out


class ToolgymAgentLoopManager(AgentLoopManager):
    """``AgentLoopManager`` whose Ray workers are :class:`ToolgymAgentLoopWorker` (legacy trainer only:
    ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=trainers.verl.agent_loop.ToolgymAgentLoopManager``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import ray

        self.agent_loop_workers_class = ray.remote(ToolgymAgentLoopWorker)
        super().__init__(*args, **kwargs)

