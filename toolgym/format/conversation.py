"""Token-in / token-out bookkeeping of one episode.

:class:`ChatFormat` says how a model family frames a conversation (tokenizer, chat template, tool-call parser,
end-of-turn token). :class:`Conversation` grows one episode's token sequence without ever re-tokenising what
the model sampled:

* the prompt is the chat template's rendering of the opening messages (with the tool schemas), tokenised once;
* each action (the policy's sampled ids) is appended verbatim with mask 1; a turn cut by its budget (no
  end-of-turn token) is closed with the end-of-turn token at mask 0;
* each observation is the **template delta** for the tool messages: the text the chat template adds after the
  assistant's end-of-turn token for those tool messages plus the next assistant header, tokenised on its own
  (it starts right after a special token, so it tokenises the same as inside the full text) with mask 0;
* :meth:`Conversation.check_drift` re-renders the whole conversation with the template and reports the first
  token where it differs from what was built (``{}`` when identical).

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

import numpy as np

from toolgym.format.parsers import ParsedTurn, ToolCallParser, detect_parser, get_parser
from toolgym.format.textonly import ControlTokens, Span, outside_spans
from toolgym.tools.base import ToolCall

__all__ = ["ChatFormat", "Conversation"]

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
        if self._cache.verbatim:
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
        if not any(self.control.spells_control(str(m.get("content", ""))) for m in tool_messages):
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


class Conversation:
    """One episode's messages and tokens, kept in lock-step.

    Args:
        fmt: the family's :class:`ChatFormat`.
        messages: the opening messages (system + user), rendered with ``add_generation_prompt=True``.
        tools: tool specs (``Tool.schema()`` dicts) shown in the prompt.

    Attributes:
        prompt_ids: prompt token ids; completion_ids / loss_mask: everything after it (1 = sampled by the policy).
        messages: the chat messages so far (assistant turns hold the decoded action text verbatim, with the
            parsed calls under ``"tool_calls"`` for readers; tool results as ``role="tool"`` messages).
    """

    def __init__(
        self, fmt: ChatFormat, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        self.fmt = fmt
        self.tools = list(tools)
        fmt.parser.set_tools(self.tools)
        self.messages: list[dict[str, Any]] = fmt.with_tools_listed(messages, self.tools)
        # what the template renders for the history (differs from ``messages`` for structured-history families)
        self.template_messages: list[dict[str, Any]] = [dict(m) for m in self.messages]
        self.prompt_text, spans = fmt.render_outside(self.messages, self.tools, add_generation_prompt=True)
        self.prompt_ids: list[int] = fmt.encode_outside(self.prompt_text, spans)
        self.completion_ids: list[int] = []
        self.loss_mask: list[int] = []
        self._turns = 0
        self._pending_obs = False  # the last thing appended is an observation ending with an assistant header

    def __len__(self) -> int:
        """Total tokens: prompt + completion."""
        return len(self.prompt_ids) + len(self.completion_ids)

    def add_action(self, action_ids: Sequence[int]) -> tuple[str, ParsedTurn, bool, tuple[int, int]]:
        """Append the policy's sampled ids (mask 1) and parse them; each call gets the family's call id.

        Returns ``(text, parsed, cut, span)``: the decoded text without its stop token, the parse, whether the
        turn was cut (no stop token at the end: the env appended the family's closing token at mask 0), and the
        ``[start, end)`` span of the action (closing token included) in ``completion_ids``.
        """
        fmt = self.fmt
        ids = [int(i) for i in action_ids]
        start = len(self.completion_ids)
        self.completion_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        cut = not ids or ids[-1] not in fmt.stop_ids
        body = ids if cut else ids[:-1]
        text = fmt.decode(body)
        parsed = fmt.parser.parse(text)
        for j, c in enumerate(parsed.calls):
            c.id = fmt.parser.call_id(self._turns, j)
        self._turns += 1
        if cut:
            self.completion_ids.append(fmt.close_id(parsed))
            self.loss_mask.append(0)
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        good = [c for c in parsed.calls if c.parse_error is None]
        structured = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in good
        ]
        if good:
            msg["tool_calls"] = structured
        self.messages.append(msg)
        if fmt.parser.structured_history:
            # every call, malformed ones included: each gets a result, and these templates render a result only
            # after its call (a malformed call re-renders unlike what the model wrote: reported as drift)
            hist: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.reasoning:
                hist[fmt.parser.reasoning_key] = parsed.reasoning
            if parsed.calls:
                hist["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name or "error", "arguments": c.arguments}}
                    for c in parsed.calls
                ]
                if parsed.reasoning and fmt.parser.reasoning_key == "thinking":
                    hist["content"] = ""  # harmony's template refuses both content and thinking beside a call
            self.template_messages.append(hist)
        else:
            self.template_messages.append({"role": "assistant", "content": text})
        self._pending_obs = False
        return text, parsed, cut, (start, len(self.completion_ids))

    def _messages(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [dict(r) if isinstance(r, Mapping) else self.fmt.tool_message(*r) for r in results]

    def observation(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]]) -> list[int]:
        """Token ids of the observation for the env's answer (not yet appended): chat messages (tool results,
        a simulated user's message, ...) or tool results as ``(name, content, call_id)`` tuples. Contents are
        encoded as text (a control token spelled in a result is never its control id)."""
        return self.fmt.encode_outside(*self.fmt.tool_delta_spans(self._messages(results)))

    def add_observation(self, results: Sequence[tuple[str, str, str] | Mapping[str, Any]],
                        ids: Sequence[int] | None = None) -> tuple[int, int]:
        """Append the observation for ``results`` (as :meth:`observation`; mask 0) and its messages; returns its
        ``[start, end)`` span. ``ids`` may pass the already computed :meth:`observation`."""
        if ids is None:
            ids = self.observation(results)
        start = len(self.completion_ids)
        self.completion_ids.extend(map(int, ids))
        self.loss_mask.extend([0] * len(ids))
        tool_msgs = self._messages(results)
        self.messages.extend(tool_msgs)
        self.template_messages.extend(dict(m) for m in tool_msgs)
        self._pending_obs = True
        return start, len(self.completion_ids)

    # -- drift ------------------------------------------------------------------------------------
    def expected_ids(self) -> list[int]:
        """What the chat template gives for the conversation (:attr:`template_messages`: assistant turns as their
        verbatim text, or structured for families that need it), outside text encoded as text, cut at the point
        the episode reached: after the last turn's closing token, or after the next assistant header.

        For templates that write no end-of-turn token (GLM: the next header closes a turn), the closing token the
        episode holds is appended to the rendering."""
        msgs = self.template_messages
        gen = self._pending_obs or len(msgs) == 0 or msgs[-1]["role"] != "assistant"
        text, spans = self.fmt.render_outside(msgs, self.tools, add_generation_prompt=gen)
        if not gen and self.completion_ids:
            last = self.fmt.decode(self.completion_ids[-1:])
            at = text.rfind(last) if last else -1
            if at >= 0 and not self.fmt.parser.turn_closed_by_header:
                text = text[: at + len(last)]
            else:
                text = text.rstrip("\n") + last if self.fmt.parser.turn_closed_by_header else text
        return self.fmt.encode_outside(text, [(a, b) for a, b in spans if a < len(text)])

    def check_drift(self, window: int = 8) -> dict[str, Any]:
        """``{}`` when ``prompt_ids + completion_ids`` equal :meth:`expected_ids`; otherwise
        ``{"index", "built", "expected", "built_text", "expected_text", "built_len", "expected_len"}`` around the
        first difference (``index`` counts from the start of the prompt); ``{"error": ...}`` when the template
        refuses to re-render the conversation."""
        built = self.prompt_ids + self.completion_ids
        try:
            exp = self.expected_ids()
        except Exception as e:  # noqa: BLE001 - a template that refuses this history: reported, never raised
            return {"error": f"the chat template cannot re-render this conversation: {type(e).__name__}: {e}"}
        if built == exp:
            return {}
        n = min(len(built), len(exp))
        idx = next((i for i in range(n) if built[i] != exp[i]), n)
        lo, hi = max(0, idx - window), idx + window
        return {
            "index": idx,
            "built": built[lo:hi],
            "expected": exp[lo:hi],
            "built_text": self.fmt.decode(built[lo:hi]),
            "expected_text": self.fmt.decode(exp[lo:hi]),
            "built_len": len(built),
            "expected_len": len(exp),
        }


def as_int_array(ids: Sequence[int]) -> np.ndarray:
    """``ids`` as a 1-D ``np.int64`` array (the token observation/action dtype)."""
    return np.asarray(ids, dtype=np.int64).reshape(-1)
