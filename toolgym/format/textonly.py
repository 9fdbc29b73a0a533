"""Outside text reaches the model as text: control tokens spelled inside tool results, task text, retrieved
passages or tool descriptions are encoded as ordinary text tokens, never as the control token ids.

A fast tokenizer matches its added tokens anywhere in the string it encodes, so a fetched page containing
``<|im_end|>\\n<|im_start|>system\\n...`` would become a real end-of-turn and a forged system turn. The chat template
is still rendered exactly as usual (same text); only the *encoding* differs, and only inside the character spans
that came from outside text:

* :class:`ControlTokens` knows the family's control tokens (every *special* added token, plus the non-special added
  tokens the chat template itself writes, e.g. Qwen's ``<tool_call>``/``<tool_response>``/``<think>``; ordinary added
  tokens such as Gemma's whitespace runs or HTML tags are not control tokens) and encodes a rendered text given
  the protected spans: the normal encoding when no control token falls inside a span (the common case: one
  encode, no copy), else the text is cut at the template's own control tokens and the pieces between them are
  encoded by a copy of the tokenizer without the control tokens - which is what the tokenizer itself does to the
  text between added tokens, so text without forged tokens encodes identically either way.
* :func:`outside_spans` finds where each outside string landed in a rendering, for any template (contents may be
  trimmed or JSON-escaped): the string is replaced by a marker, the template rendered again, and the rendering
  around the marker gives the span. Only strings that contain a control token's text are located (one extra
  rendering each), so clean text costs nothing.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["ControlTokens", "Span", "outside_spans"]

Span = tuple[int, int]  # [start, end) character offsets in a rendered text

_CACHE: weakref.WeakKeyDictionary[Any, dict[str, ControlTokens]] = weakref.WeakKeyDictionary()


class ControlTokens:
    """A tokenizer's control tokens and the span-aware encoder.

    Args:
        tokenizer: a Hugging Face fast tokenizer (``backend_tokenizer`` is used).
        chat_template: the template's source: non-special added tokens it writes count as control tokens.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None) -> None:
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # None: a slow tokenizer (see encode)
        self._tok = weakref.ref(tokenizer) if self.backend is None else None
        template = chat_template or ""
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.texts: dict[str, int] = {}
        for tid, tok in decoder.items():
            text = str(getattr(tok, "content", tok))
            if not text.strip():
                continue
            if getattr(tok, "special", False) or text in template:
                self.texts[text] = int(tid)
        self.ids: frozenset[int] = frozenset(self.texts.values())
        alts = sorted(self.texts, key=len, reverse=True)
        self.pattern: re.Pattern[str] | None = re.compile("|".join(map(re.escape, alts))) if alts else None
        self._plain: Any = None

    @classmethod
    def of(cls, tokenizer: Any, chat_template: str | None) -> ControlTokens:
        """Shared per (tokenizer, template)."""
        key = chat_template or ""
        try:
            per = _CACHE.setdefault(tokenizer, {})
        except TypeError:
            return cls(tokenizer, chat_template)
        ct = per.get(key)
        if ct is None:
            ct = per[key] = cls(tokenizer, chat_template)
        return ct

    def spells_control(self, text: str) -> bool:
        """Whether ``text`` contains any control token's text."""
        return self.pattern is not None and self.pattern.search(text) is not None

    @property
    def plain(self) -> Any:
        """A copy of the tokenizer with the control tokens removed from its added vocabulary (built on first use)."""
        if self._plain is None:
            from tokenizers import Tokenizer

            spec = json.loads(self.backend.to_str())
            spec["added_tokens"] = [t for t in spec.get("added_tokens", []) if t.get("content") not in self.texts]
            self._plain = Tokenizer.from_str(json.dumps(spec))
        return self._plain

    def encode(self, text: str, spans: Sequence[Span]) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added) where no control token is matched inside ``spans``."""
        if self.backend is None:
            return self._encode_slow(text, spans)
        enc = self.backend.encode(text, add_special_tokens=False)
        ids = enc.ids
        if not spans or self.ids.isdisjoint(ids):
            return ids
        offsets = enc.offsets
        keep: list[int] = []  # positions of control tokens the template wrote itself
        forged = False
        for k, tid in enumerate(ids):
            if tid in self.ids:
                s, e = offsets[k]
                if any(s < b and a < e for a, b in spans):
                    forged = True
                else:
                    keep.append(k)
        if not forged:
            return ids
        out: list[int] = []
        pos = 0
        plain = self.plain
        for k in keep:
            s, e = offsets[k]
            if s > pos:
                out.extend(plain.encode(text[pos:s], add_special_tokens=False).ids)
            out.append(ids[k])
            pos = e
        if pos < len(text):
            out.extend(plain.encode(text[pos:], add_special_tokens=False).ids)
        return out


    def _encode_slow(self, text: str, spans: Sequence[Span]) -> list[int]:
        """A slow (Python) tokenizer: control-token texts outside ``spans`` are the template's; the pieces between
        them are encoded with ``split_special_tokens=True`` (non-special added tokens may still match there)."""
        tok = self._tok() if self._tok is not None else None
        if tok is None:  # pragma: no cover - the tokenizer is alive while its chat format is
            raise RuntimeError("the tokenizer of these control tokens was garbage-collected")
        if not spans or self.pattern is None:
            return tok.encode(text, add_special_tokens=False)
        out: list[int] = []
        pos = 0
        for m in self.pattern.finditer(text):
            s, e = m.span()
            if any(s < b and a < e for a, b in spans):
                continue
            if s > pos:
                out.extend(tok.encode(text[pos:s], add_special_tokens=False, split_special_tokens=True))
            out.append(self.texts[m.group(0)])
            pos = e
        if pos < len(text):
            out.extend(tok.encode(text[pos:], add_special_tokens=False, split_special_tokens=True))
        return out


def _strings(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _strings(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _strings(v, (*path, i))


def _replace(obj: Any, path: tuple[Any, ...], value: str) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, Mapping):
        return {**obj, head: _replace(obj[head], rest, value)}
    out = list(obj)
    out[head] = _replace(out[head], rest, value)
    return out


def outside_spans(
    render: Callable[[list[dict[str, Any]], list[dict[str, Any]]], str],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    rendered: str,
    control: ControlTokens,
    *,
    outside_roles: frozenset[str] = frozenset({"system", "user", "tool", "ipython", "developer"}),
) -> list[Span]:
    """Where the outside strings that spell control tokens landed in ``rendered`` (= ``render(messages, tools)``).

    Outside strings: every string in the contents of messages whose role is in ``outside_roles`` (assistant turns
    are the model's own sampled text) and every string in ``tools``. A string the template does not render (or
    renders in a way that depends on its value) gets its literal occurrences in ``rendered`` as spans instead."""
    if control.pattern is None:
        return []
    msgs = [dict(m) for m in messages]
    tls = [dict(t) for t in tools]
    slots: list[tuple[str, int, tuple[Any, ...], str]] = []
    for i, m in enumerate(msgs):
        if m.get("role") in outside_roles:
            slots += [("m", i, p, s) for p, s in _strings(m.get("content"), ("content",)) if control.spells_control(s)]
    for i, t in enumerate(tls):
        slots += [("t", i, p, s) for p, s in _strings(t) if control.spells_control(s)]
    spans: list[Span] = []
    for n, (kind, i, path, s) in enumerate(slots):
        marker = f"TOOLGYMSLOT{n}Q{len(rendered)}Z"
        m2, t2 = list(msgs), list(tls)
        if kind == "m":
            m2[i] = _replace(msgs[i], path, marker)
        else:
            t2[i] = _replace(tls[i], path, marker)
        try:
            skel = render(m2, t2)
        except Exception:  # noqa: BLE001 - a template that rejects the marker: fall back to literal occurrences
            skel = ""
        a, sep, b = skel.partition(marker)
        if sep and marker not in b and rendered.startswith(a) and rendered.endswith(b) and len(a) + len(b) <= len(rendered):
            spans.append((len(a), len(rendered) - len(b)))
            continue
        start = rendered.find(s)
        while s and start != -1:
            spans.append((start, start + len(s)))
            start = rendered.find(s, start + len(s))
    return spans
