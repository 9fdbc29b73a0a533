"""The ``python`` tool: run a snippet in the :class:`~toolgym.tools.sandbox.Sandbox` and report how it ended.

The sandbox itself (fork server, warm pool, isolation, limits) lives in :mod:`toolgym.tools.sandbox`; its public
names are re-exported here (``from toolgym.tools.python import PythonTool, Sandbox, SandboxLimits, ...``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from toolgym.tools.base import Tool, ToolError, ToolErrorKind
from toolgym.tools.sandbox import Sandbox, SandboxLimits, SandboxResult, namespaces_available

__all__ = ["PythonTool", "Sandbox", "SandboxLimits", "SandboxResult", "namespaces_available"]


class PythonTool(Tool):
    """``python(code)``: run a Python snippet in a fresh sandboxed interpreter; returns stdout/stderr as text.

    How a run ended is reported so the model can read it either way:

    * exit 0, or a nonzero exit (an exception traceback, ``sys.exit(n)``): a normal observation -- the tool
      worked, the model's code failed, and the traceback is what the model needs (like a notebook cell);
      a nonzero exit appends ``[exit status N]``;
    * wall-clock timeout or CPU limit: a ``timeout`` :class:`ToolError`;
    * memory limit, output flood, death by a signal, or a sandbox failure: an ``exception`` :class:`ToolError`
      whose message says what happened (with the output so far).

    ``last_result`` keeps the :class:`SandboxResult` of the most recent call (for tests and debugging).

    Args:
        sandbox: a :class:`Sandbox` (default: one with ``SandboxLimits()`` and a warm pool of 4).
        name: tool name.
    """

    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python 3 source; print() what you want to see"},
        },
        "required": ["code"],
    }
    cacheable = True

    def __init__(self, sandbox: Sandbox | None = None, *, name: str = "python", max_concurrency: int | None = None):
        self.sandbox = sandbox or Sandbox()
        self.name = name
        lim = self.sandbox.limits
        self.timeout_s = lim.wall_s + 10.0  # the sandbox's own wall limit classifies first
        self.max_concurrency = max_concurrency if max_concurrency is not None else 2 * (os.cpu_count() or 2)
        self.description = (
            "Run Python 3 code in a fresh sandboxed interpreter and return what it prints (stdout, then stderr). "
            f"No network, no state kept between calls; limits: {lim.wall_s:g} s wall time, {lim.cpu_s} s CPU, "
            f"{lim.memory_mb} MiB memory, {lim.max_output_bytes} bytes of output."
        )
        self.last_result: SandboxResult | None = None

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ToolError("argument 'code' must be a string", kind=ToolErrorKind.INVALID_ARGUMENTS)
        res = await self.sandbox.run(code)
        self.last_result = res
        text = res.to_text(self.sandbox.limits)
        if res.status in ("timeout", "cpu_limit"):
            raise ToolError(text, kind=ToolErrorKind.TIMEOUT)
        if res.status in ("memory_limit", "output_limit", "killed", "sandbox_error"):
            raise ToolError(text, kind=ToolErrorKind.EXCEPTION)
        return text

    async def aclose(self) -> None:
        await self.sandbox.aclose()
