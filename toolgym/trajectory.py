"""Trajectory: what trainers consume, built by the env token by token and never re-tokenised.

``completion_ids`` = action_1 + obs_1 + action_2 + obs_2 + ... and ``loss_mask`` has the same length: 1 on
tokens the policy sampled, 0 on tokens the env wrote (tool responses, next-turn headers, an end-of-turn
token closing a turn cut by its budget).

This module also owns the trajectory file format: one :meth:`Trajectory.to_dict` per JSONL line, written by
:func:`write_trajectories` (atomically, through :mod:`toolgym.jsonl`) and read back, validated, by
:func:`read_trajectories`; :meth:`Trajectory.from_dict` rebuilds the object from a row. A row needs
``completion_ids``, ``loss_mask`` and ``turns``; every other key is optional (rows of older versions, or hand-made
ones, lack some) and keys toolgym does not know (``"eval"`` of ``toolgym eval`` rows, a trainer's own) are kept
in the rows and ignored by :meth:`Trajectory.from_dict`. A key that is present must have the right type, and
``loss_mask`` / ``logprobs`` must be as long as ``completion_ids``; a bad row is a :class:`TrajectoryFormatError`
naming the field (``turns[1].results[0].error_kind: ...``), and in a file a :class:`TrajectoryFileError` that also
names ``path:line``.

Images are stored inline: a row with images has an ``images`` table, ``{sha256: {mime_type, width, height, bytes,
data}}`` with the bytes in base64, each image once per row; tool results, ``prompt_images`` and a turn's other
images of the env's answer (its ``images``) name them by :meth:`toolgym.images.Image.ref`. A row is thus a whole
episode on its own (docs/multimodal.md says why), and reading it back checks each image's bytes against its
SHA-256.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from toolgym.errors import InputFileError
from toolgym.images import Image, ImageError
from toolgym.jsonl import iter_jsonl, write_jsonl
from toolgym.tools.base import ToolCall, ToolErrorKind, ToolResult

__all__ = [
    "REQUIRED_KEYS",
    "Trajectory",
    "TrajectoryFileError",
    "TrajectoryFormatError",
    "Turn",
    "check_trajectory_row",
    "extract_answer",
    "read_trajectories",
    "summarize",
    "write_trajectories",
]

#: Keys every trajectory row must have (the rest is optional, see the module docstring).
REQUIRED_KEYS = ("completion_ids", "loss_mask", "turns")


class TrajectoryFormatError(ValueError):
    """A trajectory row that is not a valid :meth:`Trajectory.to_dict`; the message names the field."""


class TrajectoryFileError(TrajectoryFormatError, InputFileError):
    """A trajectory file with a line that is not JSON, not an object, or not a valid trajectory row; the message
    names ``path:line`` (and the field). A missing file is ``FileNotFoundError``."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The final answer in ``text``: the content of the last ``<answer>...</answer>`` if present, else ``text``
    stripped."""
    found = _ANSWER.findall(text)
    return (found[-1] if found else text).strip()


@dataclass
class Turn:
    """One assistant turn and the env's answer to it.

    Attributes:
        index: 0-based turn number.
        action_start, action_end: the action's span ``[start, end)`` in ``completion_ids`` (mask 1; plus one
            mask-0 end-of-turn token at ``action_end - 1`` when ``cut`` is true).
        obs_start, obs_end: the observation's span (mask 0); equal when nothing was appended.
        text: the decoded action text (end-of-turn token removed).
        content: the text outside tool calls / reasoning (the answer on the last turn).
        calls: parsed calls (malformed ones have ``parse_error``); results: one per call, same order.
        cut: the action hit its token budget without an end-of-turn token; the env closed the turn.
        reward: the process (per-turn) reward of this turn.
        env_checks: the env's own checks of this turn, ``{name: JSON object}``, written by the env while it answers
            the turn, for its reward to read (e.g. ``"bfcl"``: BFCL's state and response check of the user turn this
            turn closed, :class:`toolgym.envs.bfcl.verdict.TurnCheck`). Empty for most envs.
        obs_images: the images the env's answer to this turn showed besides its tool results' (an
            :meth:`~toolgym.envs.base.ToolEnv.env_response` override's user message with a new screen), in order,
            each once; the row names them by ref under ``"images"``.
    """

    index: int
    action_start: int
    action_end: int
    obs_start: int = 0
    obs_end: int = 0
    text: str = ""
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    cut: bool = False
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    env_checks: dict[str, Any] = field(default_factory=dict)
    obs_images: list[Image] = field(default_factory=list)

    @property
    def error_kinds(self) -> list[str]:
        return [r.error_kind.value for r in self.results if r.error_kind is not None]

    def to_dict(self) -> dict[str, Any]:
        row = {
            "index": self.index,
            "action_span": [self.action_start, self.action_end],
            "obs_span": [self.obs_start, self.obs_end],
            "text": self.text,
            "content": self.content,
            "reasoning": self.reasoning,
            "calls": [c.to_dict() for c in self.calls],
            "results": [r.to_dict() for r in self.results],
            "cut": self.cut,
            "reward": self.reward,
            "reward_components": self.reward_components,
        }
        if self.env_checks:
            row["env_checks"] = self.env_checks
        if self.obs_images:
            row["images"] = [img.ref() for img in self.obs_images]
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any], position: int = 0) -> Turn:
        """The turn of a :meth:`to_dict` row (validated; missing optional keys take their defaults, ``index``
        defaults to ``position``). Raises :class:`TrajectoryFormatError` naming the field. A turn row names its
        results' images without their bytes (those are in the trajectory row's ``images`` table): the results
        rebuilt here have no images; :meth:`Trajectory.from_dict` restores them."""
        _check_turn(row, "turn")
        return _turn(row, position)


@dataclass
class Trajectory:
    """A whole episode at token level.

    Attributes:
        prompt_ids: the prompt token ids (system + tools + user turn + assistant header).
        completion_ids: every token after the prompt (actions and observations, interleaved).
        loss_mask: ``len(completion_ids)`` ints: 1 = sampled by the policy, 0 = written by the env.
        logprobs: optional per-completion-token sampling logprobs (0.0 on env tokens), when the policy gave them.
        turns: per-turn records (spans, calls, results, rewards).
        messages: the conversation as chat messages (for humans and drift checks).
        task: the task row.
        outcome_reward: the outcome reward (set on the last step).
        reward: outcome + sum of per-turn rewards (what the episode's step rewards add up to).
        terminated / truncated: how the episode ended.
        drift: ``{}`` when ``prompt_ids + completion_ids`` equal the chat template's tokens for ``messages``;
            otherwise the first differing index and the token windows around it.
        prompt_images: the task's images (shown before the first user text; ``task["images"]`` holds their refs).
        errors: ``{kind: message}`` faults of the episode that are not the model's: ``prompt_too_long`` (the prompt
            alone fills the token budget; the episode ends truncated before any turn), ``reward_timeout``,
            ``reward_exception``, ``reward_non_finite`` (the reward could not score; the episode scores 0). Empty
            when there are none. Evaluation reports count them apart from the model's failures.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    task: dict[str, Any] = field(default_factory=dict)
    outcome_reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    drift: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    prompt_images: list[Image] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.outcome_reward + sum(t.reward for t in self.turns)

    @property
    def turn_rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def final_text(self) -> str:
        """The content of the last turn (the model's answer when it stopped calling tools)."""
        return self.turns[-1].content if self.turns else ""

    @property
    def answer(self) -> str:
        """:func:`extract_answer` of the last turn's content."""
        return extract_answer(self.final_text)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.calls]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [r for t in self.turns for r in t.results]

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.calls) for t in self.turns)

    @property
    def error_kinds(self) -> list[str]:
        return [k for t in self.turns for k in t.error_kinds]

    @property
    def images(self) -> list[Image]:
        """Every image of the episode, each once, in order of appearance: the prompt's, then each turn's tool
        results' and the other images of the env's answer (:attr:`Turn.obs_images`)."""
        seen: dict[str, Image] = {}
        shown = (img for t in self.turns for img in [*(i for r in t.results for i in r.images), *t.obs_images])
        for img in [*self.prompt_images, *shown]:
            seen.setdefault(img.sha256, img)
        return list(seen.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (one JSONL line of a trajectory file). An episode with images also has
        ``"images"``: ``{sha256: Image.to_json()}``, each image's bytes once, in base64 (results and
        ``"prompt_images"`` name them by ref)."""
        row = {
            "task": self.task,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": self.logprobs,
            "turns": [t.to_dict() for t in self.turns],
            "turn_rewards": self.turn_rewards,
            "outcome_reward": self.outcome_reward,
            "reward": self.reward,
            "reward_components": self.reward_components,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "drift": self.drift,
            "errors": dict(self.errors),
            "messages": self.messages,
        }
        if self.prompt_images:
            row["prompt_images"] = [img.ref() for img in self.prompt_images]
        if images := self.images:
            row["images"] = {img.sha256: img.to_json() for img in images}
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Trajectory:
        """The trajectory of a :meth:`to_dict` row (e.g. one line of a trajectory file).

        The row is validated first (:func:`check_trajectory_row`); optional keys it lacks take their defaults,
        derived keys (``reward``, ``turn_rewards``) and unknown keys are ignored. Round trip:
        ``Trajectory.from_dict(t.to_dict()) == t``.

        Raises:
            TrajectoryFormatError: a missing required key or a field of the wrong type or length (named).
        """
        check_trajectory_row(row)
        lp = row.get("logprobs")
        table = _image_table(row)
        return cls(
            prompt_ids=list(row.get("prompt_ids") or []),
            completion_ids=list(row["completion_ids"]),
            loss_mask=list(row["loss_mask"]),
            logprobs=None if lp is None else [float(x) for x in lp],
            turns=[_turn(t, i, table) for i, t in enumerate(row["turns"])],
            messages=[dict(m) for m in row.get("messages") or []],
            task=dict(row.get("task") or {}),
            outcome_reward=float(row.get("outcome_reward", 0.0)),
            reward_components=dict(row.get("reward_components") or {}),
            terminated=bool(row.get("terminated", False)),
            truncated=bool(row.get("truncated", False)),
            drift=dict(row.get("drift") or {}),
            errors=dict(row.get("errors") or {}),
            prompt_images=[table[ref["sha256"]] for ref in row.get("prompt_images") or []],
        )

    def clip(self, max_tokens: int | None, blocks: Sequence[tuple[int, int]] = ()) -> Trajectory:
        """Cut ``completion_ids`` / ``loss_mask`` / ``logprobs`` to ``max_tokens`` (``None``: no limit). The tail
        cut off is env tokens or a cut turn; rewards stay those computed on the whole episode. ``blocks``:
        ``[start, end)`` spans of ``completion_ids`` never split (image blocks,
        :func:`toolgym.format.vision.image_blocks`): a cut inside one moves to its start. Returns ``self``
        (mutated)."""
        if max_tokens is not None and len(self.completion_ids) > max_tokens:
            max_tokens = min([max_tokens] + [a for a, b in blocks if a < max_tokens < b])
            self.completion_ids = self.completion_ids[:max_tokens]
            self.loss_mask = self.loss_mask[:max_tokens]
            if self.logprobs is not None:
                self.logprobs = self.logprobs[:max_tokens]
        return self


# ---------------------------------------------------------------------------------------------------------------
# Validation of rows
# ---------------------------------------------------------------------------------------------------------------


def _bad(where: str, msg: str) -> TrajectoryFormatError:
    return TrajectoryFormatError(f"{where}: {msg}")


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _check_type(row: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str, what: str) -> None:
    if key in row and not isinstance(row[key], types):
        raise _bad(f"{where}{key}", f"expected {what}, got {_kind(row[key])}")


def _check_ints(value: Any, where: str, *, allowed: frozenset[int] | None = None) -> None:
    if not isinstance(value, list):
        raise _bad(where, f"expected a list of ints, got {_kind(value)}")
    for i, x in enumerate(value):
        if type(x) is not int or (allowed is not None and x not in allowed):
            want = "0 or 1" if allowed is not None else "an int"
            raise _bad(f"{where}[{i}]", f"expected {want}, got {x!r}")


def _check_span(value: Any, where: str) -> None:
    if not (isinstance(value, list) and len(value) == 2 and all(type(x) is int for x in value)):
        raise _bad(where, f"expected [start, end] ints, got {value!r}")


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, Mapping):
        raise _bad(where, f"expected an object, got {_kind(call)}")
    for key in ("name", "raw", "id"):
        _check_type(call, key, str, f"{where}.", "a string")
    _check_type(call, "arguments", Mapping, f"{where}.", "an object")
    _check_type(call, "parse_error", (str, type(None)), f"{where}.", "a string or null")


def _check_result(res: Any, where: str) -> None:
    if not isinstance(res, Mapping):
        raise _bad(where, f"expected an object, got {_kind(res)}")
    if "call" in res:
        _check_call(res["call"], f"{where}.call")
    _check_type(res, "content", str, f"{where}.", "a string")
    kind = res.get("error_kind")
    if kind is not None and kind not in ToolErrorKind._value2member_map_:
        raise _bad(f"{where}.error_kind", f"{kind!r} is not one of {[k.value for k in ToolErrorKind]} or null")
    if "latency_s" in res and not _is_num(res["latency_s"]):
        raise _bad(f"{where}.latency_s", f"expected a number, got {_kind(res['latency_s'])}")
    if "attempts" in res and type(res["attempts"]) is not int:
        raise _bad(f"{where}.attempts", f"expected an int, got {_kind(res['attempts'])}")
    _check_type(res, "cached", bool, f"{where}.", "a boolean")
    _check_refs(res, f"{where}.")


def _check_turn(turn: Any, where: str) -> None:
    if not isinstance(turn, Mapping):
        raise _bad(where, f"expected an object, got {_kind(turn)}")
    if "index" in turn and type(turn["index"]) is not int:
        raise _bad(f"{where}.index", f"expected an int, got {_kind(turn['index'])}")
    for key in ("action_span", "obs_span"):
        if key in turn:
            _check_span(turn[key], f"{where}.{key}")
    for key in ("text", "content", "reasoning"):
        _check_type(turn, key, str, f"{where}.", "a string")
    for key, check in (("calls", _check_call), ("results", _check_result)):
        items = turn.get(key, [])
        if not isinstance(items, list):
            raise _bad(f"{where}.{key}", f"expected a list, got {_kind(items)}")
        for i, item in enumerate(items):
            check(item, f"{where}.{key}[{i}]")
    _check_type(turn, "cut", bool, f"{where}.", "a boolean")
    if "reward" in turn and not _is_num(turn["reward"]):
        raise _bad(f"{where}.reward", f"expected a number, got {_kind(turn['reward'])}")
    _check_type(turn, "reward_components", Mapping, f"{where}.", "an object")
    _check_type(turn, "env_checks", Mapping, f"{where}.", "an object")
    _check_refs(turn, f"{where}.")


_DRIFT_INTS = ("index", "built_len", "expected_len")
_DRIFT_TEXTS = ("built_text", "expected_text", "error")


def _check_drift(drift: Mapping[str, Any]) -> None:
    """A drift record (what ``Conversation.check_drift`` returns): ``index``/``built_len``/
    ``expected_len`` ints, ``built``/``expected`` lists of token ids (ints), ``built_text``/``expected_text``/
    ``error`` strings; no other keys (a viewer shows every one of them)."""
    for key, value in drift.items():
        if key in _DRIFT_INTS:
            if type(value) is not int:
                raise _bad(f"drift.{key}", f"expected an int, got {_kind(value)}")
        elif key in ("built", "expected"):
            _check_ints(value, f"drift.{key}")
        elif key in _DRIFT_TEXTS:
            if not isinstance(value, str):
                raise _bad(f"drift.{key}", f"expected a string, got {_kind(value)}")
        else:
            raise _bad(f"drift.{key}", "unknown key (a drift record holds index, built, expected, built_text, "
                       "expected_text, built_len, expected_len, error)")


def _check_refs(row: Mapping[str, Any], where: str, key: str = "images") -> None:
    """``row[key]``, when present, is a list of image refs (objects with a ``sha256`` string)."""
    refs = row.get(key, [])
    if not isinstance(refs, list):
        raise _bad(f"{where}{key}", f"expected a list, got {_kind(refs)}")
    for i, ref in enumerate(refs):
        if not (isinstance(ref, Mapping) and isinstance(ref.get("sha256"), str)):
            raise _bad(f"{where}{key}[{i}]", "expected an image ref (an object with a sha256)")


def _check_image_table(row: Mapping[str, Any]) -> None:
    """The row's ``images`` table holds an entry for every ref of its results and ``prompt_images``."""
    table = row.get("images", {})
    if not isinstance(table, Mapping):
        raise _bad("images", f"expected an object (sha256 -> image), got {_kind(table)}")
    for sha, entry in table.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("data"), str) \
                or not isinstance(entry.get("mime_type"), str) \
                or not all(type(entry.get(k)) is int for k in ("width", "height")):
            raise _bad(f"images.{sha}", "expected {mime_type, width, height, data (base64)}")
    _check_refs(row, "", "prompt_images")
    refs = [("prompt_images", r) for r in row.get("prompt_images") or []] + [
        (f"turns[{i}].results[{j}].images", ref) for i, t in enumerate(row["turns"])
        for j, res in enumerate(t.get("results") or []) for ref in res.get("images") or []] + [
        (f"turns[{i}].images", ref) for i, t in enumerate(row["turns"]) for ref in t.get("images") or []]
    for where, ref in refs:
        if ref["sha256"] not in table:
            raise _bad(where, f"image {ref['sha256']} is not in the row's images table")


def _image_table(row: Mapping[str, Any]) -> dict[str, Image]:
    """The decoded ``images`` table of a checked row; an entry whose bytes do not hash to its key is an error."""
    out: dict[str, Image] = {}
    for sha, entry in (row.get("images") or {}).items():
        try:
            out[sha] = Image.from_json({**entry, "sha256": sha})
        except ImageError as e:
            raise _bad(f"images.{sha}", e.message) from None
    return out


def check_trajectory_row(row: Any) -> None:
    """Raise :class:`TrajectoryFormatError` unless ``row`` is a valid trajectory row (see the module docstring):
    an object with ``completion_ids`` (ints), ``loss_mask`` (0/1, as long as ``completion_ids``) and ``turns``
    (objects); optional keys, when present, of the right type (``logprobs`` null or numbers as long as
    ``completion_ids``). The message names the first bad field. Unknown keys are allowed."""
    if not isinstance(row, Mapping):
        raise TrajectoryFormatError(f"expected a trajectory object, got {_kind(row)}")
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise TrajectoryFormatError(f"not a trajectory row: missing {', '.join(missing)} "
                                    "(expected one Trajectory.to_dict() per line)")
    _check_ints(row["completion_ids"], "completion_ids")
    _check_ints(row["loss_mask"], "loss_mask", allowed=frozenset((0, 1)))
    n = len(row["completion_ids"])
    if len(row["loss_mask"]) != n:
        raise _bad("loss_mask", f"{len(row['loss_mask'])} values, but completion_ids has {n}")
    if "prompt_ids" in row:
        _check_ints(row["prompt_ids"], "prompt_ids")
    lp = row.get("logprobs")
    if lp is not None:
        if not isinstance(lp, list) or not all(_is_num(x) for x in lp):
            raise _bad("logprobs", "expected null or a list of numbers")
        if len(lp) != n:
            raise _bad("logprobs", f"{len(lp)} values, but completion_ids has {n}")
    if not isinstance(row["turns"], list):
        raise _bad("turns", f"expected a list, got {_kind(row['turns'])}")
    for i, t in enumerate(row["turns"]):
        _check_turn(t, f"turns[{i}]")
    _check_image_table(row)
    for key in ("task", "reward_components", "drift"):
        _check_type(row, key, Mapping, "", "an object")
    if row.get("drift"):
        _check_drift(row["drift"])
    errs = row.get("errors", {})
    if not isinstance(errs, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in errs.items()):
        raise _bad("errors", "expected an object of strings")
    for key in ("outcome_reward", "reward"):
        if key in row and not _is_num(row[key]):
            raise _bad(key, f"expected a number, got {_kind(row[key])}")
    for key in ("terminated", "truncated"):
        _check_type(row, key, bool, "", "a boolean")
    msgs = row.get("messages", [])
    if not isinstance(msgs, list):
        raise _bad("messages", f"expected a list, got {_kind(msgs)}")
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            raise _bad(f"messages[{i}]", f"expected an object, got {_kind(m)}")


def _call(d: Mapping[str, Any]) -> ToolCall:
    return ToolCall(name=d.get("name", ""), arguments=dict(d.get("arguments") or {}), raw=d.get("raw", ""),
                    id=d.get("id", ""), parse_error=d.get("parse_error"))


def _result(d: Mapping[str, Any], table: Mapping[str, Image] | None = None) -> ToolResult:
    kind = d.get("error_kind")
    images = [table[ref["sha256"]] for ref in d.get("images") or []] if table is not None else []
    return ToolResult(call=_call(d.get("call") or {}), content=d.get("content", ""),
                      error_kind=ToolErrorKind(kind) if kind is not None else None,
                      latency_s=float(d.get("latency_s", 0.0)), attempts=int(d.get("attempts", 0)),
                      cached=bool(d.get("cached", False)), images=images)


def _turn(d: Mapping[str, Any], position: int, table: Mapping[str, Image] | None = None) -> Turn:
    a0, a1 = d.get("action_span", [0, 0])
    o0, o1 = d.get("obs_span", [0, 0])
    return Turn(index=d.get("index", position), action_start=a0, action_end=a1, obs_start=o0, obs_end=o1,
                text=d.get("text", ""), content=d.get("content", ""), reasoning=d.get("reasoning", ""),
                calls=[_call(c) for c in d.get("calls", [])], results=[_result(r, table) for r in d.get("results", [])],
                cut=d.get("cut", False), reward=float(d.get("reward", 0.0)),
                reward_components=dict(d.get("reward_components") or {}),
                env_checks=dict(d.get("env_checks") or {}),
                obs_images=[table[ref["sha256"]] for ref in d.get("images") or []] if table is not None else [])


# ---------------------------------------------------------------------------------------------------------------
# Trajectory files and summaries
# ---------------------------------------------------------------------------------------------------------------


def write_trajectories(
    path: str | os.PathLike[str], trajectories: Iterable[Trajectory | Mapping[str, Any]], *, append: bool = False
) -> Path:
    """Write trajectories as JSONL, one :meth:`Trajectory.to_dict` (or a row dict, written as given) per line;
    returns the path.

    ``append=False`` replaces ``path`` atomically (the rows go to a temporary file that is renamed into place:
    an existing file is never emptied or half-written); ``append=True`` adds the rows at the end with one write,
    leaving the existing lines untouched. See :func:`toolgym.jsonl.write_jsonl`.
    """
    rows = (t.to_dict() if isinstance(t, Trajectory) else t for t in trajectories)
    return write_jsonl(path, rows, append=append)


def read_trajectories(
    path: str | os.PathLike[str], *, on_cut_tail: Callable[[int, str], None] | None = None
) -> list[dict[str, Any]]:
    """The rows of a trajectory JSONL file (one :meth:`Trajectory.to_dict` per line, blank lines skipped), each
    validated with :func:`check_trajectory_row`; rows are returned as dicts, unknown keys kept (use
    :meth:`Trajectory.from_dict` for objects). The one reader of trajectory files (viewer, plots, trainers).

    ``on_cut_tail(line, message)``: accept a file whose last row was cut mid-write (see
    :func:`toolgym.jsonl.iter_jsonl`): the whole rows are returned and the cut one is reported to it.

    Raises:
        FileNotFoundError / PermissionError / IsADirectoryError: the file cannot be opened.
        TrajectoryFileError: a line is not JSON, not an object, or not a valid trajectory row; the message is
            ``path:line: field: what is wrong``.
    """
    p = Path(path)
    rows: list[dict[str, Any]] = []
    for lineno, row in iter_jsonl(p, error=TrajectoryFileError, on_cut_tail=on_cut_tail):
        try:
            check_trajectory_row(row)
        except TrajectoryFormatError as e:
            raise TrajectoryFileError(f"{p}:{lineno}: {e}") from None
        rows.append(row)
    return rows


def summarize(trajectories: Sequence[Trajectory], *, success_threshold: float = 1.0) -> dict[str, Any]:
    """Aggregate metrics: mean reward, success rate (``outcome_reward >= success_threshold``), tool-call rate
    (fraction of episodes with at least one call), calls per episode, tool error counts by kind, episode error
    counts by kind (``Trajectory.errors``: faults that are not the model's), mean turns, and the fraction of episodes
    that ended truncated."""
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    errors: dict[str, int] = {}
    episode_errors: dict[str, int] = {}
    for t in trajectories:
        for k in t.error_kinds:
            errors[k] = errors.get(k, 0) + 1
        for k in t.errors:
            episode_errors[k] = episode_errors.get(k, 0) + 1
    return {
        "episodes": n,
        "reward": float(np.mean([t.reward for t in trajectories])),
        "success": float(np.mean([t.outcome_reward >= success_threshold for t in trajectories])),
        "tool_call_rate": float(np.mean([t.num_tool_calls > 0 for t in trajectories])),
        "calls_per_episode": float(np.mean([t.num_tool_calls for t in trajectories])),
        "errors": errors,
        "episode_errors": episode_errors,
        "turns": float(np.mean([len(t.turns) for t in trajectories])),
        "truncated": float(np.mean([t.truncated for t in trajectories])),
    }
