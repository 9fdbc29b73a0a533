"""A fault-injection MCP server for toolgym's tests (written here; the only fake in the MCP tests).

Tools: ``echo``, ``add``, ``pid`` (the server's process id), ``sleep_ms`` (a slow tool, annotated read-only and
idempotent), ``hang`` (never returns; records its own cancellation), ``fail`` (raises: an ``isError`` result),
``crash`` (the process exits mid-call), ``count`` (how many calls this process has served), ``record`` (appends its
token to ``<marker dir>/record.log`` then sleeps: a non-idempotent side effect), ``freeze`` (blocks the server's
event loop: the whole server hangs without dying), ``big_text`` (megabytes of text), ``picture`` (a caption and
``count`` copies of one PNG image of ``width`` x ``height`` pixels as ``ImageContent`` blocks, or with ``garbage``
set, bytes that are no image declared ``image/png``); over HTTP with sessions (the legacy ``initialize`` protocol):
``session_id`` (the caller's ``Mcp-Session-Id``), ``wedge_session`` (the caller's session gets stuck: from then on
``session_echo`` hangs on it, as a stuck per-session resource would, while other sessions are served).

Run: ``python fault_server.py`` (stdio) or ``python fault_server.py --http PORT``. Set
``FAULT_SERVER_MARKER_DIR`` to a directory where ``hang`` writes ``cancelled-<token>`` when its request is
cancelled, and ``started-<token>`` when it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import time
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ImageContent, TextContent, ToolAnnotations

server = MCPServer("toolgym-fault-server")
_calls = 0
_wedged: set[str | None] = set()  # session ids whose per-session resource is stuck


def _mark(name: str) -> None:
    d = os.environ.get("FAULT_SERVER_MARKER_DIR")
    if d:
        Path(d, name).write_text(str(os.getpid()))


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    global _calls
    _calls += 1
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    global _calls
    _calls += 1
    return a + b


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def count() -> int:
    """How many echo/add calls this process has served."""
    return _calls


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
async def sleep_ms(ms: int) -> str:
    """Sleep ``ms`` milliseconds, then answer."""
    await asyncio.sleep(ms / 1000)
    return f"slept {ms} ms"


@server.tool()
async def hang(token: str) -> str:
    """Never return (until cancelled)."""
    _mark(f"started-{token}")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _mark(f"cancelled-{token}")
        raise
    return "unreachable"


@server.tool()
def fail(message: str) -> str:
    """Raise an error with ``message``."""
    raise RuntimeError(message)


@server.tool()
async def record(token: str, ms: int) -> str:
    """Append ``token`` to record.log in the marker directory, then sleep ``ms`` milliseconds."""
    d = os.environ.get("FAULT_SERVER_MARKER_DIR")
    if d:
        with open(Path(d, "record.log"), "a") as f:
            f.write(token + "\n")
    await asyncio.sleep(ms / 1000)
    return f"recorded {token}"


@server.tool()
async def freeze() -> str:
    """Block the server's event loop for an hour: every request hangs, the process stays alive."""
    _mark("frozen")
    time.sleep(3600)
    return "unreachable"


def _session(ctx: Context) -> str | None:
    return (ctx.headers or {}).get("mcp-session-id")


@server.tool()
def session_id(ctx: Context) -> str:
    """The caller's MCP session id (HTTP with sessions; ``None`` otherwise)."""
    return str(_session(ctx))


@server.tool()
def wedge_session(ctx: Context) -> str:
    """Make the caller's session stuck: ``session_echo`` never answers on it again."""
    _wedged.add(_session(ctx))
    return "wedged"


@server.tool()
async def session_echo(text: str, ctx: Context) -> str:
    """Return the text, unless the caller's session is wedged: then never return (until cancelled)."""
    if _session(ctx) in _wedged:
        await asyncio.sleep(3600)
    return text


@server.tool()
def big_text(mb: int) -> str:
    """Return ``mb`` megabytes of text (one JSON-RPC line of that size over stdio)."""
    return "x" * (mb * 1024 * 1024)


@server.tool()
def picture(width: int, height: int, count: int = 1, garbage: bool = False) -> list[TextContent | ImageContent]:
    """A caption, then ``count`` copies of one PNG image of ``width`` x ``height`` pixels (pixel (0, 0) red, the rest
    blue), or bytes that are no image declared ``image/png`` when ``garbage``."""
    from PIL import Image

    blocks: list[TextContent | ImageContent] = [TextContent(type="text", text=f"{count} picture(s)")]
    data = b"this is not a png" * 3
    if not garbage:
        img = Image.new("RGB", (width, height), (0, 10, 200))
        img.putpixel((0, 0), (255, 0, 0))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        data = buf.getvalue()
    for _ in range(count):
        blocks.append(ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type="image/png"))
    return blocks


@server.tool()
def crash() -> str:
    """Exit the server process immediately, mid-call."""
    os._exit(3)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    a = p.parse_args()
    if a.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=a.http)
    else:
        server.run()
