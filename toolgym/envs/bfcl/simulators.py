"""BFCL's multi-turn API simulators (GorillaFileSystem, TwitterAPI, MessageAPI, TicketAPI, TradingBot, TravelAPI,
VehicleControlAPI, MathAPI), run safely: one fresh set of instances per episode, methods called directly.
The instances live in a worker process (:mod:`toolgym.envs.bfcl.worker`), where a slow call can be stopped.

BFCL's own executor (``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils.execute_multi_turn_func_call``)
keeps its instances in module globals keyed by model name and entry id (two episodes of one entry would share
state) and ``eval``s call strings whose function name and argument keys are not quoted. :class:`APISession` does
neither: it builds the classes from the entry's ``initial_config`` (deep-copied) for itself, checks that a call's
name is one of the entry's functions, that every argument key is an identifier and every value a JSON value, and
then calls the bound method with those keyword arguments. Its results are the strings BFCL's executor produces
(a ``str`` as is, a ``dict`` as JSON, anything else through ``str``; ``"Error during execution: ..."`` when the
method raises), so BFCL's state and response checks compare like with like.

:func:`call_string` renders a checked call as BFCL's call syntax (``name(key='value', n=3)``) with every value
written by ``repr`` of a JSON value: the only text toolgym ever hands to BFCL's checker (which ``eval``s it).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import keyword
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["APISession", "CallRejected", "call_string", "check_call", "keyword_form", "parse_ground_truth",
           "simulator_classes"]

#: names BFCL's executor refuses to run (it raises "Function call X is not allowed.")
_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


class CallRejected(ValueError):
    """A call toolgym will not run or hand to BFCL's checker: its name is not one of the entry's functions, an
    argument key is not an identifier, or a value is not a JSON value. The message is the model's observation."""


def _json_value(v: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if v is None or isinstance(v, bool | int | str):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, list):
        return all(_json_value(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_value(x, depth + 1) for k, x in v.items())
    return False


def check_call(name: Any, arguments: Any, allowed: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` when the call may run; :class:`CallRejected` otherwise (see the class)."""
    if not isinstance(name, str) or name not in allowed:
        raise CallRejected(f"no function named {str(name)[:80]!r} is available")
    if not isinstance(arguments, Mapping):
        raise CallRejected(f"the arguments of {name} must be an object")
    for k, v in arguments.items():
        if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k):
            raise CallRejected(f"argument name {str(k)[:80]!r} of {name} is not an identifier")
        if not _json_value(v):
            raise CallRejected(f"argument {k!r} of {name} is not a JSON value")
    return name, dict(arguments)


def call_string(name: str, arguments: Mapping[str, Any]) -> str:
    """BFCL's call syntax for a call :func:`check_call` accepted: ``name(k=repr(v), ...)``."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def parse_ground_truth(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``(name, args, kwargs)`` of one of BFCL's ground-truth call strings (``sort('a.pdf')``,
    ``cd(folder='x')``), read with ``ast.literal_eval`` for every argument: never ``eval``."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain call: {text!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    return node.func.id, args, kwargs


def _result_text(out: Any) -> str:
    if isinstance(out, str):
        return out
    if isinstance(out, dict):
        try:
            return json.dumps(out)
        except (TypeError, ValueError):
            return str(out)
    return str(out)


class APISession:
    """The simulator instances of one episode of a multi-turn entry.

    Args:
        involved_classes: the entry's class names (``GorillaFileSystem``, ...).
        initial_config: the entry's ``initial_config`` (deep-copied per class; never mutated).
        long_context: load the long-context scenario (the ``multi_turn_long_context`` category).

    Attributes:
        instances: class name -> instance (what BFCL's state check compares).
        methods: public method name -> class name.
    """

    def __init__(self, involved_classes: Sequence[str], initial_config: Mapping[str, Any],
                 long_context: bool = False) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, str] = {}
        for cls_name in involved_classes:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
            inst = cls()
            if cls_name not in STATELESS_CLASSES:
                inst._load_scenario(copy.deepcopy(dict(initial_config).get(cls_name, {})), long_context=long_context)
            self.instances[cls_name] = inst
            for m, _ in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not m.startswith("_"):
                    self.methods[m] = cls_name

    def _method(self, name: str) -> Any:
        return getattr(self.instances[self.methods[name]], name)

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run one checked call (a name among :attr:`methods`); the result text BFCL's executor would give."""
        if name in _REFUSED:
            return f"Error during execution: Function call {name} is not allowed."
        try:
            return _result_text(self._method(name)(**dict(arguments)))
        except Exception as e:  # noqa: BLE001 - the simulator's error is the model's observation, as in BFCL
            return f"Error during execution: {e}"

    def call_ground_truth(self, text: str) -> str:
        """Run one of BFCL's ground-truth call strings (positional arguments allowed)."""
        name, args, kwargs = parse_ground_truth(text)
        if name not in self.methods:
            return f"Error during execution: name '{name}' is not defined"
        try:
            return _result_text(self._method(name)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001
            return f"Error during execution: {e}"

    def keyword_form(self, text: str) -> tuple[str, dict[str, Any]]:
        """A ground-truth call string as ``(name, keyword arguments)`` (positional ones named from the method's
        signature): the call a model writes in a function-calling format (oracles use it)."""
        return keyword_form(self.instances.values(), text)


def simulator_classes(involved_classes: Sequence[str]) -> list[type]:
    """The simulator classes of an entry (imported, never instantiated)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return [getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[c]), c) for c in involved_classes]


def keyword_form(owners: Any, text: str) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as ``(name, keyword arguments)``, positional arguments named from the signature of
    the method of that name on the last of ``owners`` (simulator classes or instances) that has it, as
    :attr:`APISession.methods` resolves a name two classes share."""
    name, args, kwargs = parse_ground_truth(text)
    for owner in reversed(list(owners)):
        fn = getattr(owner, name, None)
        if fn is not None and not name.startswith("_"):
            sig = inspect.signature(fn)
            if isinstance(owner, type):  # a plain function on the class: its first parameter is ``self``
                sig = sig.replace(parameters=list(sig.parameters.values())[1:])
            return name, dict(sig.bind(*args, **kwargs).arguments)
    raise ValueError(f"no simulator method named {name!r}")
