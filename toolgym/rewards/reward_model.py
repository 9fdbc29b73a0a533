"""``RewardModelReward``: a learned reward model (a sequence classifier with one output) as a toolgym reward.

The model scores token ids: the episode's ``prompt_ids + completion_ids`` for the outcome, the prefix up to the
end of a turn for the per-turn (process) reward. The ids go to the model as they are, so the reward model must
share the policy's tokenizer (it does when it was trained with ``trainers/reward_model.py`` on the same env).

Two backends, chosen by ``path_or_url``:

* **local** (a directory or hub id already on disk): ``transformers.AutoModelForSequenceClassification``,
  imported and loaded lazily on first use, run in a worker thread (one forward per micro-batch, so the event
  loop keeps serving tool calls).
* **remote** (``http://`` / ``https://``): vLLM's ``POST /classify`` (``{"model", "input": [[ids...], ...]}`` ->
  ``data[i].probs``; one request per micro-batch; a reward model with one label gets ``sigmoid(logit)`` there)
  or ``POST /pooling`` (``data[i].data``: the head's raw output, squashed with ``activation``). Serve a
  trained model with e.g. ``vllm serve runs/rm --runner pooling --convert classify``.

**Batched**: concurrent ``outcome`` / ``turn`` calls (a vector env scores its whole batch concurrently) are
gathered into micro-batches of at most ``batch_size`` sequences by :class:`toolgym.batching.MicroBatcher` (one
batch at a time per event loop).

**Hardening, as in** :class:`~toolgym.rewards.judge.LLMJudge`: every request has a total timeout (``timeout_s``);
a timeout, a refused connection, an HTTP error, a body that is not the expected JSON, a missing/non-finite score,
or a local model that fails to load or run each cost the affected episodes ``failure_score`` (default 0.0) with
the components ``<name>/failed = 1`` and ``<name>/error/<kind> = 1`` (:class:`RewardModelErrorKind`); counts per
kind are in :meth:`RewardModelReward.metrics`. Nothing is raised into the env or the batch.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from toolgym.batching import MicroBatcher
from toolgym.rewards.base import Reward, Score
from toolgym.rewards.loop_clients import PerLoop, client_session
from toolgym.trajectory import Trajectory, Turn

__all__ = ["RewardModelError", "RewardModelErrorKind", "RewardModelReward"]


class RewardModelErrorKind(StrEnum):
    """Why a reward-model score failed. The value is the component / metric name."""

    TIMEOUT = "timeout"  #: no answer within ``timeout_s``
    CONNECTION = "connection"  #: the endpoint refused or dropped the connection
    HTTP_ERROR = "http_error"  #: a non-200 status
    BAD_RESPONSE = "bad_response"  #: a 200 whose body is not the API's JSON, or a score that is not a finite number
    MODEL_ERROR = "model_error"  #: the local model failed to load or to run


class RewardModelError(Exception):
    """A classified reward-model failure (``kind``: :class:`RewardModelErrorKind`)."""

    def __init__(self, kind: RewardModelErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass
class _LoopState:
    batcher: MicroBatcher[list[int], float]
    session: aiohttp.ClientSession | None = None


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class RewardModelReward(Reward):
    """Outcome and/or per-turn reward from a sequence-classification reward model (see the module docstring).

    Args:
        path_or_url: a local model directory / hub id, or an ``http(s)://`` base URL of a vLLM server.
        model: the ``model`` field sent to a server (``None``: omitted; vLLM then uses its one served model).
        outcome: score the finished episode (:meth:`outcome`); ``False`` makes :meth:`outcome` return 0.
        per_turn: also score every turn (:meth:`turn`): the prefix ``prompt + completion[:end of the turn]``.
        api: ``"classify"`` (vLLM ``/classify``) or ``"pooling"`` (vLLM ``/pooling``); remote only.
        activation: ``"sigmoid"`` (scores in ``[0, 1]``, default) or ``"none"`` (the raw logit) for the local
            model and ``/pooling``; ``/classify`` already returns probabilities.
        label_index: which output to read when the head has several (default: the last).
        max_length: keep at most this many tokens, from the end (the end of an episode carries the answer).
        batch_size: most sequences per forward / request.
        timeout_s: total time limit of one forward or HTTP request, in seconds.
        failure_score: the reward of a failed score (default 0.0: a spurious high reward is worse than a missed one).
        device, dtype, threads: local model placement, weights dtype (e.g. ``"bfloat16"``) and torch threads.
        api_key: sent as ``Authorization: Bearer ...`` to a server.
        name: the component name.
    """

    def __init__(
        self,
        path_or_url: str,
        *,
        model: str | None = None,
        outcome: bool = True,
        per_turn: bool = False,
        api: str = "classify",
        activation: str = "sigmoid",
        label_index: int = -1,
        max_length: int | None = None,
        batch_size: int = 16,
        timeout_s: float = 30.0,
        failure_score: float = 0.0,
        device: str | None = None,
        dtype: str | None = None,
        threads: int | None = None,
        api_key: str | None = None,
        name: str = "reward_model",
    ) -> None:
        if api not in ("classify", "pooling"):
            raise ValueError(f"api must be 'classify' or 'pooling', got {api!r}")
        if activation not in ("sigmoid", "none"):
            raise ValueError(f"activation must be 'sigmoid' or 'none', got {activation!r}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.target = str(path_or_url)
        self.remote = self.target.startswith(("http://", "https://"))
        self.base_url = self.target.rstrip("/").removesuffix("/v1") if self.remote else None
        self.model_name = model
        self.score_outcome = outcome
        self.per_turn = per_turn
        self.api = api
        self.activation = activation
        self.label_index = label_index
        self.max_length = max_length
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.failure_score = failure_score
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.api_key = api_key
        self.name = name
        self._model: Any = None
        self._load_error: RewardModelError | None = None
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._clients: PerLoop[_LoopState] = PerLoop(
            lambda: _LoopState(MicroBatcher(self._batch, max_batch=self.batch_size))
        )
        self.counts: dict[str, int] = {"scored": 0, "batches": 0, "failed": 0}
        self.failures: dict[str, int] = {}

    # ----------------------------------------------------------------------------------------------- reward
    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if not self.score_outcome:
            return Score(0.0)
        return await self._scored(list(trajectory.prompt_ids) + list(trajectory.completion_ids))

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if not self.per_turn:
            return Score(0.0)
        end = min(len(trajectory.completion_ids), max(turn.action_end, turn.obs_end))
        return await self._scored(list(trajectory.prompt_ids) + list(trajectory.completion_ids[:end]))

    async def _scored(self, ids: list[int]) -> Score:
        try:
            value = await self.score_ids(ids)
        except RewardModelError as e:
            return Score.failure(self.failure_score, self.name, e.kind.value)
        return Score(value)

    async def score_ids(self, ids: Sequence[int]) -> float:
        """The score of one token sequence (joins the current micro-batch); raises :class:`RewardModelError`."""
        if self.max_length is not None and len(ids) > self.max_length:
            ids = ids[len(ids) - self.max_length:]
        return await self._clients.get().batcher.submit([int(x) for x in ids])

    async def score_many(self, sequences: Sequence[Sequence[int]]) -> list[float | RewardModelError]:
        """Scores of many sequences (batched); a failed one is its :class:`RewardModelError`, not raised."""
        out = await asyncio.gather(*(self.score_ids(s) for s in sequences), return_exceptions=True)
        return [o if isinstance(o, float | RewardModelError) else RewardModelError(
            RewardModelErrorKind.MODEL_ERROR, repr(o)) for o in out]

    # ----------------------------------------------------------------------------------------------- batching
    async def _batch(self, seqs: list[list[int]]) -> list[float | RewardModelError]:
        """One micro-batch (the batcher's ``fn``): a score or a classified :class:`RewardModelError` per sequence,
        never raised."""
        self.counts["batches"] += 1
        try:
            scores = await asyncio.wait_for(self._run(seqs, self._clients.get()), self.timeout_s)
            if len(scores) != len(seqs):
                raise RewardModelError(RewardModelErrorKind.BAD_RESPONSE, f"{len(scores)} scores for {len(seqs)} inputs")
        except RewardModelError as e:
            return [self._failed(e) for _ in seqs]
        except TimeoutError:
            err = RewardModelError(RewardModelErrorKind.TIMEOUT, f"no score from {self.target} within {self.timeout_s}s")
            return [self._failed(err) for _ in seqs]
        except Exception as e:  # noqa: BLE001 - classified, never raised into the env
            err = RewardModelError(RewardModelErrorKind.MODEL_ERROR, f"{self.target}: {e!r}")
            return [self._failed(err) for _ in seqs]
        out: list[float | RewardModelError] = []
        for s in scores:
            if isinstance(s, int | float) and math.isfinite(s):
                self.counts["scored"] += 1
                out.append(float(s))
            else:
                out.append(self._failed(RewardModelError(RewardModelErrorKind.BAD_RESPONSE, f"not a finite score: {s!r}")))
        return out

    def _failed(self, err: RewardModelError) -> RewardModelError:
        self.counts["failed"] += 1
        self.failures[err.kind.value] = self.failures.get(err.kind.value, 0) + 1
        return err

    async def _run(self, seqs: list[list[int]], st: _LoopState) -> list[float]:
        if self.remote:
            return await self._post(seqs, st)
        return await asyncio.to_thread(self._forward, seqs)

    # ----------------------------------------------------------------------------------------------- local
    def _load(self) -> Any:
        with self._load_lock:
            if self._model is not None:
                return self._model
            if self._load_error is not None:
                raise self._load_error
            try:
                import torch
                from transformers import AutoModelForSequenceClassification

                kw: dict[str, Any] = {}
                if self.dtype is not None:
                    kw["dtype"] = getattr(torch, self.dtype)
                model = AutoModelForSequenceClassification.from_pretrained(self.target, **kw)
                if self.device is not None:
                    model = model.to(self.device)
                self._model = model.eval()
            except Exception as e:  # noqa: BLE001 - a missing/broken model is a classified failure
                self._load_error = RewardModelError(RewardModelErrorKind.MODEL_ERROR,
                                                    f"cannot load reward model {self.target!r}: {e!r}")
                raise self._load_error from e
            return self._model

    def _forward(self, seqs: list[list[int]]) -> list[float]:
        import torch

        model = self._load()
        pad = model.config.pad_token_id
        if pad is None:
            raise RewardModelError(RewardModelErrorKind.MODEL_ERROR,
                                   "the reward model's config has no pad_token_id (needed to find each last token)")
        with self._run_lock:
            if self.threads:
                torch.set_num_threads(self.threads)
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), int(pad), dtype=torch.long)
            attn = torch.zeros((len(seqs), width), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
                attn[i, : len(s)] = 1
            dev = next(model.parameters()).device
            with torch.no_grad():
                logits = model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits.float().cpu()
        return [self._squash(x) for x in logits[:, self.label_index].tolist()]

    def _squash(self, x: float) -> float:
        """A raw head output through ``activation`` (a non-finite one is left for the caller to reject)."""
        return _sigmoid(x) if self.activation == "sigmoid" and math.isfinite(x) else x

    # ----------------------------------------------------------------------------------------------- remote
    async def _post(self, seqs: list[list[int]], st: _LoopState) -> list[float]:
        if st.session is None or st.session.closed:
            st.session = client_session(self.api_key)
        body: dict[str, Any] = {"input": seqs}
        if self.model_name is not None:
            body["model"] = self.model_name
        url = f"{self.base_url}/{self.api}"
        try:
            async with st.session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise RewardModelError(RewardModelErrorKind.HTTP_ERROR,
                                           f"HTTP {resp.status} from {url}: {raw[:300].decode(errors='replace')}")
        except RewardModelError:
            raise
        except TimeoutError as e:  # before ClientError: aiohttp's timeouts subclass both
            raise RewardModelError(RewardModelErrorKind.TIMEOUT, f"no response from {url} within {self.timeout_s}s") from e
        except (aiohttp.ClientConnectionError, OSError) as e:
            raise RewardModelError(RewardModelErrorKind.CONNECTION, f"{url}: {e!r}") from e
        except aiohttp.ClientError as e:
            raise RewardModelError(RewardModelErrorKind.BAD_RESPONSE, f"{url}: {e!r}") from e
        return self._parse(raw, len(seqs), url)

    def _parse(self, raw: bytes, n: int, url: str) -> list[float]:
        try:
            data = sorted(json.loads(raw)["data"], key=lambda d: d.get("index", 0))
            if len(data) != n:
                raise ValueError(f"{len(data)} results for {n} inputs")
            out = []
            for d in data:
                if self.api == "classify":
                    out.append(float(d["probs"][self.label_index]))
                else:
                    v = d["data"]
                    while isinstance(v, list):  # [x], [[x]] or per-label lists: take the chosen label
                        v = v[self.label_index]
                    out.append(self._squash(float(v)))
            return out
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise RewardModelError(RewardModelErrorKind.BAD_RESPONSE,
                                   f"not a /{self.api} response from {url}: {e!r}; body {raw[:200]!r}") from e

    # ----------------------------------------------------------------------------------------------- misc
    def metrics(self) -> dict[str, Any]:
        """Counters: sequences scored, micro-batches, failures (total and by kind)."""
        return {**self.counts, "failures": dict(self.failures)}

    async def aclose(self) -> None:
        """Close this loop's HTTP session."""
        await self._clients.aclose()
