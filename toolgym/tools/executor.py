"""ToolExecutor: runs parsed tool calls concurrently, safely, and measurably.

One executor is shared by all episodes of a vector env. For each call it: answers parse errors and
unknown tools without running anything, validates arguments against the tool's JSON schema, waits for a
slot under the global and the per-tool concurrency caps, serves the cache if it can, runs the tool with a
timeout that cancels it, retries errors the tool marks retryable, and records the latency. Every call
returns exactly one :class:`ToolResult`; no exception escapes :meth:`ToolExecutor.run`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.images import DEFAULT_IMAGE_LIMITS, Image, ImageLimits, has_images, mixed_content
from toolgym.jsonl import iter_jsonl, write_jsonl
from toolgym.tools.base import (
    Tool,
    ToolCall,
    ToolError,
    ToolErrorKind,
    ToolResult,
    canonical_arguments,
    error_text,
    text_of,
)
from toolgym.tools.threads import ThreadLane
from toolgym.tools.validation import first_error, has_patterns, make_validator

__all__ = ["ExecutorMetrics", "ToolCache", "ToolExecutor", "safe_text"]


def safe_text(text: str) -> str:
    """``text`` made encodable as UTF-8: lone surrogates (e.g. a tool echoing ``"\\ud800"`` from JSON) become their
    escape ``\\ud800`` as text; anything else is returned unchanged (the common case costs one ``encode``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class ToolCache:
    """A cache of successful tool outputs keyed by ``(tool name, canonical JSON arguments)``.

    It doubles as a record/replay log (invariant 5 of docs/design.md) when given a JSONL ``path``:

    * ``ToolCache()`` — in-memory, read and write.
    * ``ToolCache(path, read=False)`` — **record**: run every call, append each output to ``path``.
    * ``ToolCache(path, write=False, strict=True)`` — **replay**: serve outputs from ``path``; a call that
      is not in the log fails with ``exception`` instead of running the tool.

    Each JSONL line is ``{"tool": name, "arguments": canonical_json, "content": text}``.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, read: bool = True, write: bool = True,
        strict: bool = False,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.read, self.write, self.strict = read, write, strict
        self._data: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        if self.path is not None and self.read and self.path.exists():
            for _, row in iter_jsonl(self.path):  # a log written elsewhere may carry "\ud800" escapes
                self._data[(row["tool"], row["arguments"])] = safe_text(row["content"])

    def get(self, name: str, arguments: dict[str, Any]) -> str | None:
        if not self.read:
            return None
        with self._lock:
            out = self._data.get((name, canonical_arguments(arguments)))
            if out is None:
                self.misses += 1
            else:
                self.hits += 1
            return out

    def put(self, name: str, arguments: dict[str, Any], content: str) -> None:
        if not self.write:
            return
        key = (name, canonical_arguments(arguments))
        with self._lock:
            self._data[key] = content
            if self.path is not None:
                write_jsonl(self.path, [{"tool": key[0], "arguments": key[1], "content": content}], append=True)

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class ExecutorMetrics:
    """Counters and latencies of an executor since creation (or the last :meth:`reset`).

    ``latencies_s[tool]`` holds one wall time (seconds) per executed call; ``errors[kind]`` counts results
    per :class:`ToolErrorKind` value; ``calls[tool]`` counts results per tool name (unknown names included).
    """

    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    cache_hits: int = 0
    latencies_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    in_flight: int = 0
    max_in_flight: int = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def summary(self) -> dict[str, Any]:
        """``{"calls", "errors", "retries", "cache_hits", "max_in_flight", "latency_ms": {tool: {p50, p99, mean, n}}}``."""
        lat = {}
        for name, xs in self.latencies_s.items():
            if xs:
                a = np.asarray(xs) * 1e3
                lat[name] = {
                    "p50": float(np.percentile(a, 50)),
                    "p99": float(np.percentile(a, 99)),
                    "mean": float(a.mean()),
                    "n": len(xs),
                }
        return {
            "calls": dict(self.calls),
            "errors": dict(self.errors),
            "retries": self.retries,
            "cache_hits": self.cache_hits,
            "max_in_flight": self.max_in_flight,
            "latency_ms": lat,
        }


class ToolExecutor:
    """Runs tool calls with concurrency caps, timeouts, validation, retries and an optional cache.

    Args:
        tools: the tools callable by name (later duplicates of a name are an error).
        max_concurrency: global cap on tool calls executing at once across all episodes.
        default_timeout_s: timeout for tools whose ``timeout_s`` is ``None``; the call is cancelled when it
            expires and answered with ``timeout``.
        max_retries: extra attempts for :class:`ToolError` with ``retryable=True`` (and for timeouts when
            ``retry_timeouts``).
        retry_backoff_s: first backoff; doubles per retry.
        cache: a :class:`ToolCache` (``None`` disables caching). Only ``cacheable`` tools use it.
        validate: validate arguments against each tool's JSON schema before running it.
        image_limits: what an image in a result may be (:class:`~toolgym.images.ImageLimits`); a result with a
            refused image is answered with ``invalid_image`` (its text and other images kept). Results with images
            are never cached.

    All methods are coroutines meant to run on one event loop (the toolgym runtime loop when used through
    the envs). The executor owns its tools: :meth:`aclose` closes them.
    """

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        max_concurrency: int = 512,
        default_timeout_s: float = 30.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.05,
        retry_timeouts: bool = False,
        cache: ToolCache | None = None,
        validate: bool = True,
        image_limits: ImageLimits | None = None,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        self.max_concurrency = max_concurrency
        self.default_timeout_s = default_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.retry_timeouts = retry_timeouts
        self.cache = cache
        self.validate = validate
        self.image_limits = image_limits if image_limits is not None else DEFAULT_IMAGE_LIMITS
        self.metrics = ExecutorMetrics()
        self._global: asyncio.Semaphore | None = None
        self._per_tool: dict[str, asyncio.Semaphore] = {}
        self._validators: dict[str, Any] = {}
        self._slow_schemas: set[str] = set()  # tools whose schemas have patterns: validated off the loop
        # validation with patterns and the text of non-str results run here, off the loop (daemon threads)
        self._lane = ThreadLane("executor", max_workers=8, max_abandoned=64)
        for t in tools:
            self.add(t)

    # -- registry ---------------------------------------------------------------------------------
    def add(self, tool: Tool) -> None:
        """Register ``tool`` under ``tool.name``; a name clash raises ``ValueError``."""
        if not tool.name:
            raise ValueError(f"{tool!r} has no name")
        if tool.name in self.tools and self.tools[tool.name] is not tool:
            raise ValueError(f"duplicate tool name {tool.name!r}")
        self.tools[tool.name] = tool
        if tool.parameters:
            import jsonschema

            try:
                self._validators[tool.name] = make_validator(tool.parameters)
            except jsonschema.SchemaError as e:
                where = "/".join(str(p) for p in e.absolute_path)
                raise ValueError(f"tool {tool.name!r}: its parameters are not a valid JSON Schema "
                                 f"({where + ': ' if where else ''}{e.message})") from None
            if has_patterns(tool.parameters):
                self._slow_schemas.add(tool.name)

    def schemas(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Chat-template tool specs of the registered tools (or of ``names``, in that order)."""
        return [self.tools[n].schema() for n in (names if names is not None else self.tools)]

    # -- running ----------------------------------------------------------------------------------
    async def run_many(self, calls: Sequence[ToolCall], tools: Mapping[str, Tool] | None = None, *,
                       in_order: bool = False) -> list[ToolResult]:
        """Run ``calls`` concurrently (``in_order``: one after another, in the order given, for tools whose calls
        change a shared state); results come back in the same order. ``tools``: see :meth:`run`."""
        if in_order:
            return [await self.run(c, tools) for c in calls]
        if len(calls) == 1:  # the common case: no extra task
            return [await self.run(calls[0], tools)]
        return list(await asyncio.gather(*(self.run(c, tools) for c in calls)))

    async def run(self, call: ToolCall, tools: Mapping[str, Tool] | None = None) -> ToolResult:
        """Run one call and classify any failure. Never raises (except ``CancelledError`` when the caller is
        cancelled). The result's content is always encodable text (see :func:`safe_text`).

        ``tools``: the tools ``call.name`` is looked up in instead of the registry (default: the registry): an
        episode's own tools, built per episode (e.g. BFCL's simulators, :mod:`toolgym.envs.bfcl.worker`). They run
        under the same caps, timeout, retries and metrics; their arguments are validated by the tool itself (no
        JSON-schema validator is built for them)."""
        try:
            result = await self._run(call, self.tools if tools is None else tools)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a bug of ours (or a cache/validator failure) is still an answer
            result = self._fail(call, ToolErrorKind.EXCEPTION, f"internal error: {type(e).__name__}: {e}")
        m = self.metrics
        m.calls[call.name or "<unparsed>"] += 1
        if result.error_kind is not None:
            m.errors[result.error_kind.value] += 1
        if result.cached:
            m.cache_hits += 1
        elif result.attempts:
            m.latencies_s[call.name].append(result.latency_s)
        return result

    def _fail(self, call: ToolCall, kind: ToolErrorKind, message: str, **kw: Any) -> ToolResult:
        # every error result is built here (a success's text is made safe in _run, a cache hit's at load)
        return ToolResult(call, safe_text(error_text(kind, message)), kind, **kw)

    async def _validate(self, call: ToolCall, tool: Tool, timeout: float) -> ToolResult | None:
        """The failed result of a call whose arguments break the tool's JSON schema, else ``None``."""
        if not self.validate or self.tools.get(call.name) is not tool or (v := self._validators.get(call.name)) is None:
            return None
        if call.name in self._slow_schemas:  # regular expressions: off the loop, under the call's timeout
            try:
                async with asyncio.timeout(timeout):
                    err = await self._lane.run(first_error, v, call.arguments)
            except TimeoutError:
                err = f"validating the arguments took longer than the timeout of {timeout:g} s"
            except ToolError as e:  # the validation threads are all stuck
                return self._fail(call, e.kind, e.message)
        else:
            err = first_error(v, call.arguments)
        return None if err is None else self._fail(call, ToolErrorKind.INVALID_ARGUMENTS, err)

    async def _run(self, call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
        if call.parse_error is not None:
            return self._fail(call, ToolErrorKind.PARSE_ERROR, call.parse_error)
        tool = tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(tools)) or "none"
            return self._fail(call, ToolErrorKind.UNKNOWN_TOOL, f"no tool named {call.name!r}; available: {names}")
        if not isinstance(call.arguments, dict):
            return self._fail(call, ToolErrorKind.INVALID_ARGUMENTS, "arguments must be a JSON object")
        timeout = tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s
        t0 = time.perf_counter()
        invalid = await self._validate(call, tool, timeout)
        if invalid is not None:
            return invalid
        if self.cache is not None and tool.cacheable:
            hit = self.cache.get(call.name, call.arguments)
            if hit is not None:
                return ToolResult(call, hit, cached=True)
            if self.cache.strict:
                return self._fail(call, ToolErrorKind.EXCEPTION, "call not found in the replay log")

        if self._global is None:
            self._global = asyncio.Semaphore(self.max_concurrency)
        per_tool = None
        if tool.max_concurrency is not None:
            per_tool = self._per_tool.get(call.name)
            if per_tool is None:
                per_tool = self._per_tool[call.name] = asyncio.Semaphore(tool.max_concurrency)

        attempts = 0
        while True:
            attempts += 1
            kind: ToolErrorKind | None
            retryable = False
            async with self._global:
                if per_tool is not None:
                    await per_tool.acquire()
                m = self.metrics
                m.in_flight += 1
                m.max_in_flight = max(m.max_in_flight, m.in_flight)
                task = asyncio.current_task()
                cancels = task.cancelling() if task is not None else 0
                try:
                    # a deadline on this task (no helper task, unlike ``wait_for`` before Python 3.12); on expiry
                    # the tool is cancelled and ``TimeoutError`` raised here
                    async with asyncio.timeout(timeout):
                        content = await tool.acall(call.arguments)
                    kind = None
                except TimeoutError:
                    kind, content = ToolErrorKind.TIMEOUT, f"tool {call.name!r} timed out after {timeout:g} s"
                    retryable = self.retry_timeouts
                except ToolError as e:
                    kind, content, retryable = e.kind, e.message, e.retryable
                except asyncio.CancelledError as e:
                    if task is None or task.cancelling() > cancels:  # a real cancellation of this call: obey it
                        raise
                    # raised by the tool itself (nobody cancelled this task): a failure like any other
                    kind, content = ToolErrorKind.EXCEPTION, f"CancelledError raised by the tool: {e}"
                except BaseException as e:  # noqa: BLE001 - any tool failure (SystemExit, KeyboardInterrupt
                    # from an argparse-style tool included) becomes an observation; it never reaches the loop
                    kind, content = ToolErrorKind.EXCEPTION, f"{type(e).__name__}: {e}"
                finally:
                    m.in_flight -= 1
                    if per_tool is not None:
                        per_tool.release()
            images: list[Image] = []
            if kind is None:
                kind, content, images = await self._text(call, content, timeout - (time.perf_counter() - t0))
            if kind is None:
                latency = time.perf_counter() - t0
                if self.cache is not None and tool.cacheable and not images:  # the cache holds text only
                    self.cache.put(call.name, call.arguments, content)
                return ToolResult(call, content, None, latency, attempts, images=images)
            if retryable and attempts <= self.max_retries:
                self.metrics.retries += 1
                await asyncio.sleep(self.retry_backoff_s * 2 ** (attempts - 1))
                continue
            return self._fail(call, kind, content, latency_s=time.perf_counter() - t0, attempts=attempts,
                              images=images)

    async def _text(self, call: ToolCall, content: Any, budget_s: float
                    ) -> tuple[ToolErrorKind | None, str, list[Image]]:
        """The result's text and images: a ``str`` at once (a subclass copied into a plain ``str``); a value with
        images (:func:`~toolgym.images.has_images`) checked against :attr:`image_limits`, each image shown as its
        placeholder (a refused one makes the result ``invalid_image``, its text and other images kept); anything else
        through ``str()``. Both in a worker thread, bounded by what is left of the call's timeout (a slow ``__str__``
        or a huge image costs that call a ``timeout``, never the loop)."""
        try:
            if isinstance(content, str):  # a subclass of str becomes a plain one here (none of its code runs)
                return None, safe_text(content if type(content) is str else str.__str__(content)), []
            async with asyncio.timeout(max(budget_s, 0.01)):
                out = await self._lane.run(_output, content, self.image_limits)
        except TimeoutError:
            return ToolErrorKind.TIMEOUT, f"tool {call.name!r}: turning its result into text took past its timeout", []
        except ToolError as e:
            return e.kind, e.message, []
        except Exception as e:  # noqa: BLE001 - a result whose str() raises
            return ToolErrorKind.EXCEPTION, f"unprintable result ({type(e).__name__}: {e})", []
        if isinstance(out, str):
            return None, safe_text(out), []
        if out.problems:
            why = "; ".join(out.problems)
            return ToolErrorKind.INVALID_IMAGE, safe_text(f"{why}\n{out.text}" if out.text else why), out.images
        return None, safe_text(out.text), out.images

    async def aclose(self) -> None:
        """Close every tool (errors while closing are swallowed: shutdown must not fail)."""
        for t in list(self.tools.values()):
            try:
                await t.aclose()
            except Exception:  # noqa: BLE001
                pass


def _output(content: Any, limits: ImageLimits) -> Any:
    """A tool's non-str return value as text, or as :class:`~toolgym.images.MixedContent` when it carries images."""
    return mixed_content(content, limits) if has_images(content) else text_of(content)
