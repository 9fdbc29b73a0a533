"""The standard MCP client config: ``{"mcpServers": {name: {...}}}`` as JSON, a Python-literal ``.pydata`` file
(RL-Factory's form, read with :func:`ast.literal_eval`, never ``eval``), a dict, or a list of such dicts.

:func:`load_mcp_config` parses one into ``{server name: MCPServerConfig}``; the keys are listed in
:mod:`toolgym.tools.mcp` and on :class:`MCPServerConfig`.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolgym.errors import InputFileError

__all__ = [
    "DEFAULT_RESTART_AFTER_TIMEOUTS",
    "PREFIX_SEPARATOR",
    "ConfigSource",
    "MCPServerConfig",
    "load_mcp_config",
]

PREFIX_SEPARATOR = "__"
_CONFIG_KEYS = {
    "command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout", "max_concurrency",
    "include", "exclude", "cacheable", "stderr", "disabled", "description", "idempotent", "restart_after_timeouts",
}  # fmt: skip
DEFAULT_RESTART_AFTER_TIMEOUTS = 3


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
        stderr: where a stdio server's stderr goes: ``"auto"`` (default: this process's stderr when toolgym's
            output is verbose, ``toolgym -v`` / ``TOOLGYM_VERBOSE=1``, else nowhere; a tail is kept for error
            messages either way), ``"inherit"``, ``"devnull"`` or a file path.
        idempotent: which tools' calls may be re-sent after the connection died mid-call: ``True`` (all),
            ``False`` (none), a list of server-side tool names, or ``None`` (default: the tools annotated
            ``readOnlyHint`` or ``idempotentHint``).
        restart_after_timeouts: after this many consecutive calls cancelled without an answer, drop the session as
            hung (``0``: never): a stdio server is restarted; an HTTP server gets a new session on new connections
            (toolgym does not own its process).
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
    stderr: str = "auto"
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
            stderr=str(spec.get("stderr", "auto")),
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
