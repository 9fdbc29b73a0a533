"""Registration of the toolgym environments with Gymnasium.

Each env is registered with a ``vector_entry_point`` so ``gym.make_vec(id, num_envs=N)`` returns a
:class:`toolgym.envs.vector.ToolVectorEnv` (one event loop, one shared tool executor) instead of N copies in
Gymnasium's sync/async wrappers. :func:`make_vector_env` is the one builder of a rollout vector env (autoreset
off) from an env id: evaluation, the rollout driver, the TRL adapter and the demo all build theirs with it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

__all__ = ["ENVS", "import_env_id", "make_vector", "make_vector_env", "register_envs"]

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
    "toolgym/Chart-v0": (
        "toolgym.envs.chart:ChartEnv",
        "a bar chart shown as an image; a zoom tool that answers with images + a calculator; reward = exact number",
    ),
    "toolgym/BFCL-v0": (
        "toolgym.envs.bfcl.env:BFCLEnv",
        "Berkeley Function Calling Leaderboard categories (category=...); reward = BFCL's own checker verdict",
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
    from toolgym.envs.vector import ToolVectorEnv

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


def import_env_id(env_id: str) -> str:
    """``"module:Env-v0"`` -> imports ``module`` (which registers its envs, as ``gym.make`` does) and returns
    ``"Env-v0"``; any other id is returned unchanged. ``ImportError`` when the module is missing."""
    if ":" in env_id:
        mod, _, env_id = env_id.partition(":")
        importlib.import_module(mod)
    return env_id


def make_vector_env(env_id: str, num_envs: int, env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """A :class:`~toolgym.envs.vector.ToolVectorEnv` of ``num_envs`` copies of ``env_id`` with autoreset disabled (what
    a rollout drives: each episode is reset explicitly with its task).

    ``env_id`` is any registered id, including ``"module:Env-v0"`` (``module`` is imported first). Envs
    registered without toolgym's vector entry point are wrapped in a ToolVectorEnv directly. ``env_kwargs`` go to
    every sub-env (``tokenizer``, ``split``, ...).
    """
    from gymnasium.vector import AutoresetMode

    from toolgym.envs.vector import ToolVectorEnv

    register_envs()
    env_id = import_env_id(env_id)
    spec = gym.spec(env_id)
    kw = dict(env_kwargs or {})
    if spec.vector_entry_point is not None:
        return gym.make_vec(env_id, num_envs=num_envs, autoreset_mode=AutoresetMode.DISABLED, **kw)

    def env_fn(**k: Any) -> Any:
        return gym.make(spec.id, disable_env_checker=True, **k)

    return ToolVectorEnv(env_fn, num_envs=num_envs, autoreset_mode=AutoresetMode.DISABLED, **kw)
