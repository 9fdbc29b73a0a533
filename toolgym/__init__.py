"""toolgym: token-level Gymnasium environments for training LLMs to use tools with RL.

``import toolgym`` registers the environments (``toolgym/Calculator-v0``, ``toolgym/Search-v0``, ...).
"""

from __future__ import annotations

import logging
from typing import Any

from toolgym.envs.registration import register_envs
from toolgym.moved import alias_moved_modules
from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind, ToolResult
from toolgym.tools.executor import ToolCache, ToolExecutor
from toolgym.tools.function import FunctionTool, tool
from toolgym.trajectory import Trajectory, Turn

__version__ = "0.1.0"

# bitsandbytes (the [train] extra's 8-bit AdamW; peft imports it whenever it is installed) logs a warning at import
# about an optional 4-bit CPU kernel package toolgym never uses: it would be an extra stderr line in every
# command that imports TRL or peft (a CLI error is one line)
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__all__ = [
    "FunctionTool",
    "Score",
    "Tool",
    "ToolCache",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "ToolErrorKind",
    "ToolExecutor",
    "ToolResult",
    "ToolVectorEnv",
    "Trajectory",
    "Turn",
    "__version__",
    "register_envs",
    "tool",
]



#: old module path -> where it lives (``import toolgym.eval`` still works, with a DeprecationWarning)
MOVED_MODULES = {
    "toolgym.cli_bench": "toolgym.cli.bench",
    "toolgym.cli_common": "toolgym.cli.common",
    "toolgym.cli_eval": "toolgym.cli.eval",
    "toolgym.cli_view": "toolgym.cli.view",
    "toolgym.eval": "toolgym.evaluation.runner",
    "toolgym.tasks": "toolgym.evaluation.tasks",
    "toolgym.plots": "toolgym.report.plots",
    "toolgym.vector": "toolgym.envs.vector",
    "toolgym.viewer": "toolgym.report.viewer",
}


def __getattr__(name: str) -> Any:
    # on first use: toolgym.rewards pulls in aiohttp and the vector env thread pools, which ``import toolgym`` need
    # not pay
    if name == "Score":
        from toolgym.rewards.base import Score

        return Score
    if name == "ToolEnv":
        from toolgym.envs.base import ToolEnv

        return ToolEnv
    if name == "ToolVectorEnv":
        from toolgym.envs.vector import ToolVectorEnv

        return ToolVectorEnv
    raise AttributeError(f"module 'toolgym' has no attribute {name!r}")


alias_moved_modules(MOVED_MODULES)
register_envs()
