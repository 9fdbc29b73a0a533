"""Tool-call parsers: the base class, the registry and family detection.

A :class:`ToolCallParser` reads one family's tool-call format from a turn's text (:meth:`ToolCallParser.parse`,
which never raises: the guard is here, once, around each family's :meth:`ToolCallParser._parse`) and writes calls
in it (``format_calls``). The families live in :mod:`toolgym.format.families`, one module per family (or group);
importing ``toolgym.format`` registers all of them, in a fixed order (``parser="auto"`` tries the last registered
first). Register a new family with ``@register_parser("name")`` on a subclass that implements ``_parse`` and
``format_calls``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.tools.base import ToolCall

__all__ = [
    "ParsedTurn",
    "ToolCallParser",
    "detect_parser",
    "get_parser",
    "list_parsers",
    "register_parser",
    "template_family",
]


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

    def parse(self, text: str) -> ParsedTurn:
        """Parse one turn's decoded text (special tokens included, end-of-turn token removed). Never raises: any
        unexpected exception of the family's :meth:`_parse` becomes one call with ``parse_error`` set (defence in
        depth; malformed calls the family recognises are reported by :meth:`_parse` itself)."""
        try:
            return self._parse(text)
        except Exception as e:  # noqa: BLE001 - parse never raises
            return ParsedTurn(text.strip(), [ToolCall("", raw=text[:2000], parse_error=f"unparsable turn: {e}")])

    @abc.abstractmethod
    def _parse(self, text: str) -> ParsedTurn:
        """The family's parser (called by :meth:`parse`, which guards it): content, calls (malformed ones with
        ``parse_error``) and reasoning of one turn's text."""

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
