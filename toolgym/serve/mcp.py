"""``toolgym serve mcp``: expose toolgym tool sets as an MCP server (stdio or streamable HTTP).

So tools can run on other hosts and be shared by many trainers: point an ``mcpServers`` entry at
``http://host:8000/mcp`` (or at ``toolgym serve mcp --tools calculator`` as a stdio command) and use it
through :class:`toolgym.tools.mcp.MCPToolset` / ``toolgym/MCP-v0``.

Tool sets are resolved lazily by name (:data:`TOOLSETS`) or as ``"module:factory"``; a factory returns a
:class:`~toolgym.tools.base.Tool` or a list of them. Calls run through a server-side
:class:`~toolgym.tools.executor.ToolExecutor` (argument validation, timeouts, classified errors); a failed call
is answered with ``isError`` and the text ``Error (<kind>): <message>``.

Examples::

    toolgym serve mcp --tools calculator                       # stdio
    toolgym serve mcp --tools calculator,search --transport http --port 8000   # loopback only
    TOOLGYM_SERVE_TOKEN=... toolgym serve mcp --tools calculator --transport http --host 0.0.0.0

A non-loopback ``--host`` needs a token (``--token-file`` or ``$TOOLGYM_SERVE_TOKEN``, 16+ characters) that
every request carries as ``Authorization: Bearer TOKEN``; without one only loopback ``Host`` names are answered
(:mod:`toolgym.serve.access`).
    python -m toolgym.serve.mcp --tools mypkg.tools:make_tools --transport http
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

from toolgym.serve.access import SERVE_TOKEN_ENV as TOKEN_ENV
from toolgym.serve.access import add_token_argument, check_bind, read_token
from toolgym.tools.base import Tool, ToolCall
from toolgym.tools.mcp.results import ERROR_KIND_META  # the key the toolgym client maps back to an error kind

__all__ = [
    "ERROR_KIND_META",
    "TOOLSETS",
    "HTTPOptions",
    "build_server",
    "main",
    "resolve_toolsets",
    "run",
    "serve_http",
    "serve_stdio",
]

#: tool-set name -> "module:factory" (imported only when asked for)
TOOLSETS: dict[str, str] = {
    "calculator": "toolgym.tools.calculator:calculator_tool",
    "search": "toolgym.serve.mcp:search_toolset",
    "sql": "toolgym.serve.mcp:sql_toolset",
    "python": "toolgym.serve.mcp:python_toolset",
}


# -- built-in factories (lazy imports: a missing module is a clear error only when asked for) -------
def search_toolset() -> Tool:
    """The Search-v0 ``search`` tool over the embedded BM25 index."""
    from toolgym.data.geo import default_retriever
    from toolgym.tools.search import SearchTool

    return SearchTool(default_retriever())


def sql_toolset() -> Tool:
    """The SQL-v0 ``execute_sql`` tool (read-only) over ``$TOOLGYM_SQL_DB`` or the embedded Chinook database."""
    import os

    from toolgym.data.chinook import chinook_path
    from toolgym.tools.sql import SQLTool

    db = os.environ.get("TOOLGYM_SQL_DB")
    return SQLTool(Path(db) if db else chinook_path())


def python_toolset() -> Tool:
    """The Python-v0 sandboxed ``python`` tool (a warm pool of isolated interpreters)."""
    from toolgym.tools.python import PythonTool

    return PythonTool()


def _load_factory(spec: str) -> Any:
    target = TOOLSETS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(TOOLSETS))
        raise ValueError(f"unknown tool set {spec!r}: use one of {known} or 'module:factory'")
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ImportError(f"tool set {spec!r} needs module {mod_name!r}, which cannot be imported: {e}") from e
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ImportError(f"tool set {spec!r}: {mod_name!r} has no attribute {attr!r}") from None


def resolve_toolsets(specs: Sequence[str]) -> list[Tool]:
    """Build the tools of the named tool sets (names from :data:`TOOLSETS` or ``"module:factory"``).

    Raises:
        ValueError: an unknown name, a factory returning something that is not a Tool, or a duplicate tool name.
        ImportError: the tool set's module cannot be imported (the message names it).
    """
    tools: list[Tool] = []
    for spec in specs:
        made = _load_factory(spec.strip())()
        items = made if isinstance(made, list | tuple) else [made]
        for t in items:
            if not isinstance(t, Tool):
                raise ValueError(f"tool set {spec!r} returned {type(t).__name__}, not a toolgym Tool")
            tools.append(t)
    names = [t.name for t in tools]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"duplicate tool names across tool sets: {dup}")
    return tools


def build_server(tools: Sequence[Tool], *, name: str = "toolgym", executor_kwargs: dict[str, Any] | None = None) -> Any:
    """A low-level :class:`mcp.server.lowlevel.Server` listing ``tools`` (schema = ``Tool.parameters``) and
    running calls through a :class:`~toolgym.tools.executor.ToolExecutor` built with ``executor_kwargs``."""
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from toolgym.tools.executor import ToolExecutor

    executor = ToolExecutor(tools, **(executor_kwargs or {}))
    listing = [
        types.Tool(name=t.name, description=t.description or None, input_schema=dict(t.parameters)) for t in tools
    ]

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = await executor.run(ToolCall(params.name, dict(params.arguments or {}), id=str(ctx.request_id)))
        if result.ok:
            return types.CallToolResult(content=[types.TextContent(type="text", text=result.content)])
        # the message alone (a toolgym client adds its own "Error (<kind>): " prefix); the kind travels in _meta
        kind = result.error_kind.value if result.error_kind is not None else "exception"
        prefix = f"Error ({kind}): "
        text = result.content[len(prefix) :] if result.content.startswith(prefix) else result.content
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], is_error=True, _meta={ERROR_KIND_META: kind}
        )

    server = Server(name, on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    server.toolgym_executor = executor  # type: ignore[attr-defined] - for metrics / shutdown
    return server


async def serve_stdio(server: Any) -> None:
    """Serve ``server`` over this process's stdin/stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(
    server: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    stateless: bool = False,
    json_response: bool = False,
    log_level: str = "warning",
    token: str | None = None,
) -> None:
    """Serve ``server`` over streamable HTTP at ``http://host:port/path`` (uvicorn) until cancelled.

    A non-loopback ``host`` needs ``token`` (:func:`toolgym.serve.access.check_bind`); requests are checked by
    :func:`toolgym.serve.access.asgi_guard`."""
    import uvicorn

    from toolgym.serve import access

    access.check_bind(host, token, what="serve mcp", env=TOKEN_ENV)
    app = access.asgi_guard(server.streamable_http_app(
        streamable_http_path=path, stateless_http=stateless, json_response=json_response, host=host
    ), token)
    await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).serve()


class HTTPOptions(TypedDict, total=False):
    """The keyword options of :func:`serve_http` (defaults there): the endpoint (``host``, ``port``, ``path``), the
    SDK's streamable-HTTP options (``stateless`` sessions, ``json_response`` instead of SSE), uvicorn's
    ``log_level`` and the Bearer ``token`` HTTP requests must carry (required for a non-loopback ``host``)."""

    host: str
    port: int
    path: str
    stateless: bool
    json_response: bool
    log_level: str
    token: str | None


def run(
    tools: Sequence[str] | Sequence[Tool],
    *,
    transport: str = "stdio",
    name: str = "toolgym",
    default_timeout_s: float = 30.0,
    max_concurrency: int = 512,
    **http: Unpack[HTTPOptions],
) -> None:
    """Build the tools (names or instances) and serve them until stopped (blocking).

    Args:
        tools: tool-set names / ``"module:factory"`` strings, or Tool instances.
        transport: ``"stdio"`` or ``"http"`` (streamable HTTP; ``"streamable-http"`` also accepted).
        default_timeout_s, max_concurrency: the server-side executor's per-call timeout and concurrency cap.
        http: :class:`HTTPOptions`, for ``transport="http"``.
    """
    built = [t for t in tools if isinstance(t, Tool)]
    names = [t for t in tools if isinstance(t, str)]
    built += resolve_toolsets(names)
    if not built:
        raise ValueError("no tools to serve")
    server = build_server(
        built, name=name, executor_kwargs={"default_timeout_s": default_timeout_s, "max_concurrency": max_concurrency}
    )
    if transport == "stdio":
        coro = serve_stdio(server)
    elif transport in ("http", "streamable-http", "streamable_http"):
        coro = serve_http(server, **http)
    else:
        raise ValueError(f"unknown transport {transport!r} (use 'stdio' or 'http')")
    try:
        asyncio.run(coro)
    except KeyboardInterrupt:
        pass


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add the ``serve mcp`` options to ``parser`` (or a new one)."""
    p = parser or argparse.ArgumentParser(prog="toolgym serve mcp", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tools", default="calculator",
        help=f"comma-separated tool sets: {', '.join(TOOLSETS)} or module:factory (default: calculator)",
    )  # fmt: skip
    p.add_argument("--transport", default="stdio", choices=["stdio", "http", "streamable-http"])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; any other needs a "
                   "token)")
    p.add_argument("--port", type=int, default=8000)
    add_token_argument(p, TOKEN_ENV)
    p.add_argument("--path", default="/mcp", help="HTTP endpoint path (default /mcp)")
    p.add_argument("--stateless", action="store_true", help="stateless streamable HTTP (no session ids)")
    p.add_argument("--json-response", action="store_true", help="answer with JSON bodies instead of SSE streams")
    p.add_argument("--name", default="toolgym", help="server name reported to clients")
    p.add_argument("--timeout", type=float, default=30.0, help="per-call timeout in seconds")
    p.add_argument("--max-concurrency", type=int, default=512, help="calls executing at once")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``toolgym serve mcp`` (and ``python -m toolgym.serve.mcp``)."""
    args = build_parser().parse_args(argv)
    token = None
    if args.transport != "stdio":
        token = read_token(args.token_file, TOKEN_ENV)
        check_bind(args.host, token, what="serve mcp", env=TOKEN_ENV)  # CLIError: exit 2 before any tool is built
    try:
        specs = [s for s in args.tools.split(",") if s.strip()]
        tools = resolve_toolsets(specs)
    except (ValueError, ImportError) as e:
        print(f"toolgym serve mcp: {e}", file=sys.stderr)
        return 2
    print(
        f"toolgym serve mcp: serving {', '.join(t.name for t in tools)} over {args.transport}"
        + (f" at http://{args.host}:{args.port}{args.path}" if args.transport != "stdio" else ""),
        file=sys.stderr,
    )
    run(
        tools,
        transport=args.transport,
        host=args.host,
        port=args.port,
        path=args.path,
        stateless=args.stateless,
        json_response=args.json_response,
        name=args.name,
        default_timeout_s=args.timeout,
        max_concurrency=args.max_concurrency,
        token=token,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
