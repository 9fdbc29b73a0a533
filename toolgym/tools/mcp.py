"""MCP toolsets: every tool of the MCP servers in a standard ``{"mcpServers": {...}}`` config as toolgym tools.

Built on the official ``mcp`` SDK 2.x (:class:`mcp.Client`). One :class:`MCPServerConnection` (one MCP
session, one server process for stdio) per server is shared by every episode that uses the toolset, with any
number of requests in flight on it.

Config (JSON, or the Python-literal ``.pydata`` form RL-Factory uses, parsed with :func:`ast.literal_eval`)::

    {"mcpServers": {
        "sqlite": {"command": "uvx", "args": ["mcp-server-sqlite", "--db-path", "x.db"], "env": {"K": "v"}},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}
    }}

Per-server keys: ``command``/``args``/``env``/``cwd`` (stdio) or ``url``/``headers`` (streamable HTTP), and
the optional toolgym keys ``timeout`` (per-call seconds), ``max_concurrency`` (requests in flight on that
session), ``include``/``exclude`` (tool names), ``cacheable`` (allow the executor's cache; default false),
``stderr`` (``"inherit"``, ``"devnull"`` or a file path for a stdio server's stderr), ``disabled``,
``idempotent`` (``true``, ``false`` or a list of tool names: calls that may be re-sent after the connection died
mid-call; default: the tools whose MCP annotations say ``readOnlyHint`` or ``idempotentHint``) and
``restart_after_timeouts`` (a stdio server whose calls time out this many times in a row, with no answer between,
is restarted as hung; default 3, ``0`` never).
A top-level list of such dicts (RL-Factory's form) is merged. A leading ``~`` in ``command`` is expanded. ``env`` is merged over the SDK's safe default
environment (``HOME``, ``PATH``, ...), not over the whole parent environment.

Tool names: a tool keeps its server-side name unless another server exposes the same name; then every
tool with that name becomes ``<server>__<tool>`` (``prefix="auto"``, the default). ``prefix="always"``
prefixes every tool, ``prefix="never"`` raises on a clash.

Errors (each becomes a classified observation through the executor):

* ``isError`` results -> :class:`ToolError` of kind ``exception`` with the server's text;
* a JSON-RPC ``invalid params`` error -> ``invalid_arguments``;
* arguments the transport cannot encode (a lone surrogate, NaN) -> ``invalid_arguments`` before anything is sent,
  so one bad call never reaches (and never breaks) the session other episodes share;
* the server cannot be reached -> a ``retryable`` :class:`ToolError` (the call was never sent; the executor
  retries); the connection or the server process dies while a call is in flight -> ``exception``, retryable
  only for tools marked idempotent (annotation or config): a call that may have run is never re-sent by default.
  The dead session is closed (its process reaped) and the next call starts a new one, with exponential
  backoff between failed (re)connects;
* a stdio server that stops answering (hung, not dead): after ``restart_after_timeouts`` consecutive calls cancelled
  without an answer (timeouts), its process is killed and the next call starts a new one;
* the executor's per-call timeout cancels the pending request: the SDK sends ``notifications/cancelled``
  and the session stays usable.

All sessions live on the toolgym runtime loop (:mod:`toolgym.runtime`): each is owned by one long-lived
task there (anyio task groups must be entered and exited in the same task); calls from any loop or thread
are routed to it.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import weakref
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolgym.errors import InputFileError
from toolgym.runtime import in_runtime, run_async, run_sync
from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = [
    "MCPServerConfig",
    "MCPServerConnection",
    "MCPTool",
    "MCPToolset",
    "assign_tool_names",
    "load_mcp_config",
    "load_mcp_tools",
]

logger = logging.getLogger(__name__)

PREFIX_SEPARATOR = "__"
ERROR_KIND_META = "toolgym/error_kind"  # same key as toolgym.serve.mcp.ERROR_KIND_META
_CONFIG_KEYS = {
    "command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout", "max_concurrency",
    "include", "exclude", "cacheable", "stderr", "disabled", "description", "idempotent", "restart_after_timeouts",
}  # fmt: skip
DEFAULT_RESTART_AFTER_TIMEOUTS = 3


# ------------------------------------------------------------------------------------------------
# config
# ------------------------------------------------------------------------------------------------
@dataclass
class MCPServerConfig:
    """One entry of ``mcpServers``.

    Attributes:
        name: the key in ``mcpServers`` (used as the tool-name prefix on clashes).
        command, args, env, cwd: how to start a stdio server.
        url, headers: a streamable-HTTP server's endpoint (e.g. ``http://host:8000/mcp``) and extra headers.
        timeout_s: per-call timeout in seconds for this server's tools (``None``: the executor's default).
        max_concurrency: cap on requests in flight on this server's session (``None``: unlimited).
        include, exclude: keep only / drop these tool names (server-side names).
        cacheable: whether the executor may cache this server's results (default ``False``: tools may have
            side effects).
        stderr: where a stdio server's stderr goes: ``"inherit"``, ``"devnull"`` or a file path.
        idempotent: which tools' calls may be re-sent after the connection died mid-call: ``True`` (all),
            ``False`` (none), a list of server-side tool names, or ``None`` (default: the tools annotated
            ``readOnlyHint`` or ``idempotentHint``).
        restart_after_timeouts: restart a stdio server after this many consecutive calls cancelled without an
            answer (``0``: never). HTTP servers are not restarted (toolgym does not own their process).
    """

    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    timeout_s: float | None = None
    max_concurrency: int | None = None
    include: list[str] | None = None
    exclude: list[str] | None = None
    cacheable: bool = False
    stderr: str = "inherit"
    idempotent: bool | list[str] | None = None
    restart_after_timeouts: int = DEFAULT_RESTART_AFTER_TIMEOUTS

    @property
    def transport(self) -> Literal["stdio", "streamable-http"]:
        return "stdio" if self.command is not None else "streamable-http"

    @classmethod
    def from_dict(cls, name: str, spec: Mapping[str, Any]) -> MCPServerConfig:
        """Validate one ``mcpServers`` entry; raise ``ValueError`` with the server name on bad input."""
        if not isinstance(spec, Mapping):
            raise ValueError(f"mcpServers[{name!r}] must be an object, got {type(spec).__name__}")
        unknown = set(spec) - _CONFIG_KEYS
        if unknown:
            raise ValueError(f"mcpServers[{name!r}]: unknown keys {sorted(unknown)}")
        kind = spec.get("type", spec.get("transport"))
        if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamable_http", "streamableHttp"):
            raise ValueError(
                f"mcpServers[{name!r}]: transport {kind!r} is not supported (use stdio or streamable HTTP)"
            )
        has_cmd, has_url = "command" in spec, "url" in spec
        if has_cmd == has_url:
            raise ValueError(f"mcpServers[{name!r}] needs exactly one of 'command' (stdio) or 'url' (HTTP)")
        args = spec.get("args", [])
        if not isinstance(args, list | tuple) or not all(isinstance(a, str | int | float) for a in args):
            raise ValueError(f"mcpServers[{name!r}].args must be a list of strings")
        env = spec.get("env")
        if env is not None and not isinstance(env, Mapping):
            raise ValueError(f"mcpServers[{name!r}].env must be an object")
        headers = spec.get("headers")
        if headers is not None and not isinstance(headers, Mapping):
            raise ValueError(f"mcpServers[{name!r}].headers must be an object")
        timeout = spec.get("timeout")
        idem = spec.get("idempotent")
        if idem is not None and not isinstance(idem, bool) and not (
            isinstance(idem, list | tuple) and all(isinstance(x, str) for x in idem)
        ):
            raise ValueError(f"mcpServers[{name!r}].idempotent must be true, false or a list of tool names")
        rat = spec.get("restart_after_timeouts", DEFAULT_RESTART_AFTER_TIMEOUTS)
        if isinstance(rat, bool) or not isinstance(rat, int) or rat < 0:
            raise ValueError(f"mcpServers[{name!r}].restart_after_timeouts must be an integer >= 0")
        return cls(
            name=name,
            command=os.path.expanduser(str(spec["command"])) if has_cmd else None,
            args=[str(a) for a in args],
            env={str(k): str(v) for k, v in env.items()} if env is not None else None,
            cwd=str(spec["cwd"]) if spec.get("cwd") is not None else None,
            url=str(spec["url"]) if has_url else None,
            headers={str(k): str(v) for k, v in headers.items()} if headers is not None else None,
            timeout_s=float(timeout) if timeout is not None else None,
            max_concurrency=int(spec["max_concurrency"]) if spec.get("max_concurrency") is not None else None,
            include=list(spec["include"]) if spec.get("include") is not None else None,
            exclude=list(spec["exclude"]) if spec.get("exclude") is not None else None,
            cacheable=bool(spec.get("cacheable", False)),
            stderr=str(spec.get("stderr", "inherit")),
            idempotent=list(idem) if isinstance(idem, list | tuple) else idem,
            restart_after_timeouts=rat,
        )


ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]]


def _read_config_text(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix in (".pydata", ".py"):
        return ast.literal_eval(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def load_mcp_config(source: ConfigSource) -> dict[str, MCPServerConfig]:
    """Parse an MCP config into ``{server name: MCPServerConfig}`` (in config order; disabled ones dropped).

    Args:
        source: a path to a ``.json`` file or a Python-literal ``.pydata`` file (RL-Factory style; read with
            :func:`ast.literal_eval`, never ``eval``), a JSON string, a dict ``{"mcpServers": {...}}``, or a
            list of such dicts (merged; a server name may appear once).

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: malformed config (the message names the offending server / key); from a file:
            :class:`~toolgym.errors.InputFileError` naming the file.
    """
    data: Any = source
    path: Path | None = None
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(source)
        except json.JSONDecodeError:
            data = ast.literal_eval(source)
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"MCP config not found: {path}")
        try:
            data = _read_config_text(path)
        except (SyntaxError, ValueError) as e:
            raise InputFileError(f"cannot parse MCP config {path}: {e}") from e
    try:
        return _parse_config(data)
    except ValueError as e:
        if path is None:
            raise
        raise InputFileError(f"MCP config {path}: {e}") from e


def _parse_config(data: Any) -> dict[str, MCPServerConfig]:
    blocks = data if isinstance(data, list | tuple) else [data]
    out: dict[str, MCPServerConfig] = {}
    for block in blocks:
        if not isinstance(block, Mapping) or not isinstance(block.get("mcpServers"), Mapping):
            raise ValueError('an MCP config must be {"mcpServers": {name: {...}}} (or a list of those)')
        for name, spec in block["mcpServers"].items():
            if name in out:
                raise ValueError(f"MCP server {name!r} is defined twice")
            if PREFIX_SEPARATOR in str(name):
                raise ValueError(f"MCP server name {name!r} must not contain {PREFIX_SEPARATOR!r}")
            if isinstance(spec, Mapping) and spec.get("disabled"):
                continue
            out[str(name)] = MCPServerConfig.from_dict(str(name), spec)
    return out


# ------------------------------------------------------------------------------------------------
# one server session
# ------------------------------------------------------------------------------------------------
def _result_text(result: Any) -> str:
    """The text a model reads from a ``CallToolResult``: text blocks joined by newlines, placeholders for
    binary blocks, or the structured content as JSON when there is no content."""
    import mcp_types as types

    parts: list[str] = []
    for block in result.content or []:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            kind = "image" if isinstance(block, types.ImageContent) else "audio"
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource: {block.uri}]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            parts.append(res.text if isinstance(res, types.TextResourceContents) else f"[resource: {res.uri}]")
        else:  # pragma: no cover - future content types
            parts.append(str(block))
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _error_kind(result: Any) -> ToolErrorKind:
    """``exception``, or the kind a ``toolgym serve mcp`` server put in ``_meta["toolgym/error_kind"]``."""
    meta = getattr(result, "meta", None) or {}
    try:
        return ToolErrorKind(meta.get(ERROR_KIND_META, "exception"))
    except ValueError:
        return ToolErrorKind.EXCEPTION


def _check_encodable(arguments: Mapping[str, Any]) -> None:
    """Raise ``invalid_arguments`` unless ``arguments`` encode as strict JSON in UTF-8 (what the transport sends).

    Checked per call before anything is sent: an argument the transport cannot encode (a lone surrogate such as
    ``"\\ud800"`` from the model's JSON, NaN) would otherwise fail inside the shared session's writer."""
    try:
        json.dumps(arguments, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
        raise ToolError(
            f"arguments cannot be encoded for the MCP transport: {type(e).__name__}: {e}".encode(
                "utf-8", "backslashreplace").decode("utf-8"),
            kind=ToolErrorKind.INVALID_ARGUMENTS,
        ) from None


def _is_connection_error(e: BaseException) -> bool:
    """True for failures that mean the session is gone (the server died, the socket dropped)."""
    import anyio
    import httpx2
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(e, MCPError):
        return e.code == CONNECTION_CLOSED
    return isinstance(
        e, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError | httpx2.TransportError
    )


def _leaf_errors(e: BaseException) -> list[BaseException]:
    """The leaf exceptions of (nested) exception groups, in order; ``[e]`` for a plain exception."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaf_errors(sub)]
    return [e]


def describe_connect_error(e: BaseException) -> str:
    """A one-line cause for a failed MCP connect: exception groups unwrapped (anyio task groups wrap the real
    error), ``connection closed`` for a session the server closed, the transport's own text otherwise; no
    exception-class prefixes for the common causes."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    parts: list[str] = []
    for leaf in _leaf_errors(e):
        text = str(leaf).strip()
        if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
            text = "connection closed"
        elif isinstance(leaf, TimeoutError | OSError | ConnectionError) or type(leaf).__module__.startswith("httpx"):
            text = (text or type(leaf).__name__).rstrip(".")
            text = text[:1].lower() + text[1:]
        else:
            text = f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__
        if text not in parts:
            parts.append(text)
    return "; ".join(parts) or type(e).__name__


class _StderrTail:
    """A stdio server's stderr, forwarded to where the config sends it (``inherit``: this process's stderr; a
    file path; ``devnull``: nowhere) by a daemon thread that keeps the last lines for start-up error messages."""

    def __init__(self, dest: str, lines: int = 8) -> None:
        r, w = os.pipe()
        self.writer = os.fdopen(w, "w", encoding="utf-8")  # the SDK passes it to the server as its stderr
        self.tail: deque[str] = deque(maxlen=lines)
        self._dest = dest
        self._file = None if dest in ("inherit", "devnull") else open(dest, "a", encoding="utf-8")  # noqa: SIM115
        self._thread = threading.Thread(target=self._pump, args=(os.fdopen(r, "rb"),), daemon=True,
                                        name="mcp-stderr")
        self._thread.start()

    def _pump(self, reader: Any) -> None:
        with reader:
            for raw in reader:
                line = raw.decode("utf-8", "replace")
                if line.strip():
                    self.tail.append(line.rstrip()[:300])
                out = sys.stderr if self._dest == "inherit" else self._file
                if out is not None:
                    with contextlib.suppress(Exception):
                        out.write(line)
                        out.flush()
        if self._file is not None:
            self._file.close()

    def close(self) -> None:
        """Close this process's copy of the pipe (the thread ends once the server's copy closes too)."""
        with contextlib.suppress(OSError):
            self.writer.close()


class _Session:
    """One live MCP session, owned by one task on the runtime loop."""

    def __init__(self) -> None:
        self.client: Any = None
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.alive = False
        self.probe: asyncio.Task[None] | None = None
        self.unanswered = 0  # calls cancelled (timed out) in a row with no answer from the server between them

    def transport_closed(self) -> bool | None:
        """Whether the SDK's dispatcher saw the transport end (EOF); ``None`` when it cannot tell."""
        disp = getattr(getattr(self.client, "_session", None), "_dispatcher", None)
        closed = getattr(disp, "_closed", None)
        return closed if isinstance(closed, bool) else None


_LIVE: weakref.WeakSet[MCPServerConnection] = weakref.WeakSet()


class MCPServerConnection:
    """One MCP server: a lazily opened session shared by all callers, restarted when it dies.

    Args:
        config: the server's config entry.
        connect_timeout_s: budget for starting the server and the MCP handshake.
        backoff_s: delay before the second consecutive (re)connect attempt after a failed one; doubles per
            failure up to ``max_backoff_s``. The first reconnect after a working session dies is immediate.
        max_backoff_s: cap on the reconnect delay.
        mode: the SDK's protocol negotiation (``"auto"`` probes ``server/discover`` and falls back to the
            ``initialize`` handshake; ``"legacy"`` goes straight to ``initialize``).
        ping_timeout_s: after a request fails at the connection level while the transport is still open (HTTP),
            a probe request (``tools/list``) with this timeout decides whether the session is dead.

    Attributes:
        restarts: sessions opened after the first one (server restarts / reconnects).
        connect_failures: failed connect attempts.
        hung_restarts: sessions dropped because ``restart_after_timeouts`` calls in a row got no answer.
    """

    def __init__(
        self,
        config: MCPServerConfig,
        *,
        connect_timeout_s: float = 60.0,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        mode: str = "auto",
        ping_timeout_s: float = 10.0,
    ) -> None:
        self.config = config
        self.ping_timeout_s = ping_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.mode = mode
        self.restarts = 0
        self.connect_failures = 0
        self.sessions_opened = 0
        self.hung_restarts = 0
        self._session: _Session | None = None
        self._connecting: asyncio.Future[_Session] | None = None
        self._consecutive_failures = 0
        self._next_attempt_at = 0.0
        self._closed = False
        self._sem: asyncio.Semaphore | None = None
        self._stderr_file: Any = None
        _LIVE.add(self)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def connected(self) -> bool:
        return self._session is not None and self._session.alive

    # -- session lifecycle (runtime loop only) ------------------------------------------------------
    def _server_target(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        c = self.config
        if c.command is not None:
            params = StdioServerParameters(command=c.command, args=c.args, env=c.env, cwd=c.cwd)
            if self._stderr_file is None:  # every mode keeps a tail for start-up error messages
                self._stderr_file = _StderrTail(c.stderr)
            return stdio_client(params, errlog=self._stderr_file.writer)
        assert c.url is not None
        if c.headers:
            import httpx2

            http_client = httpx2.AsyncClient(headers=c.headers)
            stack.push_async_callback(http_client.aclose)
            return streamable_http_client(c.url, http_client=http_client)
        return c.url

    async def _own(self, session: _Session, ready: asyncio.Future[_Session]) -> None:
        """The owner task: enter the client, publish it, hold it until asked to stop, exit it here."""
        from mcp import Client

        try:
            async with (
                contextlib.AsyncExitStack() as stack,
                Client(self._server_target(stack), mode=self.mode, cache=None) as client,
            ):
                session.client = client
                session.alive = True
                if not ready.done():
                    ready.set_result(session)
                await session.stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else ConnectionError(repr(e)))
            elif not isinstance(e, asyncio.CancelledError):
                logger.debug("MCP server %r session ended: %r", self.name, e)
        finally:
            session.alive = False

    async def _open(self, delay: float) -> _Session:
        if delay > 0:
            await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        session = _Session()
        ready: asyncio.Future[_Session] = loop.create_future()
        session.task = loop.create_task(self._own(session, ready), name=f"mcp-session-{self.name}")
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
        except BaseException as e:
            ready.cancel()  # the owner must not publish into (or raise through) an abandoned future
            session.stop.set()
            if not session.task.done():
                # the owner is still inside the handshake: cancel it (the SDK reaps a started process)
                session.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(session.task), 10.0)
            if isinstance(e, TimeoutError):
                raise TimeoutError(f"no MCP handshake within {self.connect_timeout_s:g} s") from e
            raise

    async def _get_session(self) -> _Session:
        s = self._session
        if s is not None and s.alive:
            return s
        if self._closed:
            raise ToolError(f"MCP server {self.name!r} is closed", retryable=False)
        loop = asyncio.get_running_loop()
        if self._connecting is None or self._connecting.done():
            delay = max(0.0, self._next_attempt_at - loop.time())
            fut = loop.create_task(self._open(delay))
            fut.add_done_callback(self._on_connected)
            self._connecting = fut
        try:
            return await asyncio.shield(self._connecting)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise ToolError(f"cannot connect to MCP server {self.name!r}: {await self._failure_text(e)}",
                            retryable=True) from e

    async def _failure_text(self, e: BaseException) -> str:
        """Why the connect failed: the unwrapped cause, where the server is, and its last stderr lines."""
        c = self.config
        text = describe_connect_error(e)
        if c.url is not None:
            return f"{text} (url {c.url})"
        tail = self._stderr_file
        if tail is not None:
            await asyncio.sleep(0.1)  # let the pump thread read what the server wrote before it exited
        cmd = " ".join([c.command or "", *c.args])
        cmd = cmd if len(cmd) <= 120 else cmd[:117] + "..."
        text = f"{text} (command: {cmd})"
        if "connection closed" in text:
            text = text.replace("connection closed", "connection closed: the server exited or closed stdout", 1)
        if tail is not None and tail.tail:
            text += "; its last stderr lines: " + " | ".join(list(tail.tail)[-5:])
        return text

    def _on_connected(self, fut: asyncio.Future[_Session]) -> None:
        loop = fut.get_loop()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self.connect_failures += 1
            self._consecutive_failures += 1
            delay = min(self.backoff_s * 2 ** (self._consecutive_failures - 1), self.max_backoff_s)
            self._next_attempt_at = loop.time() + delay
            logger.warning("MCP server %r: connect failed (%s); next attempt in %.2fs", self.name,
                           describe_connect_error(exc), delay)
            return
        session = fut.result()
        if self._closed:
            session.stop.set()
            return
        if self.sessions_opened:
            self.restarts += 1
        self.sessions_opened += 1
        self._consecutive_failures = 0
        self._next_attempt_at = 0.0
        self._session = session

    async def _check_session(self, session: _Session) -> None:
        """After a connection-level failure of one request: drop the session if it is dead.

        A closed transport (stdio EOF: the server died) is dead at once. Over HTTP one request's stream can fail
        while the session lives (e.g. an overloaded server cutting an SSE stream), so a probe request decides; one
        probe per session is shared by all the requests that failed together.
        """
        if not session.alive:
            self._drop(session)
            return
        if session.transport_closed() is not False:
            self._drop(session)
            return
        if session.probe is None or session.probe.done():
            session.probe = asyncio.get_running_loop().create_task(self._probe(session))
        await asyncio.shield(session.probe)

    async def _probe(self, session: _Session) -> None:
        try:
            # tools/list, not ping: ping is gone from the 2026-07-28 protocol the SDK may negotiate
            await asyncio.wait_for(session.client.list_tools(), self.ping_timeout_s)
        except TimeoutError:
            # no answer in time: busy, not provably dead (requests on it still time out on their own)
            logger.info("MCP server %r: probe timed out; keeping the session", self.name)
        except Exception:
            logger.warning("MCP server %r: session lost (probe failed); reconnecting", self.name)
            self._drop(session)

    def _unanswered(self, session: _Session) -> None:
        """A call on ``session`` was cancelled with no answer (a timeout): restart a stdio server that has left
        ``restart_after_timeouts`` calls in a row unanswered (hung, not dead: its pipe is still open)."""
        session.unanswered += 1
        n = self.config.restart_after_timeouts
        if n and self.config.command is not None and session.unanswered >= n and self._session is session:
            logger.warning(
                "MCP server %r: %d calls in a row got no answer; restarting it as hung", self.name, session.unanswered
            )
            self.hung_restarts += 1
            self._drop(session)

    def _drop(self, session: _Session) -> None:
        """Forget a dead session and let its owner task close it (reaping the process)."""
        session.alive = False
        session.stop.set()
        if self._session is session:
            self._session = None

    # -- public (any loop) ------------------------------------------------------------------------
    async def connect(self) -> None:
        """Open the session now (normally it opens on the first call)."""
        await run_async(self._get_session())

    async def list_tools(self) -> list[Any]:
        """All tools the server lists (``mcp_types.Tool``; pagination followed)."""
        return await run_async(self._list_tools())

    async def _list_tools(self) -> list[Any]:
        session = await self._get_session()
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            try:
                page = await session.client.list_tools(cursor=cursor)
            except Exception as e:
                if _is_connection_error(e):
                    await self._check_session(session)
                raise
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: Mapping[str, Any], *, idempotent: bool = False) -> str:
        """Call ``name`` on the server and return the text of its result.

        Args:
            idempotent: the call may be re-sent when the connection dies while it is in flight (it may have run).

        Raises:
            ToolError: ``invalid_arguments`` for arguments the transport cannot encode (nothing is sent) and for a
                JSON-RPC invalid-params error; ``exception`` for ``isError`` results and server-side errors;
                ``exception`` + ``retryable`` when the server could not be reached (the call was not sent), or when
                the connection died mid-call and ``idempotent``.
        """
        _check_encodable(arguments)
        return await run_async(self._call_tool(name, dict(arguments), idempotent))

    async def _call_tool(self, name: str, arguments: dict[str, Any], idempotent: bool = False) -> str:
        from mcp.shared.exceptions import MCPError
        from mcp_types import INVALID_PARAMS

        if self.config.max_concurrency is not None and self._sem is None:
            self._sem = asyncio.Semaphore(self.config.max_concurrency)
        async with self._sem if self._sem is not None else contextlib.nullcontext():
            session = await self._get_session()
            try:
                result = await session.client.call_tool(name, arguments)
            except asyncio.CancelledError:
                self._unanswered(session)
                raise
            except ToolError:
                raise
            except Exception as e:
                if _is_connection_error(e) or not session.alive:
                    await self._check_session(session)
                    again = "retrying (idempotent tool)" if idempotent else (
                        "not re-sent: it may have run (mark the tool idempotent to retry)"
                    )
                    raise ToolError(
                        f"MCP server {self.name!r} connection lost during {name!r} ({type(e).__name__}: {e}); "
                        f"the server is being restarted; {again}",
                        retryable=idempotent,
                    ) from e
                session.unanswered = 0  # the server answered (with an error)
                if isinstance(e, MCPError):
                    kind = ToolErrorKind.INVALID_ARGUMENTS if e.code == INVALID_PARAMS else ToolErrorKind.EXCEPTION
                    raise ToolError(e.message, kind=kind) from e
                raise
            session.unanswered = 0
        if getattr(result, "is_error", False):
            raise ToolError(_result_text(result) or f"tool {name!r} reported an error", kind=_error_kind(result))
        if not hasattr(result, "content"):
            raise ToolError(f"tool {name!r} returned an unsupported result type {type(result).__name__}")
        return _result_text(result)

    async def aclose(self) -> None:
        """Close the session and stop the server process (idempotent, never raises)."""
        await run_async(self._aclose())

    async def _aclose(self) -> None:
        self._closed = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        s, self._session = self._session, None
        if s is not None:
            s.stop.set()
            if s.task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(s.task), 15.0)
                if not s.task.done():
                    s.task.cancel()
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None

    def __repr__(self) -> str:
        where = self.config.url or " ".join([self.config.command or "", *self.config.args])
        return f"MCPServerConnection({self.name!r}, {where!r})"


# ------------------------------------------------------------------------------------------------
# tools
# ------------------------------------------------------------------------------------------------
class MCPTool(Tool):
    """One tool of an MCP server. ``parameters`` is the server's ``inputSchema`` (the executor validates
    arguments against it before the server is called).

    Attributes:
        server: the connection it calls through (shared with the server's other tools).
        remote_name: the tool's name on the server (``name`` may carry a ``<server>__`` prefix).
        annotations: the server's tool annotations (``mcp_types.ToolAnnotations``) or ``None``.
        idempotent: whether a call may be re-sent after the connection died mid-call (see
            :attr:`MCPServerConfig.idempotent`; default from the ``readOnlyHint`` / ``idempotentHint`` annotations).
    """

    def __init__(
        self,
        server: MCPServerConnection,
        remote_name: str,
        *,
        name: str | None = None,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        cacheable: bool = False,
        annotations: Any = None,
        idempotent: bool | None = None,
    ) -> None:
        self.server = server
        self.remote_name = remote_name
        self.name = name or remote_name
        self.description = description
        params = dict(parameters) if parameters else {"type": "object", "properties": {}}
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        self.parameters = params
        self.timeout_s = timeout_s
        self.cacheable = cacheable
        self.annotations = annotations
        if idempotent is None:
            idempotent = bool(
                getattr(annotations, "read_only_hint", None) or getattr(annotations, "idempotent_hint", None)
            )
        self.idempotent = idempotent

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        return await self.server.call_tool(self.remote_name, arguments, idempotent=self.idempotent)

    async def aclose(self) -> None:
        await self.server.aclose()

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, server={self.server.name!r})"


PrefixMode = Literal["auto", "always", "never"]


def assign_tool_names(tools: Mapping[str, Sequence[str]], prefix: PrefixMode = "auto") -> dict[tuple[str, str], str]:
    """The toolgym name of each ``(server, tool)`` given ``{server: [tool names]}``.

    ``"auto"``: a name exposed by two or more servers becomes ``<server>__<name>`` on every one of them; all
    other names are kept. ``"always"``: every tool is ``<server>__<name>``. ``"never"``: names are kept and a
    clash raises ``ValueError``. A clash left after prefixing (e.g. a server exposing ``a__x`` next to server
    ``a``'s ``x``) also raises ``ValueError``.
    """
    counts = Counter(name for names in tools.values() for name in set(names))
    clashes = {name for name, c in counts.items() if c > 1}
    if clashes and prefix == "never":
        raise ValueError(f"tool names shared by several MCP servers: {sorted(clashes)} (use prefix='auto')")
    out = {
        (server, name): f"{server}{PREFIX_SEPARATOR}{name}" if prefix == "always" or name in clashes else name
        for server, names in tools.items()
        for name in names
    }
    final = Counter(out.values())
    if dup := sorted(k for k, c in final.items() if c > 1):
        raise ValueError(f"tool names clash after prefixing: {dup}")
    return out


class MCPToolset:
    """The tools of every server in an MCP config.

    Args:
        config: anything :func:`load_mcp_config` accepts.
        prefix: tool naming: ``"auto"`` prefixes ``<server>__`` only to names two servers share,
            ``"always"`` prefixes every tool, ``"never"`` raises ``ValueError`` on a clash.
        timeout_s: default per-call timeout for servers without their own ``timeout``.
        **connection_kwargs: passed to each :class:`MCPServerConnection` (``connect_timeout_s``,
            ``backoff_s``, ``max_backoff_s``, ``mode``).

    Use :meth:`connect` (sync) or ``await`` :meth:`aconnect` to start the servers and discover the tools
    (``list_tools``); both return the tool list and fill :attr:`tools`. Close with :meth:`close` /
    :meth:`aclose` (or let the executor that owns the tools close them). Context managers, sync and async.
    """

    def __init__(
        self,
        config: ConfigSource,
        *,
        prefix: PrefixMode = "auto",
        timeout_s: float | None = None,
        **connection_kwargs: Any,
    ) -> None:
        if prefix not in ("auto", "always", "never"):
            raise ValueError(f"prefix must be 'auto', 'always' or 'never', got {prefix!r}")
        self.configs = load_mcp_config(config)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.servers: dict[str, MCPServerConnection] = {
            name: MCPServerConnection(cfg, **connection_kwargs) for name, cfg in self.configs.items()
        }
        self.tools: list[MCPTool] = []

    async def aconnect(self) -> list[MCPTool]:
        """Start every server concurrently, list their tools and build :attr:`tools`.

        Raises:
            ConnectionError: a server could not be started / reached (names the server); the servers
                that did start are closed again.
        """
        return await run_async(self._aconnect())

    async def _aconnect(self) -> list[MCPTool]:
        names = list(self.servers)
        listed = await asyncio.gather(*(self.servers[n]._list_tools() for n in names), return_exceptions=True)
        errors = [(n, r) for n, r in zip(names, listed, strict=True) if isinstance(r, BaseException)]
        if errors:
            await self._aclose()
            msg = "; ".join(
                f"{e.message if isinstance(e, ToolError) else f'{n}: ' + describe_connect_error(e)}"
                for n, e in errors
            )
            raise ConnectionError(f"cannot start MCP servers: {msg}") from errors[0][1]
        per_server: dict[str, list[Any]] = {}
        for n, tools in zip(names, listed, strict=True):
            cfg = self.configs[n]
            assert isinstance(tools, list)
            per_server[n] = [
                t for t in tools
                if (cfg.include is None or t.name in cfg.include) and (cfg.exclude is None or t.name not in cfg.exclude)
            ]  # fmt: skip
        try:
            names = assign_tool_names({n: [t.name for t in ts] for n, ts in per_server.items()}, self.prefix)
        except ValueError:
            await self._aclose()
            raise
        out: list[MCPTool] = []
        for n, tools in per_server.items():
            cfg, conn = self.configs[n], self.servers[n]
            for t in tools:
                out.append(
                    MCPTool(
                        conn,
                        t.name,
                        name=names[(n, t.name)],
                        description=t.description or t.title or "",
                        parameters=t.input_schema,
                        timeout_s=cfg.timeout_s if cfg.timeout_s is not None else self.timeout_s,
                        cacheable=cfg.cacheable,
                        annotations=t.annotations,
                        idempotent=(
                            t.name in cfg.idempotent if isinstance(cfg.idempotent, list) else cfg.idempotent
                        ),
                    )
                )
        self.tools = out
        return out

    def connect(self) -> list[MCPTool]:
        """Sync :meth:`aconnect` (runs on the runtime loop; not callable from inside it)."""
        return run_sync(self._aconnect())

    async def aclose(self) -> None:
        """Close every server session and stop stdio server processes."""
        await run_async(self._aclose())

    async def _aclose(self) -> None:
        await asyncio.gather(*(s._aclose() for s in self.servers.values()), return_exceptions=True)

    def close(self) -> None:
        run_sync(self._aclose())

    def __enter__(self) -> MCPToolset:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MCPToolset:
        await self.aconnect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __iter__(self) -> Iterable[MCPTool]:  # type: ignore[override]
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)


def load_mcp_tools(config: ConfigSource, **kwargs: Any) -> list[MCPTool]:
    """Start the servers of ``config`` and return their tools (sync). See :class:`MCPToolset` for kwargs.
    The tools own the sessions: close them with ``ToolExecutor.aclose()`` or ``tool.aclose()``."""
    return MCPToolset(config, **kwargs).connect()


@atexit.register
def _close_all_at_exit() -> None:  # pragma: no cover - exercised by process exit
    """Stop stdio servers still running when the interpreter exits (they would also exit on stdin EOF)."""
    live = [c for c in list(_LIVE) if c._session is not None and not c._closed]
    if not live or in_runtime():
        return

    async def _close() -> None:
        await asyncio.wait_for(asyncio.gather(*(c._aclose() for c in live), return_exceptions=True), 10.0)

    with contextlib.suppress(BaseException):
        run_sync(_close())
