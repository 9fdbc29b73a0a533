"""One vLLM test case as data (:class:`Case`) and the helper that writes a tool schema.

``toolgym``: ``"agree"`` (the same calls, no parse error), ``"stricter"`` (a parse error the model reads where
vLLM recovers a call or reads text; every call toolgym does make is one of vLLM's, in order) or ``"text"``
(toolgym reads the turn as an answer where vLLM finds a call); ``why`` says why for the last two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    """One vLLM test case. ``vllm``: the calls vLLM returns, ``(name, arguments)`` (arguments as vLLM's JSON
    decoded, or the raw string when vLLM passes a non-JSON string on)."""

    parsers: tuple[str, ...]
    source: str  # "<vLLM test file>::<test>[case]"
    text: str
    vllm: list[tuple[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    toolgym: str = "agree"
    why: str = ""


def tool(tool_name: str, /, **props: dict[str, Any]) -> dict[str, Any]:
    """A tool schema as the OpenAI API writes it."""
    return {"type": "function", "function": {"name": tool_name, "parameters": {"type": "object", "properties": props}}}


