"""The tools of the servers in an MCP config: :class:`MCPTool` (one server-side tool), :func:`assign_tool_names`
(``<server>__`` prefixes on clashes), :class:`MCPToolset` (start the servers, list and wrap their tools) and
:func:`load_mcp_tools`."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from toolgym.runtime import run_async, run_sync
from toolgym.tools.base import Tool, ToolError
from toolgym.tools.mcp.config import PREFIX_SEPARATOR, ConfigSource, load_mcp_config
from toolgym.tools.mcp.connection import MCPServerConnection
from toolgym.tools.mcp.results import MCPServerError, _is_connection_error, describe_connect_error

__all__ = ["MCPTool", "MCPToolset", "PrefixMode", "assign_tool_names", "load_mcp_tools"]


def _one_line(e: BaseException) -> str:
    """A validation error (pydantic's are several lines) as one line: ``where: what`` per error."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            return "; ".join(f"{'.'.join(str(p) for p in x.get('loc', ()))}: {x.get('msg')}" for x in errors()[:3])
        except Exception:  # noqa: BLE001 - not pydantic's errors(): fall back to the text
            pass
    return " ".join(describe_connect_error(e).split())


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

    async def acall(self, arguments: Mapping[str, Any]) -> Any:
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

        A tool whose definition is unusable (a malformed entry or ``inputSchema``) is left out and logged with its
        server and name (:attr:`skipped`); the server's other tools are kept.

        Raises:
            ConnectionError: a server could not be started / reached (names the server); the servers
                that did start are closed again.
            MCPServerError: a server answered ``tools/list`` with a reply that is not a tool list at all.
        """
        return await run_async(self._aconnect())

    async def _aconnect(self) -> list[MCPTool]:
        names = list(self.servers)
        listed = await asyncio.gather(*(self.servers[n]._list_tools() for n in names), return_exceptions=True)
        errors = [(n, r) for n, r in zip(names, listed, strict=True) if isinstance(r, BaseException)]
        if errors:
            await self._aclose()
            unreachable = [(n, e) for n, e in errors if isinstance(e, ToolError) or _is_connection_error(e)
                           or isinstance(e, TimeoutError | ConnectionError)]  # fmt: skip
            if len(unreachable) == len(errors):
                msg = "; ".join(
                    f"{e.message if isinstance(e, ToolError) else f'{n}: ' + describe_connect_error(e)}"
                    for n, e in errors
                )
                raise ConnectionError(f"cannot start MCP servers: {msg}") from errors[0][1]
            # the server answered, with something the client cannot use (not "cannot reach a service")
            bad = [(n, e) for n, e in errors if (n, e) not in unreachable]
            msg = "; ".join(f"MCP server {n!r}: {_one_line(e)}" for n, e in bad)
            raise MCPServerError(f"invalid reply to tools/list: {msg}") from bad[0][1]
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

    @property
    def skipped(self) -> dict[tuple[str, str], str]:
        """``{(server, tool): why}``: tools listed with an unusable definition, left out."""
        return {(n, t): why for n, conn in self.servers.items() for t, why in conn.invalid_tools.items()}

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
