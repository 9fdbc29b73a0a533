"""Trajectory viewer: one self-contained static HTML file for one trajectory JSONL file, or two side by side.

Each JSONL row is a :meth:`toolgym.trajectory.Trajectory.to_dict`. The page holds the episodes as one embedded
JSON document and renders everything in the browser, lazily, so that thousands of episodes stay fast:

* **episodes**: a compact table (task, reward, outcome, turns, tool calls, tokens, tool latency, errors, how it
  ended), sortable by any column (click a header), paged; a click on a row expands that episode only: the
  conversation turn by turn (model text, each tool call with arguments, result and its images, error kind, latency, attempts,
  per-turn reward and, in GRPO trajectories, the advantage the turn's tokens trained with), the **loss mask** as
  decoded runs (model tokens, mask 1, and env tokens, mask 0, in different colours), a **per-token** view (each token with its id, mask and sampling logprob on hover), the
  **drift** as an aligned token diff marking the first difference, the prompt and the task row;
* **tasks**: one row per task (a GRPO group, or the k samples of an eval): episodes, mean reward and its spread,
  successes, pass@1 and pass@k; a click lists that task's episodes;
* **compare** (with a second file, e.g. before / after training): per task, both files' episodes, mean reward,
  success and pass@k side by side with the change, and both sets of episodes next to each other on a click;
* reward and completion-length **histograms** (inline SVG) of the episodes that pass the filters.

Filters (outcome, reward range, error kind, how the episode ended, drift, free text), the view, the sort and the
page live in the URL fragment (``report.html#outcome=failure&error=timeout&sort=-reward``), so a view can be
bookmarked. Everything (CSS, JS, data) is inline: the file opens from disk with no server and no network.

Size: token ids are stored once per episode (a run-length loss mask, logprobs to 4 decimals when present),
decoded token strings once per distinct id, prompts and task rows once per distinct value. The page template is
``toolgym/report/viewer.html``; its data goes in one ``<script type="application/json">`` element.

Token ids are decoded with a tokenizer (default: the embedded one). Without one (``tokenizer=False`` / ``None``),
the mask view is rebuilt from the turn records (action text = mask 1, tool results = mask 0) and the per-token
view shows ids only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.images import MIME_TYPES
from toolgym.trajectory import TrajectoryFileError, read_trajectories

__all__ = ["TrajectoryFileError", "build_data", "content_security_policy", "load_trajectory_rows", "render_html", "write_report"]


def load_trajectory_rows(
    path: str | Path, *, on_cut_tail: Callable[[int, str], None] | None = None
) -> list[dict[str, Any]]:
    """Read a trajectory JSONL file for the viewer: :func:`toolgym.trajectory.read_trajectories` (every row
    validated, extra keys kept, rows of older versions lacking optional keys accepted; blank lines skipped; with
    ``on_cut_tail``, a last row cut mid-write is reported to it and the whole rows are kept).

    Raises:
        FileNotFoundError / PermissionError / IsADirectoryError: the file cannot be opened.
        TrajectoryFileError: a line is not JSON, not an object, lacks ``completion_ids`` / ``loss_mask`` /
            ``turns``, or has a field of the wrong type or length (the message gives the line and the field).
    """
    return read_trajectories(path, on_cut_tail=on_cut_tail)


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def _as_row(t: Any) -> dict[str, Any]:
    if isinstance(t, Mapping):
        return dict(t)
    if hasattr(t, "to_dict"):
        return t.to_dict()
    raise TypeError(f"expected a trajectory dict or Trajectory, got {type(t).__name__}")


def _errors(row: Mapping[str, Any]) -> list[str]:
    return [r["error_kind"] for t in row.get("turns", []) for r in t.get("results", []) if r.get("error_kind")]


def _runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values: ``[(start, end, value)]``."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, int(mask[start])))
            start = i
    return out


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    if not ids:
        return ""
    vocab = len(tokenizer)
    ok = [int(i) for i in ids if 0 <= int(i) < vocab]
    text = tokenizer.decode(ok, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if len(ok) != len(ids):
        text += f" [{len(ids) - len(ok)} out-of-vocabulary ids]"
    return text


def _mask_segments(row: Mapping[str, Any], tokenizer: Any) -> list[tuple[int, str, int]]:
    """``[(mask, text, n_tokens)]`` covering the completion in order."""
    ids = list(row.get("completion_ids") or [])
    mask = list(row.get("loss_mask") or [])
    if tokenizer is not None and ids and len(ids) == len(mask):
        return [(m, _decode(tokenizer, ids[a:b]), b - a) for a, b, m in _runs(mask)]
    # No tokenizer (or a malformed row): rebuild from the turn records.
    segs: list[tuple[int, str, int]] = []
    for t in row.get("turns", []):
        a0, a1 = (t.get("action_span") or [0, 0])[:2]
        o0, o1 = (t.get("obs_span") or [a1, a1])[:2]
        segs.append((1, t.get("text", ""), int(a1) - int(a0)))
        if o1 > o0:
            body = "\n".join(f"<tool_response>\n{r.get('content', '')}\n</tool_response>" for r in t.get("results", []))
            segs.append((0, body, int(o1) - int(o0)))
    return segs


def _expected(task: Mapping[str, Any]) -> str | None:
    for key in ("answer", "golden_answers", "expected", "target", "solution"):
        if key in task:
            v = task[key]
            return ", ".join(map(str, v)) if isinstance(v, list) else str(v)
    return None


def _answer(row: Mapping[str, Any]) -> str:
    from toolgym.trajectory import extract_answer

    turns = row.get("turns") or []
    return extract_answer(turns[-1].get("content", "")) if turns else ""


# ---------------------------------------------------------------------------------------------------------------
# Data: what the page embeds (compact, deduplicated)
# ---------------------------------------------------------------------------------------------------------------

ERROR_KINDS = ("parse_error", "unknown_tool", "invalid_arguments", "timeout", "exception")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class _Tables:
    """Deduplicating tables shared by all episodes of a page: prompts, task rows, decoded token strings."""

    #: a decoded prompt shares its start with the last stored one when at least this many characters agree
    MIN_SHARED = 64

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.prompts: list[str] = []
        self.tasks: list[Any] = []
        #: decoded prompts: a string, or ``[base, n, suffix]`` = the first ``n`` UTF-16 code units of entry
        #: ``base`` (always a string) + ``suffix``: the system prompt and tool list are stored once, not per task
        self.ptexts: list[str | list[Any]] = []
        self.vocab: dict[int, str] = {}
        self.split_utf8: set[int] = set()  # ids whose lone decoding is a partial UTF-8 character
        #: every image of the page once: ``{sha256: {"src": data URI, "alt": placeholder and size}}``
        self.images: dict[str, dict[str, str]] = {}
        self._index: dict[tuple[str, str], int] = {}
        self._decoded: dict[tuple[int, ...], int] = {}
        self._base: int | None = None

    def decoded_prompt(self, ids: Sequence[int]) -> int:
        """The index of ``ids`` decoded in :attr:`ptexts` (each distinct prompt decoded and stored once, its
        start shared with the last full entry when they agree on at least :attr:`MIN_SHARED` characters)."""
        key = tuple(ids)
        if key not in self._decoded:
            text = _decode(self.tok, ids)
            entry: str | list[Any] = text
            if self._base is not None:
                base = self.ptexts[self._base]
                assert isinstance(base, str)
                n = len(os.path.commonprefix([base, text]))  # noqa: RUF071 - characters, not paths
                if n >= self.MIN_SHARED:  # lengths in UTF-16 code units: the page slices JS strings
                    entry = [self._base, len(text[:n].encode("utf-16-le")) // 2, text[n:]]
            if isinstance(entry, str):
                self._base = len(self.ptexts)
            self._decoded[key] = len(self.ptexts)
            self.ptexts.append(entry)
        return self._decoded[key]

    def intern(self, kind: str, value: Any) -> int:
        key = (kind, value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str))
        if key not in self._index:
            table = self.prompts if kind == "prompt" else self.tasks
            self._index[key] = len(table)
            table.append(value)
        return self._index[key]

    def add_tokens(self, ids: Iterable[int]) -> None:
        if self.tok is None:
            return
        vocab = len(self.tok)
        for i in set(map(int, ids)) - self.vocab.keys():
            self.vocab[i] = self.tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) \
                if 0 <= i < vocab else f"<oov {i}>"
            if "\ufffd" in self.vocab[i]:
                self.split_utf8.add(i)


    def add_images(self, table: Any) -> None:
        """The images of a row's ``images`` table, as ``data:`` URIs, each once per page (only the MIME types of
        :data:`toolgym.images.MIME_TYPES` with base64 data: the page's CSP allows ``data:`` images only)."""
        if not isinstance(table, Mapping):
            return
        for sha, entry in table.items():
            if sha in self.images or not isinstance(entry, Mapping):
                continue
            mime, data = entry.get("mime_type"), entry.get("data")
            if mime in MIME_TYPES and isinstance(data, str) and _BASE64.fullmatch(data):
                self.images[str(sha)] = {"src": f"data:{mime};base64,{data}",
                                         "alt": f"{mime} {entry.get('width')}x{entry.get('height')} sha256 {sha}"}


def _shas(refs: Any) -> list[str]:
    return [str(r["sha256"]) for r in refs if isinstance(r, Mapping) and "sha256" in r] if isinstance(refs, list) else []


def _rle(mask: Sequence[int]) -> list[list[int]]:
    """Run-length loss mask: ``[[value, length], ...]``."""
    return [[m, b - a] for a, b, m in _runs(mask)] if mask else []


def _turn_record(t: Mapping[str, Any]) -> dict[str, Any]:
    calls = t.get("calls") or []
    results = list(t.get("results") or [])
    if len(calls) > len(results):  # calls without results (should not happen: invariant 3): shown, never dropped
        results += [{"call": c, "content": "(no result recorded)", "error_kind": "missing"} for c in calls[len(results):]]
    out_calls = []
    for j, r in enumerate(results):
        c = r.get("call") or (calls[j] if j < len(calls) else {})
        out_calls.append({
            "name": c.get("name") or "?", "id": c.get("id") or "", "args": c.get("arguments"),
            "perr": c.get("parse_error"), "raw": c.get("raw") if c.get("parse_error") else None,
            "content": r.get("content", ""), "err": r.get("error_kind"), "lat": _num(r.get("latency_s")),
            "attempts": r.get("attempts"), "cached": bool(r.get("cached")), "imgs": _shas(r.get("images")),
        })
    a0, a1 = (t.get("action_span") or [0, 0])[:2]
    o0, o1 = (t.get("obs_span") or [a1, a1])[:2]
    return {"text": t.get("text", ""), "reasoning": t.get("reasoning") or "", "calls": out_calls,
            "reward": _num(t.get("reward")), "comps": t.get("reward_components") or {}, "cut": bool(t.get("cut")),
            "model_tokens": int(a1) - int(a0), "env_tokens": int(o1) - int(o0), "oimg": _shas(t.get("images"))}


def _episode(k: int, row: Mapping[str, Any], tables: _Tables, threshold: float) -> dict[str, Any]:
    """One episode as the page's JS reads it (short keys: this is repeated thousands of times)."""
    task = row.get("task") or {}
    turns = row.get("turns") or []
    ids = [int(i) for i in row.get("completion_ids") or []]
    mask = [int(m) for m in row.get("loss_mask") or []]
    outcome = _num(row.get("outcome_reward", 0.0))
    prompt_text = str(task.get("prompt", ""))
    if not prompt_text:
        users = [m.get("content", "") for m in row.get("messages") or [] if m.get("role") == "user"]
        prompt_text = str(users[0]) if users else ""
    errs = _errors(row)
    lat = sum(_num(r.get("latency_s")) for t in turns for r in t.get("results") or [])
    tables.add_tokens(ids)
    tables.add_images(row.get("images"))
    ep: dict[str, Any] = {
        "k": k, "task": str(task.get("id", "")), "t": tables.intern("task", task),
        "p": tables.intern("prompt", prompt_text),
        "r": _num(row.get("reward", outcome)), "o": outcome, "s": int(outcome >= threshold),
        "nt": len(turns), "nc": sum(len(t.get("calls") or []) for t in turns), "tok": len(ids),
        "m1": sum(mask), "lat": round(lat, 6), "errs": errs,
        "end": "terminated" if row.get("terminated") else "truncated" if row.get("truncated") else "unfinished",
        "ans": _answer(row), "exp": _expected(task), "comps": row.get("reward_components") or {},
        "turns": [_turn_record(t) for t in turns], "ids": ids, "mask": _rle(mask),
    }
    if pimg := _shas(row.get("prompt_images")):
        ep["pimg"] = pimg
    advs = row.get("turn_advantages")  # written by the GRPO adapter: the advantage each turn's tokens trained with
    if isinstance(advs, list) and len(advs) == len(turns):
        for rec, a in zip(ep["turns"], advs, strict=True):
            rec["adv"] = _num(a)
    if len(ids) != len(mask):
        ep["badmask"] = [len(mask), len(ids)]
    lps = row.get("logprobs")
    if isinstance(lps, list) and len(lps) == len(ids):
        ep["lp"] = [round(_num(x), 4) for x in lps]
    prompt_ids = row.get("prompt_ids") or []
    ep["np"] = len(prompt_ids)
    if tables.tok is not None and prompt_ids:
        ep["pt"] = tables.decoded_prompt(prompt_ids)
    if tables.tok is None or len(ids) != len(mask):
        ep["segs"] = _mask_segments(row, None if len(ids) != len(mask) else tables.tok)
    elif tables.split_utf8 and not tables.split_utf8.isdisjoint(ids):  # split UTF-8 characters: decode runs whole
        ep["segs"] = _mask_segments(row, tables.tok)
    drift = _drift(row.get("drift"))
    if drift:
        tables.add_tokens([*drift["built"], *drift["expected"]])
        ep["drift"] = drift
    return ep


def _ints(x: Any) -> list[int]:
    return [int(i) for i in x if type(i) is int] if isinstance(x, list) else []


def _drift(d: Any) -> dict[str, Any]:
    """The drift record as the page shows it, rebuilt from its known fields only (ints and strings, whatever the
    row held: rows given to :func:`render_html` directly are not validated)."""
    if not isinstance(d, Mapping) or not d:
        return {}

    def num(key: str) -> int | None:
        return d[key] if type(d.get(key)) is int else None

    return {"index": num("index"), "built": _ints(d.get("built")), "expected": _ints(d.get("expected")),
            "built_len": num("built_len"), "expected_len": num("expected_len"),
            "error": str(d["error"]) if d.get("error") is not None else None}


def build_data(
    rows: Sequence[Mapping[str, Any]],
    *,
    tokenizer: Any = None,
    success_threshold: float = 1.0,
    compare: Sequence[Mapping[str, Any]] | None = None,
    labels: Sequence[str] = ("A", "B"),
) -> dict[str, Any]:
    """The JSON document the page embeds: ``{"runs": [{"label", "eps": [...]}, ...], "prompts" (the user
    questions), "ptexts" (decoded prompts, see :class:`_Tables`), "tasks", "vocab" ({id: decoded token}; empty
    without a tokenizer), "threshold", "images" ({sha256: {"src": data URI, "alt"}}: every image of the episodes
    once)}`` (one run, or two with ``compare``)."""
    tables = _Tables(tokenizer)
    runs = [{"label": labels[0], "eps": [_episode(k, r, tables, success_threshold) for k, r in enumerate(rows)]}]
    if compare is not None:
        runs.append({"label": labels[1],
                     "eps": [_episode(k, r, tables, success_threshold) for k, r in enumerate(compare)]})
    kinds = sorted(set(ERROR_KINDS) | {e for run in runs for ep in run["eps"] for e in ep["errs"]})
    return {"runs": runs, "prompts": tables.prompts, "ptexts": tables.ptexts, "tasks": tables.tasks,
            "vocab": {str(k): v for k, v in sorted(tables.vocab.items())}, "threshold": success_threshold,
            "error_kinds": kinds, "decoded": tokenizer is not None, "images": tables.images}


_TEMPLATE = Path(__file__).with_name("viewer.html")


def content_security_policy() -> str:
    """The page's Content-Security-Policy: its one script (identified by its SHA-256, so that no script a
    trajectory's text might smuggle into the page can run), inline CSS, nothing fetched from anywhere. The page
    carries it in a ``<meta>`` tag (a file opened from disk is protected too); a server sends it as a header."""
    template = _TEMPLATE.read_text(encoding="utf-8")
    code = template.rsplit("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
            "base-uri 'none'; form-action 'none'")


def _json_for_script(data: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>``, ``&`` and the JS line separators escaped."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_html(
    trajectories: Iterable[Mapping[str, Any] | Any],
    *,
    tokenizer: Any = None,
    title: str = "toolgym trajectories",
    success_threshold: float = 1.0,
    compare: Iterable[Mapping[str, Any] | Any] | None = None,
    labels: Sequence[str] = ("A", "B"),
) -> str:
    """The page as one HTML string (inline CSS, JS and data; no external resources).

    Args:
        trajectories: ``Trajectory.to_dict()`` rows (or :class:`~toolgym.trajectory.Trajectory` objects).
        tokenizer: decodes ``prompt_ids`` / ``completion_ids``; ``None`` rebuilds the mask view from the turn
            texts (the per-token view then shows ids only).
        title: page title.
        success_threshold: an episode succeeded when ``outcome_reward >= success_threshold``.
        compare: a second set of episodes (e.g. after training) shown side by side per task.
        labels: the names of the two sets in the comparison.
    """
    rows = [_as_row(t) for t in trajectories]
    other = None if compare is None else [_as_row(t) for t in compare]
    data = build_data(rows, tokenizer=tokenizer, success_threshold=success_threshold, compare=other, labels=labels)
    before, after = _TEMPLATE.read_text(encoding="utf-8").split("{{DATA}}")
    title_html = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    before = before.replace("{{TITLE}}", title_html).replace("{{CSP}}", content_security_policy())
    return before + _json_for_script(data) + after


def write_report(
    source: str | Path | Iterable[Mapping[str, Any] | Any],
    out: str | Path,
    *,
    tokenizer: Any = "embedded",
    title: str | None = None,
    limit: int | None = None,
    success_threshold: float = 1.0,
    compare: str | Path | Iterable[Mapping[str, Any] | Any] | None = None,
    labels: Sequence[str] | None = None,
) -> Path:
    """Write the HTML page for a trajectory file (or rows) to ``out``; returns ``out``.

    Args:
        source: a JSONL path (see :func:`load_trajectory_rows`) or the rows / trajectories themselves.
        out: the HTML file to write (parent directories are created; written whole, then renamed into place).
        tokenizer: ``"embedded"`` (the embedded SmolLM2 tokenizer), a tokenizer object, a name/path for
            :func:`toolgym.models.load_tokenizer`, or ``None`` to skip decoding (mask view from turn texts).
        title: page title (default: the file name(s)).
        limit: only the first ``limit`` episodes (of each file).
        success_threshold: an episode succeeded when ``outcome_reward >= success_threshold``.
        compare: a second trajectory file (or rows), e.g. after training, compared per task with ``source``.
        labels: names of the two sets (default: the file names, or ``A`` / ``B``).
    """
    def load(src: Any) -> tuple[list[dict[str, Any]], str | None]:
        if isinstance(src, str | Path):
            return load_trajectory_rows(src), Path(src).name
        return [_as_row(t) for t in src], None

    rows, name = load(source)
    other, other_name = load(compare) if compare is not None else (None, None)
    if labels is None:
        labels = (name or "A", other_name or "B")
        if labels[0] == labels[1]:
            labels = (f"A: {labels[0]}", f"B: {labels[1]}")
    if title is None:
        title = "toolgym trajectories" + (f" — {name}" if name else "") + (f" vs {other_name}" if other_name else "")
    if limit is not None:
        rows = rows[:limit]
        other = other[:limit] if other is not None else None
    tok = tokenizer
    if isinstance(tokenizer, str | Path):
        from toolgym.models import load_tokenizer

        tok = load_tokenizer(None if tokenizer == "embedded" else tokenizer)
    page = render_html(rows, tokenizer=tok, title=title, success_threshold=success_threshold, compare=other,
                       labels=tuple(labels))
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(p)
    return p
