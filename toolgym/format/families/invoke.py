"""``<invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke>`` blocks, shared by MiniMax-M2 (no tag
prefix) and DeepSeek-V3.2's DSML (tags prefixed with ``｜DSML｜``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from toolgym.format.families.common import split_reasoning, tag_blocks
from toolgym.format.parsers import ParsedTurn
from toolgym.tools.base import ToolCall

__all__ = ["Invoke", "parse_invoke_blocks", "read_invokes"]

_ATTR = re.compile(r'\s+([A-Za-z_][\w-]*)="([^"<>]*)"')


@dataclass
class Invoke:
    """One ``<invoke>`` block: its name, its parameters ``(key, attributes, value text)`` in order, the block's
    text, and why it is malformed (``None``: well formed)."""

    name: str
    params: list[tuple[str, dict[str, str], str]] = field(default_factory=list)
    raw: str = ""
    error: str | None = None


def _open_tag(text: str, pos: int, tag: str) -> tuple[dict[str, str], int] | None:
    """The attributes of the tag ``<tag ...>`` that starts at ``pos`` and the index after it, or ``None``."""
    if not text.startswith(f"<{tag}", pos):
        return None
    i = pos + len(tag) + 1
    attrs: dict[str, str] = {}
    while True:
        m = _ATTR.match(text, i)
        if m is None:
            break
        if m.group(1) in attrs:
            return None
        attrs[m.group(1)] = m.group(2)
        i = m.end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if not text.startswith(">", i) or "name" not in attrs:
        return None
    return attrs, i + 1


def _params(body: str, prefix: str) -> tuple[list[tuple[str, dict[str, str], str]], str | None]:
    p_tag, p_close = f"{prefix}parameter", f"</{prefix}parameter>"
    out: list[tuple[str, dict[str, str], str]] = []
    pos = 0
    while True:
        start = body.find("<", pos)
        gap = body[pos:] if start == -1 else body[pos:start]
        if gap.strip():
            return out, f"unexpected text in an invoke: {gap.strip()[:40]!r}"
        if start == -1:
            return out, None
        opened = _open_tag(body, start, p_tag)
        if opened is None:
            return out, f'a parameter tag must be <{p_tag} name="KEY">'
        attrs, vstart = opened
        end = body.find(p_close, vstart)
        if end == -1:
            return out, f"<{p_tag}> is not closed by {p_close}"
        name = attrs.pop("name")
        if not name or any(k == name for k, _, _ in out):
            return out, f"parameter {name!r} is empty or given twice"
        out.append((name, attrs, body[vstart:end]))
        pos = end + len(p_close)


def read_invokes(inner: str, prefix: str = "") -> tuple[list[Invoke], str | None]:
    """The ``<invoke>`` blocks of a call section's inside ``inner`` (tags prefixed with ``prefix``), and an error
    for text outside them (``None``: only whitespace). Never raises."""
    i_tag, i_close = f"{prefix}invoke", f"</{prefix}invoke>"
    invokes: list[Invoke] = []
    pos = 0
    while True:
        start = inner.find(f"<{i_tag}", pos)
        if start == -1:
            rest = inner[pos:]
            return invokes, (f"unexpected text between invokes: {rest.strip()[:40]!r}" if rest.strip() else None)
        if inner[pos:start].strip():
            return invokes, f"unexpected text between invokes: {inner[pos:start].strip()[:40]!r}"
        end = inner.find(i_close, start)
        nxt = inner.find(f"<{i_tag}", start + 1)
        if end == -1 or (nxt != -1 and nxt < end):
            stop = len(inner) if nxt == -1 else nxt
            invokes.append(Invoke("", raw=inner[start:stop], error=f"<{i_tag}> is not closed by {i_close}"))
            pos = stop
            continue
        raw = inner[start : end + len(i_close)]
        opened = _open_tag(inner, start, i_tag)
        if opened is None or opened[1] > end:
            invokes.append(Invoke("", raw=raw, error=f'an invoke must open with <{i_tag} name="NAME">'))
        else:
            attrs, body_start = opened
            name = attrs["name"].strip()
            params, err = _params(inner[body_start:end], prefix)
            if not name or any(c in name for c in " \t\n{}"):
                err = f"an invoke needs a function name, got {attrs['name'][:40]!r}"
            invokes.append(Invoke(name if not err or name else "", params, raw, err))
        pos = end + len(i_close)


def parse_invoke_blocks(text: str, open_tag: str, close_tag: str, prefix: str,
                        call: Callable[[Invoke], ToolCall]) -> ParsedTurn:
    """A turn whose calls are ``open_tag…close_tag`` blocks of ``<invoke>`` elements (tags prefixed with
    ``prefix``): each well-formed invoke is read by ``call``; a malformed block or invoke, text between invokes
    and a block without invokes are parse errors. Reasoning is split off first."""
    body, reasoning = split_reasoning(text)
    outside, blocks = tag_blocks(body, open_tag, close_tag)
    calls: list[ToolCall] = []
    for inner, err in blocks:
        if err:
            calls.append(ToolCall("", raw=inner, parse_error=err))
            continue
        invokes, between = read_invokes(inner, prefix)
        for inv in invokes:
            calls.append(ToolCall(inv.name, raw=inv.raw, parse_error=inv.error) if inv.error else call(inv))
        if between:
            calls.append(ToolCall("", raw=inner, parse_error=between))
        elif not invokes:
            calls.append(ToolCall("", raw=inner, parse_error=f"{open_tag} holds no <{prefix}invoke>"))
    return ParsedTurn("".join(outside).strip(), calls, reasoning)
