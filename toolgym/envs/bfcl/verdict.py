"""BFCL's verdicts for toolgym episodes, from BFCL's own checkers (the ``bfcl-eval`` package).

* :func:`ast_verdict`: ``bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker`` on the episode's calls (tool names
  mapped back to BFCL's dotted names, arguments as decoded), with the decoder rules of BFCL's AST runner in front
  (a call that could not be parsed: ``ast_decoder:decoder_failed``; no call: ``ast_decoder:decoder_wrong_output_format``).
* :func:`irrelevance_verdict`: BFCL's relevance runner rule for the irrelevance categories: valid exactly when no
  call was decoded (``irrelevance_error:decoder_success`` otherwise).
* :func:`multi_turn_verdict`: ``multi_turn_checker`` on the calls the episode ran, per turn and step, as BFCL's
  multi-turn runner calls it (fewer turns than the entry has: ``multi_turn:force_terminated``). The checker runs every
  call through BFCL's executor, which caches instances in module globals under the model name and ``eval``s the
  call strings: every check here gets its own model name (a fresh UUID, its globals removed afterwards), and the
  strings are those :func:`toolgym.envs.bfcl.simulators.call_string` wrote for checked calls, never the model's text.
* :func:`turn_verdict`: BFCL's per-turn state and response checks (``state_checker``, ``response_checker``) for one
  turn of a running episode: the multi-turn process reward (the env runs it where the simulators live and records
  it on the trajectory).
* :class:`BFCLReward`: the env's reward, a :class:`~toolgym.rewards.base.Reward` like any other: it reads the
  trajectory and the task row only (the calls as the env recorded them, the per-turn checks) and computes the
  verdict; BFCL's checkers run in a worker thread, one at a time, off the event loop.

A verdict is ``{"valid": bool, "error_type": str | None, "error": str}``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import types
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from toolgym.envs.bfcl.simulators import call_string
from toolgym.rewards.base import Reward, Score
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import Trajectory, Turn

__all__ = ["TURN_CHECKS", "BFCLReward", "ast_verdict", "checker_model_name", "install_model_config_standin",
           "irrelevance_verdict", "multi_turn_verdict", "ran_calls", "turn_verdict", "user_turns"]

_lock = threading.Lock()
_checking = threading.Lock()  # BFCL's checkers run one at a time (as they did on one loop), off the loop

#: the task-row key under which the env records BFCL's check of each finished user turn
TURN_CHECKS = "bfcl_turn_checks"
#: the result kinds of calls that ran on the simulators (an ``exception`` is the simulator's error message)
_RAN = (None, ToolErrorKind.EXCEPTION)


#: the model name toolgym passes to BFCL's checkers (the stand-in mapping answers for any name)
CHECKER_MODEL = "toolgym"


class _AnyModelConfig(Mapping[str, Any]):
    """``MODEL_CONFIG_MAPPING`` stand-in: every model name has ``underscore_to_dot=False``."""

    _entry = types.SimpleNamespace(underscore_to_dot=False)

    def __getitem__(self, key: str) -> Any:
        return self._entry

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def install_model_config_standin() -> None:
    """Put the stand-in ``bfcl_eval.constants.model_config`` module into ``sys.modules`` unless the real one is
    already imported (then the real one stays: a process that imported BFCL's handlers keeps them)."""
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    mod = types.ModuleType(name, "toolgym's stand-in: MODEL_CONFIG_MAPPING answers underscore_to_dot=False for any "
                                 "model (toolgym maps tool names back to BFCL's before checking)")
    mod.MODEL_CONFIG_MAPPING = _AnyModelConfig()  # type: ignore[attr-defined]
    mod.__toolgym_standin__ = True  # type: ignore[attr-defined]
    sys.modules[name] = mod


def checker_model_name() -> str:
    """The model name to pass to BFCL's AST checker: any name under the stand-in; under BFCL's real mapping (a
    process that imported its handlers first) one of its models whose entry says ``underscore_to_dot=False``."""
    mod = sys.modules.get("bfcl_eval.constants.model_config")
    if mod is None or getattr(mod, "__toolgym_standin__", False):
        return CHECKER_MODEL
    for key, cfg in mod.MODEL_CONFIG_MAPPING.items():
        if not getattr(cfg, "underscore_to_dot", True):
            return key.replace("/", "_")
    raise RuntimeError("BFCL's MODEL_CONFIG_MAPPING has no model with underscore_to_dot=False")


def _verdict(result: Mapping[str, Any]) -> dict[str, Any]:
    valid = bool(result.get("valid"))
    err = result.get("error", result.get("error_message", ""))
    if isinstance(err, list):
        err = "; ".join(str(e) for e in err)
    return {"valid": valid, "error_type": None if valid else str(result.get("error_type", "unknown")),
            "error": "" if valid else str(err)[:2000]}


def _language(category: str) -> Any:
    from bfcl_eval.constants.enums import Language

    if category == "simple_java":
        return Language.JAVA
    if category == "simple_javascript":
        return Language.JAVASCRIPT
    return Language.PYTHON


def ast_verdict(row: Mapping[str, Any], calls: Sequence[tuple[str, Any]], parse_failed: bool = False) -> dict[str, Any]:
    """BFCL's AST verdict for one single-turn answer.

    Args:
        row: the task row (:func:`toolgym.envs.bfcl.data.load_category`): ``functions``, ``ground_truth``, ``name_map``,
            ``category``.
        calls: the decoded calls, ``(tool name, arguments)`` in the order written (tool names as shown to the
            model; mapped back to BFCL's names here).
        parse_failed: a call of the answer could not be parsed (BFCL's decoder fails on the whole answer).
    """
    if parse_failed:
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "error": "a call could not be parsed"}
    if not calls:
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format", "error": "no function call"}
    install_model_config_standin()
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    names = row.get("name_map", {})
    output = [{names.get(n, n): dict(a) if isinstance(a, Mapping) else a} for n, a in calls]
    try:
        result = ast_checker(row["functions"], output, row["ground_truth"], _language(row["category"]),
                             row["category"], checker_model_name())
    except Exception as e:  # noqa: BLE001 - an answer BFCL's checker cannot read is an invalid answer
        return {"valid": False, "error_type": "ast_checker:exception", "error": f"{type(e).__name__}: {e}"}
    return _verdict(result)


def irrelevance_verdict(n_decoded_calls: int) -> dict[str, Any]:
    """Valid exactly when no call was decoded (BFCL's relevance runner for the irrelevance categories)."""
    if n_decoded_calls == 0:
        return {"valid": True, "error_type": None, "error": ""}
    return {"valid": False, "error_type": "irrelevance_error:decoder_success",
            "error": "Valid syntax. Successfully decode AST when it should not."}


def multi_turn_verdict(row: Mapping[str, Any], decoded: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """BFCL's multi-turn verdict.

    Args:
        row: the task row (``id``, ``initial_config``, ``involved_classes``, ``ground_truth``, ``category``).
        decoded: per user turn, per step with calls, the call strings of that step (checked calls only, written by
            :func:`~toolgym.envs.bfcl.simulators.call_string`). Fewer turns than the entry has = the episode stopped early.
    """
    truth = row["ground_truth"]
    if len(decoded) != len(truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error": f"the episode ran {len(decoded)} of {len(truth)} turns"}
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    model = f"toolgym_{uuid.uuid4().hex}"  # this check's own key in BFCL's instance cache
    entry = {"id": row["id"], "initial_config": row["initial_config"], "involved_classes": row["involved_classes"]}
    steps = [[list(s) for s in turn if s] for turn in decoded]
    try:
        result = multi_turn_checker(steps, [list(t) for t in truth], entry, row["category"], model)
    except Exception as e:  # noqa: BLE001
        result = {"valid": False, "error_type": "multi_turn:checker_exception", "error_message": f"{type(e).__name__}: {e}"}
    finally:
        prefix = re.sub(r"[-./:]", "_", model) + "_"
        with _lock:
            for key in [k for k in list(vars(multi_turn_utils)) if k.startswith(prefix)]:
                vars(multi_turn_utils).pop(key, None)
    return _verdict(result)


def turn_verdict(model_instances: Mapping[str, Any], truth_instances: Mapping[str, Any],
                 model_results: Sequence[str], truth_results: Sequence[str], turn_index: int,
                 model_called: bool) -> dict[str, Any]:
    """BFCL's checks of one turn with a non-empty ground truth: the model made a call this turn
    (``multi_turn:empty_turn_model_response``), the instances' states match (``state_checker``), and the ground
    truth's results of this turn are among the model's results so far (``response_checker``)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    if not model_called:
        return {"valid": False, "error_type": "multi_turn:empty_turn_model_response",
                "error": f"Model response list is empty for turn {turn_index}"}
    res = state_checker(dict(model_instances), dict(truth_instances))
    if res["valid"]:
        res = response_checker(list(model_results), list(truth_results), turn_index)
    return _verdict(res)


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
    """

    name = "bfcl"

    def __init__(self, step_limit: int = 20, per_turn: bool = True) -> None:
        self.step_limit = int(step_limit)
        self.per_turn = bool(per_turn)

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
                v = await asyncio.to_thread(_check, multi_turn_verdict, task, decoded)
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
