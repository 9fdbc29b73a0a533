"""Token-in / token-out bookkeeping of one episode.

:class:`~toolgym.format.chat.ChatFormat` says how a model family frames a conversation (tokenizer, chat template,
tool-call parser, end-of-turn token: :mod:`toolgym.format.chat`). :class:`Conversation` grows one episode's token sequence without ever re-tokenising what
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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolgym.format.chat import ChatFormat
from toolgym.format.parsers import ParsedTurn

__all__ = ["Conversation", "as_int_array"]


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
        """The env's answer as chat messages; a message's ``"images"`` (the :class:`~toolgym.images.Image` objects a
        vision-language conversation renders) are dropped: a text-only policy reads their placeholders."""
        msgs = [dict(r) if isinstance(r, Mapping) else self.fmt.tool_message(*r) for r in results]
        for m in msgs:
            m.pop("images", None)
        return msgs

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
        return self.encode_rendered(text, [(a, b) for a, b in spans if a < len(text)])

    def encode_rendered(self, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        """Token ids of a rendering of the whole conversation (``spans``: outside strings spelling control tokens),
        as :meth:`expected_ids` compares them with what was built."""
        return self.fmt.encode_outside(text, spans)

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
