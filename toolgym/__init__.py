"""toolgym: token-level Gymnasium environments for training LLMs to use tools with RL.

``import toolgym`` registers the environments (``toolgym/Calculator-v0``, ``toolgym/Search-v0``, ...).
"""

from __future__ import annotations

import logging
from typing import Any

from toolgym.envs.registration import register_envs
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
    "ToolError",
    "ToolErrorKind",
    "ToolExecutor",
    "ToolResult",
    "Trajectory",
    "Turn",
    "__version__",
    "register_envs",
    "tool",
]



def __getattr__(name: str) -> Any:
    # ``toolgym.Score`` on first use: importing toolgym.rewards pulls in aiohttp, which ``import toolgym`` need not pay
    if name == "Score":
        from toolgym.rewards.base import Score

        return Score
    raise AttributeError(f"module 'toolgym' has no attribute {name!r}")


register_envs()
