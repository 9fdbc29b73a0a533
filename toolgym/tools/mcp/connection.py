"""One MCP server's session: opened lazily on the toolgym runtime loop, shared by every caller, restarted when it
dies or hangs (:class:`MCPServerConnection`); a stdio server's stderr forwarded with its last lines kept for error
messages; every live connection closed when the interpreter exits."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from toolgym.runtime import in_runtime, run_async, run_sync
from toolgym.tools.base import ToolError, ToolErrorKind
from toolgym.tools.mcp.config import MCPServerConfig
from toolgym.tools.mcp.results import (
    _check_encodable,
    _error_kind,
    _is_connection_error,
    _result_content,
    _result_text,
    describe_connect_error,
)
from toolgym.tools.mcp.transport import filter_tool_lists, stdio_transport

__all__ = ["MCPServerConnection"]

logger = logging.getLogger("toolgym.tools.mcp")


class _StderrTail:
    """A stdio server's stderr, forwarded to where the config sends it (``inherit``: this process's stderr; a
    file path; ``devnull``: nowhere; ``auto``: ``inherit`` when toolgym's output is verbose, else ``devnull``) by a daemon thread that keeps the last lines for start-up error messages."""

    def __init__(self, dest: str, lines: int = 8) -> None:
        r, w = os.pipe()
        self.writer = os.fdopen(w, "w", encoding="utf-8")  # the SDK passes it to the server as its stderr
        self.tail: deque[str] = deque(maxlen=lines)
        if dest == "auto":  # the server's log is the user's only when they asked for verbose output
            from toolgym.console import verbose

            dest = "inherit" if verbose() else "devnull"
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
        connect_timeout_s: budget for starting the server and the MCP handshake; for an HTTP server whose config
            sets ``timeout``, at most that.
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
        invalid_tools: ``{tool name: why}`` for the tools the server lists that cannot be used (a malformed entry or
            ``inputSchema``); they are left out of every ``tools/list`` and logged, the server's other tools work.
        hung_restarts: sessions dropped because ``restart_after_timeouts`` calls in a row got no answer (stdio: the
            server process restarted; HTTP: a new session).
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
        if config.url is not None and config.timeout_s is not None:
            # an HTTP handshake is a few requests: the config's per-call ``timeout`` bounds it too (a server that
            # accepts and never answers is reported after that, not after the connect budget); a stdio server's
            # start-up (a package download by ``uvx``, ...) keeps the whole budget
            connect_timeout_s = min(connect_timeout_s, config.timeout_s)
        self.connect_timeout_s = connect_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.mode = mode
        self.restarts = 0
        self.connect_failures = 0
        self.sessions_opened = 0
        self.hung_restarts = 0
        self.invalid_tools: dict[str, str] = {}
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
        from mcp.client.streamable_http import streamable_http_client

        c = self.config
        if c.command is not None:
            params = StdioServerParameters(command=c.command, args=c.args, env=c.env, cwd=c.cwd)
            if self._stderr_file is None:  # every mode keeps a tail for start-up error messages
                self._stderr_file = _StderrTail(c.stderr)
            target = stdio_transport(params, self._stderr_file.writer)
        else:
            assert c.url is not None
            http_client = None
            if c.headers:
                import httpx2

                http_client = httpx2.AsyncClient(headers=c.headers)
                stack.push_async_callback(http_client.aclose)
            target = streamable_http_client(c.url, http_client=http_client)
        return filter_tool_lists(target, self._invalid_tool)

    def _invalid_tool(self, tool: str, why: str) -> None:
        """A tool the server lists that cannot be used (malformed entry or ``inputSchema``): left out, reported once."""
        if self.invalid_tools.get(tool) != why:
            self.invalid_tools[tool] = why
            logger.warning("MCP server %r: tool %r left out: invalid definition (%s)", self.name, tool, why)

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
        """A call on ``session`` was cancelled with no answer (a timeout). After ``restart_after_timeouts`` calls in a
        row unanswered the session is hung (not dead: its pipe or socket is still open) and is dropped: a stdio
        server's process is killed and the next call starts a new one; over HTTP the session is closed (the SDK
        ends it with a ``DELETE``, so the server can free what it holds) and the next call opens a new session on
        new connections (the server's process is not toolgym's to restart)."""
        session.unanswered += 1
        n = self.config.restart_after_timeouts
        if n and session.unanswered >= n and self._session is session:
            how = "restarting it" if self.config.command is not None else "opening a new session"
            logger.warning(
                "MCP server %r: %d calls in a row got no answer; %s as hung", self.name, session.unanswered, how
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

    async def call_tool(self, name: str, arguments: Mapping[str, Any], *, idempotent: bool = False) -> Any:
        """Call ``name`` on the server and return the text of its result (with image blocks: the blocks, each
        image as ``{"type": "image", "data", "mime_type"}``, which the executor checks and shows as placeholders).

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

    async def _call_tool(self, name: str, arguments: dict[str, Any], idempotent: bool = False) -> Any:
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
        return _result_content(result)

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
