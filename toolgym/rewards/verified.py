"""Tool-verified rewards: score an episode by running a verification (RL-Factory's ``verify_tool`` idea).

Typical use: execute the model's final SQL and the gold SQL with the same read-only tool and compare the
result sets; run a unit test on generated code; check a computed value with a calculator. The verification
is any function (sync or async) ``verify(prediction, task) -> float | bool``; :meth:`ToolVerified.compare_tool`
builds one from a :class:`~toolgym.tools.base.Tool` and a comparison of its outputs.

Failures never crash the batch: a verification that raises, times out, or raises a classified
:class:`~toolgym.tools.base.ToolError` scores ``failure_score`` (default 0.0 — an answer that cannot be
verified earns nothing) and the component ``<name>/error/<kind>`` is set to 1.0.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolgym.rewards.base import Reward, Score
from toolgym.tools.base import Tool, ToolError, ToolErrorKind
from toolgym.trajectory import Trajectory

__all__ = ["ToolVerified", "VerifyFn"]

VerifyFn = Callable[[Any, Mapping[str, Any]], "float | bool | Awaitable[float | bool]"]


class ToolVerified(Reward):
    """An outcome reward computed by a verification function.

    Args:
        verify: ``verify(prediction, task)`` (sync or async) -> a score (``bool`` -> 0/1). Sync functions run in
            a worker thread so they never block the event loop.
        name: the component name.
        prediction: how to read the prediction from a trajectory (default ``trajectory.answer``).
        timeout_s: wall-clock limit of one verification in seconds (``None``: no limit).
        failure_score: the score of a verification that failed (raised / timed out).
        max_concurrency: cap on verifications in flight across the batch (``None``: no cap).
    """

    def __init__(
        self,
        verify: VerifyFn,
        *,
        name: str = "verified",
        prediction: Callable[[Trajectory], Any] | None = None,
        timeout_s: float | None = 30.0,
        failure_score: float = 0.0,
        max_concurrency: int | None = None,
    ) -> None:
        self.verify = verify
        self.name = name
        self.prediction = prediction or (lambda t: t.answer)
        self.timeout_s = timeout_s
        self.failure_score = failure_score
        self.max_concurrency = max_concurrency
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self.failures: dict[str, int] = {}

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.max_concurrency is None:
            return None
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.max_concurrency), loop
        return self._sem

    async def _call(self, prediction: Any, task: Mapping[str, Any]) -> float:
        if inspect.iscoroutinefunction(self.verify) or inspect.iscoroutinefunction(
            getattr(self.verify, "__call__", None)  # noqa: B004 - async callable objects
        ):
            out = await self.verify(prediction, task)
        else:
            out = await asyncio.to_thread(self.verify, prediction, task)
            if inspect.isawaitable(out):
                out = await out
        return float(out)

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        return await self.check(self.prediction(trajectory), task)

    async def check(self, prediction: Any, task: Mapping[str, Any]) -> Score:
        """Verify one prediction directly (no trajectory needed): its :class:`Score`, with the component
        ``<name>/error/<kind> = 1`` when the verification itself failed."""
        sem = self._semaphore()
        kind: str | None = None
        try:
            if sem is not None:
                await sem.acquire()
            try:
                value = await asyncio.wait_for(self._call(prediction, task), self.timeout_s)
            finally:
                if sem is not None:
                    sem.release()
        except TimeoutError:
            kind = ToolErrorKind.TIMEOUT.value
        except ToolError as e:
            kind = e.kind.value
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken verification must not crash the batch
            kind = ToolErrorKind.EXCEPTION.value
        if kind is not None:
            self.failures[kind] = self.failures.get(kind, 0) + 1
            return Score(float(self.failure_score), {f"{self.name}/error/{kind}": 1.0})
        return Score(value)

    @classmethod
    def compare_tool(
        cls,
        tool: Tool,
        *,
        argument: str,
        gold_field: str,
        compare: Callable[[str, str, Mapping[str, Any]], float | bool] | None = None,
        extra_arguments: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> ToolVerified:
        """A verifier that runs ``tool`` on the prediction and on ``task[gold_field]`` and compares outputs.

        Args:
            tool: the tool to run (e.g. a read-only SQL executor). Its ``acall`` is awaited directly; a
                :class:`ToolError` it raises on the *prediction* (bad SQL) scores 0 without a failure
                component (a wrong answer, not a broken verifier); on the *gold* it is a verifier failure.
            argument: the tool argument that receives the prediction / gold (e.g. ``"query"``).
            gold_field: the task key holding the gold input (e.g. ``"gold_sql"``).
            compare: ``compare(pred_output, gold_output, task) -> score``; default: equal outputs -> 1.0.
            extra_arguments: other fixed tool arguments.
            kwargs: passed to :class:`ToolVerified` (``name``, ``timeout_s``, ...).
        """
        extra = dict(extra_arguments or {})
        cmp = compare or (lambda p, g, task: float(p == g))

        async def verify(prediction: Any, task: Mapping[str, Any]) -> float:
            gold_out = await tool.acall({**extra, argument: task[gold_field]})
            try:
                pred_out = await tool.acall({**extra, argument: prediction})
            except ToolError:
                return 0.0
            out = cmp(pred_out, gold_out, task)
            if inspect.isawaitable(out):
                out = await out
            return float(out)

        kwargs.setdefault("name", f"verified_{tool.name}")
        return cls(verify, **kwargs)
