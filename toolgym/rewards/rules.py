"""Rule-based rewards: exact match, token F1, numeric match with tolerance, and format rewards.

Each rule exists twice:

* a plain function ``fn(prediction, golds) -> float`` in ``[0, 1]`` (``golds``: one gold or a list; the score is
  the best over all golds, as in SQuAD / Search-R1 evaluation), and
* a :class:`~toolgym.rewards.base.Reward` class that reads the prediction from ``trajectory.answer`` (the content
  of the last ``<answer>...</answer>``) and the golds from a task field (``field=``, default
  ``"golden_answers"``, Search-R1's name).

Text normalisation is SQuAD's: lower case, drop punctuation, drop the articles *a / an / the*, collapse
whitespace. Format rewards: :func:`answer_format` (one well-formed, non-empty ``<answer>`` block) and the
per-turn process reward :class:`ToolCallFormat` (well-formed calls that ran get a bonus, failed calls a penalty
by error kind).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any

from toolgym.rewards.base import Reward, Score
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import Trajectory, Turn

__all__ = [
    "F1",
    "AnswerFormat",
    "ExactMatch",
    "NumericMatch",
    "RuleReward",
    "ToolCallFormat",
    "answer_format",
    "exact_match",
    "exact_number",
    "f1_score",
    "normalize_answer",
    "numeric_match",
    "parse_exact_number",
    "parse_number",
]

Golds = Any  # a str / number, or an iterable of them; None = no gold

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, remove punctuation, remove articles, collapse whitespace."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _gold_list(golds: Golds) -> list[Any]:
    """Golds as a list: ``None`` -> ``[]``, a scalar / str -> ``[it]``, an iterable -> list (numpy arrays too)."""
    if golds is None:
        return []
    if isinstance(golds, (str, bytes, int, float, Fraction)):
        return [golds]
    if hasattr(golds, "tolist"):  # numpy arrays / scalars (HF datasets hand these out)
        out = golds.tolist()
        return out if isinstance(out, list) else [out]
    if isinstance(golds, Iterable):
        return list(golds)
    return [golds]


def exact_match(prediction: str, golds: Golds) -> float:
    """1.0 when the normalised prediction equals any normalised gold, else 0.0 (0.0 with no golds)."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(str(g)) for g in _gold_list(golds)))


def _f1_one(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD v2: an empty side scores 1 only when both are empty
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Golds) -> float:
    """Token-level F1 (bag of normalised words) against the best gold, in ``[0, 1]`` (0.0 with no golds)."""
    pred = normalize_answer(prediction).split()
    return max((_f1_one(pred, normalize_answer(str(g)).split()) for g in _gold_list(golds)), default=0.0)


_NUMBER = re.compile(
    r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+−]?\.\d+(?:[eE][-+]?\d+)?"
)


def _to_float(token: str) -> float | None:
    token = token.replace("−", "-").replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            d = float(den)
            return float(num) / d if d != 0 else None
        return float(token)
    except ValueError:
        return None


def parse_number(text: Any) -> float | None:
    """The number a text states, or ``None``.

    Numbers (ints, floats, bools excluded) pass through. For text: the whole text when it is one number (after
    stripping ``$``, ``%``, thousands separators, surrounding ``\\boxed{}``/spaces), else the **last** number in
    it (GSM8K convention: "... so the answer is 42"). Fractions ``3/4`` give 0.75; ``50%`` gives 50 (the
    percent sign is dropped, not divided). Non-finite values give ``None``.
    """
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, (int, float, Fraction)):
        value = float(text)
        return value if math.isfinite(value) else None
    s = str(text).strip()
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", s)
    if boxed:
        s = boxed[-1]
    found = _NUMBER.findall(s)
    if not found:
        return None
    value = _to_float(found[-1])
    return value if value is not None and math.isfinite(value) else None


def parse_exact_number(text: Any) -> Fraction | None:
    """The number ``text`` is, exactly (a ``Fraction``), or ``None``: the whole text must be one number, with
    thousands separators (``,``, spaces) and a trailing period allowed (``12,345``, ``-7``, ``3.50``, ``1e3``).
    Stricter than :func:`parse_number`, which finds the last number in a text."""
    if isinstance(text, bool) or text is None:
        return None
    if isinstance(text, int | Fraction):
        return Fraction(text)
    s = str(text).strip().replace(",", "").replace(" ", "").rstrip(".")
    if not s:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def exact_number(prediction: Any, golds: Golds) -> float:
    """1.0 when ``prediction`` is exactly one number (:func:`parse_exact_number`) equal to a gold number, with no
    tolerance (``0.1 + 0.2`` is not ``0.3`` unless written so), else 0.0."""
    pred = parse_exact_number(prediction)
    if pred is None:
        return 0.0
    return float(any(parse_exact_number(g) == pred for g in _gold_list(golds)))


def numeric_match(prediction: Any, golds: Golds, *, abs_tol: float = 1e-6, rel_tol: float = 1e-4) -> float:
    """1.0 when the number in ``prediction`` is within tolerance of any gold number, else 0.0.

    Within tolerance means ``math.isclose(pred, gold, rel_tol=rel_tol, abs_tol=abs_tol)``: ``|p - g| <=
    max(rel_tol * max(|p|, |g|), abs_tol)``. A prediction or gold without a number never matches. The exact check
    (the whole answer one number, equal exactly) is :func:`exact_number` (``NumericMatch(exact=True)``).
    """
    pred = parse_number(prediction)
    if pred is None:
        return 0.0
    for g in _gold_list(golds):
        gold = parse_number(g)
        if gold is not None and math.isclose(pred, gold, rel_tol=rel_tol, abs_tol=abs_tol):
            return 1.0
    return 0.0


_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def answer_format(prediction: str, golds: Golds = None) -> float:
    """1.0 when ``prediction`` (the raw final text, tags included) holds exactly one ``<answer>...</answer>``
    block with non-empty content and no stray ``<answer>``/``</answer>`` tag; else 0.0. ``golds`` is ignored
    (the signature matches the other rules)."""
    blocks = _ANSWER_BLOCK.findall(prediction)
    if len(blocks) != 1 or not blocks[0].strip():
        return 0.0
    return float(prediction.count("<answer>") == 1 and prediction.count("</answer>") == 1)


class RuleReward(Reward):
    """An outcome reward from a rule ``fn(prediction, golds) -> float``.

    Args:
        fn: the rule.
        field: the task key holding the gold(s) (a str/number or a list of them).
        name: the component name.
        prediction: how to read the prediction from a trajectory (default ``trajectory.answer``).
        missing_gold: the score when the task has no such field (default 0.0; the component
            ``<name>/missing_gold`` is set to 1.0 so it is visible in metrics).
    """

    def __init__(
        self,
        fn: Callable[[Any, Golds], float],
        field: str = "golden_answers",
        *,
        name: str | None = None,
        prediction: Callable[[Trajectory], Any] | None = None,
        missing_gold: float = 0.0,
    ) -> None:
        self.fn = fn
        self.field = field
        self.name = name or getattr(fn, "__name__", "rule")
        self.prediction = prediction or (lambda t: t.answer)
        self.missing_gold = missing_gold

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if self.field not in task:
            return Score(float(self.missing_gold), {f"{self.name}/missing_gold": 1.0})
        return Score(float(self.fn(self.prediction(trajectory), task[self.field])))


class ExactMatch(RuleReward):
    """SQuAD exact match of ``trajectory.answer`` against ``task[field]`` (best over golds)."""

    def __init__(self, field: str = "golden_answers", *, name: str = "exact_match", **kw: Any) -> None:
        super().__init__(exact_match, field, name=name, **kw)


class F1(RuleReward):
    """SQuAD token F1 of ``trajectory.answer`` against ``task[field]`` (best over golds)."""

    def __init__(self, field: str = "golden_answers", *, name: str = "f1", **kw: Any) -> None:
        super().__init__(f1_score, field, name=name, **kw)


class NumericMatch(RuleReward):
    """1.0 when the number in ``trajectory.answer`` is within ``abs_tol``/``rel_tol`` of a gold number
    (:func:`numeric_match`); with ``exact=True``, when the answer is exactly one number equal to a gold
    (:func:`exact_number`: Calculator-v0's reward; the tolerances are then unused)."""

    def __init__(
        self,
        field: str = "answer",
        *,
        abs_tol: float = 1e-6,
        rel_tol: float = 1e-4,
        exact: bool = False,
        name: str | None = None,
        **kw: Any,
    ) -> None:
        self.abs_tol, self.rel_tol, self.exact = abs_tol, rel_tol, exact
        default = "exact_number" if exact else "numeric_match"
        super().__init__(self._match, field, name=name or default, **kw)

    def _match(self, prediction: Any, golds: Golds) -> float:
        if self.exact:
            return exact_number(prediction, golds)
        return numeric_match(prediction, golds, abs_tol=self.abs_tol, rel_tol=self.rel_tol)


class AnswerFormat(Reward):
    """Outcome format reward: ``value`` when the final turn's raw text has one well-formed, non-empty
    ``<answer>`` block (:func:`answer_format`), else 0. Needs no gold."""

    def __init__(self, value: float = 1.0, *, name: str = "answer_format") -> None:
        self.value = value
        self.name = name

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        text = trajectory.turns[-1].text if trajectory.turns else ""
        return Score(float(self.value * answer_format(text)))


DEFAULT_ERROR_PENALTIES: dict[str, float] = {
    ToolErrorKind.PARSE_ERROR.value: -0.2,
    ToolErrorKind.UNKNOWN_TOOL.value: -0.2,
    ToolErrorKind.INVALID_ARGUMENTS.value: -0.1,
    ToolErrorKind.EXCEPTION.value: -0.05,
    ToolErrorKind.TIMEOUT.value: 0.0,  # usually the tool's fault, not the policy's
}


class ToolCallFormat(Reward):
    """Per-turn (process) reward for tool-call hygiene.

    A turn with calls scores ``ok`` when every call parsed and ran without error; otherwise the sum of
    ``penalties[kind]`` over its failed calls (defaults: :data:`DEFAULT_ERROR_PENALTIES`; a kind missing from
    the table costs ``default_penalty``). A turn without calls scores ``no_call`` (default 0). Components of
    a turn: ``tool_call_format/<kind>`` = the count of each error kind.
    """

    per_turn = True

    def __init__(
        self,
        ok: float = 0.1,
        penalties: Mapping[str, float] | None = None,
        *,
        no_call: float = 0.0,
        default_penalty: float = -0.1,
        name: str = "tool_call_format",
    ) -> None:
        self.ok = ok
        self.penalties = dict(DEFAULT_ERROR_PENALTIES if penalties is None else penalties)
        self.penalties = {getattr(k, "value", k): v for k, v in self.penalties.items()}
        self.no_call = no_call
        self.default_penalty = default_penalty
        self.name = name

    def score_turn(self, turn: Turn) -> tuple[float, dict[str, float]]:
        """The turn's score and its error-kind counts (a pure function of the turn)."""
        if not turn.calls:
            return self.no_call, {}
        kinds = turn.error_kinds
        # a call without a result (should not happen: invariant 3) counts as an exception
        kinds += [ToolErrorKind.EXCEPTION.value] * max(0, len(turn.calls) - len(turn.results))
        if not kinds:
            return self.ok, {}
        counts = Counter(kinds)
        score = sum(self.penalties.get(k, self.default_penalty) * n for k, n in counts.items())
        return score, {f"{self.name}/{k}": float(n) for k, n in counts.items()}

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        score, comps = self.score_turn(turn)
        return Score(float(score), comps)
