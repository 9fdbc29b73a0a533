"""MCP results and errors as toolgym sees them: the text a model reads from a ``CallToolResult``, the error kind a
``toolgym serve mcp`` server attached, the per-call encodability check, and which exceptions mean the session is
gone (plus a one-line description of a failed connect)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from toolgym.images import placeholder
from toolgym.tools.base import ToolError, ToolErrorKind

__all__ = ["ERROR_KIND_META", "MCPServerError", "describe_connect_error"]


class MCPServerError(RuntimeError):
    """An MCP server answered with something the client cannot use (e.g. a ``tools/list`` reply that is not a tool
    list). Not a connection failure: the server is reachable; the message names it."""

#: ``_meta`` key carrying the toolgym error kind of a failed call (``toolgym serve mcp`` sets it, the client reads it)
ERROR_KIND_META = "toolgym/error_kind"


def _block_text(block: Any) -> str:
    """The text a model reads for one content block: its text, or a placeholder for a binary block."""
    import mcp_types as types

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return placeholder(block.mime_type, _decoded_len(block.data))
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, {_decoded_len(block.data)} bytes]"
    if isinstance(block, types.ResourceLink):
        return f"[resource: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        return res.text if isinstance(res, types.TextResourceContents) else f"[resource: {res.uri}]"
    return str(block)  # pragma: no cover - future content types


def _result_text(result: Any) -> str:
    """The text a model reads from a ``CallToolResult``: text blocks joined by newlines, placeholders for
    binary blocks, or the structured content as JSON when there is no content."""
    parts = [_block_text(block) for block in result.content or []]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _decoded_len(data: str) -> int:
    """The byte count of base64 ``data`` (padding not counted)."""
    return len(data) * 3 // 4 - len(data[-2:]) + len(data[-2:].rstrip("="))


def _result_content(result: Any) -> Any:
    """What a successful ``CallToolResult`` gives the executor: :func:`_result_text` when it has no image blocks;
    otherwise the blocks in order, each image as ``{"type": "image", "data": <base64>, "mime_type": ...}`` (the
    executor checks it and shows it as its placeholder) and every other block as its text."""
    import mcp_types as types

    blocks = list(result.content or [])
    if not any(isinstance(b, types.ImageContent) for b in blocks):
        return _result_text(result)
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, types.ImageContent):
            out.append({"type": "image", "data": block.data, "mime_type": block.mime_type})
        else:
            out.append(_block_text(block))
    return out


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
    except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError is a ValueError
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
