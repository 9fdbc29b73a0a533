"""GPT-OSS harmony: a call is a message to ``functions.NAME``."""

from __future__ import annotations

import json
import re
from typing import Any

from toolgym.format.families.common import (
    json_object,
)
from toolgym.format.parsers import ParsedTurn, ToolCallParser, register_parser
from toolgym.tools.base import ToolCall

__all__ = ["HarmonyParser"]


# -- GPT-OSS harmony --------------------------------------------------------------------------------
_H_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_H_RECIPIENT = re.compile(r"to=([^\s<]+)")
_H_ROLE = re.compile(r"\s*([A-Za-z_][\w.]*)")
_H_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


@register_parser("openai", "harmony")
class HarmonyParser(ToolCallParser):
    """GPT-OSS harmony. The text is what follows the prompt's ``<|start|>assistant``: one or more messages, each
    ``HEADER<|message|>BODY`` ended by ``<|end|>`` (more follow after ``<|start|>assistant``), ``<|call|>`` or
    ``<|return|>``. A message whose header names a recipient ``functions.NAME`` (before or after
    ``<|channel|>``) is a call with a JSON body; ``analysis`` is reasoning; ``final`` (and ``commentary`` without
    a recipient) is content. Only ``<|call|>`` and ``<|return|>`` stop a turn (``<|end|>`` ends a message)."""

    stop_tokens = ("<|call|>", "<|return|>")
    template_markers = (("<|channel|>", "<|call|>"),)
    structured_history = True
    reasoning_key = "thinking"

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|call|>" if parsed.calls else "<|return|>"

    def answer_text(self, text: str) -> str:
        return f"<|channel|>final<|message|>{text}"

    def _parse(self, text: str) -> ParsedTurn:
        if "<|message|>" not in text and "to=" not in text:
            return ParsedTurn(text.strip(), [])
        chunks = text.split("<|start|>")
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        for k, chunk in enumerate(chunks):
            if k > 0:
                m = _H_ROLE.match(chunk)
                role = m.group(1) if m else ""
                if role != "assistant":
                    calls.append(ToolCall("", raw=chunk, parse_error=f"a harmony message from {role!r} in an assistant turn"))
                    continue
                chunk = chunk[m.end() :] if m else chunk
            if not chunk.strip():
                continue
            header, sep, body = chunk.partition("<|message|>")
            m = _H_END.search(body)
            if m is not None:
                if body[m.end() :].strip():
                    calls.append(ToolCall("", raw=chunk, parse_error="text after a harmony message's end token"))
                body = body[: m.start()]
            rec = _H_RECIPIENT.search(header)
            ch = _H_CHANNEL.search(header)
            channel = ch.group(1) if ch else ""
            if rec is not None:
                target = rec.group(1)
                name = target.removeprefix("functions.")
                if not sep:
                    calls.append(ToolCall(name, raw=chunk, parse_error=f"a call to {target!r} has no <|message|>"))
                elif not name:
                    calls.append(ToolCall("", raw=chunk, parse_error="empty recipient in a harmony call"))
                elif not body.strip():  # vLLM makes this a call with arguments "" (not JSON): reported instead
                    calls.append(ToolCall(name, raw=chunk, parse_error=f"a call to {target!r} has no arguments"))
                else:
                    calls.append(json_object(body, chunk, name))
            elif not sep:
                content.append(header)
            elif channel == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        return ParsedTurn("\n".join(c for c in content if c.strip()).strip(), calls, "\n".join(reasoning).strip())

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        """The template's form: `` to=functions.NAME<|channel|>commentary json<|message|>{...}`` (one call per
        message; several are joined with ``<|call|><|start|>assistant``; the last ``<|call|>`` is the stop token)."""
        head = f"<|channel|>analysis<|message|>{content}<|end|><|start|>assistant" if content and calls else ""
        msgs = [
            f" to=functions.{n}<|channel|>commentary json<|message|>{json.dumps(a, ensure_ascii=False)}" for n, a in calls
        ]
        return head + "<|call|><|start|>assistant".join(msgs) if calls else self.answer_text(content)
