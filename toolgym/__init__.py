"""toolgym: token-level Gymnasium environments for training LLMs to use tools with RL.

``import toolgym`` registers the environments (``toolgym/Calculator-v0``, ``toolgym/Search-v0``, ...).
"""

from __future__ import annotations

from toolgym.envs.registration import register_envs
from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind, ToolResult
from toolgym.tools.executor import ToolCache, ToolExecutor
from toolgym.tools.function import FunctionTool, tool
from toolgym.trajectory import Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "FunctionTool",
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

register_envs()
