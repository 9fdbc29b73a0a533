"""qwen-agent compatibility (optional extra ``qwen``): use qwen-agent ``BaseTool`` instances as toolgym tools.

For RL-Factory users whose tools are qwen-agent tools::

    from qwen_agent.tools import CodeInterpreter          # or your own @register_tool class
    from toolgym.tools.qwen_agent import from_qwen_agent
    tools = from_qwen_agent([MyTool(), "image_gen"])     # instances, classes, or registered names

A wrapped tool keeps the qwen tool's ``name`` and ``description``; its ``parameters`` become a JSON schema
(qwen's old list form ``[{"name", "type", "description", "required"}]`` is converted; a dict is used as is),
so the executor validates arguments before the tool runs. ``call`` runs in a worker thread with the arguments
as a JSON string (what qwen-agent's own agent loop passes). ``str`` results pass through; lists of
``ContentItem`` are joined (text, or ``[image: ...]`` placeholders); other values are JSON-encoded. Exceptions
become ``exception`` errors.

qwen-agent's MCP manager is not used (it imports a 1.x ``mcp`` name and fails on ``mcp`` 2.x): use
:mod:`toolgym.tools.mcp` for MCP servers. Wrapping needs no qwen-agent import: any object with ``name``,
``description``, ``parameters`` and ``call(params, **kwargs)`` works; registered names need qwen-agent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any

from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = ["QwenAgentTool", "from_qwen_agent", "qwen_parameters_to_schema"]

_JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def qwen_parameters_to_schema(parameters: Any) -> dict[str, Any]:
    """A JSON-schema object from qwen-agent ``parameters`` (the legacy list form or a schema dict).

    Raises:
        ValueError: neither a list of ``{"name", ...}`` dicts nor a dict.
    """
    if isinstance(parameters, Mapping):
        schema = dict(parameters)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return schema
    if isinstance(parameters, list | tuple):
        props: dict[str, Any] = {}
        required: list[str] = []
        for p in parameters:
            if not isinstance(p, Mapping) or "name" not in p:
                raise ValueError(f"qwen-agent parameter entries need a 'name': {p!r}")
            prop = {k: v for k, v in p.items() if k not in ("name", "required")}
            if prop.get("type") not in _JSON_TYPES:
                prop.pop("type", None)
            props[str(p["name"])] = prop
            if p.get("required"):
                required.append(str(p["name"]))
        schema = {"type": "object", "properties": props}
        if required:
            schema["required"] = required
        return schema
    raise ValueError(f"unsupported qwen-agent parameters: {type(parameters).__name__}")


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, list) and all(hasattr(x, "get_type_and_value") for x in result):
        parts = []
        for item in result:
            kind, value = item.get_type_and_value()
            parts.append(value if kind == "text" else f"[{kind}: {value}]")
        return "\n".join(parts)
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


class QwenAgentTool(Tool):
    """A qwen-agent ``BaseTool`` instance as a toolgym :class:`Tool`.

    Args:
        qwen_tool: the qwen-agent tool (or any object with ``name``, ``description``, ``parameters``,
            ``call(params, **kwargs)``).
        name: override the tool name.
        timeout_s: per-call timeout (``None``: the executor's default). A timed-out call's worker thread
            cannot be interrupted; it finishes in the background.
        cacheable: allow the executor's cache (default ``False``).
        call_kwargs: extra keyword arguments for every ``call``.
    """

    def __init__(
        self,
        qwen_tool: Any,
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        cacheable: bool = False,
        max_concurrency: int | None = None,
        call_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(qwen_tool, "call", None)):
            raise TypeError(f"{qwen_tool!r} has no call(params) method")
        self.qwen_tool = qwen_tool
        self.name = name or str(getattr(qwen_tool, "name", "") or "")
        if not self.name:
            raise ValueError(f"{qwen_tool!r} has no name")
        self.description = str(getattr(qwen_tool, "description", "") or "")
        self.parameters = qwen_parameters_to_schema(getattr(qwen_tool, "parameters", []))
        self.timeout_s = timeout_s
        self.cacheable = cacheable
        self.max_concurrency = max_concurrency
        self.call_kwargs = dict(call_kwargs or {})

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        params = json.dumps(dict(arguments), ensure_ascii=False)
        try:
            result = await asyncio.to_thread(self.qwen_tool.call, params, **self.call_kwargs)
        except ToolError:
            raise
        except Exception as e:
            raise ToolError(f"{type(e).__name__}: {e}", kind=ToolErrorKind.EXCEPTION) from e
        return _result_text(result)


def from_qwen_agent(tools: Iterable[Any], **kwargs: Any) -> list[QwenAgentTool]:
    """Wrap qwen-agent tools: instances, ``BaseTool`` subclasses (built with no arguments), or names registered
    in qwen-agent's ``TOOL_REGISTRY`` (needs ``qwen-agent`` installed). ``kwargs`` go to :class:`QwenAgentTool`."""
    out = []
    for t in tools:
        if isinstance(t, str):
            try:
                from qwen_agent.tools import TOOL_REGISTRY
            except ImportError as e:
                raise ImportError(f"tool {t!r} by name needs qwen-agent: pip install 'toolgym[qwen]'") from e
            if t not in TOOL_REGISTRY:
                raise ValueError(f"no qwen-agent tool registered as {t!r}")
            t = TOOL_REGISTRY[t]
        if isinstance(t, type):
            t = t()
        out.append(QwenAgentTool(t, **kwargs))
    return out
