"""Who may reach a server: the loopback rule and the Bearer token shared by ``toolgym ui`` and ``toolgym serve``.

* A server binds ``127.0.0.1`` by default. Any other ``--host`` needs a token of 16+ characters (``--token-file``
  or the command's environment variable), else the command refuses to start (:class:`CLIError`, exit 2).
* With a token every request must carry ``Authorization: Bearer TOKEN`` (compared in constant time).
* Without a token the ``Host`` header must be a loopback name, so a web page that rebinds its own DNS name to
  127.0.0.1 (DNS rebinding) cannot talk to the server from a browser.

:func:`asgi_guard` wraps an ASGI app (uvicorn: the MCP server), :func:`aiohttp_guard` is an aiohttp middleware
(``serve model``, ``serve retriever``).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
from pathlib import Path
from typing import Any

from toolgym.errors import CLIError, ExitCode

__all__ = ["LOOPBACK_NAMES", "SERVE_TOKEN_ENV", "add_token_argument", "add_ui_arguments", "aiohttp_guard", "asgi_guard",
           "check_bind", "is_loopback", "read_token", "refusal"]

SERVE_TOKEN_ENV = "TOOLGYM_SERVE_TOKEN"  # the token of `toolgym serve mcp|model|retriever`
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only listens on this machine."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, *, what: str = "the server", env: str = "TOOLGYM_UI_TOKEN") -> None:
    """Refuse a non-loopback bind without a token, and a token too short to guess at (``CLIError``, exit 2)."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise CLIError(f"the access token must have at least {MIN_TOKEN_CHARS} characters (e.g. `python -c \"import "
                       "secrets; print(secrets.token_urlsafe())\"`)", ExitCode.USAGE)
    if not is_loopback(host) and not token:
        raise CLIError(f"refusing to serve on {host}: a non-loopback --host needs a token (set {env} or "
                       f"--token-file FILE); without one {what} binds 127.0.0.1 only", ExitCode.USAGE)


def read_token(token_file: str | None, env: str = "TOOLGYM_UI_TOKEN") -> str | None:
    """The token in ``token_file`` (stripped), else in ``$env``; ``None`` when neither is set."""
    if token_file:
        try:
            return Path(token_file).read_text(encoding="utf-8").strip() or None
        except OSError as e:
            raise CLIError(f"cannot read --token-file {token_file}: {e.strerror}", ExitCode.INPUT) from None
    return os.environ.get(env, "").strip() or None


def add_token_argument(p: argparse.ArgumentParser, env: str) -> None:
    """``--token-file`` for a server command (the token's other source is ``$env``)."""
    p.add_argument("--token-file", default=None,
                   help=f"file holding the access token (else ${env}); a non-loopback --host needs one")


def add_ui_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``toolgym ui`` (declared in the core, so that ``toolgym --help`` lists them without the training package;
    the web UI's server parses its command line with them too)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; any other needs a "
                   "token)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--runs", default="runs", help="runs directory: jobs, uploads, outputs; every path stays inside")
    p.add_argument("--token-file", default=None, help="file holding the access token (else $TOOLGYM_UI_TOKEN)")
    p.add_argument("--max-upload-mb", type=float, default=20.0, help="largest request body (uploads) in MB")


def _host_name(host_header: str) -> str:
    """``"127.0.0.1:8000"`` -> ``"127.0.0.1"``; ``"[::1]:80"`` -> ``"[::1]"``."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def refusal(token: str | None, host_header: str, authorization: str) -> tuple[int, str] | None:
    """``(status, message)`` when a request must be refused, else ``None`` (the rule in the module docstring)."""
    if token is None:
        if _host_name(host_header.strip().lower()) not in LOOPBACK_NAMES:
            return 403, "this server answers loopback host names only (no token is set)"
        return None
    given = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        return 401, "token required: send Authorization: Bearer YOUR_TOKEN"
    return None


def asgi_guard(app: Any, token: str | None) -> Any:
    """``app`` (ASGI) behind :func:`refusal`: refused HTTP requests get a plain-text 401/403."""

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            denied = refusal(token, headers.get("host", ""), headers.get("authorization", ""))
            if denied is not None:
                body = denied[1].encode()
                await send({"type": "http.response.start", "status": denied[0],
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def aiohttp_guard(token: str | None) -> Any:
    """An aiohttp middleware applying :func:`refusal` to every request."""
    from aiohttp import web

    @web.middleware
    async def guard(request: Any, handler: Any) -> Any:
        denied = refusal(token, request.headers.get("Host", ""), request.headers.get("Authorization", ""))
        if denied is not None:
            return web.Response(status=denied[0], text=denied[1])
        return await handler(request)

    return guard
