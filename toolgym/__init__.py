"""toolgym: token-level Gymnasium environments for training LLMs to use tools with RL.

``import toolgym`` registers the environments (``toolgym/Calculator-v0``, ``toolgym/Search-v0``, ...).
"""

from __future__ import annotations

from typing import Any

from toolgym.envs.registration import register_envs
from toolgym.images import Image, ImageError, ImageLimits
from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind, ToolResult
from toolgym.tools.executor import ToolCache, ToolExecutor
from toolgym.tools.function import FunctionTool, tool
from toolgym.trajectory import Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "FunctionTool",
    "Image",
    "ImageError",
    "ImageLimits",
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


register_envs()
