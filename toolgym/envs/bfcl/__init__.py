"""``toolgym/BFCL-v0``: the Berkeley Function Calling Leaderboard in one place (docs/bfcl.md).

* :mod:`~toolgym.envs.bfcl.data`: BFCL's categories, entries and splits, read from the ``bfcl-eval`` package;
* :mod:`~toolgym.envs.bfcl.simulators`: BFCL's multi-turn API simulators, run safely (checked calls, no ``eval``);
* :mod:`~toolgym.envs.bfcl.worker`: the worker process where an episode's simulators run, under the tool timeout;
* :mod:`~toolgym.envs.bfcl.checkers`: BFCL's checkers as verdicts;
* :mod:`~toolgym.envs.bfcl.verdict`: :class:`BFCLReward`, the env's reward;
* :mod:`~toolgym.envs.bfcl.env`: :class:`BFCLEnv`, the env.

The table over categories (``toolgym eval bfcl``) is :mod:`toolgym.evaluation.bfcl`, with the other evaluations.
The names below are read on first use, so the worker process imports only what it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BUDGETS", "STEP_LIMIT", "BFCLEnv", "BFCLReward"]

_WHERE = {"BFCLEnv": "env", "BUDGETS": "env", "STEP_LIMIT": "env", "BFCLReward": "verdict"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
