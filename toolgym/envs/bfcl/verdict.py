"""BFCL's verdict as the reward of ``toolgym/BFCL-v0``: :class:`BFCLReward`, a :class:`~toolgym.rewards.base.Reward`
like every other env's. It reads the trajectory and the task row only: the calls the trajectory's results say ran
(:func:`ran_calls`, :func:`user_turns`) and the per-turn checks the env recorded under ``task[TURN_CHECKS]``, and
asks BFCL's checkers (:mod:`toolgym.envs.bfcl.checkers`) for the verdict: the AST checker in a worker thread, the
multi-turn checker (which runs the episode's calls again on fresh simulators) in a worker process under
:class:`~toolgym.envs.bfcl.worker.SimulatorWorker`'s bounds, never on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.envs.bfcl.checkers import ast_verdict, irrelevance_verdict
from toolgym.envs.bfcl.simulators import call_string
from toolgym.envs.bfcl.worker import SimulatorWorker
from toolgym.rewards.base import Reward, Score
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import Trajectory, Turn

__all__ = ["CHECKER", "TURN_CHECKS", "BFCLReward", "ran_calls", "user_turns"]

_checking = threading.Lock()  # BFCL's AST checker runs one call at a time (its modules hold globals)
#: the process where every BFCLReward's multi-turn verdicts run (one at a time), started by the first one
CHECKER = SimulatorWorker()

#: the task-row key under which the env records BFCL's check of each finished user turn
TURN_CHECKS = "bfcl_turn_checks"
#: the result kinds of calls that ran on the simulators (an ``exception`` is the simulator's error message)
_RAN = (None, ToolErrorKind.EXCEPTION)


def ran_calls(turn: Turn) -> list[str]:
    """The call strings (:func:`~toolgym.envs.bfcl.simulators.call_string`) of the calls of ``turn`` that ran on the
    simulators, in order: a call rejected before running (``parse_error``, ``unknown_tool``, ``invalid_arguments``)
    or stopped by its timeout (``timeout``: the simulators' state is as if it never ran) is left out."""
    return [call_string(r.call.name, r.call.arguments) for r in turn.results
            if r.call.parse_error is None and r.error_kind in _RAN]


def user_turns(turns: Sequence[Turn], step_limit: int) -> tuple[list[list[list[str]]], int | None]:
    """A multi-turn episode's calls as BFCL's checker reads them: per finished user turn, per step with calls run,
    the call strings; a turn whose calls all failed to parse ends the user turn. Also the user turn in which the
    episode made more than ``step_limit`` steps (BFCL's force-quit), else ``None``."""
    decoded: list[list[list[str]]] = []
    steps: list[list[str]] = []
    n_steps = 0
    for turn in turns:
        if not any(c.parse_error is None for c in turn.calls):
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
    stored as ``trajectory.task["bfcl"]``. Process (multi-turn): each user turn with a non-empty ground truth earns
    ``1 / (number of such turns)`` when BFCL's state and response checks passed for it (component
    ``bfcl_turn_pass``), read from the checks the env recorded under ``task[TURN_CHECKS]``.

    Args:
        step_limit: steps with calls allowed per user turn (BFCL's 20; the env's ``step_limit``).
        per_turn: give the process reward (the env sets it when it serves a multi-turn category).

    Attributes:
        checker: the process where BFCL's multi-turn checker runs (:data:`CHECKER`, shared: one verdict at a time;
            killed when a verdict outruns the reward's time limit, started again by the next).
    """

    name = "bfcl"

    def __init__(self, step_limit: int = 20, per_turn: bool = True) -> None:
        self.step_limit = int(step_limit)
        self.per_turn = bool(per_turn)
        self.checker = CHECKER

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        v = await self.verdict(trajectory, task)
        return Score(1.0 if v["valid"] else 0.0, {"bfcl_valid": float(v["valid"])})

    async def verdict(self, trajectory: Trajectory, task: Mapping[str, Any]) -> dict[str, Any]:
        """BFCL's verdict on the finished episode (also stored as ``trajectory.task["bfcl"]``)."""
        kind = task["kind"]
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
            v["turn_passes"] = [bool(c["valid"]) for c in task.get(TURN_CHECKS, [])]
        trajectory.task["bfcl"] = v
        return v

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        check = next((c for c in task.get(TURN_CHECKS, []) if c["turn"] == turn.index), None)
        if check is None:
            return Score(0.0, {})
        n = sum(1 for t in task.get("ground_truth", []) if t)
        share = 1.0 / n if n else 0.0
        return Score(share if check["valid"] else 0.0, {"bfcl_turn_pass": float(check["valid"])})
