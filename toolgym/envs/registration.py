"""Registration of the toolgym environments with Gymnasium.

Each env is registered with a ``vector_entry_point`` so ``gym.make_vec(id, num_envs=N)`` returns a
:class:`toolgym.vector.ToolVectorEnv` (one event loop, one shared tool executor) instead of N copies in
Gymnasium's sync/async wrappers.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import gymnasium as gym

__all__ = ["ENVS", "make_vector", "register_envs"]

#: id -> (entry point "module:Class", one-line description)
ENVS: dict[str, tuple[str, str]] = {
    "toolgym/Calculator-v0": (
        "toolgym.envs.calculator:CalculatorEnv",
        "multi-step arithmetic with large numbers and a safe calculator tool; reward = exact numeric answer",
    ),
    "toolgym/CalculatorChain-v0": (
        "toolgym.envs.calculator_chain:CalculatorChainEnv",
        "multi-step: 2-4 dependent calculator calls; process reward = each intermediate value verified, + exact answer",
    ),
    "toolgym/Search-v0": (
        "toolgym.envs.search:SearchEnv",
        "Search-R1 style QA over an embedded GeoNames corpus (BM25) or a remote retriever; reward = EM",
    ),
    "toolgym/SQL-v0": (
        "toolgym.envs.sql:SQLEnv",
        "natural-language questions over the Chinook SQLite database; reward = execution accuracy",
    ),
    "toolgym/Python-v0": (
        "toolgym.envs.python:PythonEnv",
        "arithmetic word problems with a sandboxed Python tool; reward = exact numeric answer",
    ),
    "toolgym/MCP-v0": (
        "toolgym.envs.mcp:MCPEnv",
        "any MCP server from a config file + a JSONL task file; reward by name or callable",
    ),
}


def _load(entry_point: str) -> Any:
    mod, _, attr = entry_point.partition(":")
    return getattr(importlib.import_module(mod), attr)


def make_vector(entry_point: str, num_envs: int = 1, **kwargs: Any) -> Any:
    """The ``vector_entry_point`` of every toolgym env: a ToolVectorEnv over ``num_envs`` copies."""
    from toolgym.vector import ToolVectorEnv

    return ToolVectorEnv(_load(entry_point), num_envs=num_envs, **kwargs)


def register_envs() -> None:
    """Register every toolgym env (idempotent)."""
    for env_id, (entry_point, _) in ENVS.items():
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=entry_point,
            vector_entry_point=functools.partial(make_vector, entry_point),
            disable_env_checker=False,
        )
