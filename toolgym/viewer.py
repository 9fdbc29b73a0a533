"""Trajectory viewer: one self-contained static HTML file for a trajectory JSONL file.

Each JSONL row is a :meth:`toolgym.trajectory.Trajectory.to_dict`. The report shows, per episode:

* a header with the task id, the episode reward, the outcome reward, success, turns, tool calls, error kinds,
  how the episode ended (terminated / truncated) and any chat-template drift;
* the conversation turn by turn: the model's text, each tool call with its arguments, its result, its error kind,
  its latency and attempts, and the per-turn (process) reward;
* the **loss mask**: the completion tokens decoded in runs, model tokens (mask 1: trained on) and env tokens
  (mask 0: tool responses, turn headers) in different colours, with token counts;
* the prompt (decoded) and the task row, collapsed.

Filters at the top (outcome, reward range, error kind, how the episode ended, drift, free text) hide
non-matching episodes; their state lives in the URL fragment (``report.html#outcome=failure&error=timeout``), so
a filtered view can be bookmarked or opened directly. Everything (CSS, JS) is inline: the file opens from disk
with no server and no network access.

Token ids are decoded with a tokenizer (default: the embedded one). Without one (``tokenizer=False``), the mask
view is rebuilt from the turn records (action text = mask 1, tool results = mask 0), with the span lengths from
``turns[i].action_span`` / ``obs_span``.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.data.jsonl import iter_jsonl

__all__ = ["TrajectoryFileError", "load_trajectory_rows", "render_html", "write_report"]

#: Keys every trajectory row must have (the rest is optional and shown when present).
REQUIRED_KEYS = ("completion_ids", "loss_mask", "turns")


class TrajectoryFileError(ValueError):
    """A trajectory file that cannot be read or is not ``Trajectory.to_dict()`` JSONL (message says where)."""


def load_trajectory_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read a trajectory JSONL file (one ``Trajectory.to_dict()`` per line; blank lines are skipped).

    Raises:
        FileNotFoundError / PermissionError / IsADirectoryError: the file cannot be opened.
        TrajectoryFileError: a line is not JSON, not an object, or lacks ``completion_ids`` / ``loss_mask`` /
            ``turns`` (the message gives the line number).
    """
    p = Path(path)
    rows: list[dict[str, Any]] = []
    for lineno, row in iter_jsonl(p, error=TrajectoryFileError):
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing:
            raise TrajectoryFileError(
                f"{p}:{lineno}: not a trajectory row (missing {', '.join(missing)}); "
                "expected one Trajectory.to_dict() per line"
            )
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def _fmt_reward(x: Any) -> str:
    v = _num(x)
    return f"{v:.3f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


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


def _pretty_args(args: Any) -> str:
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(args)


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
# Rendering
# ---------------------------------------------------------------------------------------------------------------

_CSS = """
:root{--model:#d9f2dd;--model-b:#2e7d32;--env:#e8ebf5;--env-b:#5c6bc0;--err:#c62828;--ok:#2e7d32;--mut:#666}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#fafafa;color:#222}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:10px 18px;z-index:5}
h1{font-size:18px;margin:0 0 6px}
.summary{color:var(--mut);margin-bottom:6px}
.summary b{color:#222}
.filters{display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.filters label{font-size:13px;color:#333}
.filters input[type=number]{width:5em}
.filters input[type=search]{width:14em}
.legend{display:flex;gap:12px;font-size:12px;margin-top:6px;color:var(--mut)}
main{padding:12px 18px}
.episode{background:#fff;border:1px solid #ddd;border-radius:6px;margin:0 0 14px;padding:10px 14px}
.episode.success{border-left:5px solid var(--ok)}
.episode.failure{border-left:5px solid var(--err)}
.ep-head{display:flex;flex-wrap:wrap;gap:8px;align-items:baseline}
.ep-head h2{font-size:15px;margin:0}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;background:#eee;color:#333}
.badge.ok{background:#e3f4e5;color:var(--ok)}
.badge.bad{background:#fde7e7;color:var(--err)}
.badge.warn{background:#fff4d6;color:#8a6100}
.badge.err{background:#fde7e7;color:var(--err);font-family:ui-monospace,monospace}
.kv{color:var(--mut);font-size:13px}
.kv b{color:#222;font-weight:600}
.turn{border-top:1px dashed #ddd;margin-top:8px;padding-top:6px}
.turn-head{font-size:13px;color:var(--mut)}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
.action{background:var(--model);border-left:3px solid var(--model-b);padding:4px 8px}
.call{border:1px solid #e0e0e0;border-radius:4px;margin:6px 0 6px 14px;padding:4px 8px;background:#fcfcfc}
.call.failed{border-color:#f2b8b8;background:#fff8f8}
.call-head{font-size:13px}
.call-head code{font-weight:600}
.result{background:var(--env);border-left:3px solid var(--env-b);padding:4px 8px}
.tok{white-space:pre-wrap;word-break:break-word;font:12.5px/1.6 ui-monospace,SFMono-Regular,Menlo,monospace;
  border:1px solid #e3e3e3;padding:6px;background:#fff}
.tok span{border-radius:2px}
.tok .m1{background:var(--model);box-shadow:inset 0 -2px 0 var(--model-b)}
.tok .m0{background:var(--env);color:#3a3f5c;box-shadow:inset 0 -2px 0 var(--env-b)}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:middle;margin-right:4px}
.sw.m1{background:var(--model);box-shadow:inset 0 -2px 0 var(--model-b)}
.sw.m0{background:var(--env);box-shadow:inset 0 -2px 0 var(--env-b)}
details{margin:6px 0}
summary{cursor:pointer;color:#333;font-size:13px}
.hidden{display:none}
#empty{color:var(--mut);padding:20px}
"""

_JS = r"""
(function(){
  var eps = Array.prototype.slice.call(document.querySelectorAll('.episode'));
  var f = {outcome: document.getElementById('f-outcome'), min: document.getElementById('f-min'),
           max: document.getElementById('f-max'), error: document.getElementById('f-error'),
           ended: document.getElementById('f-ended'), drift: document.getElementById('f-drift'),
           q: document.getElementById('f-q')};
  function val(k){ return f[k].value; }
  function apply(){
    var n = 0, lo = parseFloat(val('min')), hi = parseFloat(val('max')), q = val('q').toLowerCase();
    eps.forEach(function(el){
      var d = el.dataset, r = parseFloat(d.reward), errs = d.errors ? d.errors.split(' ') : [], show = true;
      if (val('outcome') === 'success' && d.success !== '1') show = false;
      if (val('outcome') === 'failure' && d.success === '1') show = false;
      if (!isNaN(lo) && r < lo) show = false;
      if (!isNaN(hi) && r > hi) show = false;
      var e = val('error');
      if (e === 'any' && errs.length === 0) show = false;
      else if (e === 'none' && errs.length > 0) show = false;
      else if (e !== 'all' && e !== 'any' && e !== 'none' && errs.indexOf(e) < 0) show = false;
      if (val('ended') !== 'all' && d.ended !== val('ended')) show = false;
      if (val('drift') === 'drift' && d.drift !== '1') show = false;
      if (q && d.search.indexOf(q) < 0) show = false;
      el.classList.toggle('hidden', !show);
      if (show) n++;
    });
    document.getElementById('shown').textContent = String(n);
    document.getElementById('empty').classList.toggle('hidden', n > 0);
    var parts = [];
    Object.keys(f).forEach(function(k){
      var v = val(k), d = f[k].dataset.default;
      if (v !== d) parts.push(k + '=' + encodeURIComponent(v));
    });
    var h = parts.length ? '#' + parts.join('&') : '';
    if (location.hash !== h && window.history && history.replaceState) {
      try { history.replaceState(null, '', h || location.pathname + location.search); } catch (err) {}
    }
  }
  function fromHash(){
    var h = location.hash.replace(/^#/, '');
    if (!h) return;
    h.split('&').forEach(function(kv){
      var i = kv.indexOf('='), k = kv.slice(0, i), v = decodeURIComponent(kv.slice(i + 1));
      if (f[k]) f[k].value = v;
    });
  }
  Object.keys(f).forEach(function(k){
    f[k].dataset.default = f[k].value;
    f[k].addEventListener('input', apply);
    f[k].addEventListener('change', apply);
  });
  document.getElementById('f-reset').addEventListener('click', function(){
    Object.keys(f).forEach(function(k){ f[k].value = f[k].dataset.default; });
    apply();
  });
  fromHash();
  apply();
  window.toolgymViewer = {apply: apply, filters: f};
})();
"""

ERROR_KINDS = ("parse_error", "unknown_tool", "invalid_arguments", "timeout", "exception")


def _render_call(call_res: Mapping[str, Any]) -> str:
    call = call_res.get("call") or {}
    kind = call_res.get("error_kind")
    lat = _num(call_res.get("latency_s"))
    name = call.get("name") or "?"
    bits = [f'<div class="call{" failed" if kind else ""}">', '<div class="call-head">']
    bits.append(f"tool call <code>{_e(name)}</code>")
    if call.get("id"):
        bits.append(f' <span class="kv">id {_e(call["id"])}</span>')
    bits.append(f' <span class="badge err">{_e(kind)}</span>' if kind else ' <span class="badge ok">ok</span>')
    bits.append(f' <span class="kv">latency <b class="latency">{lat * 1e3:.1f} ms</b></span>')
    attempts = call_res.get("attempts")
    if attempts and attempts != 1:
        bits.append(f' <span class="kv">attempts <b>{_e(attempts)}</b></span>')
    if call_res.get("cached"):
        bits.append(' <span class="badge">cached</span>')
    bits.append("</div>")
    if call.get("parse_error"):
        bits.append(f'<div class="kv">parse error: {_e(call["parse_error"])}</div>')
        if call.get("raw"):
            bits.append(f'<pre class="raw">{_e(call["raw"])}</pre>')
    else:
        bits.append(f'<div class="kv">arguments</div><pre class="args">{_e(_pretty_args(call.get("arguments")))}</pre>')
    bits.append(f'<div class="kv">result</div><pre class="result">{_e(call_res.get("content", ""))}</pre>')
    bits.append("</div>")
    return "".join(bits)


def _render_turn(t: Mapping[str, Any]) -> str:
    idx = t.get("index", 0)
    a0, a1 = (t.get("action_span") or [0, 0])[:2]
    o0, o1 = (t.get("obs_span") or [a1, a1])[:2]
    head = [f"turn {int(idx) + 1}", f"reward <b>{_fmt_reward(t.get('reward', 0.0))}</b>",
            f"{int(a1) - int(a0)} model tokens", f"{int(o1) - int(o0)} env tokens"]
    comps = t.get("reward_components") or {}
    if comps:
        head.append("components " + ", ".join(f"{_e(k)}={_fmt_reward(v)}" for k, v in comps.items()))
    out = [f'<div class="turn" data-turn="{_e(idx)}"><div class="turn-head">{" · ".join(head)}']
    if t.get("cut"):
        out.append(' <span class="badge warn">cut at the turn budget</span>')
    out.append("</div>")
    if t.get("reasoning"):
        out.append(f'<details><summary>reasoning</summary><pre>{_e(t["reasoning"])}</pre></details>')
    out.append(f'<pre class="action">{_e(t.get("text", ""))}</pre>')
    calls = t.get("calls") or []
    results = t.get("results") or []
    for j, res in enumerate(results):
        out.append(_render_call(res if res.get("call") else {**res, "call": calls[j] if j < len(calls) else {}}))
    if len(calls) > len(results):  # calls without results (should not happen: invariant 3)
        for c in calls[len(results):]:
            out.append(_render_call({"call": c, "content": "(no result recorded)", "error_kind": "missing"}))
    out.append("</div>")
    return "".join(out)


def _render_episode(k: int, row: Mapping[str, Any], tokenizer: Any, success_threshold: float) -> str:
    task = row.get("task") or {}
    turns = row.get("turns") or []
    reward = _num(row.get("reward", row.get("outcome_reward", 0.0)))
    outcome = _num(row.get("outcome_reward", 0.0))
    success = outcome >= success_threshold
    errs = _errors(row)
    ended = "terminated" if row.get("terminated") else "truncated" if row.get("truncated") else "unfinished"
    drift = bool(row.get("drift"))
    n_calls = sum(len(t.get("calls") or []) for t in turns)
    ids = row.get("completion_ids") or []
    mask = row.get("loss_mask") or []
    prompt_text = str(task.get("prompt", ""))
    if not prompt_text:
        users = [m.get("content", "") for m in row.get("messages") or [] if m.get("role") == "user"]
        prompt_text = str(users[0]) if users else ""
    search = " ".join([str(task.get("id", "")), prompt_text, *(t.get("text", "") for t in turns)]).lower()

    cls = "success" if success else "failure"
    out = [
        f'<section class="episode {cls}" id="ep-{k}" data-index="{k}" data-reward="{reward!r}" '
        f'data-outcome="{outcome!r}" data-success="{int(success)}" data-errors="{_e(" ".join(sorted(set(errs))))}" '
        f'data-ended="{ended}" data-drift="{int(drift)}" data-search="{_e(search)}">',
        '<div class="ep-head">',
        f"<h2>#{k} {_e(task.get('id', ''))}</h2>",
        f'<span class="badge {"ok" if success else "bad"}">{"success" if success else "failure"}</span>',
        f'<span class="kv">reward <b class="reward">{_fmt_reward(reward)}</b></span>',
        f'<span class="kv">outcome <b>{_fmt_reward(outcome)}</b></span>',
        f'<span class="kv">turns <b>{len(turns)}</b></span>',
        f'<span class="kv">tool calls <b>{n_calls}</b></span>',
        f'<span class="badge{" warn" if ended == "truncated" else ""}">{ended}</span>',
    ]
    for kind, n in sorted(Counter(errs).items()):
        out.append(f'<span class="badge err">{_e(kind)} ×{n}</span>')
    if drift:
        out.append('<span class="badge warn">drift</span>')
    if len(ids) != len(mask):
        out.append(f'<span class="badge bad">mask length {len(mask)} ≠ {len(ids)} completion tokens</span>')
    out.append("</div>")
    if prompt_text:
        out.append(f'<div class="kv">prompt: <b>{_e(prompt_text)}</b></div>')
    exp = _expected(task)
    out.append(f'<div class="kv">answer: <b class="answer">{_e(_answer(row))}</b>'
               + (f" · expected: <b>{_e(exp)}</b>" if exp is not None else "") + "</div>")
    out.extend(_render_turn(t) for t in turns)

    segs = _mask_segments(row, tokenizer)
    n1 = sum(int(m) for m in mask)
    out.append(f'<details class="mask" open><summary>loss mask: {n1} model tokens (1), {len(mask) - n1} env tokens '
               f'(0){" — rebuilt from turn texts" if tokenizer is None else ""}</summary><div class="tok">')
    for m, text, n in segs:
        who = "model" if m else "env"
        out.append(f'<span class="m{m}" title="{who}: {n} tokens, mask {m}">{_e(text)}</span>')
    out.append("</div></details>")
    prompt_ids = row.get("prompt_ids") or []
    if tokenizer is not None and prompt_ids:
        out.append(f"<details><summary>prompt ({len(prompt_ids)} tokens, decoded)</summary>"
                   f'<pre class="prompt">{_e(_decode(tokenizer, prompt_ids))}</pre></details>')
    if drift:
        out.append(f'<details open><summary>drift</summary><pre>{_e(json.dumps(row.get("drift"), indent=1))}</pre>'
                   "</details>")
    comps = row.get("reward_components") or {}
    if comps:
        out.append('<div class="kv">outcome reward components: '
                   + ", ".join(f"{_e(k)}=<b>{_fmt_reward(v)}</b>" for k, v in comps.items()) + "</div>")
    out.append(f'<details><summary>task row</summary><pre>{_e(json.dumps(task, indent=1, ensure_ascii=False, default=str))}'
               "</pre></details>")
    out.append("</section>")
    return "".join(out)


def _summary(rows: Sequence[Mapping[str, Any]], success_threshold: float) -> str:
    n = len(rows)
    if n == 0:
        return "no episodes"
    rew = sum(_num(r.get("reward")) for r in rows) / n
    succ = sum(_num(r.get("outcome_reward")) >= success_threshold for r in rows) / n
    calls = [sum(len(t.get("calls") or []) for t in r.get("turns", [])) for r in rows]
    turns = sum(len(r.get("turns") or []) for r in rows) / n
    errs = Counter(k for r in rows for k in _errors(r))
    err_s = ", ".join(f"{_e(k)} {v}" for k, v in sorted(errs.items())) or "none"
    lat = [_num(x.get("latency_s")) for r in rows for t in r.get("turns", []) for x in t.get("results", [])]
    lat_s = f" · median tool latency <b>{sorted(lat)[len(lat) // 2] * 1e3:.1f} ms</b>" if lat else ""
    return (f"<b>{n}</b> episodes · mean reward <b>{rew:.3f}</b> · success <b>{succ:.1%}</b> · "
            f"tool-call rate <b>{sum(c > 0 for c in calls) / n:.1%}</b> · calls/episode <b>{sum(calls) / n:.2f}</b> · "
            f"turns/episode <b>{turns:.2f}</b> · errors: {err_s}{lat_s}")


def render_html(
    trajectories: Iterable[Mapping[str, Any] | Any],
    *,
    tokenizer: Any = None,
    title: str = "toolgym trajectories",
    success_threshold: float = 1.0,
) -> str:
    """The report as one HTML string (inline CSS and JS; no external resources).

    Args:
        trajectories: ``Trajectory.to_dict()`` rows (or :class:`~toolgym.trajectory.Trajectory` objects).
        tokenizer: decodes ``prompt_ids`` / ``completion_ids`` for the loss-mask view; ``None`` rebuilds the view
            from the turn texts (no decoding).
        title: page title.
        success_threshold: an episode succeeded when ``outcome_reward >= success_threshold``.
    """
    rows = [_as_row(t) for t in trajectories]
    kinds = sorted(set(ERROR_KINDS) | {k for r in rows for k in _errors(r)})
    err_opts = "".join(f'<option value="{_e(k)}">{_e(k)}</option>' for k in kinds)
    body = "\n".join(_render_episode(k, r, tokenizer, success_threshold) for k, r in enumerate(rows))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="toolgym viewer">
<title>{_e(title)}</title>
<style>{_CSS}</style></head>
<body>
<header>
<h1>{_e(title)}</h1>
<div class="summary" id="summary">{_summary(rows, success_threshold)}</div>
<div class="filters">
<label>outcome <select id="f-outcome"><option value="all">all</option><option value="success">success</option>
<option value="failure">failure</option></select></label>
<label>reward ≥ <input id="f-min" type="number" step="any" value=""></label>
<label>reward ≤ <input id="f-max" type="number" step="any" value=""></label>
<label>errors <select id="f-error"><option value="all">all</option><option value="any">with errors</option>
<option value="none">without errors</option>{err_opts}</select></label>
<label>ended <select id="f-ended"><option value="all">all</option><option value="terminated">terminated</option>
<option value="truncated">truncated</option></select></label>
<label>drift <select id="f-drift"><option value="all">all</option><option value="drift">with drift</option></select></label>
<label>search <input id="f-q" type="search" value="" placeholder="task id or text"></label>
<button id="f-reset" type="button">reset</button>
<span class="kv">showing <b id="shown">{len(rows)}</b> of <b id="total">{len(rows)}</b></span>
</div>
<div class="legend"><span><span class="sw m1"></span>model tokens (loss mask 1)</span>
<span><span class="sw m0"></span>env tokens: tool responses, turn headers (mask 0)</span></div>
</header>
<main>
{body}
<div id="empty" class="hidden">No episode matches the filters.</div>
</main>
<script>{_JS}</script>
</body></html>
"""


def write_report(
    source: str | Path | Iterable[Mapping[str, Any] | Any],
    out: str | Path,
    *,
    tokenizer: Any = "embedded",
    title: str | None = None,
    limit: int | None = None,
    success_threshold: float = 1.0,
) -> Path:
    """Write the HTML report for a trajectory file (or rows) to ``out``; returns ``out``.

    Args:
        source: a JSONL path (see :func:`load_trajectory_rows`) or the rows / trajectories themselves.
        out: the HTML file to write (parent directories are created).
        tokenizer: ``"embedded"`` (the embedded SmolLM2 tokenizer), a tokenizer object, a name/path for
            :func:`toolgym.models.load_tokenizer`, or ``None`` to skip decoding (mask view from turn texts).
        title: page title (default: the file name).
        limit: render only the first ``limit`` episodes.
        success_threshold: an episode succeeded when ``outcome_reward >= success_threshold``.
    """
    if isinstance(source, str | Path):
        rows = load_trajectory_rows(source)
        title = title or f"toolgym trajectories — {Path(source).name}"
    else:
        rows = [_as_row(t) for t in source]
    if limit is not None:
        rows = rows[:limit]
    tok = tokenizer
    if isinstance(tokenizer, str | Path):
        from toolgym.models import load_tokenizer

        tok = load_tokenizer(None if tokenizer == "embedded" else tokenizer)
    page = render_html(rows, tokenizer=tok, title=title or "toolgym trajectories",
                       success_threshold=success_threshold)
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(page, encoding="utf-8")
    return p
