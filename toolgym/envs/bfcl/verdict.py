"""BFCL's verdict as the reward of ``toolgym/BFCL-v0``: :class:`BFCLReward`, a :class:`~toolgym.rewards.base.Reward`
like every other env's. It reads the trajectory and the task row only: the calls the trajectory's results say ran
(:func:`ran_calls`, :func:`user_turns`) and, for the multi-turn process reward, the per-turn checks the env wrote on
the turns that closed a user turn (``Turn.env_checks["bfcl"]``, a :class:`TurnCheck`), and asks BFCL's checkers
(:mod:`toolgym.envs.bfcl.checkers`) for the verdict: the AST checker in a worker thread, the multi-turn checker
(which runs the episode's calls again on fresh simulators) in a worker process under
:class:`~toolgym.envs.bfcl.worker.SimulatorWorker`'s bounds, never on the event loop.

Optional partial credit for single-turn AST entries (:func:`partial_weights`, :func:`partial_terms`): small terms for
calls that parse, name the entry's functions and use its parameters, beside the exact verdict (docs/bfcl.md).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from toolgym.envs.bfcl.checkers import ast_verdict, irrelevance_verdict
from toolgym.envs.bfcl.simulators import call_string
from toolgym.envs.bfcl.worker import SimulatorWorker
from toolgym.rewards.base import Reward, Score
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.trajectory import Trajectory, Turn

__all__ = ["CHECK_KEY", "DEFAULT_PARTIAL", "PARTIAL_TERMS", "BFCLReward", "TurnCheck", "closes_user_turn", "partial_terms", "partial_weights",
           "ran_calls", "user_turns"]

_checking = threading.Lock()  # BFCL's AST checker runs one call at a time (its modules hold globals)

#: the ``Turn.env_checks`` key under which the env writes BFCL's check of the user turn a turn closed
CHECK_KEY = "bfcl"
#: the result kinds of calls that ran on the simulators (an ``exception`` is the simulator's error message)
_RAN = (None, ToolErrorKind.EXCEPTION)
#: the partial-credit terms: component name (``reward_components``) of each weight key
PARTIAL_TERMS = {"parse": "bfcl_parse", "names": "bfcl_names", "keys": "bfcl_keys"}
#: the weights ``partial_credit=True`` gives: together 0.3, less than the 1.0 of one correct answer
DEFAULT_PARTIAL = {"parse": 0.1, "names": 0.1, "keys": 0.1}


class TurnCheck(TypedDict):
    """BFCL's check of one finished user turn with a non-empty ground truth, as the env hands it to the reward:
    ``Turn.env_checks["bfcl"]`` on the assistant turn that closed the user turn (a turn without a parsed call).

    Keys: ``user_turn`` (0-based user turn), ``valid`` (BFCL's state and response checks passed), ``error_type``
    (``None`` when valid, else BFCL's, e.g. ``multi_turn:instance_state_mismatch``), ``error`` (BFCL's message).
    """

    user_turn: int
    valid: bool
    error_type: str | None
    error: str


def partial_weights(spec: bool | Mapping[str, float] | None) -> dict[str, float]:
    """The partial-credit weights of a ``partial_credit`` option: ``False`` / ``None`` -> ``{}`` (BFCL's binary
    verdict only); ``True`` -> :data:`DEFAULT_PARTIAL`; a mapping of some of ``parse``, ``names``, ``keys`` to
    weights (a term left out earns nothing).

    Raises:
        ValueError: an unknown term, a weight that is negative or not finite, or weights that add up to 1 or more
            (the exact verdict must dominate: all terms together earn less than one correct answer).
    """
    if spec is None or spec is False:
        return {}
    if spec is True:
        return dict(DEFAULT_PARTIAL)
    if not isinstance(spec, Mapping):
        raise ValueError(f"partial_credit must be a bool or a mapping of {sorted(PARTIAL_TERMS)} to weights, "
                         f"got {spec!r}")
    unknown = sorted(set(spec) - set(PARTIAL_TERMS))
    if unknown:
        raise ValueError(f"partial_credit: unknown term(s) {unknown}; the terms are {sorted(PARTIAL_TERMS)}")
    weights = {}
    for k, w in spec.items():
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ValueError(f"partial_credit: the weight of {k!r} must be a finite number >= 0, got {w!r}")
        weights[k] = float(w)
    if sum(weights.values()) >= 1.0:
        raise ValueError(f"partial_credit: the weights add up to {sum(weights.values()):g}; they must add up to less "
                         "than 1 so that one correct answer (1.0) earns more than every partial term together")
    return weights


def partial_terms(task: Mapping[str, Any], calls: Sequence[ToolCall]) -> dict[str, float]:
    """The partial-credit terms (0.0 or 1.0 each, under their component names) of a single-turn AST answer whose
    calls are ``calls`` (the last turn's, as parsed):

    * ``bfcl_parse``: the answer made at least one call and every call parsed (a call whose JSON lacks its closing
      braces does not);
    * ``bfcl_names``: at least one call parsed and every parsed call names one of the entry's functions (as shown to
      the model; ``"function"`` is not one);
    * ``bfcl_keys``: ``bfcl_names`` holds and every parsed call's argument keys are parameters of its function, with
      every required parameter present (values are not looked at: that is the exact verdict's job).
    """
    good = [c for c in calls if c.parse_error is None]
    names = task.get("name_map", {})
    docs = {f["name"]: f.get("parameters") or {} for f in task["functions"]}
    named = bool(good) and all(names.get(c.name, c.name) in docs for c in good)
    keyed = named and all(_keys_fit(docs[names.get(c.name, c.name)], c.arguments) for c in good)
    return {"bfcl_parse": float(bool(calls) and len(good) == len(calls)), "bfcl_names": float(named),
            "bfcl_keys": float(keyed)}


def _keys_fit(schema: Mapping[str, Any], arguments: Any) -> bool:
    if not isinstance(arguments, Mapping):
        return False
    props = schema.get("properties") or {}
    return set(arguments) <= set(props) and set(schema.get("required") or []) <= set(arguments)


def ran_calls(turn: Turn) -> list[str]:
    """The call strings (:func:`~toolgym.envs.bfcl.simulators.call_string`) of the calls of ``turn`` that ran on the
    simulators, in order: a call rejected before running (``parse_error``, ``unknown_tool``, ``invalid_arguments``)
    or stopped by its timeout (``timeout``: the simulators' state is as if it never ran) is left out."""
    return [call_string(r.call.name, r.call.arguments) for r in turn.results
            if r.call.parse_error is None and r.error_kind in _RAN]


def closes_user_turn(turn: Turn) -> bool:
    """A multi-turn episode's turn without a parsed call ends its user turn (the env answers with the next one)."""
    return not any(c.parse_error is None for c in turn.calls)


def user_turns(turns: Sequence[Turn], step_limit: int) -> tuple[list[list[list[str]]], int | None]:
    """A multi-turn episode's calls as BFCL's checker reads them: per finished user turn, per step with calls run,
    the call strings; a turn whose calls all failed to parse ends the user turn. Also the user turn in which the
    episode made more than ``step_limit`` steps (BFCL's force-quit), else ``None``."""
    decoded: list[list[list[str]]] = []
    steps: list[list[str]] = []
    n_steps = 0
    for turn in turns:
        if closes_user_turn(turn):
            decoded.append(steps)
            steps, n_steps = [], 0
            continue
        step = ran_calls(turn)
        if step:
            steps.append(step)
        n_steps += 1
        if n_steps > step_limit:
            return decoded, len(decoded)
    return decoded, None


def _check(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    with _checking:
        return fn(*args, **kwargs)


class BFCLReward(Reward):
    """BFCL's verdict as the reward of ``toolgym/BFCL-v0``.

    Outcome: 1.0 exactly when BFCL's checker says the episode is valid (component ``bfcl_valid``); the verdict
    (``valid``, ``error_type``, ``error``, ``truncated``, ``category``, ``id``; multi-turn also ``turn_passes``) is
    stored as ``trajectory.task["bfcl"]``. With ``partial_credit``, a single-turn AST entry also earns
    ``sum(weight * term)`` of :func:`partial_terms` (components ``bfcl_parse``, ``bfcl_names``, ``bfcl_keys``, each
    0/1 and unweighted); irrelevance and multi-turn entries keep their rules (no partial credit). Process
    (multi-turn): the turn that closes a user turn with a non-empty ground truth earns ``1 / (number of such
    turns)`` when BFCL's state and response checks passed for it (component ``bfcl_turn_pass``), read from the
    :class:`TurnCheck` the env wrote on that turn (``Turn.env_checks["bfcl"]``); a closing turn without one (an
    episode that did not run in ``toolgym/BFCL-v0``) is an error, never a silent 0.

    Args:
        step_limit: steps with calls allowed per user turn (BFCL's 20; the env's ``step_limit``).
        per_turn: give the process reward (the env sets it when it serves a multi-turn category).
        partial_credit: ``False`` (default: BFCL's binary verdict), ``True`` (:data:`DEFAULT_PARTIAL`, 0.1 per
            term) or ``{"parse": w, "names": w, "keys": w}`` (:func:`partial_weights`: weights adding up to < 1).
        checker: the process where BFCL's multi-turn checker runs (one verdict at a time; killed when a verdict
            outruns the reward's time limit, started again by the next). ``None``: the reward starts one of its
            own on its first multi-turn verdict and owns it (:meth:`close`); the env passes its own worker.

    Attributes:
        weights: the partial-credit weights (``{}`` when off).
    """

    name = "bfcl"

    def __init__(self, step_limit: int = 20, per_turn: bool = True,
                 partial_credit: bool | Mapping[str, float] = False, checker: SimulatorWorker | None = None) -> None:
        self.step_limit = int(step_limit)
        self.per_turn = bool(per_turn)
        self.weights = partial_weights(partial_credit)
        self.owns_checker = checker is None
        self.checker = checker if checker is not None else SimulatorWorker()

    def close(self) -> None:
        """Stop the checker process when this reward owns it (it is also stopped when the reward is collected and
        at exit)."""
        if self.owns_checker:
            self.checker.close()

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        v = await self.verdict(trajectory, task)
        value, comps = (1.0 if v["valid"] else 0.0), {"bfcl_valid": float(v["valid"])}
        if self.weights and task["kind"] == "ast":
            terms = partial_terms(task, trajectory.turns[-1].calls if trajectory.turns else [])
            value += sum(w * terms[PARTIAL_TERMS[k]] for k, w in self.weights.items())
            comps.update(terms)
        return Score(value, comps)

    async def verdict(self, trajectory: Trajectory, task: Mapping[str, Any]) -> dict[str, Any]:
        """BFCL's verdict on the finished episode (also stored as ``trajectory.task["bfcl"]``)."""
        kind = _kind(task)
        if kind == "multi_turn":
            decoded, quit_turn = user_turns(trajectory.turns, self.step_limit)
            if quit_turn is not None:
                v = {"valid": False, "error_type": "multi_turn:force_terminated",
                     "error": f"more than {self.step_limit} steps in turn {quit_turn}"}
            else:
                v = await self.checker.multi_turn_verdict(task, decoded)
        else:
            calls = trajectory.turns[-1].calls if trajectory.turns else []
            good = [c for c in calls if c.parse_error is None]
            if kind == "irrelevance":
                v = irrelevance_verdict(len(good))
            else:
                names = task["name_map"]
                v = await asyncio.to_thread(_check, ast_verdict, task, [(names.get(c.name, c.name), c.arguments)
                                                                        for c in good], len(good) < len(calls))
        cut = trajectory.truncated or any(t.cut for t in trajectory.turns)
        v = {**v, "truncated": bool(cut), "category": task["category"], "id": task.get("id")}
        if kind == "multi_turn":
            v["turn_passes"] = [bool(t.env_checks[CHECK_KEY]["valid"]) for t in trajectory.turns
                                if CHECK_KEY in t.env_checks]
        trajectory.task["bfcl"] = v
        return v

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if _kind(task) != "multi_turn" or not closes_user_turn(turn):
            return Score(0.0, {})
        k = sum(1 for t in trajectory.turns[: turn.index] if closes_user_turn(t))  # the user turn it closes
        truths = task["ground_truth"]
        if k >= len(truths) or not truths[k]:
            return Score(0.0, {})
        check = turn.env_checks.get(CHECK_KEY)
        if check is None:
            raise ValueError(f"BFCLReward: turn {turn.index} closes user turn {k} of BFCL entry {task.get('id')!r} "
                             "but carries no BFCL check (Turn.env_checks['bfcl']); the per-turn reward needs the "
                             "checks toolgym/BFCL-v0 writes while it runs the episode")
        n = sum(1 for t in truths if t)
        return Score(1.0 / n if check["valid"] else 0.0, {"bfcl_turn_pass": float(check["valid"])})


def _kind(task: Mapping[str, Any]) -> str:
    kind = task.get("kind")
    if kind not in ("ast", "irrelevance", "multi_turn"):
        raise ValueError(f"BFCLReward scores BFCL entries (toolgym/BFCL-v0's rows, whose 'kind' is ast, irrelevance "
                         f"or multi_turn); task {task.get('id')!r} has kind {kind!r}")
    return str(kind)
