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
``restart_after_timeouts`` (a server whose calls time out this many times in a row, with no answer between, is
treated as hung: a stdio server is restarted, an HTTP server gets a new session; default 3, ``0`` never).
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
* a server that stops answering (hung, not dead): after ``restart_after_timeouts`` consecutive calls cancelled
  without an answer (timeouts), a stdio server's process is killed and the next call starts a new one; an HTTP
  session is closed and the next call opens a new one (a session stuck on the server side is replaced; for a
  server that answers nobody, calls keep timing out, on time, until it answers a new handshake);
* the executor's per-call timeout cancels the pending request: the SDK sends ``notifications/cancelled``
  and the session stays usable.

All sessions live on the toolgym runtime loop (:mod:`toolgym.runtime`): each is owned by one long-lived
task there (anyio task groups must be entered and exited in the same task); calls from any loop or thread
are routed to it.

Modules: :mod:`~toolgym.tools.mcp.config` (the ``mcpServers`` config), :mod:`~toolgym.tools.mcp.connection` (one
server's session: lifecycle, restarts, stderr tail), :mod:`~toolgym.tools.mcp.toolset` (the tools, their names,
the toolset) and :mod:`~toolgym.tools.mcp.results` (result text, error kinds, connect-error descriptions). Every
public name is importable from here.
"""

from toolgym.tools.mcp.config import (
    DEFAULT_RESTART_AFTER_TIMEOUTS,
    PREFIX_SEPARATOR,
    ConfigSource,
    MCPServerConfig,
    load_mcp_config,
)
from toolgym.tools.mcp.connection import MCPServerConnection
from toolgym.tools.mcp.results import ERROR_KIND_META, MCPServerError, describe_connect_error
from toolgym.tools.mcp.toolset import MCPTool, MCPToolset, PrefixMode, assign_tool_names, load_mcp_tools

__all__ = [
    "DEFAULT_RESTART_AFTER_TIMEOUTS",
    "ERROR_KIND_META",
    "PREFIX_SEPARATOR",
    "ConfigSource",
    "MCPServerConfig",
    "MCPServerConnection",
    "MCPServerError",
    "MCPTool",
    "MCPToolset",
    "PrefixMode",
    "assign_tool_names",
    "describe_connect_error",
    "load_mcp_config",
    "load_mcp_tools",
]
