"""Rollout driver: run token-level tool episodes with a policy, lock-step or continuous.

A :class:`Policy` is batched and token level: prompt token ids in, sampled token ids (and their logprobs) out.
Three are provided:

* :class:`TransformersPolicy`: a Hugging Face causal LM, generating in a worker thread (so tool I/O keeps running);
* :class:`OpenAIPolicy`: an OpenAI-compatible ``/v1/completions`` server that accepts token-id prompts and returns
  token ids + logprobs (what ``vllm serve`` exposes; also ``toolgym serve model``);
* :class:`ScriptedPolicy`: a function of the episode (task, turn, history) that writes the text of each turn,
  e.g. an oracle that solves the task by calling the tools (for RFT/SFT warm starts and benchmarks).

:class:`RolloutDriver` runs episodes on a :class:`toolgym.vector.ToolVectorEnv` with one of two schedules:

* ``"lockstep"``: generate one turn for every running episode in one policy call, step them all concurrently
  (all tool calls of the step run at once), repeat until every episode has ended. The number of policy calls
  per wave is the same on every rank when ``sync_fn`` is given, which distributed generation needs (vLLM server
  mode, ZeRO-3).
* ``"continuous"``: one coroutine per env slot; an episode asks for its next turn as soon as its tools answered,
  a finished slot immediately starts the next task, and concurrent requests are micro-batched for a batched
  policy. A finished or tool-waiting episode never holds a generation slot.

Trajectories are written as JSONL (one :meth:`Trajectory.to_dict` per line). This module never imports
``trainers/``, TRL or vLLM; torch and transformers are imported lazily inside :class:`TransformersPolicy`.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from toolgym import runtime
from toolgym.trajectory import Trajectory

__all__ = [
    "EpisodeState",
    "Generation",
    "GenerationRequest",
    "OpenAIPolicy",
    "Policy",
    "RolloutDriver",
    "RolloutStats",
    "ScriptedPolicy",
    "TransformersPolicy",
    "attach_logprobs",
    "flatten_logprobs",
    "read_trajectories",
    "summarize",
    "write_trajectories",
]

Schedule = Literal["lockstep", "continuous"]


# ---------------------------------------------------------------------------------------------------------------
# Policy protocol
# ---------------------------------------------------------------------------------------------------------------


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
    """

    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...] = ()
    episode: EpisodeState | None = None


@dataclass
class Generation:
    """A sampled turn.

    Attributes:
        token_ids: the sampled ids, ending with a stop id if the policy stopped by itself.
        logprobs: one float per sampled id (the sampling distribution's log-probability), or ``None``.
        finish_reason: ``"stop"`` (a stop id was sampled) or ``"length"`` (``max_new_tokens`` reached).
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@runtime_checkable
class Policy(Protocol):
    """A batched token-level policy: ``await policy.agenerate(requests)`` -> one :class:`Generation` per request.

    ``concurrent``: ``True`` if separate calls may overlap (a server that batches by itself); ``False`` if the
    policy runs one batch at a time (a local model), in which case the continuous schedule micro-batches
    concurrent requests into one call.
    """

    concurrent: bool

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]: ...


def _cut_at_stop(ids: Sequence[int], stop_ids: Iterable[int]) -> tuple[list[int], bool]:
    stops = set(stop_ids)
    for j, t in enumerate(ids):
        if t in stops:
            return [int(x) for x in ids[: j + 1]], True
    return [int(x) for x in ids], False


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


# ---------------------------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------------------------


class TransformersPolicy:
    """A Hugging Face causal LM as a batched policy.

    Generation runs in a worker thread (one batch at a time, ``concurrent = False``) so tool calls of other
    episodes keep running on the event loop. Prompts are left-padded; each row is cut after its first stop id.

    Args:
        model: a ``PreTrainedModel`` (causal LM) on any device.
        tokenizer: gives ``pad_token_id`` (else ``eos``); optional when the model config has a pad id.
        temperature: sampling temperature; ``0`` (or ``do_sample=False``) = greedy.
        top_p, top_k: nucleus / top-k sampling (``top_k=0`` disables it).
        do_sample: sample (default when ``temperature > 0``) or decode greedily.
        max_batch_size: split larger batches into chunks of this many rows (``None``: one call).
        return_logprobs: compute each sampled token's log-probability under the processed (temperature /
            top-p / top-k) distribution.
        seed: seeds torch's RNG before each call (reproducible sampling; ``None`` leaves it alone).
    """

    concurrent = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        do_sample: bool | None = None,
        max_batch_size: int | None = None,
        return_logprobs: bool = True,
        seed: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.do_sample = (temperature > 0) if do_sample is None else do_sample
        self.max_batch_size = max_batch_size
        self.return_logprobs = return_logprobs
        self.seed = seed
        self.calls = 0
        self._lock = threading.Lock()
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None:
            pad = getattr(model.config, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else model.config.eos_token_id
        if isinstance(pad, list):
            pad = pad[0]
        self.pad_token_id = int(pad if pad is not None else 0)

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        return await asyncio.to_thread(self.generate, requests)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Blocking :meth:`agenerate`."""
        if not requests:
            return []
        with self._lock:
            step = self.max_batch_size or len(requests)
            out: list[Generation] = []
            for k in range(0, len(requests), step):
                out.extend(self._generate_batch(requests[k : k + step]))
            return out

    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        self.calls += 1
        device = next(self.model.parameters()).device
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            if r.prompt_ids:
                ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
                attn[i, width - len(r.prompt_ids) :] = 1
        stop_ids = sorted({s for r in requests for s in r.stop_ids})
        max_new = max(1, max(r.max_new_tokens for r in requests))
        cfg: dict[str, Any] = {
            "max_new_tokens": max_new,
            "do_sample": self.do_sample,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": stop_ids or None,
            "return_dict_in_generate": True,
            "output_scores": self.return_logprobs,
        }
        if self.do_sample:
            cfg.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        gen_config = GenerationConfig(**cfg)
        if self.seed is not None:
            torch.manual_seed(self.seed + self.calls)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=gen_config
                )
        finally:
            if was_training:
                self.model.train()
        seqs = out.sequences[:, width:].cpu()
        lps = None
        if self.return_logprobs and out.scores:
            scores = torch.stack([s.float().cpu() for s in out.scores], dim=1)  # (B, T, V)
            logp = torch.log_softmax(scores, dim=-1)
            lps = logp.gather(-1, seqs[:, : scores.size(1)].unsqueeze(-1)).squeeze(-1)  # (B, T)
        gens: list[Generation] = []
        for i, r in enumerate(requests):
            row, stopped = _cut_at_stop(seqs[i].tolist(), r.stop_ids or stop_ids)
            if len(row) > r.max_new_tokens:
                row, stopped = row[: r.max_new_tokens], False
            lp = None
            if lps is not None:
                lp = [float(x) if math.isfinite(float(x)) else 0.0 for x in lps[i, : len(row)].tolist()]
            gens.append(Generation(row, lp, "stop" if stopped else "length"))
        return gens


class OpenAIPolicy:
    """An OpenAI-compatible ``/v1/completions`` endpoint as a policy (token ids in, token ids + logprobs out).

    Sends one request per turn with ``prompt`` = the token ids (vLLM and ``toolgym serve model`` accept token-id
    prompts), ``logprobs=1`` and vLLM's ``return_token_ids`` / ``return_tokens_as_token_ids`` / ``stop_token_ids``
    extensions, so no text is ever re-tokenised. Requests overlap (``concurrent = True``): the server batches.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"`` (``/v1`` is appended unless present).
        model: the served model name (``None``: the first of ``GET /v1/models``).
        temperature, top_p: sampling parameters.
        api_key: sent as a bearer token when given.
        max_concurrency: requests in flight at once.
        timeout_s: per-request timeout.
    """

    concurrent = True

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        api_key: str | None = None,
        max_concurrency: int = 256,
        timeout_s: float = 600.0,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.extra_body = dict(extra_body or {})
        self.calls = 0
        self._sem: dict[int, asyncio.Semaphore] = {}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _model_name(self, session: Any) -> str:
        if self.model is None:
            async with session.get(f"{self.base_url}/models", headers=self._headers()) as resp:
                resp.raise_for_status()
                data = await resp.json()
            self.model = data["data"][0]["id"]
        return self.model

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        import aiohttp

        loop_id = id(asyncio.get_running_loop())
        sem = self._sem.setdefault(loop_id, asyncio.Semaphore(self.max_concurrency))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            model = await self._model_name(session)

            async def one(r: GenerationRequest) -> Generation:
                async with sem:
                    return await self._complete(session, model, r)

            return list(await asyncio.gather(*(one(r) for r in requests)))

    async def _complete(self, session: Any, model: str, r: GenerationRequest) -> Generation:
        self.calls += 1
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(r.prompt_ids),
            "max_tokens": int(max(1, r.max_new_tokens)),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": 1,
            "stop_token_ids": list(r.stop_ids),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            **self.extra_body,
        }
        async with session.post(f"{self.base_url}/completions", json=body, headers=self._headers()) as resp:
            if resp.status >= 400:
                raise RuntimeError(f"completions request failed ({resp.status}): {(await resp.text())[:500]}")
            data = await resp.json()
        choice = data["choices"][0]
        lp_block = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            tokens = lp_block.get("tokens")
            if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise RuntimeError(
                    "the server returned no token ids: it needs vLLM's `return_token_ids` or "
                    "`return_tokens_as_token_ids` support (text is never re-tokenised)"
                )
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        ids = [int(t) for t in ids]
        logprobs = flatten_logprobs(lp_block.get("token_logprobs"))
        if logprobs is not None:
            logprobs = [0.0 if not math.isfinite(x) else x for x in logprobs][: len(ids)]
            if len(logprobs) != len(ids):
                logprobs = None
        ids_cut, stopped = _cut_at_stop(ids, r.stop_ids)
        if logprobs is not None:
            logprobs = logprobs[: len(ids_cut)]
        finish = "stop" if stopped else (choice.get("finish_reason") or "length")
        return Generation(ids_cut, logprobs, finish)


class ScriptedPolicy:
    """A policy that writes each turn's text with a function of the episode: oracles, baselines, benchmarks.

    Args:
        script: ``fn(state: EpisodeState) -> str``: the assistant text of turn ``state.turn`` (tool calls in the
            model's native format, e.g. ``env.format.parser.format_calls(...)``; the answer in ``<answer>``).
            It may return ``None`` to give an empty answer.
        end_turn: append the env's end-of-turn token (as a model that stopped by itself would).

    Encoding goes through ``env.encode_action`` (the env's own tokenizer), so the ids are what a model would
    have sampled to write that text. Logprobs are ``0.0`` (the script is deterministic).
    """

    concurrent = True

    def __init__(self, script: Callable[[EpisodeState], str | None], *, end_turn: bool = True) -> None:
        self.script = script
        self.end_turn = end_turn
        self.calls = 0

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls += 1
        out = []
        for r in requests:
            if r.episode is None or r.episode.env is None:
                raise ValueError("ScriptedPolicy needs requests from a RolloutDriver (episode state with its env)")
            text = self.script(r.episode) or ""
            ids = [int(t) for t in r.episode.env.encode_action(text, end_turn=self.end_turn)]
            finish = "stop"
            if len(ids) > r.max_new_tokens:
                ids, finish = ids[: r.max_new_tokens], "length"
            out.append(Generation(ids, [0.0] * len(ids), finish))
        return out


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------


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


def attach_logprobs(traj: Trajectory, turn_logprobs: Sequence[Sequence[float] | None]) -> None:
    """Fill ``traj.logprobs`` (one float per completion token, ``0.0`` on env tokens) from the per-turn sampled
    logprobs, walking ``loss_mask``: mask-1 tokens are exactly the sampled ones, in order (DESIGN invariant 1).
    Leaves ``None`` when any turn has no logprobs or the counts disagree."""
    if any(lp is None for lp in turn_logprobs):
        traj.logprobs = None
        return
    flat = [float(x) for lp in turn_logprobs for x in lp]  # type: ignore[union-attr]
    if sum(traj.loss_mask) != len(flat):
        traj.logprobs = None
        return
    it = iter(flat)
    traj.logprobs = [next(it) if m else 0.0 for m in traj.loss_mask]


class RolloutDriver:
    """Run episodes of a toolgym env with a :class:`Policy`.

    Args:
        env: a :class:`~toolgym.vector.ToolVectorEnv`, or an env id for ``gym.make_vec`` (then ``num_envs`` and
            ``env_kwargs`` build it; autoreset is disabled).
        policy: the policy.
        schedule: ``"lockstep"`` or ``"continuous"`` (see the module docstring).
        max_turn_tokens: the most tokens sampled per assistant turn.
        max_completion_tokens: the most completion tokens per episode (actions + observations); a turn never
            asks for more than what is left, and trainers can rely on ``len(completion_ids) <= this`` once
            :meth:`clip` has been applied (observations can overshoot; the env truncates the episode).
        sync_fn: lock-step only: ``fn(local_active_count) -> global_max_active_count``. With it the driver calls
            the policy once per turn until **every rank** is done (even with no local request), so collective
            generation backends see the same number of calls on each rank.
        num_envs, env_kwargs: used when ``env`` is an id.
    """

    def __init__(
        self,
        env: Any,
        policy: Policy,
        *,
        schedule: Schedule = "lockstep",
        max_turn_tokens: int = 256,
        max_completion_tokens: int | None = None,
        sync_fn: Callable[[int], int] | None = None,
        num_envs: int | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(env, str):
            import gymnasium as gym
            from gymnasium.vector import AutoresetMode

            import toolgym  # noqa: F401  (registers the envs)

            env = gym.make_vec(
                env, num_envs=num_envs or 1, autoreset_mode=AutoresetMode.DISABLED, **dict(env_kwargs or {})
            )
        if schedule not in ("lockstep", "continuous"):
            raise ValueError(f"schedule must be 'lockstep' or 'continuous', got {schedule!r}")
        if max_turn_tokens < 1:
            raise ValueError("max_turn_tokens must be >= 1")
        self.venv = env
        self.policy = policy
        self.schedule: Schedule = schedule
        self.max_turn_tokens = max_turn_tokens
        self.max_completion_tokens = max_completion_tokens
        self.sync_fn = sync_fn
        self.stats = RolloutStats()
        self._bar: Any = None
        self._on_episode: Callable[[int, Trajectory], None] | None = None
        self._t0 = self._refreshed = time.perf_counter()

    @property
    def num_envs(self) -> int:
        return int(self.venv.num_envs)

    def _sub(self, i: int) -> Any:
        return self.venv.envs[i].unwrapped

    def _budget(self, env: Any) -> int:
        traj: Trajectory = env.trajectory
        used = len(traj.completion_ids)
        left = self.max_turn_tokens
        if self.max_completion_tokens is not None:
            left = min(left, self.max_completion_tokens - used)
        left = min(left, int(env.max_episode_tokens) - len(traj.prompt_ids) - used)
        return max(0, left)  # 0: budget spent; the driver sends an empty action and the env closes the turn

    def _request(self, i: int, index: int, task: dict[str, Any]) -> GenerationRequest:
        env = self._sub(i)
        traj: Trajectory = env.trajectory
        return GenerationRequest(
            prompt_ids=list(traj.prompt_ids) + list(traj.completion_ids),
            max_new_tokens=self._budget(env),
            stop_ids=tuple(sorted(env.format.stop_ids)),
            episode=EpisodeState(index=index, task=task, turn=len(traj.turns), env=env),
        )

    async def _call_policy(self, reqs: list[GenerationRequest]) -> list[Generation]:
        """One policy call for ``reqs`` (requests with no budget left get an empty action without the policy;
        with ``sync_fn`` the call is made even when nothing is left to generate locally)."""
        todo = [r for r in reqs if r.max_new_tokens > 0]
        if not todo and reqs and self.sync_fn is None:
            return [Generation([], [], "length") for _ in reqs]
        t0 = time.perf_counter()
        got = await self.policy.agenerate(todo)
        self.stats.gen_s += time.perf_counter() - t0
        self.stats.policy_calls += 1
        self.stats.batch_sizes.append(len(todo))
        if len(got) != len(todo):
            raise RuntimeError(f"policy returned {len(got)} generations for {len(todo)} requests")
        it = iter(got)
        gens = [next(it) if r.max_new_tokens > 0 else Generation([], [], "length") for r in reqs]
        for r, g in zip(reqs, gens, strict=True):
            if len(g.token_ids) > r.max_new_tokens:  # enforce the budget whatever the policy did
                g.token_ids = g.token_ids[: r.max_new_tokens]
                if g.logprobs is not None:
                    g.logprobs = g.logprobs[: r.max_new_tokens]
            self.stats.generated_tokens += len(g.token_ids)
        return gens

    # -- public API -------------------------------------------------------------------------------
    def run(
        self, tasks: Sequence[Mapping[str, Any] | None], *, seeds: Sequence[int | None] | int | None = None,
        trajectory_path: str | Path | None = None, progress: bool = False,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Blocking :meth:`arun` (must not be called from a running event loop: ``await arun`` there)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(tasks, seeds=seeds, trajectory_path=trajectory_path, progress=progress,
                                         on_episode=on_episode))
        raise RuntimeError("RolloutDriver.run() called inside a running event loop; use `await driver.arun(...)`")

    async def arun(
        self, tasks: Sequence[Mapping[str, Any] | None], *, seeds: Sequence[int | None] | int | None = None,
        trajectory_path: str | Path | None = None, progress: bool = False,
        on_episode: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run one episode per task row (``None``: a task drawn from the seed) and return the trajectories in
        task order, each with ``logprobs`` filled when the policy gave them.

        Args:
            tasks: task rows (any number; more than ``num_envs`` run in waves or through the slots).
            seeds: one seed per task, or an int (task ``k`` gets ``seed + k``), or ``None``.
            trajectory_path: append the trajectories as JSONL to this file.
            progress: show a tqdm bar over episodes, with live turns, tool calls and generated tokens/s.
            on_episode: ``fn(task_index, trajectory)`` called as each episode ends (in completion order), e.g.
                to stream it to a file (``toolgym eval``).
        """
        rows = [None if t is None else dict(t) for t in tasks]
        if seeds is None or isinstance(seeds, int | np.integer):
            seed_list: list[int | None] = [None if seeds is None else int(seeds) + k for k in range(len(rows))]
        else:
            seed_list = list(seeds)
            if len(seed_list) != len(rows):
                raise ValueError(f"expected {len(rows)} seeds, got {len(seed_list)}")
        self.stats = RolloutStats()
        self._on_episode = on_episode
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(rows), desc=f"rollout ({self.schedule})", unit="ep")
        self._bar = bar
        t0 = self._t0 = time.perf_counter()
        try:
            if self.schedule == "lockstep":
                out = await self._lockstep(rows, seed_list, bar)
            else:
                out = await self._continuous(rows, seed_list, bar)
        finally:
            if bar is not None:
                bar.close()
        self.stats.wall_s = time.perf_counter() - t0
        self.stats.episodes = len(out)
        self.stats.turns = sum(len(t.turns) for t in out)
        if trajectory_path is not None:
            write_trajectories(trajectory_path, out, append=True)
        return out

    # -- lock-step --------------------------------------------------------------------------------
    async def _lockstep(
        self, rows: list[dict[str, Any] | None], seeds: list[int | None], bar: Any
    ) -> list[Trajectory]:
        n = self.num_envs
        out: list[Trajectory | None] = [None] * len(rows)
        waves = max(1, math.ceil(len(rows) / n)) if rows else 0
        if self.sync_fn is not None:  # every rank runs the same number of waves
            waves = self.sync_fn(waves)
        for w in range(waves):
            idx = list(range(w * n, min((w + 1) * n, len(rows))))
            mask = np.zeros(n, dtype=bool)
            mask[: len(idx)] = True
            wave_tasks = [rows[k] for k in idx] + [None] * (n - len(idx))
            wave_seeds = [seeds[k] for k in idx] + [None] * (n - len(idx))
            if idx:
                self.venv.reset(seed=wave_seeds, options={"tasks": wave_tasks, "reset_mask": mask})
            active = {j: idx[j] for j in range(len(idx))}  # sub-env -> episode index
            lps: dict[int, list[list[float] | None]] = {j: [] for j in active}
            while True:
                local = len(active)
                if self.sync_fn is not None:
                    if self.sync_fn(local) == 0:
                        break
                elif local == 0:
                    break
                order = sorted(active)
                reqs = [self._request(j, active[j], rows[active[j]] or self._sub(j).task) for j in order]
                gens = await self._call_policy(reqs)
                if not order:
                    continue
                actions: list[np.ndarray | None] = [None] * n
                for j, g in zip(order, gens, strict=True):
                    actions[j] = np.asarray(g.token_ids, dtype=np.int64)
                    lps[j].append(g.logprobs)
                _, _, terms, truncs, _ = await self.venv.astep(actions)
                for j in order:
                    self._stepped(self._sub(j).trajectory)
                    if terms[j] or truncs[j]:
                        traj = self._sub(j).trajectory
                        attach_logprobs(traj, lps[j])
                        k = active.pop(j)
                        out[k] = traj
                        self._finished(k, traj)
        return [t for t in out if t is not None]

    # -- continuous -------------------------------------------------------------------------------
    async def _continuous(
        self, rows: list[dict[str, Any] | None], seeds: list[int | None], bar: Any
    ) -> list[Trajectory]:
        if self.sync_fn is not None:
            raise ValueError("the continuous schedule cannot agree on call counts across ranks: use 'lockstep'")
        n = self.num_envs
        out: list[Trajectory | None] = [None] * len(rows)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for k in range(len(rows)):
            queue.put_nowait(k)
        batcher = None if getattr(self.policy, "concurrent", False) else _MicroBatcher(self)

        async def generate(req: GenerationRequest) -> Generation:
            if batcher is None:
                return (await self._call_policy([req]))[0]
            return await batcher.submit(req)

        async def slot(j: int) -> None:
            env = self._sub(j)
            while True:
                try:
                    k = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                mask = np.zeros(n, dtype=bool)
                mask[j] = True
                tasks = [None] * n
                tasks[j] = rows[k]
                sd: list[int | None] = [None] * n
                sd[j] = seeds[k]
                self.venv.reset(seed=sd, options={"tasks": tasks, "reset_mask": mask})
                lps: list[list[float] | None] = []
                while True:
                    g = await generate(self._request(j, k, rows[k] or env.task))
                    lps.append(g.logprobs)
                    _, _, te, tr, _ = await runtime.run_async(env.astep(np.asarray(g.token_ids, dtype=np.int64)))
                    self._stepped(env.trajectory)
                    if te or tr:
                        break
                traj = env.trajectory
                attach_logprobs(traj, lps)
                out[k] = traj
                self._finished(k, traj)

        workers = [asyncio.create_task(slot(j)) for j in range(min(n, len(rows)))]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            if batcher is not None:
                await batcher.close()
        return [t for t in out if t is not None]

    # -- progress and per-episode hooks ----------------------------------------------------------
    def _stepped(self, traj: Trajectory | None) -> None:
        """Live counters after one turn of one episode was stepped (the bar shows them before episodes end)."""
        self.stats.live_turns += 1
        if traj is not None and traj.turns:
            self.stats.tool_calls += len(traj.turns[-1].calls)
        bar = self._bar
        if bar is not None:
            now = time.perf_counter()
            bar.set_postfix(turns=self.stats.live_turns, calls=self.stats.tool_calls,
                            tok_s=f"{self.stats.generated_tokens / max(now - self._t0, 1e-9):.1f}", refresh=False)
            if now - self._refreshed >= 0.5:  # at most twice a second, even while no episode finishes
                self._refreshed = now
                bar.refresh()

    def _finished(self, k: int, traj: Trajectory) -> None:
        bar = self._bar
        if bar is not None:
            bar.update(1)
        cb = self._on_episode
        if cb is not None:
            cb(k, traj)

    # -- helpers for trainers ---------------------------------------------------------------------
    def clip(self, traj: Trajectory) -> Trajectory:
        """Cut ``completion_ids`` / ``loss_mask`` / ``logprobs`` to ``max_completion_tokens`` (the tail is env
        tokens or a cut turn; rewards were computed on the whole episode). Returns ``traj`` (mutated)."""
        m = self.max_completion_tokens
        if m is not None and len(traj.completion_ids) > m:
            traj.completion_ids = traj.completion_ids[:m]
            traj.loss_mask = traj.loss_mask[:m]
            if traj.logprobs is not None:
                traj.logprobs = traj.logprobs[:m]
        return traj


class _MicroBatcher:
    """Collects concurrent single-turn requests into one policy call whenever the policy is idle."""

    def __init__(self, driver: RolloutDriver) -> None:
        self.driver = driver
        self.pending: list[tuple[GenerationRequest, asyncio.Future[Generation]]] = []
        self.wake = asyncio.Event()
        self.task = asyncio.create_task(self._loop())

    async def submit(self, req: GenerationRequest) -> Generation:
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self.pending.append((req, fut))
        self.wake.set()
        return await fut

    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            await asyncio.sleep(0)  # let every coroutine that is ready this tick submit its request
            batch, self.pending = self.pending, []
            self.wake.clear()
            if not batch:
                continue
            try:
                gens = await self.driver._call_policy([r for r, _ in batch])
            except Exception as exc:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for (_, f), g in zip(batch, gens, strict=True):
                if not f.done():
                    f.set_result(g)

    async def close(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


# ---------------------------------------------------------------------------------------------------------------
# Trajectory files and summaries
# ---------------------------------------------------------------------------------------------------------------


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], *, append: bool = False) -> Path:
    """Write trajectories as JSONL (one ``Trajectory.to_dict()`` per line); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a" if append else "w", encoding="utf-8") as fh:
        for t in trajectories:
            fh.write(json.dumps(t.to_dict(), default=_json_default) + "\n")
    return p


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """The JSONL rows written by :func:`write_trajectories` (dicts, with ``prompt_ids``, ``completion_ids``,
    ``loss_mask``, ``reward``, ``task``, ...)."""
    from toolgym.data.jsonl import read_jsonl

    return read_jsonl(path)


def summarize(trajectories: Sequence[Trajectory], *, success_threshold: float = 1.0) -> dict[str, Any]:
    """Aggregate metrics: mean reward, success rate (``outcome_reward >= success_threshold``), tool-call rate
    (fraction of episodes with at least one call), calls per episode, error counts by kind, mean turns, and the
    fraction of episodes that ended truncated."""
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    errors: dict[str, int] = {}
    for t in trajectories:
        for k in t.error_kinds:
            errors[k] = errors.get(k, 0) + 1
    return {
        "episodes": n,
        "reward": float(np.mean([t.reward for t in trajectories])),
        "success": float(np.mean([t.outcome_reward >= success_threshold for t in trajectories])),
        "tool_call_rate": float(np.mean([t.num_tool_calls > 0 for t in trajectories])),
        "calls_per_episode": float(np.mean([t.num_tool_calls for t in trajectories])),
        "errors": errors,
        "turns": float(np.mean([len(t.turns) for t in trajectories])),
        "truncated": float(np.mean([t.truncated for t in trajectories])),
    }
