"""Tool-call parsers by model family, and their registry.

A parser turns the decoded text of one assistant turn into a :class:`ParsedTurn`: the visible content and
every tool call. Malformed calls are **reported, never dropped**: each becomes a :class:`ToolCall` with
``parse_error`` set, which the executor answers with a ``parse_error`` observation. ``parse`` never raises.

Built in:

* ``hermes`` (alias ``qwen``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as
  Hermes, Qwen2.5, Qwen3 and SmolLM2 with a ChatML tool template emit them.
* ``llama3_json`` (alias ``llama3``): Llama 3.1-3.3 JSON calls: the whole message is
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``), several separated by ``;``.
* in :mod:`toolgym.format.families`: ``qwen3_coder`` (alias ``qwen3_xml``), ``deepseek_v3``, ``deepseek_v31``,
  ``openai`` (alias ``harmony``), ``mistral``, ``glm45`` and ``gemma4`` (each under vLLM's ``--tool-call-parser``
  name, so a user passes the same name to both).

A parser also carries its family's *framing*: the tokens that end a turn (:attr:`ToolCallParser.stop_tokens`),
the call ids its template accepts (:meth:`ToolCallParser.call_id`), whether the template needs structured
``tool_calls`` in the history (:attr:`ToolCallParser.structured_history`), and the markers that identify its chat
template (:attr:`ToolCallParser.template_markers`, used by ``parser="auto"``: :func:`detect_parser`).

Register a new family with ``@register_parser("name")`` on a :class:`ToolCallParser` subclass.

This module never imports :mod:`toolgym.format.families` (which imports the base classes from here): the package
``toolgym.format`` imports the families, so they are registered whenever this module is importable (importing
``toolgym.format.parsers`` runs ``toolgym/format/__init__.py`` first). Registration order matters for
:func:`detect_parser` (later = more specific), and it is fixed: ``families`` imports this module (registering
``hermes`` and ``llama3_json``) before it registers its own parsers.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.tools.base import ToolCall

__all__ = [
    "HermesParser",
    "Llama3JsonParser",
    "ParsedTurn",
    "ToolCallParser",
    "detect_parser",
    "get_parser",
    "list_parsers",
    "register_parser",
    "template_family",
]

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)


@dataclass
class ParsedTurn:
    """The parse of one assistant turn.

    Attributes:
        content: the text outside tool calls and reasoning blocks, stripped (the "answer" when no calls).
        calls: every call in order of appearance, malformed ones included (``parse_error`` set).
        reasoning: the text inside ``<think>...</think>`` blocks, if any.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""

    @property
    def n_malformed(self) -> int:
        return sum(c.parse_error is not None for c in self.calls)


class ToolCallParser(abc.ABC):
    """Parses tool calls in one family's format and writes calls in that format; carries the family's framing.

    Class attributes (framing):
        stop_tokens: token texts that end an assistant turn when sampled (``()``: the chat format guesses). The
            first one in the vocabulary closes a turn cut by its budget (:meth:`close_token` may choose per turn).
        template_markers: substrings of a chat template that identify this family (``parser="auto"``); every
            marker of one entry must be present. Checked in registration order, most specific first.
        structured_history: the template needs assistant turns as structured messages (``tool_calls``,
            reasoning) to render the history, instead of the turn's verbatim text.
        reasoning_key: the message key the template reads earlier reasoning from (structured history only).
        turn_closed_by_header: the template writes no end-of-turn token after an assistant turn; the next role
            header (sampled by the model as its stop token) closes it.
    """

    name: str = ""
    stop_tokens: tuple[str, ...] = ()
    template_markers: tuple[tuple[str, ...], ...] = ()
    structured_history: bool = False
    reasoning_key: str = "reasoning_content"
    turn_closed_by_header: bool = False

    def __init__(self) -> None:
        self.param_types: dict[str, dict[str, Any]] = {}

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        """Remember each tool's parameter types (formats that write arguments as text convert values with them).

        ``schemas``: ``Tool.schema()`` dicts (``{"type": "function", "function": {"name", "parameters"}}``)."""
        types: dict[str, dict[str, Any]] = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            props = (f.get("parameters") or {}).get("properties") or {}
            if isinstance(f.get("name"), str) and isinstance(props, Mapping):
                types[f["name"]] = {k: (v or {}).get("type") for k, v in props.items() if isinstance(v, Mapping)}
        self.param_types = types

    def call_id(self, turn: int, index: int) -> str:
        """The id of call ``index`` of assistant turn ``turn`` (unique in the episode, accepted by the template)."""
        return f"call_{turn}_{index}"

    def close_token(self, parsed: ParsedTurn) -> str | None:
        """The token closing a turn cut by its budget (``None``: the chat format's end-of-turn token)."""
        return None

    def answer_text(self, text: str) -> str:
        """The assistant text a model of this family writes to answer ``text`` without calling a tool."""
        return text

    @abc.abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """Parse one turn's decoded text (special tokens included, end-of-turn token removed). Never raises."""

    @abc.abstractmethod
    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        """The assistant text a model of this family writes for ``content`` followed by ``calls``
        (``(name, arguments)`` pairs). Used by scripted policies and SFT data."""


_REGISTRY: dict[str, Callable[[], ToolCallParser]] = {}


def register_parser(*names: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    """Class decorator registering a parser under one or more names."""

    def deco(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        for n in names:
            _REGISTRY[n] = cls
        if not cls.name:
            cls.name = names[0]
        return cls

    return deco


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """A parser instance by registry name (an instance is returned as is)."""
    if isinstance(name, ToolCallParser):
        return name
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; registered: {sorted(_REGISTRY)}") from None


def list_parsers() -> list[str]:
    return sorted(_REGISTRY)


def template_family(chat_template: str | None) -> str | None:
    """The registered parser name whose template markers are in ``chat_template``, or ``None``."""
    try:
        return detect_parser(chat_template)
    except ValueError:
        return None


def detect_parser(chat_template: str | None) -> str:
    """The registered parser name for a chat template (``parser="auto"``), from each family's template markers.

    Families are tried from the last registered to the first (a family's markers can contain a more generic
    one's, e.g. Qwen3-Coder's template also mentions ``<tool_call>`` and ``arguments``). Raises ``ValueError``
    naming the choices when no family's markers are all present."""
    text = chat_template if isinstance(chat_template, str) else ""
    seen: set[type[ToolCallParser]] = set()
    for name, cls in reversed(_REGISTRY.items()):  # later registrations are the more specific families
        if cls in seen:
            continue
        seen.add(cls)
        if any(all(m in text for m in markers) for markers in cls.template_markers):
            return cls.name or name
    raise ValueError(
        "parser='auto' cannot tell the tool-call format from this chat template (no known family's markers in "
        f"it); pass parser= one of {sorted(_REGISTRY)}"
    )


_JSON_DECODER = json.JSONDecoder()


def _split_reasoning(text: str) -> tuple[str, str]:
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
    return _THINK.sub(grab, text), "\n".join(r for r in reasoning if r)


def _call_from_obj(obj: Any, raw: str, args_key: str) -> ToolCall:
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


@register_parser("hermes", "qwen")
class HermesParser(ToolCallParser):
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`` blocks (Hermes / Qwen / ChatML).

    Errors reported: invalid JSON, a non-object, a missing name, non-object arguments, an unclosed
    ``<tool_call>``, a stray ``</tool_call>``, and more than one JSON value in one block.
    """

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    template_markers = (("<tool_call>", "arguments"),)

    def parse(self, text: str) -> ParsedTurn:
        try:
            return self._parse(text)
        except Exception as e:  # noqa: BLE001 - defence in depth: parse never raises
            return ParsedTurn(text.strip(), [ToolCall("", raw=text, parse_error=f"unparsable turn: {e}")])

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = _split_reasoning(text)
        calls: list[ToolCall] = []
        content: list[str] = []
        pos = 0
        o, c = self.open_tag, self.close_tag
        while True:
            start = body.find(o, pos)
            stray = body.find(c, pos)
            if stray != -1 and (start == -1 or stray < start):
                content.append(body[pos:stray])
                calls.append(ToolCall("", raw=c, parse_error=f"{c} without a matching {o}"))
                pos = stray + len(c)
                continue
            if start == -1:
                content.append(body[pos:])
                break
            content.append(body[pos:start])
            end = body.find(c, start + len(o))
            nxt = body.find(o, start + len(o))
            if end == -1 or (nxt != -1 and nxt < end):
                stop = len(body) if nxt == -1 else nxt
                raw = body[start:stop]
                calls.append(ToolCall("", raw=raw, parse_error=f"{o} is not closed by {c}"))
                pos = stop
                continue
            raw = body[start : end + len(c)]
            calls.append(self._decode(body[start + len(o) : end].strip(), raw))
            pos = end + len(c)
        return ParsedTurn("".join(content).strip(), calls, reasoning)

    @staticmethod
    def _decode(payload: str, raw: str) -> ToolCall:
        if not payload:
            return ToolCall("", raw=raw, parse_error="empty tool call")
        try:
            obj, end = _JSON_DECODER.raw_decode(payload)
        except json.JSONDecodeError as e:
            return ToolCall("", raw=raw, parse_error=f"invalid JSON in tool call: {e.msg} at char {e.pos}")
        except RecursionError:
            return ToolCall("", raw=raw, parse_error="tool call JSON is nested too deeply")
        if payload[end:].strip():
            return ToolCall("", raw=raw, parse_error="extra text after the JSON object in a tool call")
        return _call_from_obj(obj, raw, "arguments")

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        parts = [content] if content else []
        for name, args in calls:
            parts.append(
                f"{self.open_tag}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{self.close_tag}"
            )
        return "\n".join(parts)


@register_parser("llama3_json", "llama3")
class Llama3JsonParser(ToolCallParser):
    """Llama 3.x JSON calls: the turn is ``{"name": ..., "parameters": {...}}`` (``"arguments"`` accepted),
    optionally prefixed by ``<|python_tag|>``; several calls are separated by ``;``.

    A turn whose text (after the optional tag) does not start with ``{`` is a plain answer. One that does
    must be entirely calls: any invalid JSON or trailing text is a parse error.
    """

    python_tag = "<|python_tag|>"
    stop_tokens = ("<|eot_id|>", "<|eom_id|>")
    template_markers = (("<|start_header_id|>", '"parameters"'), ("<|start_header_id|>", "ipython"))

    def parse(self, text: str) -> ParsedTurn:
        try:
            return self._parse(text)
        except Exception as e:  # noqa: BLE001
            return ParsedTurn(text.strip(), [ToolCall("", raw=text, parse_error=f"unparsable turn: {e}")])

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = _split_reasoning(text)
        s = body.strip()
        tagged = s.startswith(self.python_tag)
        if tagged:
            s = s[len(self.python_tag) :].lstrip()
        if not s.startswith("{"):
            if tagged:
                return ParsedTurn("", [ToolCall("", raw=body, parse_error="<|python_tag|> not followed by a JSON call")], reasoning)
            return ParsedTurn(s, [], reasoning)
        calls: list[ToolCall] = []
        dec = json.JSONDecoder()
        pos = 0
        while pos < len(s):
            try:
                obj, end = dec.raw_decode(s, pos)
            except json.JSONDecodeError as e:
                calls.append(ToolCall("", raw=s[pos:], parse_error=f"invalid JSON in tool call: {e.msg} at char {e.pos}"))
                break
            except RecursionError:
                calls.append(ToolCall("", raw=s[pos:], parse_error="tool call JSON is nested too deeply"))
                break
            if isinstance(obj, dict) and "name" in obj and "parameters" not in obj and "arguments" not in obj:
                # vLLM reads such an object as text, never as a call
                calls.append(ToolCall("", raw=s[pos:end], parse_error='a call needs "parameters" (or "arguments")'))
            else:
                calls.append(_call_from_obj(obj, s[pos:end], "parameters"))
            pos = end
            rest = s[pos:].lstrip()
            if not rest:
                break
            if rest.startswith(";"):
                pos = len(s) - len(rest) + 1
                while pos < len(s) and s[pos].isspace():
                    pos += 1
                continue
            calls.append(ToolCall("", raw=rest, parse_error="unexpected text after a JSON tool call"))
            break
        return ParsedTurn("", calls, reasoning)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        body = "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
        return f"{content}\n{body}".strip() if content and not calls else body or content

