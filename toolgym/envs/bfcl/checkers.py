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
  turn of a running episode: the multi-turn process reward (run in the worker process, where the simulators live).

:mod:`toolgym.envs.bfcl.verdict` turns them into the env's reward.

A verdict is ``{"valid": bool, "error_type": str | None, "error": str}``.
"""

from __future__ import annotations

import re
import sys
import threading
import types
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ast_verdict", "checker_model_name", "install_model_config_standin", "irrelevance_verdict",
           "multi_turn_verdict", "turn_verdict"]

_lock = threading.Lock()


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
