"""``LLMJudge``: a model-as-judge reward over OpenAI-compatible ``/v1/chat/completions`` endpoints.

Built for many judge servers (vLLM, ``toolgym serve model``, any OpenAI-compatible API):

* **Endpoints** — a list of base URLs (``http://host:8000`` or ``http://host:8000/v1``); each request goes to the
  endpoint with the fewest requests in flight (ties: round robin). An endpoint that refuses connections is
  marked down for ``down_cooldown_s`` and skipped while others are up.
* **Concurrency cap** — at most ``max_concurrency`` requests in flight across all endpoints.
* **Timeouts and retries** — each attempt has a total timeout of ``timeout_s``; timeouts, refused connections,
  HTTP 429 / 5xx and garbled responses are retried up to ``max_retries`` times, each retry on an endpoint not
  yet tried for this request when one is left (failover).
* **Prompt template** — ``str.format`` fields from the task row and the trajectory: every task key, plus
  ``question`` (the task's ``question`` / ``prompt``), ``prediction`` (``trajectory.answer``), ``response``
  (the final turn's content), ``reference`` (the gold answer(s), joined with `` | ``).
* **Score parser** — :func:`parse_score`: ``<score>7</score>``, ``[[7]]``, ``Score: 7/10``, ``Rating: 8 out of
  10``, a bare fraction or number; normalised to ``[0, 1]`` (see ``max_score``).
* **Cache** — successful scores are cached by the rendered request (messages + model + sampling settings); the
  same prompt in flight twice is sent once.

**Failures never crash the batch.** A judgement that fails gets ``failure_score`` (default **0.0**: an
answer the judge could not grade earns nothing — the conservative choice for RL, where a spurious high reward
is worse than a missed one) and the components ``<name>/failed = 1.0`` and ``<name>/error/<kind> = 1.0``, with
``kind`` one of :class:`JudgeErrorKind`, so trainers can filter or mask those samples (pass
``failure_score=float("nan")`` to mask them explicitly). Counts per kind are in :meth:`LLMJudge.metrics`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import string
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import aiohttp

from toolgym.rewards.base import Reward, Score
from toolgym.rewards.loop_clients import PerLoop, client_session
from toolgym.trajectory import Trajectory

__all__ = ["DEFAULT_JUDGE_PROMPT", "JudgeErrorKind", "JudgeResult", "LLMJudge", "parse_score"]

DEFAULT_JUDGE_PROMPT = """You are grading a model's answer to a question against the reference answer.

Question: {question}
Reference answer(s): {reference}
Model's answer: {prediction}

Decide whether the model's answer is correct and complete. Explain briefly, then end with a line of the form
"Score: N/10", where 10 means fully correct and 0 means wrong."""

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCORE_PATTERNS = [
    re.compile(rf"<score>\s*({_NUM})\s*(?:(?:/|out of)\s*({_NUM})\s*)?</score>", re.IGNORECASE),
    re.compile(rf"\[\[\s*({_NUM})\s*(?:/\s*({_NUM})\s*)?\]\]"),
    re.compile(
        rf"\b(?:score|rating|grade)\b\s*(?:is|=|:)?\s*[*_`\[(]*\s*({_NUM})\s*(?:(?:/|out of)\s*({_NUM}))?",
        re.IGNORECASE,
    ),
    re.compile(rf"({_NUM})\s*(?:/|out of)\s*({_NUM})"),
    re.compile(rf"^\s*[*_`\[(]*\s*({_NUM})\s*[*_`\])]*\.?\s*$"),
]


def parse_score(text: str, max_score: float | None = None) -> float | None:
    """A judge's score normalised to ``[0, 1]``, or ``None`` when the text states none.

    Patterns, by priority (within one pattern the **last** match wins: judges reason first, then score):
    ``<score>N</score>`` (or ``<score>N/M</score>``), ``[[N]]``, ``Score|Rating|Grade[:=is] N[/M | out of M]``,
    a bare ``N/M``, and a text that is just a number.

    Normalisation: an explicit denominator ``M`` gives ``N / M``; else ``N / max_score`` when ``max_score`` is
    given; else auto: ``N <= 1`` as is, ``N <= 10`` as ``N / 10``, ``N <= 100`` as ``N / 100``. Results are
    clipped to ``[0, 1]``; a zero denominator or a number out of every range gives ``None``.
    """
    if not text:
        return None
    for pattern in _SCORE_PATTERNS:
        matches = pattern.findall(text)
        if not matches:
            continue
        last = matches[-1]
        num, den = (last[0], last[1]) if isinstance(last, tuple) else (last, "")
        try:
            value = float(num)
            if den:
                d = float(den)
                if d <= 0:
                    return None
                value = value / d
            elif max_score is not None:
                value = value / float(max_score)
            elif value > 100:
                return None
            elif value > 10:
                value = value / 100
            elif value > 1:
                value = value / 10
        except (ValueError, ZeroDivisionError):
            return None
        return min(1.0, max(0.0, value))
    return None


class JudgeErrorKind(StrEnum):
    """Why a judgement failed. The value is the component / metric name."""

    TIMEOUT = "timeout"  #: no complete response within ``timeout_s`` (after retries)
    CONNECTION = "connection"  #: every endpoint tried refused or dropped the connection
    HTTP_ERROR = "http_error"  #: a non-200 status (4xx are not retried, 429/5xx are)
    BAD_RESPONSE = "bad_response"  #: a 200 whose body is not a chat completion
    PARSE_ERROR = "parse_error"  #: the judge answered but no score could be parsed
    TEMPLATE_ERROR = "template_error"  #: the prompt template names a field the task / trajectory lacks


@dataclass
class JudgeResult:
    """One judgement.

    Attributes:
        score: the normalised score in ``[0, 1]``; ``None`` when the judgement failed.
        text: the judge's reply ("" when none came back).
        error: the failure kind, ``None`` on success.
        message: a human-readable reason for a failure.
        endpoint: the base URL that answered (the last one tried on failure).
        attempts: HTTP attempts made (0 when served from cache or never sent).
        cached: served from the cache.
        latency_s: wall time of the whole judgement in seconds, retries included.
    """

    score: float | None
    text: str = ""
    error: JudgeErrorKind | None = None
    message: str = ""
    endpoint: str | None = None
    attempts: int = 0
    cached: bool = False
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _Endpoint:
    url: str  # base, without trailing /v1
    in_flight: int = 0
    down_until: float = 0.0
    requests: int = 0
    failures: dict[str, int] = field(default_factory=dict)


class _Retryable(Exception):
    def __init__(self, kind: JudgeErrorKind, message: str, *, down: bool = False) -> None:
        super().__init__(message)
        self.kind, self.message, self.down = kind, message, down


class _Fatal(_Retryable):
    pass


class _LoopState:
    """Loop-bound resources: an aiohttp session, the concurrency semaphore, in-flight request futures."""

    def __init__(self, max_concurrency: int, api_key: str | None) -> None:
        self.session: aiohttp.ClientSession = client_session(api_key, limit=max(max_concurrency, 1) * 2)
        self.sem = asyncio.Semaphore(max_concurrency)
        self.pending: dict[str, asyncio.Future[JudgeResult]] = {}


def _normalise_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _fmt_reference(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " | ".join(str(v) for v in value)
    return "" if value is None else str(value)


class LLMJudge(Reward):
    """Outcome reward from an LLM judge (see the module docstring for the behaviour in full).

    Args:
        endpoints: one base URL or a list (``http://127.0.0.1:8000`` or ``.../v1``).
        model: the ``model`` field sent (``None``: omitted; vLLM and ``toolgym serve model`` then use their one
            served model).
        prompt_template: the user message, a ``str.format`` template (fields: see the module docstring).
        system_prompt: an optional system message (also formatted).
        fields: ``fields(trajectory, task) -> dict`` replacing the default template fields.
        reference_field: task key(s) tried in order for ``{reference}``.
        parser: ``parser(text) -> float | None`` (default :func:`parse_score` with ``max_score``).
        max_score: the judge's scale for bare numbers (default 10, matching the default prompt).
        max_concurrency: cap on requests in flight across all endpoints.
        timeout_s: total time limit of one HTTP attempt, in seconds.
        max_retries: extra attempts after the first for retryable failures.
        retry_backoff_s: sleep before a retry (doubles each time), in seconds.
        down_cooldown_s: how long an endpoint that refused a connection is avoided, in seconds.
        failure_score: the reward of a failed judgement (default 0.0).
        cache: keep successful scores keyed by the rendered request; ``cache_size`` bounds it (LRU).
        temperature, max_tokens: sampling settings sent with every request.
        extra_body: extra JSON fields merged into every request (e.g. vLLM's ``allowed_token_ids``,
            ``stop``, ``chat_template_kwargs``).
        api_key: sent as ``Authorization: Bearer ...`` when given.
        name: the component name.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        model: str | None = None,
        *,
        prompt_template: str = DEFAULT_JUDGE_PROMPT,
        system_prompt: str | None = None,
        fields: Callable[[Trajectory, Mapping[str, Any]], Mapping[str, Any]] | None = None,
        reference_field: str | Sequence[str] = ("golden_answers", "reference", "answer", "gold"),
        parser: Callable[[str], float | None] | None = None,
        max_score: float | None = 10,
        max_concurrency: int = 16,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.05,
        down_cooldown_s: float = 5.0,
        failure_score: float = 0.0,
        cache: bool = True,
        cache_size: int = 100_000,
        temperature: float = 0.0,
        max_tokens: int = 512,
        extra_body: Mapping[str, Any] | None = None,
        api_key: str | None = None,
        name: str = "judge",
    ) -> None:
        urls = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not urls:
            raise ValueError("LLMJudge needs at least one endpoint")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.endpoints = [_Endpoint(_normalise_url(u)) for u in urls]
        self.model = model
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.fields_fn = fields
        self.reference_fields = [reference_field] if isinstance(reference_field, str) else list(reference_field)
        self.max_score = max_score
        self.parser = parser or (lambda text: parse_score(text, self.max_score))
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.down_cooldown_s = down_cooldown_s
        self.failure_score = failure_score
        self.cache_enabled = cache
        self.cache_size = cache_size
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self.api_key = api_key
        self.name = name
        self._cache: OrderedDict[str, JudgeResult] = OrderedDict()
        self._rr = itertools.count()
        self._clients: PerLoop[_LoopState] = PerLoop(lambda: _LoopState(self.max_concurrency, self.api_key))
        self.counts: dict[str, int] = {"judgements": 0, "cache_hits": 0, "http_attempts": 0, "failed": 0}
        self.failures: dict[str, int] = {}

    # ----------------------------------------------------------------------------------------------- prompt
    def template_fields(self, trajectory: Trajectory, task: Mapping[str, Any]) -> dict[str, Any]:
        """The ``str.format`` fields for one episode (override or pass ``fields=`` to change them)."""
        if self.fields_fn is not None:
            return dict(self.fields_fn(trajectory, task))
        out = dict(task)
        question = task.get("question", task.get("prompt"))
        if question is None:
            users = [m.get("content", "") for m in task.get("messages", []) if m.get("role") == "user"]
            question = users[-1] if users else ""
        reference = next((task[k] for k in self.reference_fields if k in task), "")
        out.update(
            question=question,
            prediction=trajectory.answer,
            response=trajectory.final_text,
            reference=_fmt_reference(reference),
        )
        return out

    def render(self, fields: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages for ``fields``; raises ``KeyError`` / ``ValueError`` on a bad template."""
        fmt = string.Formatter()
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": fmt.vformat(self.system_prompt, (), fields)})
        messages.append({"role": "user", "content": fmt.vformat(self.prompt_template, (), fields)})
        return messages

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": messages, "temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.model is not None:
            body["model"] = self.model
        body.update(self.extra_body)
        return body

    # ----------------------------------------------------------------------------------------------- reward
    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        try:
            messages = self.render(self.template_fields(trajectory, task))
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            result = JudgeResult(None, error=JudgeErrorKind.TEMPLATE_ERROR, message=f"prompt template: {e!r}")
            self._record_failure(result)
        else:
            result = await self.judge(messages)
        return self._finish(result)

    def _finish(self, result: JudgeResult) -> Score:
        if result.ok:
            assert result.score is not None
            return Score(float(result.score), {f"{self.name}/cached": float(result.cached)})
        assert result.error is not None
        return Score.failure(self.failure_score, self.name, result.error.value)

    # ----------------------------------------------------------------------------------------------- client
    def _loop_state(self) -> _LoopState:
        st = self._clients.get()
        return self._clients.renew() if st.session.closed else st

    def _key(self, body: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    async def judge(self, messages: list[dict[str, str]]) -> JudgeResult:
        """Judge already-rendered chat ``messages``: cache, de-duplication, cap, retries, failover, parsing."""
        body = self._body(messages)
        key = self._key(body)
        self.counts["judgements"] += 1
        if self.cache_enabled and key in self._cache:
            self._cache.move_to_end(key)
            self.counts["cache_hits"] += 1
            hit = self._cache[key]
            return JudgeResult(hit.score, hit.text, endpoint=hit.endpoint, cached=True)
        st = self._loop_state()
        pending = st.pending.get(key)
        if pending is not None:
            try:
                result = await asyncio.shield(pending)
                return JudgeResult(
                    result.score, result.text, result.error, result.message, result.endpoint, 0, True, 0.0
                )
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this caller was cancelled
                # the request we joined was cancelled by its owner: send our own below
        fut: asyncio.Future[JudgeResult] = asyncio.get_running_loop().create_future()
        st.pending[key] = fut
        try:
            result = await self._request(st, body)
            if result.ok and self.cache_enabled:
                self._cache[key] = result
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            if not result.ok:
                self._record_failure(result)
            fut.set_result(result)
            return result
        except BaseException:
            if not fut.done():
                fut.cancel()  # joined callers send their own request
            raise
        finally:
            st.pending.pop(key, None)

    def _record_failure(self, result: JudgeResult) -> None:
        assert result.error is not None
        self.counts["failed"] += 1
        self.failures[result.error.value] = self.failures.get(result.error.value, 0) + 1

    def _pick(self, tried: set[str]) -> _Endpoint:
        now = time.monotonic()
        fresh = [e for e in self.endpoints if e.url not in tried]
        up = [e for e in fresh if e.down_until <= now]
        pool = up or fresh or [e for e in self.endpoints if e.down_until <= now] or self.endpoints
        low = min(e.in_flight for e in pool)
        best = [e for e in pool if e.in_flight == low]
        return best[next(self._rr) % len(best)]

    async def _request(self, st: _LoopState, body: dict[str, Any]) -> JudgeResult:
        t0 = time.monotonic()
        tried: set[str] = set()
        last: _Retryable | None = None
        ep: _Endpoint | None = None
        attempts = 0
        async with st.sem:
            for attempt in range(self.max_retries + 1):
                if attempt and self.retry_backoff_s:
                    await asyncio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
                ep = self._pick(tried)
                tried.add(ep.url)
                attempts += 1
                self.counts["http_attempts"] += 1
                try:
                    text = await self._post(st, ep, body)
                except _Fatal as e:
                    last = e
                    ep.failures[e.kind.value] = ep.failures.get(e.kind.value, 0) + 1
                    break
                except _Retryable as e:
                    last = e
                    ep.failures[e.kind.value] = ep.failures.get(e.kind.value, 0) + 1
                    if e.down:
                        ep.down_until = time.monotonic() + self.down_cooldown_s
                    continue
                ep.down_until = 0.0
                score = self.parser(text)
                if score is None:
                    return JudgeResult(
                        None, text, JudgeErrorKind.PARSE_ERROR, f"no score in the judge's reply: {text[:200]!r}",
                        ep.url, attempts, False, time.monotonic() - t0,
                    )  # fmt: skip
                return JudgeResult(float(score), text, None, "", ep.url, attempts, False, time.monotonic() - t0)
        assert last is not None
        return JudgeResult(
            None, "", last.kind, last.message, ep.url if ep else None, attempts, False, time.monotonic() - t0
        )

    async def _post(self, st: _LoopState, ep: _Endpoint, body: dict[str, Any]) -> str:
        ep.in_flight += 1
        ep.requests += 1
        try:
            async with st.session.post(
                f"{ep.url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    msg = f"HTTP {resp.status} from {ep.url}: {raw[:300].decode(errors='replace')}"
                    if resp.status == 429 or resp.status >= 500:
                        raise _Retryable(JudgeErrorKind.HTTP_ERROR, msg)
                    raise _Fatal(JudgeErrorKind.HTTP_ERROR, msg)
            try:
                data = json.loads(raw)
                content = data["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise _Retryable(JudgeErrorKind.BAD_RESPONSE, f"not a chat completion from {ep.url}: {e!r}") from e
            return "" if content is None else str(content)
        except _Retryable:
            raise
        except TimeoutError as e:  # before ClientError: aiohttp's timeouts subclass both
            raise _Retryable(JudgeErrorKind.TIMEOUT, f"no response from {ep.url} within {self.timeout_s}s") from e
        except (aiohttp.ClientConnectionError, OSError) as e:
            refused = isinstance(e, (aiohttp.ClientConnectorError, ConnectionRefusedError))
            raise _Retryable(JudgeErrorKind.CONNECTION, f"{ep.url}: {e!r}", down=refused) from e
        except aiohttp.ClientError as e:
            raise _Retryable(JudgeErrorKind.BAD_RESPONSE, f"{ep.url}: {e!r}") from e
        except Exception as e:  # e.g. a closed session: classified, never a crash
            raise _Fatal(JudgeErrorKind.CONNECTION, f"{ep.url}: {e!r}") from e
        finally:
            ep.in_flight -= 1

    def metrics(self) -> dict[str, Any]:
        """Counters: judgements, cache hits, HTTP attempts, failures by kind, and per-endpoint load/failures."""
        return {
            **self.counts,
            "failures": dict(self.failures),
            "cache_entries": len(self._cache),
            "endpoints": {
                e.url: {"requests": e.requests, "in_flight": e.in_flight, "failures": dict(e.failures)}
                for e in self.endpoints
            },
        }

    async def aclose(self) -> None:
        """Close this loop's HTTP session (others close when their loop is garbage-collected)."""
        await self._clients.aclose()
