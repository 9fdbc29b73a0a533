"""toolgym's MCP client transports: a stdio transport whose reader survives what a server writes, and a
``tools/list`` filter that keeps a server's good tools when one of them is malformed.

:func:`stdio_transport` replaces the SDK's ``stdio_client`` (same process handling: the server in its own process
group, stdin closed then the group terminated on exit) for two faults of its reader:

* the SDK decodes the server's stdout strictly: one line that is not UTF-8 raised inside the reader task and ended
  it while the session still looked alive, so every call after it timed out. Here every line is decoded with
  replacement characters (a garbage line becomes a parse error the session logs and ignores; bad bytes inside a
  JSON string arrive as U+FFFD), and whenever the reader ends, for any reason, the read stream is closed: the
  session sees the transport end and toolgym restarts the server;
* the SDK joined its line buffer with each new chunk (``buffer + chunk``, then ``split``): a one-line result of
  *n* bytes costs O(n²/chunk). Here bytes accumulate in one ``bytearray`` and each byte is
  scanned for the newline once, so a line costs O(n).

:func:`filter_tool_lists` wraps any transport (stdio or HTTP). The SDK validates a ``tools/list`` result as a
whole, so one tool with a malformed ``inputSchema`` made every tool of that server (and the env) fail. The filter
checks each listed tool on its own (the SDK's ``Tool`` model and a valid JSON Schema for ``inputSchema``) and
drops the bad ones before the SDK sees the reply, reporting each with its name and why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

__all__ = ["filter_tool_lists", "stdio_transport"]

logger = logging.getLogger("toolgym.tools.mcp")

_CLOSE_GRACE_S = 2.0  # the server may exit on its own after its stdin closes
_KILL_GRACE_S = 2.0  # after SIGTERM to its process group, before SIGKILL
_FLUSH_S = 0.5  # the writer's time to send what it accepted before stdin closes
_DRAIN_IDLE_S = 1.0  # after stdin breaks, how long the reader may read nothing before the session ends


def _parse(line: bytes) -> Any:
    """A ``SessionMessage`` for one line of the server's stdout, or the parse error as a value (the session logs
    it); the line is decoded with replacement characters, never strictly."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line.decode("utf-8", "replace")))
    except ValueError as e:
        return e


async def _exited(process: Any, timeout_s: float) -> bool:
    """Whether ``process`` exits within ``timeout_s`` (polled: ``wait()`` also waits for its pipes to close, which a
    child that inherited them may keep open)."""
    with anyio.move_on_after(timeout_s):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


@contextlib.asynccontextmanager
async def stdio_transport(params: Any, errlog: Any) -> AsyncIterator[tuple[Any, Any]]:
    """Start the stdio MCP server of ``params`` (``mcp.StdioServerParameters``; its stderr to ``errlog``) and yield
    the session's ``(read stream, write stream)``. See the module docstring for what differs from the SDK."""
    from mcp.client.stdio import get_default_environment
    from mcp.os.posix.utilities import terminate_posix_process_tree

    process = await anyio.open_process(
        [params.command, *params.args], env=get_default_environment() | (params.env or {}), stderr=errlog,
        cwd=params.cwd, start_new_session=True,
    )  # fmt: skip
    read_send, read_recv = anyio.create_memory_object_stream[Any](0)
    write_send, write_recv = anyio.create_memory_object_stream[Any](0)
    writer_done = anyio.Event()
    reader_done = anyio.Event()
    progress = [0]  # bytes the reader has taken from the server's stdout

    async def reader() -> None:
        assert process.stdout is not None
        buf = bytearray()
        scanned = 0  # bytes of buf already searched for a newline
        deliver = True
        try:
            async for chunk in process.stdout:
                progress[0] += len(chunk)
                buf += chunk
                while (end := buf.find(b"\n", scanned)) >= 0:
                    line = bytes(buf[:end])
                    del buf[: end + 1]  # CPython drops a bytearray's head in O(1)
                    scanned = 0
                    if deliver and line.strip():
                        try:
                            await read_send.send(_parse(line))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            deliver = False  # the session is gone: keep draining so the server can exit
                scanned = len(buf)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            pass
        except Exception:  # noqa: BLE001 - whatever ends the reader ends the session (below), never silently
            logger.exception("MCP stdio reader failed; closing the session")
        finally:
            read_send.close()  # the session sees the transport end (and toolgym restarts the server)
            reader_done.set()

    async def end_after_drain() -> None:
        """The server stopped reading (it exited or closed stdin). Answers it wrote before are still in the pipe:
        the reader delivers them and ends the session at EOF. A server that keeps stdout open without writing ends
        it here, once the reader has read nothing for ``_DRAIN_IDLE_S``."""
        seen = -1
        while seen != progress[0]:
            seen = progress[0]
            with anyio.move_on_after(_DRAIN_IDLE_S):
                await reader_done.wait()
        read_send.close()

    async def writer() -> None:
        assert process.stdin is not None
        broken = False
        try:
            async with write_recv:
                async for message in write_recv:
                    if broken:  # taken and dropped: the request fails when the session ends, like those in flight
                        continue
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    try:
                        await process.stdin.send(data.encode("utf-8", "backslashreplace"))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                        # not closing the write stream: a failed send would look like a dead session to the caller
                        # and end it before the answers already in the pipe are read
                        broken = True
                        tg.start_soon(end_after_drain)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            read_send.close()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            with anyio.CancelScope(shield=True):
                read_recv.close()
                write_send.close()
                with anyio.move_on_after(_FLUSH_S):
                    await writer_done.wait()
                with contextlib.suppress(Exception):
                    await process.stdin.aclose()  # type: ignore[union-attr]
                if not await _exited(process, _CLOSE_GRACE_S):
                    with contextlib.suppress(Exception):
                        await terminate_posix_process_tree(process, _KILL_GRACE_S)
                    await _exited(process, _KILL_GRACE_S)
                with contextlib.suppress(Exception):
                    await process.aclose()
            tg.cancel_scope.cancel()


def check_tool(tool: Any) -> str | None:
    """Why one raw ``tools/list`` entry cannot be used (``None`` when it can): the SDK's ``Tool`` model rejects it,
    or its ``inputSchema`` is not a valid JSON Schema."""
    import jsonschema
    import mcp_types as types
    from pydantic import ValidationError

    try:
        types.Tool.model_validate(tool)
    except ValidationError as e:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg', e)}" if where else str(e)
    schema = tool.get("inputSchema")
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path)
        return f"inputSchema{'/' + path if path else ''}: {e.message}"
    return None


def _filtered(item: Any, on_invalid: Callable[[str, str], None]) -> Any:
    """``item`` with the unusable tools of a ``tools/list`` result removed (any other item unchanged)."""
    import mcp_types as types

    msg = getattr(item, "message", None)
    if not isinstance(msg, types.JSONRPCResponse) or not isinstance(msg.result, dict):
        return item
    tools = msg.result.get("tools")
    if not isinstance(tools, list):
        return item
    keep = []
    for t in tools:
        why = check_tool(t) if isinstance(t, dict) else f"expected an object, got {type(t).__name__}"
        if why is None:
            keep.append(t)
        else:
            name = t.get("name") if isinstance(t, dict) else None
            on_invalid(name if isinstance(name, str) else repr(name), why)
    if len(keep) != len(tools):
        msg.result["tools"] = keep
    return item


@contextlib.asynccontextmanager
async def filter_tool_lists(
    transport: Any, on_invalid: Callable[[str, str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Wrap ``transport`` (an async context manager yielding ``(read, write)``): every ``tools/list`` result read
    from it loses the tools :func:`check_tool` rejects, each reported as ``on_invalid(tool name, why)``."""
    async with transport as (inner_read, inner_write):
        send, recv = anyio.create_memory_object_stream[Any](0)

        async def pump() -> None:
            async with send:
                try:
                    async for item in inner_read:
                        await send.send(_filtered(item, on_invalid))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                    pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield recv, inner_write
            finally:
                recv.close()
                tg.cancel_scope.cancel()
