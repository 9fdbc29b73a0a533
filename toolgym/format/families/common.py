"""What several families' parsers share: reasoning blocks, strict call objects, JSON objects, tagged blocks."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from toolgym.format.parsers import ParsedTurn
from toolgym.tools.base import ToolCall

__all__ = ["JSON_DECODER", "THINK", "ToolCallBlocks", "arg_text", "call_from_obj", "json_object", "render_calls",
           "render_text_calls", "section_calls", "split_reasoning", "tag_blocks"]

THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
JSON_DECODER = json.JSONDecoder()


def split_reasoning(text: str) -> tuple[str, str]:
    """``(text without <think> blocks, their contents joined)``."""
    if "think>" not in text:  # no <think> / </think> at all: the common case, no regex pass
        return text, ""
    reasoning = []

    def grab(m: re.Match[str]) -> str:
        inner = m.group(0)[len("<think>") :]
        if inner.endswith("</think>"):
            inner = inner[: -len("</think>")]
        reasoning.append(inner.strip())
        return ""

    # A Qwen3 generation prompt may open <think> in the prompt, so a turn can start inside reasoning.
    if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
        head, text = text.split("</think>", 1)
        reasoning.append(head.strip())
    return THINK.sub(grab, text), "\n".join(r for r in reasoning if r)


def call_from_obj(obj: Any, raw: str, args_key: str) -> ToolCall:
    """Validate a decoded call object strictly; errors name what is wrong."""
    if not isinstance(obj, dict):
        return ToolCall("", raw=raw, parse_error=f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", raw=raw, parse_error='a tool call needs a non-empty string "name"')
    args = obj.get(args_key, obj.get("arguments", {}) if args_key != "arguments" else {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(
            name, raw=raw, parse_error=f'"{args_key}" of a call to {name!r} must be a JSON object, '
            f"got {type(args).__name__}"
        )
    return ToolCall(name, args, raw=raw)


def json_object(payload: str, raw: str, name: str) -> ToolCall:
    """A call to ``name`` whose arguments are the JSON object ``payload`` (strict: nothing else after it)."""
    payload = payload.strip()
    if not payload:
        return ToolCall(name, {}, raw=raw)
    try:
        obj, end = JSON_DECODER.raw_decode(payload)
    except json.JSONDecodeError as e:
        return ToolCall(name, raw=raw, parse_error=f"invalid JSON arguments for {name!r}: {e.msg} at char {e.pos}")
    except RecursionError:
        return ToolCall(name, raw=raw, parse_error="tool call JSON is nested too deeply")
    if payload[end:].strip():
        return ToolCall(name, raw=raw, parse_error=f"extra text after the JSON arguments of {name!r}")
    if not isinstance(obj, dict):
        return ToolCall(name, raw=raw, parse_error=f"arguments of {name!r} must be a JSON object, got {type(obj).__name__}")
    return ToolCall(name, obj, raw=raw)


def tag_blocks(body: str, open_tag: str, close_tag: str,
               end_of: Callable[[int], int] | None = None) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Split ``body`` into text outside ``open_tag…close_tag`` blocks and the blocks' insides.

    Returns ``(outside, blocks)``: each block is ``(inner, error)``; ``error`` says why a block is malformed
    (not closed, or a stray closing tag). ``end_of(i)``, when given, is where the block whose inside starts at
    ``i`` really ends (the index of its ``close_tag``; a format whose values may contain the tags tells them apart
    there), or -1 to fall back to the first ``close_tag`` before the next ``open_tag``. The tags' places are found
    once, so a text of thousands of unclosed blocks is split in linear time."""
    opens = [m.start() for m in re.finditer(re.escape(open_tag), body)]
    closes = [m.start() for m in re.finditer(re.escape(close_tag), body)]

    def first(positions: list[int], at: int) -> int:
        i = bisect_left(positions, at)
        return positions[i] if i < len(positions) else -1

    outside: list[str] = []
    blocks: list[tuple[str, str | None]] = []
    pos = 0
    while True:
        start, stray = first(opens, pos), first(closes, pos)
        if stray != -1 and (start == -1 or stray < start):
            outside.append(body[pos:stray])
            blocks.append((close_tag, f"{close_tag} without a matching {open_tag}"))
            pos = stray + len(close_tag)
            continue
        if start == -1:
            outside.append(body[pos:])
            return outside, blocks
        outside.append(body[pos:start])
        inner = start + len(open_tag)
        end = end_of(inner) if end_of is not None else -1
        if end == -1:
            end, nxt = first(closes, inner), first(opens, inner)
            if end == -1 or (nxt != -1 and nxt < end):
                stop = len(body) if nxt == -1 else nxt
                blocks.append((body[start:stop], f"{open_tag} is not closed by {close_tag}"))
                pos = stop
                continue
        blocks.append((body[inner:end], None))
        pos = end + len(close_tag)


def section_calls(body: str, start: int, tags: tuple[str, str, str, str], decode: Callable[[str], ToolCall],
                  family: str) -> tuple[str, list[ToolCall]]:
    """The calls of a section of call blocks that opens at ``body[start]`` (DeepSeek's and Kimi's formats), and
    the text after the section. ``tags``: ``(section begin, section end, call begin, call end)``; each well-formed
    block's inside is read by ``decode``. Errors: a malformed block, text between blocks, an unclosed or empty
    section (``family`` names the format in the messages)."""
    begin, end_tag, call_open, call_close = tags
    rest = body[start + len(begin) :]
    end = rest.find(end_tag)
    inner, tail = (rest, "") if end == -1 else (rest[:end], rest[end + len(end_tag) :])
    outside, blocks = tag_blocks(inner, call_open, call_close)
    calls = [ToolCall("", raw=b, parse_error=err) if err else decode(b) for b, err in blocks]
    if any(o.strip() for o in outside):
        calls.append(ToolCall("", raw=inner, parse_error=f"unexpected text between {family} tool calls"))
    if end == -1:
        calls.append(ToolCall("", raw=rest, parse_error=f"{begin} is not closed by {end_tag}"))
    elif not blocks:
        calls.append(ToolCall("", raw=rest, parse_error=f"empty {family} tool-call section"))
    return tail, calls


def render_calls(calls: Sequence[tuple[str, dict[str, Any]]], content: str, sep: str,
                 call_text: Callable[[str, dict[str, Any]], str]) -> str:
    """``content``, then ``sep``, then each call written by ``call_text(name, arguments)``, one per line
    (``content`` alone without calls, the calls alone without content)."""
    out = "\n".join(call_text(name, args) for name, args in calls)
    return f"{content}{sep}{out}" if content and out else content or out


def render_text_calls(calls: Sequence[tuple[str, dict[str, Any]]], content: str, sep: str,
                      head: str, param: str, foot: str) -> str:
    """:func:`render_calls` for the formats that write each argument as text: a call is ``head`` (``{name}``
    filled), one ``param`` per argument (``{key}`` and ``{value}``: :func:`arg_text`), then ``foot``."""
    return render_calls(calls, content, sep, lambda name, args: head.format(name=name) + "".join(
        param.format(key=k, value=arg_text(v)) for k, v in args.items()) + foot)


def arg_text(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else str(v)


class ToolCallBlocks:
    """Mixin (before :class:`~toolgym.format.parsers.ToolCallParser`): calls in ``<tool_call>...</tool_call>``
    blocks, each read by the family's ``_call(inner)``; reasoning split off first."""

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = split_reasoning(text)
        outside, blocks = tag_blocks(body, "<tool_call>", "</tool_call>", self._block_end(body))
        calls = [ToolCall("", raw=inner, parse_error=err) if err else self._call(inner) for inner, err in blocks]
        return ParsedTurn("".join(outside).strip(), calls, reasoning)

    def _block_end(self, body: str) -> Callable[[int], int] | None:
        """The ``end_of`` of :func:`tag_blocks` for ``body`` (``None``: a block ends at the first ``</tool_call>``)."""
        return None

    def _call(self, inner: str) -> ToolCall:  # pragma: no cover - overridden
        raise NotImplementedError
