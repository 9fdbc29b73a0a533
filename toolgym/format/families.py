"""Tool-call parsers of the model families beyond Hermes/Qwen JSON and Llama 3 JSON.

Each is registered under the name vLLM's ``--tool-call-parser`` uses for the same format (facts taken from vLLM's
tool parsers and the families' chat templates; no code copied). Like every parser, ``parse`` never raises: a
malformed call becomes a :class:`~toolgym.tools.base.ToolCall` with ``parse_error`` set.

===================  =====================================================================================
name                 format (what the model writes)
===================  =====================================================================================
``qwen3_coder``      ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
                     (Qwen3-Coder, Qwen3.5+); alias ``qwen3_xml``; in :mod:`toolgym.format.qwen3_xml`. Values are
                     text, converted with the tool's JSON schema; tags inside values told from real ones by it.
``deepseek_v3``      ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``
``deepseek_v31``     V3.1's variant: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.
``openai``           GPT-OSS harmony: messages ``[<|start|>assistant]HEADER<|message|>BODY<|end|>|<|call|>|<|return|>``;
                     a call is a message to ``functions.NAME`` (recipient in the template's place,
                     `` to=functions.NAME<|channel|>commentary json``, or channel-first, ``<|channel|>commentary
                     to=functions.NAME <|constrain|>json``); alias ``harmony``.
``mistral``          ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+; ``[CALL_ID]ID`` before ``[ARGS]`` accepted) or
                     ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (pre-v11).
``glm45``            ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>`` (GLM-4.5/4.6/4.7).
``gemma4``           ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`` (Gemma 4).
===================  =====================================================================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.format.parsers import (
    ParsedTurn,
    ToolCallParser,
    _call_from_obj,
    _split_reasoning,
    register_parser,
)
from toolgym.format.qwen3_xml import Qwen3CoderParser, json_value, python_literal  # registered here, before the rest
from toolgym.tools.base import ToolCall

__all__ = [
    "DeepSeekV3Parser",
    "DeepSeekV31Parser",
    "Gemma4Parser",
    "Glm45Parser",
    "HarmonyParser",
    "MistralParser",
    "Qwen3CoderParser",
]

_DEC = json.JSONDecoder()


class _Guarded(ToolCallParser):
    """``parse`` wraps ``_parse``: any unexpected exception becomes one reported parse error (never raised)."""

    def parse(self, text: str) -> ParsedTurn:
        try:
            return self._parse(text)
        except Exception as e:  # noqa: BLE001 - defence in depth: parse never raises
            return ParsedTurn(text.strip(), [ToolCall("", raw=text[:2000], parse_error=f"unparsable turn: {e}")])

    def _parse(self, text: str) -> ParsedTurn:  # pragma: no cover - overridden
        raise NotImplementedError


def _json_object(payload: str, raw: str, name: str) -> ToolCall:
    """A call to ``name`` whose arguments are the JSON object ``payload`` (strict: nothing else after it)."""
    payload = payload.strip()
    if not payload:
        return ToolCall(name, {}, raw=raw)
    try:
        obj, end = _DEC.raw_decode(payload)
    except json.JSONDecodeError as e:
        return ToolCall(name, raw=raw, parse_error=f"invalid JSON arguments for {name!r}: {e.msg} at char {e.pos}")
    except RecursionError:
        return ToolCall(name, raw=raw, parse_error="tool call JSON is nested too deeply")
    if payload[end:].strip():
        return ToolCall(name, raw=raw, parse_error=f"extra text after the JSON arguments of {name!r}")
    if not isinstance(obj, dict):
        return ToolCall(name, raw=raw, parse_error=f"arguments of {name!r} must be a JSON object, got {type(obj).__name__}")
    return ToolCall(name, obj, raw=raw)


def _blocks(body: str, open_tag: str, close_tag: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Split ``body`` into text outside ``open_tag…close_tag`` blocks and the blocks' insides.

    Returns ``(outside, blocks)``: each block is ``(inner, error)``; ``error`` says why a block is malformed
    (not closed, or a stray closing tag)."""
    outside: list[str] = []
    blocks: list[tuple[str, str | None]] = []
    pos = 0
    while True:
        start = body.find(open_tag, pos)
        stray = body.find(close_tag, pos)
        if stray != -1 and (start == -1 or stray < start):
            outside.append(body[pos:stray])
            blocks.append((close_tag, f"{close_tag} without a matching {open_tag}"))
            pos = stray + len(close_tag)
            continue
        if start == -1:
            outside.append(body[pos:])
            return outside, blocks
        outside.append(body[pos:start])
        end = body.find(close_tag, start + len(open_tag))
        nxt = body.find(open_tag, start + len(open_tag))
        if end == -1 or (nxt != -1 and nxt < end):
            stop = len(body) if nxt == -1 else nxt
            blocks.append((body[start:stop], f"{open_tag} is not closed by {close_tag}"))
            pos = stop
            continue
        blocks.append((body[start + len(open_tag) : end], None))
        pos = end + len(close_tag)


def _arg_text(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else str(v)


class _ToolCallBlocks:
    """Mixin (before :class:`_Guarded`): calls in ``<tool_call>...</tool_call>`` blocks, each read by the family's
    ``_call(inner)``; reasoning split off first."""

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = _split_reasoning(text)
        outside, blocks = _blocks(body, "<tool_call>", "</tool_call>")
        calls = [ToolCall("", raw=inner, parse_error=err) if err else self._call(inner) for inner, err in blocks]
        return ParsedTurn("".join(outside).strip(), calls, reasoning)

    def _call(self, inner: str) -> ToolCall:  # pragma: no cover - overridden
        raise NotImplementedError


# -- DeepSeek V3 / V3.1 ----------------------------------------------------------------------------
_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_FENCE = re.compile(r"\A\s*```(?:json)?\s*\n?(.*?)\n?```\s*\Z", re.DOTALL)


class _DeepSeekBase(_Guarded):
    stop_tokens = ("<｜end▁of▁sentence｜>",)

    def _parse(self, text: str) -> ParsedTurn:
        body, reasoning = _split_reasoning(text)
        start = body.find(_DS_CALLS_BEGIN)
        if start == -1:
            if _DS_CALL_BEGIN in body:
                return ParsedTurn(body.strip(), [ToolCall("", raw=body, parse_error=f"{_DS_CALL_BEGIN} outside {_DS_CALLS_BEGIN}")], reasoning)
            return ParsedTurn(body.strip(), [], reasoning)
        content = body[:start]
        rest = body[start + len(_DS_CALLS_BEGIN) :]
        end = rest.find(_DS_CALLS_END)
        calls: list[ToolCall] = []
        if end == -1:
            inner, tail = rest, ""
        else:
            inner, tail = rest[:end], rest[end + len(_DS_CALLS_END) :]
        outside, blocks = _blocks(inner, _DS_CALL_BEGIN, _DS_CALL_END)
        for inner_call, err in blocks:
            calls.append(ToolCall("", raw=inner_call, parse_error=err) if err else self._decode(inner_call))
        if any(o.strip() for o in outside):
            calls.append(ToolCall("", raw=inner, parse_error="unexpected text between DeepSeek tool calls"))
        if end == -1:
            calls.append(ToolCall("", raw=rest, parse_error=f"{_DS_CALLS_BEGIN} is not closed by {_DS_CALLS_END}"))
        elif not blocks:
            calls.append(ToolCall("", raw=rest, parse_error="empty DeepSeek tool-call section"))
        return ParsedTurn((content + tail).strip(), calls, reasoning)

    def _decode(self, inner: str) -> ToolCall:  # pragma: no cover - overridden
        raise NotImplementedError


@register_parser("deepseek_v31")
class DeepSeekV31Parser(_DeepSeekBase):
    """DeepSeek-V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`` inside the calls section."""

    template_markers = ((_DS_SEP,),)

    def _decode(self, inner: str) -> ToolCall:
        raw = f"{_DS_CALL_BEGIN}{inner}{_DS_CALL_END}"
        name, sep, payload = inner.partition(_DS_SEP)
        name = name.strip()
        if not sep or not name:
            return ToolCall("", raw=raw, parse_error=f"a DeepSeek call needs NAME{_DS_SEP}ARGUMENTS")
        return _json_object(payload, raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        body = "".join(f"{_DS_CALL_BEGIN}{n}{_DS_SEP}{json.dumps(a, ensure_ascii=False)}{_DS_CALL_END}" for n, a in calls)
        return f"{content}{_DS_CALLS_BEGIN}{body}{_DS_CALLS_END}"


@register_parser("deepseek_v3")
class DeepSeekV3Parser(_DeepSeekBase):
    """DeepSeek-V3 / R1: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{json}\\n```<｜tool▁call▁end｜>``."""

    template_markers = ((_DS_SEP, "```json"),)

    def _decode(self, inner: str) -> ToolCall:
        raw = f"{_DS_CALL_BEGIN}{inner}{_DS_CALL_END}"
        kind, sep, rest = inner.partition(_DS_SEP)
        if not sep:
            return ToolCall("", raw=raw, parse_error=f"a DeepSeek-V3 call needs TYPE{_DS_SEP}NAME")
        name, nl, payload = rest.partition("\n")
        name = name.strip()
        if not name:
            return ToolCall("", raw=raw, parse_error="empty function name in a DeepSeek-V3 call")
        m = _DS_FENCE.match(payload)
        if not nl or m is None:
            return ToolCall(name, raw=raw, parse_error=f"the arguments of {name!r} must be a ```json fenced block")
        return _json_object(m.group(1), raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        if not calls:
            return content
        body = "\n".join(
            f"{_DS_CALL_BEGIN}function{_DS_SEP}{n}\n```json\n{json.dumps(a, ensure_ascii=False)}\n```{_DS_CALL_END}"
            for n, a in calls
        )
        return f"{content}{_DS_CALLS_BEGIN}{body}{_DS_CALLS_END}"


# -- Mistral ----------------------------------------------------------------------------------------
@register_parser("mistral")
class MistralParser(_Guarded):
    """Mistral: ``[TOOL_CALLS]NAME[ARGS]{json}`` (v11+, optional ``[CALL_ID]ID``) or ``[TOOL_CALLS][{...}, ...]``
    (pre-v11). Reasoning in ``[THINK]...[/THINK]`` (v13) is split off. Call ids are 9 alphanumerics, as Mistral's
    templates require."""

    stop_tokens = ("</s>",)
    template_markers = (("[TOOL_CALLS]",), ("[AVAILABLE_TOOLS]",))
    _TAG, _ARGS, _ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"

    def call_id(self, turn: int, index: int) -> str:
        return f"t{turn % 1000:03d}c{index % 10000:04d}"  # 9 alphanumerics, unique in an episode

    def _parse(self, text: str) -> ParsedTurn:
        reasoning = []
        body = text
        while "[THINK]" in body or "[/THINK]" in body:
            head, o, rest = body.partition("[THINK]")
            inner, c, tail = rest.partition("[/THINK]")
            if not o:  # a turn that starts inside reasoning (the prompt opened it)
                inner, _, tail = body.partition("[/THINK]")
                head = ""
            reasoning.append(inner.strip())
            body = head + tail
            if not c and o:
                break
        parts = body.split(self._TAG)
        calls: list[ToolCall] = []
        if len(parts) > 2 and any(p.strip().startswith("[") for p in parts[1:]):
            # vLLM refuses a second [TOOL_CALLS] when the calls are a JSON list (pre-v11): no call is made
            msg = f"a JSON list of calls must be the only {self._TAG} of a turn"
            return ParsedTurn(parts[0].strip(), [ToolCall("", raw=self._TAG + p, parse_error=msg) for p in parts[1:]],
                              "\n".join(r for r in reasoning if r))
        for part in parts[1:]:
            calls.extend(self._decode(part))
        return ParsedTurn(parts[0].strip(), calls, "\n".join(r for r in reasoning if r))

    def _decode(self, part: str) -> list[ToolCall]:
        raw = self._TAG + part
        s = part.strip()
        if s.startswith("["):  # pre-v11: a JSON list of calls
            try:
                obj, end = _DEC.raw_decode(s)
            except json.JSONDecodeError as e:
                return [ToolCall("", raw=raw, parse_error=f"invalid JSON in [TOOL_CALLS]: {e.msg} at char {e.pos}")]
            except RecursionError:
                return [ToolCall("", raw=raw, parse_error="tool call JSON is nested too deeply")]
            if s[end:].strip():
                return [ToolCall("", raw=raw, parse_error="extra text after the [TOOL_CALLS] JSON list")]
            if not isinstance(obj, list) or not obj:
                return [ToolCall("", raw=raw, parse_error="[TOOL_CALLS] must be followed by a non-empty JSON list")]
            return [_call_from_obj(o, raw, "arguments") for o in obj]
        head, sep, payload = part.partition(self._ARGS)
        if not sep:
            return [ToolCall("", raw=raw, parse_error="[TOOL_CALLS] needs NAME[ARGS]{...} or a JSON list")]
        name, _, _call_id = head.partition(self._ID)
        name = name.strip()
        if not name:
            return [ToolCall("", raw=raw, parse_error="empty function name after [TOOL_CALLS]")]
        return [_json_object(payload, raw, name)]

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        return content + "".join(f"{self._TAG}{n}{self._ARGS}{json.dumps(a, ensure_ascii=False)}" for n, a in calls)


# -- GLM-4.5 ----------------------------------------------------------------------------------------
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _declares_string(spec: Any) -> bool:
    if not isinstance(spec, Mapping):
        return False
    t = spec.get("type")
    alts = spec.get("anyOf")
    return (t == "string" or (isinstance(t, list) and "string" in t)
            or (isinstance(alts, list) and any(isinstance(o, Mapping) and o.get("type") == "string" for o in alts)))


@register_parser("glm45", "glm47")
class Glm45Parser(_ToolCallBlocks, _Guarded):
    """GLM-4.5 / 4.6 / 4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``
    (newlines between parts optional). Values are text, converted with the tool's parameter types. The template
    writes no end-of-turn token: the model stops by writing the next header (``<|observation|>`` to call tools,
    ``<|user|>`` to hand back)."""

    stop_tokens = ("<|observation|>", "<|user|>", "<|endoftext|>")
    template_markers = (("<arg_key>", "<arg_value>"),)
    turn_closed_by_header = True

    def __init__(self) -> None:
        super().__init__()
        self.string_params: dict[str, set[str]] = {}

    def set_tools(self, schemas: Sequence[Mapping[str, Any]]) -> None:
        """Also note which parameters are strings (``"string"``, a type list or an ``anyOf`` with a string)."""
        super().set_tools(schemas)
        self.string_params = {}
        for s in schemas or ():
            f = s.get("function", s) if isinstance(s, Mapping) else {}
            params = f.get("parameters") if isinstance(f, Mapping) else None
            props = params.get("properties") if isinstance(params, Mapping) else None
            if isinstance(f.get("name"), str) and isinstance(props, Mapping):
                self.string_params[f["name"]] = {k for k, v in props.items() if _declares_string(v)}

    def _typed(self, tool: str, key: str, raw: str) -> Any:
        """A value as vLLM's GLM parsers read it: text for a string parameter, else JSON, else a Python literal,
        else text. ValueError for a literal with no JSON form (vLLM's turn fails there: no call)."""
        if key in self.string_params.get(tool, ()):
            return raw
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            pass
        try:
            value = python_literal(raw)
        except ValueError:
            return raw
        return json_value(value)

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|observation|>" if parsed.calls else "<|user|>"

    def _call(self, inner: str) -> ToolCall:
        raw = f"<tool_call>{inner}</tool_call>"
        cut = inner.find("<arg_key>")
        name = (inner if cut == -1 else inner[:cut]).strip()
        if not name or "\n" in name or "<" in name:
            return ToolCall("", raw=raw, parse_error="a GLM <tool_call> must start with the function name")
        rest = "" if cut == -1 else inner[cut:]
        args: dict[str, Any] = {}
        pos = 0
        for m in _GLM_PAIR.finditer(rest):
            if rest[pos : m.start()].strip():
                return ToolCall(name, raw=raw, parse_error="unexpected text between <arg_key>/<arg_value> pairs")
            key = m.group(1).strip()
            if key in args:
                return ToolCall(name, raw=raw, parse_error=f"argument {key!r} given twice")
            try:
                args[key] = self._typed(name, key, m.group(2))
            except ValueError as e:
                return ToolCall(name, raw=raw, parse_error=f"argument {key!r} of {name!r}: {e}")
            pos = m.end()
        if rest[pos:].strip():
            return ToolCall(name, raw=raw, parse_error="an <arg_key> without its <arg_value> (or stray text)")
        return ToolCall(name, args, raw=raw)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        blocks = []
        for name, args in calls:
            pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_arg_text(v)}</arg_value>\n" for k, v in args.items())
            blocks.append(f"<tool_call>{name}\n{pairs}</tool_call>")
        return "\n".join(([content] if content else []) + blocks)


# -- Gemma 4 ----------------------------------------------------------------------------------------
_GQ = '<|"|>'
_BARE_KEY = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*:")


def _gemma_value_to_json(s: str) -> str:
    """Gemma 4's argument syntax (``<|"|>``-quoted strings, bare keys) as JSON text."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        if s.startswith(_GQ, i):
            j = s.find(_GQ, i + len(_GQ))
            if j == -1:
                raise ValueError('unterminated <|"|> string')
            out.append(json.dumps(s[i + len(_GQ) : j], ensure_ascii=False))
            i = j + len(_GQ)
            continue
        ch = s[i]
        out.append(ch)
        i += 1
        if ch in "{,":
            m = _BARE_KEY.match(s, i)
            if m:
                out.append(json.dumps(m.group(1)) + ":")
                i = m.end()
    return "".join(out)


def _gemma_arg(v: Any) -> str:
    if isinstance(v, str):
        return f"{_GQ}{v}{_GQ}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_gemma_arg(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_gemma_arg(x) for x in v) + "]"
    return "null" if v is None else str(v)


@register_parser("gemma4")
class Gemma4Parser(_Guarded):
    """Gemma 4: ``<|tool_call>call:NAME{k:v,...}<tool_call|>``; reasoning in ``<|channel>thought…<channel|>``.
    A turn that calls tools ends with ``<|tool_response>`` (the results follow in the same model turn); an answer
    ends with ``<turn|>``. The template needs structured ``tool_calls`` in the history."""

    stop_tokens = ("<turn|>", "<|tool_response>", "<eos>")
    template_markers = (("<|tool_call>",),)
    structured_history = True

    def close_token(self, parsed: ParsedTurn) -> str | None:
        return "<|tool_response>" if parsed.calls else "<turn|>"

    def _parse(self, text: str) -> ParsedTurn:
        reasoning: list[str] = []
        body = text
        while "<|channel>" in body:
            head, _, rest = body.partition("<|channel>")
            inner, c, tail = rest.partition("<channel|>")
            reasoning.append(inner.removeprefix("thought").strip())
            body = head + tail
            if not c:
                break
        outside, blocks = _blocks(body, "<|tool_call>", "<tool_call|>")
        calls = [ToolCall("", raw=inner, parse_error=err) if err else self._call(inner) for inner, err in blocks]
        return ParsedTurn("".join(outside).strip(), calls, "\n".join(r for r in reasoning if r))

    def _call(self, inner: str) -> ToolCall:
        raw = f"<|tool_call>{inner}<tool_call|>"
        s = inner.strip()
        if not s.startswith("call:"):
            return ToolCall("", raw=raw, parse_error="a Gemma 4 call must start with 'call:NAME{'")
        name, brace, rest = s[len("call:") :].partition("{")
        name = name.strip()
        if not brace or not name:
            return ToolCall("", raw=raw, parse_error="a Gemma 4 call needs call:NAME{arguments}")
        try:
            as_json = _gemma_value_to_json("{" + rest)
        except ValueError as e:
            return ToolCall(name, raw=raw, parse_error=f"arguments of {name!r}: {e}")
        return _json_object(as_json, raw, name)

    def format_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> str:
        body = "".join(
            "<|tool_call>call:" + n + "{" + ",".join(f"{k}:{_gemma_arg(v)}" for k, v in sorted(a.items())) + "}<tool_call|>"
            for n, a in calls
        )
        return content + body


# -- GPT-OSS harmony --------------------------------------------------------------------------------
_H_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_H_RECIPIENT = re.compile(r"to=([^\s<]+)")
_H_ROLE = re.compile(r"\s*([A-Za-z_][\w.]*)")
_H_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


@register_parser("openai", "harmony")
class HarmonyParser(_Guarded):
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
                    calls.append(_json_object(body, chunk, name))
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
