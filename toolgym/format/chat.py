"""How a model family frames a conversation: :class:`ChatFormat` (tokenizer, chat template, tool-call parser,
end-of-turn token), with the renderings it caches (the prompt, the template delta of an observation, the framing of
tool results). One episode's token sequence is built on it by :class:`toolgym.format.conversation.Conversation`.

Per-family framing comes from the parser (:class:`~toolgym.format.parsers.ToolCallParser`): the stop tokens
(several per family, e.g. harmony's ``<|call|>`` and ``<|return|>``), the token closing a cut turn, the call ids
the template accepts, whether the history needs structured ``tool_calls`` (GPT-OSS, Gemma 4), and turns closed by
the next header (GLM). Outside text (tool results, task text, tool descriptions) is encoded with control tokens
split (:mod:`toolgym.format.textonly`), in the prompt, the observations and the drift check alike.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgym.format.parsers import ParsedTurn, ToolCallParser, detect_parser, get_parser
from toolgym.format.textonly import ControlTokens, Span, outside_spans
from toolgym.tools.base import ToolCall

__all__ = ["ChatFormat"]

_PLACEHOLDER = "\x00TOOLGYM_{}\x00"
_PROBE = 'probe\n{"k": [1, 2]} <b>&amp;</b> \'q\' "dq" \\ end'


@dataclass
class _RenderCache:
    """Template renderings that depend only on the tokenizer, template, end-of-turn token and template variables."""

    verbatim: bool | None = None  # does the template insert tool contents verbatim (checked once with a probe)?
    shows_tools: bool | None = None  # does the template show the ``tools`` it is given?
    skeletons: dict[tuple[str, ...], str] = field(default_factory=dict)  # tool names -> delta with placeholders
    frame_lens: dict[tuple[tuple[str, str], ...], int] = field(default_factory=dict)  # (role, name)s -> tokens besides contents


_SHARED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _RenderCache]] = weakref.WeakKeyDictionary()


@dataclass
class ChatFormat:
    """A model family's framing: tokenizer + chat template + tool-call parser + end-of-turn token.

    Args:
        tokenizer: a Hugging Face tokenizer (fast preferred).
        chat_template: a Jinja template string; ``None`` uses the tokenizer's own.
        parser: a parser name from :func:`toolgym.format.parsers.get_parser`, an instance, or ``"auto"`` (picked
            from the chat template by :func:`~toolgym.format.parsers.detect_parser`; an error names the choices).
        eot_token: the token text that ends an assistant turn; ``None``: the parser's first stop token in the
            vocabulary, else a guess (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, else the eos token).
        template_kwargs: extra variables for the template (e.g. ``{"enable_thinking": False}``).
    """

    tokenizer: Any
    chat_template: str | None = None
    parser: ToolCallParser | str = "auto"
    eot_token: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tok = self.tokenizer
        template = self.chat_template if self.chat_template is not None else getattr(tok, "chat_template", None)
        if self.parser == "auto":
            self.parser = detect_parser(template if isinstance(template, str) else None)
        self.parser = get_parser(self.parser)
        self.control = ControlTokens.of(tok, template if isinstance(template, str) else None)
        if self.eot_token is None:
            for cand in self.parser.stop_tokens:
                tid = tok.convert_tokens_to_ids(cand)
                if tid is not None and tid != tok.unk_token_id:
                    self.eot_token = cand
                    break
        if self.eot_token is None:
            for cand in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
                tid = tok.convert_tokens_to_ids(cand)
                if tid is not None and tid != tok.unk_token_id:
                    self.eot_token = cand
                    break
            else:
                self.eot_token = tok.eos_token
        # The fast tokenizer's Rust backend, called directly: same ids as ``tokenizer.encode`` without the
        # Python wrapper's per-call overhead (and ``decode`` without clean-up, i.e. verbatim).
        self._backend = getattr(tok, "backend_tokenizer", None)
        self.vocab_size: int = len(tok)
        ids = self.encode(self.eot_token)
        if len(ids) != 1:
            raise ValueError(f"end-of-turn token {self.eot_token!r} is not a single token: {ids}")
        self.eot_id: int = ids[0]
        stops = {self.eot_id} | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
        for cand in self.parser.stop_tokens:
            tid = tok.convert_tokens_to_ids(cand)
            if tid is not None and tid != tok.unk_token_id and len(self.encode(cand)) == 1:
                stops.add(tid)
        self.stop_ids: frozenset[int] = frozenset(stops)
        # the text that ends an assistant turn with tool calls in the template's rendering (GLM: the next header)
        self.call_end_token: str = self.parser.close_token(ParsedTurn("", [ToolCall("f")])) or self.eot_token
        # Template renderings are cached per (tokenizer, template, end-of-turn token, template variables), shared
        # by every ChatFormat built alike: the sub-envs of a vector env render each skeleton once, not once each.
        key = (self.chat_template, self.eot_token, self.parser.name, repr(sorted(self.template_kwargs.items())))
        try:
            self._cache = _SHARED.setdefault(tok, {}).setdefault(key, _RenderCache())
        except TypeError:  # a tokenizer that cannot be weakly referenced or hashed: a cache of its own
            self._cache = _RenderCache()
        if self._cache.verbatim is None:  # frame a tool turn once now: a template/tokenizer mismatch fails here
            try:
                self._cache.verbatim = self._check_verbatim()
            except ValueError as e:
                raise ValueError(
                    f"this chat template cannot frame a tool turn with end-of-turn token {self.eot_token!r} "
                    f"(parser {self.parser.name!r}): {e}. Pass a chat_template written in this tokenizer's own "
                    "tokens (see docs/families.md), or eot_token=/parser= explicitly"
                ) from e

    # -- rendering --------------------------------------------------------------------------------
    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
        *, add_generation_prompt: bool = False,
    ) -> str:
        """The chat template's text for ``messages`` (with ``tools`` shown to the model)."""
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt, tokenize=False, **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added (template text already carries its special tokens)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_outside(self, text: str, spans: Sequence[Span]) -> list[int]:
        """Token ids of rendered ``text`` where the characters in ``spans`` (outside text) are encoded as text:
        a control token spelled there never becomes its control id (see :mod:`toolgym.format.textonly`)."""
        if not spans:
            return self.encode(text)
        return self.control.encode(text, spans)

    def render_outside(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
        *, add_generation_prompt: bool = False,
    ) -> tuple[str, list[Span]]:
        """:meth:`render` plus the spans of outside strings that spell control tokens (``[]`` when none do)."""
        text = self.render(messages, tools, add_generation_prompt=add_generation_prompt)
        spans = outside_spans(
            lambda m, t: self.render(m, t, add_generation_prompt=add_generation_prompt), messages, tools or [], text,
            self.control,
        )
        return text, spans

    def with_tools_listed(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """``messages``, with the tool specs listed in the system message when the template does not show the
        ``tools`` it is given (DeepSeek-V3's template writes tool calls but never lists tools); else unchanged."""
        msgs = [dict(m) for m in messages]
        if not tools:
            return msgs
        if self._cache.shows_tools is None:
            probe = {"type": "function", "function": {"name": "toolgym_probe_fn", "description": "d",
                                                       "parameters": {"type": "object", "properties": {}}}}
            self._cache.shows_tools = "toolgym_probe_fn" in self.render([{"role": "user", "content": "u"}], [probe])
        if self._cache.shows_tools:
            return msgs
        listing = "# Tools\n\nYou can call these functions (JSON schemas):\n" + "\n".join(
            json.dumps(t, ensure_ascii=False) for t in tools
        )
        if msgs and msgs[0].get("role") == "system" and isinstance(msgs[0].get("content"), str):
            msgs[0]["content"] = f"{msgs[0]['content']}\n\n{listing}" if msgs[0]["content"] else listing
        else:
            msgs.insert(0, {"role": "system", "content": listing})
        return msgs

    def close_id(self, parsed: ParsedTurn) -> int:
        """The token id closing a turn cut by its budget (per family: e.g. GLM closes a call turn with
        ``<|observation|>``, harmony with ``<|call|>``)."""
        tok = self.parser.close_token(parsed)
        if tok:
            ids = self.encode(tok)
            if len(ids) == 1:
                return ids[0]
        return self.eot_id

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept and no clean-up (ids outside the vocabulary are dropped)."""
        n = self.vocab_size
        keep = [i for i in map(int, ids) if 0 <= i < n]
        if self._backend is not None:
            return self._backend.decode(keep, skip_special_tokens=False)
        return self.tokenizer.decode(keep, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def tool_delta(self, tool_messages: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]) -> str:
        """The text the template adds after an assistant turn's end-of-turn token for ``tool_messages`` and
        the next assistant header (see :meth:`tool_delta_spans`)."""
        return self.tool_delta_spans(tool_messages)[0]

    def tool_delta_spans(self, tool_messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[Span]]:
        """The observation text for ``tool_messages`` and the spans of the tool contents in it that spell control
        tokens (encoded as text by :meth:`encode_outside`).

        Computed on a fixed stand-in history (the delta of a tool turn does not depend on what was said before in
        the supported templates; the episode's drift check verifies that). When the template inserts tool
        contents verbatim (checked once with a probe), the rendering is cached per tuple of tool names and
        contents are substituted, so a step costs no template rendering.
        """
        # call ids are part of the key: some templates render them (Mistral's [TOOL_RESULTS]ID[TOOL_CONTENT])
        key = tuple(f"{m.get('role', 'tool')}\x00{m.get('name', '')}\x00{m.get('tool_call_id', '')}" for m in tool_messages)
        if self._cache.verbatim is None:
            self._cache.verbatim = self._check_verbatim()
        parts = any(not isinstance(m.get("content", ""), str) for m in tool_messages)  # content parts (images)
        if self._cache.verbatim and not parts:
            skel = self._cache.skeletons.get(key)
            if skel is None:
                msgs = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(tool_messages)]
                skel = self._cache.skeletons[key] = self._render_delta(msgs)
            out = skel
            spans: list[Span] = []
            for i, m in enumerate(tool_messages):
                content = str(m.get("content", ""))
                ph = _PLACEHOLDER.format(i)
                at = out.find(ph)
                out = out.replace(ph, content, 1)
                if at >= 0 and self.control.spells_control(content):
                    spans = [(a + len(content) - len(ph), b + len(content) - len(ph)) if a > at else (a, b) for a, b in spans]
                    spans.append((at, at + len(content)))
            return out, spans
        text = self._render_delta(tool_messages)
        if not parts and not any(self.control.spells_control(str(m.get("content", ""))) for m in tool_messages):
            return text, []
        return text, outside_spans(lambda m, _t: self._render_delta(m), tool_messages, [], text, self.control)

    def observation_frame_len(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens an observation of ``messages`` (tool results or other env messages) has besides their contents
        (cached per tuple of roles and names)."""
        key = tuple((str(m.get("role", "tool")), str(m.get("name", ""))) for m in messages)
        n = self._cache.frame_lens.get(key)
        if n is None:
            msgs = [self.tool_message(name, "", self.parser.call_id(0, i)) if role == "tool"
                    else {"role": role, "content": ""} for i, (role, name) in enumerate(key)]
            n = self._cache.frame_lens[key] = len(self.encode(self.tool_delta_spans(msgs)[0]))
        return n

    def _render_delta(self, tool_messages: Sequence[Mapping[str, Any]]) -> str:
        if self.parser.structured_history and any(m.get("role", "tool") == "tool" for m in tool_messages):
            # The template needs the calls these results answer: a stand-in assistant turn with structured
            # tool_calls; the delta is what the rendering with the results adds after the rendering without them.
            calls = [
                {"id": m.get("tool_call_id") or f"c{i}", "type": "function",
                 "function": {"name": str(m.get("name", "")), "arguments": {}}}
                for i, m in enumerate(tool_messages) if m.get("role", "tool") == "tool"
            ]
            base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": calls}]
            before = self.render(base)
            after = self.render(base + list(tool_messages), add_generation_prompt=True)
            if not after.startswith(before):
                raise ValueError("the chat template renders an assistant turn with tool calls differently once "
                                 "tool results follow it: cannot compute the observation delta")
            return after[len(before) :]
        # The stand-in assistant turn ends with a marker: the delta is what follows "marker + end-of-turn". (Comparing
        # with a rendering that stops at the assistant turn would not work: templates such as Qwen3's render the
        # last assistant turn differently, e.g. with an empty <think></think> block.)
        marker = "\x00TOOLGYM_ASSISTANT\x00"
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}]
        after = self.render(base + list(tool_messages), add_generation_prompt=True)
        _, sep, delta = after.partition(marker + self.call_end_token)
        if not sep:
            raise ValueError(
                f"cannot find the end of an assistant turn ({self.call_end_token!r}) in the chat template's rendering"
            )
        return delta

    def _check_verbatim(self) -> bool:
        probe = [self.tool_message("probe", _PROBE, self.parser.call_id(0, 0))]
        real = self._render_delta(probe)
        skel = self._render_delta([{**probe[0], "content": _PLACEHOLDER.format(0)}])
        return skel.count(_PLACEHOLDER.format(0)) == 1 and skel.replace(_PLACEHOLDER.format(0), _PROBE) == real

    def tool_message(self, name: str, content: str, call_id: str = "") -> dict[str, Any]:
        """A chat message carrying one tool result."""
        msg: dict[str, Any] = {"role": "tool", "name": name, "content": content}
        if call_id:
            msg["tool_call_id"] = call_id
        return msg
