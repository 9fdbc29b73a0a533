"""What the page knows about each registered env, read from its class without building it (:func:`env_cards`), and
the one builder of an env from the page's inputs (:func:`make_env`): a constructor's required arguments come from
what the page holds (an MCP config from the MCP card, a task typed by hand), and any construction error is one
classified line (:class:`~trainers.ui.errors.UIError`), never a raw ``__init__()`` message.

Every env of :data:`toolgym.envs.registration.ENVS` gets a card; nothing here names a particular env.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any

from trainers.ui.errors import UIError

__all__ = ["MCP_ARG", "TASKS_ARG", "config_secrets", "env_card", "env_cards", "example_call", "make_env", "required_args",
           "schemas_of", "task_list"]

#: the constructor argument an MCP config fills (the MCP card's text, parsed)
MCP_ARG = "mcp_config"
#: the constructor argument a task typed on the page fills (one task row ``{"id", "prompt"}``)
TASKS_ARG = "tasks"
_FILLED = (MCP_ARG, TASKS_ARG)


def _env_class(env_id: str) -> type | None:
    """The class behind a registered id (``"module:Class"`` entry point), or ``None`` for a callable factory."""
    import gymnasium as gym

    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    if isinstance(entry, str) and ":" in entry:
        mod, _, attr = entry.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            return None
        return obj if inspect.isclass(obj) else None
    return entry if inspect.isclass(entry) else None


def required_args(cls: type | None) -> list[str]:
    """Names of ``cls.__init__``'s parameters without a default (``self``, ``*args``, ``**kwargs`` left out)."""
    if cls is None:
        return []
    try:
        sig = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return []
    return [p.name for p in list(sig.parameters.values())[1:]
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _tools_per_task(cls: type | None) -> bool:
    """Whether the env shows each episode its own tools (it overrides :attr:`ToolEnv.tool_schemas`)."""
    from toolgym.envs.base import ToolEnv

    return cls is not None and issubclass(cls, ToolEnv) and cls.tool_schemas is not ToolEnv.tool_schemas


def env_card(env_id: str) -> dict[str, Any]:
    """``{"id", "about", "needs", "tools_per_task", "note"}`` for a registered env: ``needs`` the constructor's
    required arguments, ``note`` one line telling the user what the env needs from the page (or ``""``)."""
    from toolgym.envs.registration import ENVS, register_envs

    register_envs()
    cls = _env_class(env_id)
    needs = required_args(cls)
    per_task = _tools_per_task(cls)
    notes = []
    if MCP_ARG in needs:
        notes.append("built from an MCP config: write or upload one in the MCP card, then load")
    if TASKS_ARG in needs:
        notes.append("its tasks come from a file; by hand, the task is the prompt you type")
    other = [n for n in needs if n not in _FILLED]
    if other:
        notes.append(f"needs {', '.join(other)}, which the page cannot give: use module:Env-v0 with defaults")
    if per_task:
        notes.append("its tools are per task: pick a task to see that task's tools")
    return {"id": env_id, "about": ENVS.get(env_id, ("", ""))[1], "needs": needs, "tools_per_task": per_task,
            "note": "; ".join(notes)}


def env_cards() -> list[dict[str, Any]]:
    """A card per registered env, in registration order."""
    from toolgym.envs.registration import ENVS

    return [env_card(k) for k in ENVS]


def config_secrets(data: Any) -> list[str]:
    """The values of an MCP config's ``env`` and ``headers`` (API keys, bearer tokens): never shown back."""
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    out: list[str] = []
    for cfg in (servers.values() if isinstance(servers, dict) else []):
        for key in ("env", "headers"):
            table = cfg.get(key) if isinstance(cfg, dict) else None
            if isinstance(table, dict):
                out += [str(v) for v in table.values() if isinstance(v, str) and len(v) >= 6]
    return sorted(out, key=len, reverse=True)


def _mcp_config(text: str, env_id: str) -> dict[str, Any]:
    text = (text or "").strip()
    if not text:
        raise UIError(f"{env_id} is built from an MCP config: write or upload one in the MCP card "
                      '({"mcpServers": {"name": {"command": ..., "args": [...]}}}), then load it')
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UIError(f"{env_id}: the MCP card's config is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise UIError(f'{env_id}: an MCP config is a JSON object {{"mcpServers": {{...}}}}')
    return data


def make_env(name: str, *, mcp_config: str = "", prompt: str = "", kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build env ``name`` (any spelling ``toolgym list`` accepts, or ``module:Env-v0``) for the page: its required
    ``mcp_config`` from ``mcp_config`` (JSON text, the MCP card's), its required ``tasks`` as one task whose prompt
    is ``prompt`` (no reward: nothing to score it against); ``kwargs`` are passed on. Returns the Gymnasium env.

    Raises:
        UIError: an unknown env, an argument the page cannot give, or the env's construction error, classified
            (:func:`toolgym.envs.resolve.env_construction_error`; secrets of the MCP config masked).
    """
    import gymnasium as gym

    from toolgym.envs.resolve import env_construction_error, resolve_env_id
    from toolgym.errors import CLIError

    name = (name or "").strip()
    if not name:
        raise UIError("pick an env")
    try:
        env_id = resolve_env_id(name)
    except CLIError as e:
        raise UIError(e.message) from None
    cls = _env_class(env_id.partition(":")[2] if ":" in env_id else env_id)
    needs = required_args(cls)
    args: dict[str, Any] = dict(kwargs or {})
    other = [n for n in needs if n not in _FILLED and n not in args]
    if other:
        raise UIError(f"{env_id} needs {', '.join(other)} to be built, which the page cannot give")
    hidden: list[str] = []
    if MCP_ARG in needs:
        args[MCP_ARG] = _mcp_config(mcp_config, env_id)
        hidden = config_secrets(args[MCP_ARG])
    if TASKS_ARG in needs:
        text = (prompt or "").strip() or "Use the tools to answer."
        args[TASKS_ARG] = [{"id": "typed-0", "prompt": text}]
        if "reward" in inspect.signature(cls.__init__).parameters:  # type: ignore[misc]
            args["reward"] = None
    try:
        return gym.make(env_id, **args)
    except Exception as e:  # noqa: BLE001 - every construction error is one classified line
        msg = env_construction_error(env_id, e).message
        for s in hidden:
            msg = msg.replace(s, "***")
        raise UIError(msg) from None


def schemas_of(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tool specs (OpenAI ``{"type": "function", "function": {...}}`` or bare) as ``[{"name", "description",
    "parameters"}]``."""
    out = []
    for s in specs:
        fn = s.get("function", s)
        out.append({"name": fn.get("name"), "description": fn.get("description", ""),
                    "parameters": fn.get("parameters", {})})
    return out


def task_list(env: Any, limit: int = 500) -> list[str]:
    """The ids of a fixed task set's first ``limit`` tasks (``[]`` for procedural tasks)."""
    tasks = getattr(env.unwrapped, "tasks", None)
    if callable(tasks) or not isinstance(tasks, Sequence):
        return []
    return [str(t.get("id", k)) if isinstance(t, Mapping) else str(k) for k, t in enumerate(tasks[:limit])]


def task_by_id(env: Any, task_id: str) -> dict[str, Any]:
    """The task row of ``env`` whose id is ``task_id``; a ``UIError`` when there is none."""
    tasks = getattr(env.unwrapped, "tasks", None)
    if not callable(tasks) and isinstance(tasks, Sequence):
        for k, t in enumerate(tasks):
            if isinstance(t, Mapping) and str(t.get("id", k)) == task_id:
                return dict(t)
    raise UIError(f"no task {task_id!r} in this env")


def _placeholder(schema: Mapping[str, Any]) -> Any:
    t = schema.get("type")
    t = t[0] if isinstance(t, list) and t else t
    if schema.get("enum"):
        return schema["enum"][0]
    return {"string": "...", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}.get(t, "...")


def example_call(env: Any, tools: Sequence[Mapping[str, Any]]) -> str:
    """A call of the first tool, written in the env's own tool-call format (its parser's ``format_calls``), its
    required arguments filled with placeholders; ``""`` when there is no tool or the format cannot write one."""
    if not tools:
        return ""
    t = tools[0]
    params = t.get("parameters") or {}
    props = params.get("properties") or {}
    args = {k: _placeholder(props.get(k) or {}) for k in params.get("required") or list(props)[:1]}
    try:
        return env.unwrapped.format.parser.format_calls([(str(t.get("name")), args)])
    except Exception:  # noqa: BLE001 - an example is a convenience: a parser that cannot write one shows none
        return ""
