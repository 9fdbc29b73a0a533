"""``toolgym/MCP-v0``: train on the tools of any MCP server, given a config file and a task file.

    env = gym.make("toolgym/MCP-v0", mcp_config="servers.json", tasks="tasks.jsonl", reward="exact_match")

* ``mcp_config``: ``{"mcpServers": {...}}`` as JSON / ``.pydata`` / a dict (see :mod:`toolgym.tools.mcp`). The
  servers are started and their tools listed (``list_tools``) when the env is built; all episodes of a vector
  env share one session per server.
* ``tasks``: a JSONL file (or a list of dicts): one task per line with ``"prompt"`` (user text) or
  ``"messages"`` (a chat list), an optional ``"id"`` (default ``<file stem>-<line>``), and the fields the
  reward reads.
* Oracle (optional, for ``toolgym eval --policy oracle`` and SFT data): a task row may carry ``"oracle_calls"``,
  one entry per tool-calling turn, each a call ``{"name": ..., "arguments": {...}}`` or a list of them, and
  ``"oracle_answer"``; :meth:`MCPEnv.oracle` makes those calls, then answers ``<answer>oracle_answer</answer>``,
  or, without ``oracle_answer``, ``<answer>`` + the text of the last successful tool result.
* ``reward``: a rule by name — ``"exact_match"``/``"em"``, ``"f1"``, ``"numeric"``/``"numeric_match"`` —
  scoring the final ``<answer>...</answer>`` against ``reward_field`` (or ``"rule@field"``; by default the
  first of ``golden_answers``/``answers``/``answer`` present in the first task); ``"module:function"`` or
  ``"path/to/file.py:function"`` (a ``fn(trajectory, task) -> float``, a :class:`~toolgym.rewards.base.Reward`
  instance, or a ``Reward`` subclass built with no arguments); or any Reward / callable object.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.envs.base import ToolEnv
from toolgym.errors import InputFileError
from toolgym.jsonl import iter_jsonl
from toolgym.rewards.base import Reward, RewardLike
from toolgym.tools.mcp import ConfigSource, MCPToolset

__all__ = ["DEFAULT_SYSTEM_PROMPT", "RULES", "MCPEnv", "load_tasks", "resolve_reward"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant with access to tools. Call a tool whenever it helps you answer; you may call "
    "tools several times and read their results. When you know the final answer, reply without a tool call and "
    "put the answer inside <answer>...</answer>, e.g. <answer>42</answer>."
)

#: reward names -> the rule classes in toolgym.rewards.rules
RULES: dict[str, str] = {
    "exact_match": "ExactMatch",
    "em": "ExactMatch",
    "f1": "F1",
    "numeric": "NumericMatch",
    "numeric_match": "NumericMatch",
}
_GOLD_FIELDS = ("golden_answers", "answers", "answer")


def load_tasks(tasks: str | os.PathLike[str] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Read task rows from a JSONL file (blank lines skipped) or copy a list of dicts; give each an ``id``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object, or a row has neither ``prompt`` nor ``messages`` (the message
            gives the line / row number), or there are no tasks (from a file:
            :class:`~toolgym.errors.InputFileError`).
    """
    rows: list[dict[str, Any]] = []
    if isinstance(tasks, str | os.PathLike):
        path = Path(tasks)
        if not path.exists():
            raise FileNotFoundError(f"task file not found: {path}")
        stem = path.stem
        for lineno, row in iter_jsonl(path, error=InputFileError):
            row.setdefault("id", f"{stem}-{lineno}")
            rows.append(_check_row(row, f"{path}:{lineno}", InputFileError))
        if not rows:
            raise InputFileError(f"{path}: no tasks")
    else:
        for i, row in enumerate(tasks):
            if not isinstance(row, Mapping):
                raise ValueError(f"task {i}: a task must be a dict, got {type(row).__name__}")
            row = dict(row)
            row.setdefault("id", f"task-{i}")
            rows.append(_check_row(row, f"task {i}"))
    if not rows:
        raise ValueError("no tasks")
    return rows


def _check_row(row: dict[str, Any], where: str, error: type[ValueError] = ValueError) -> dict[str, Any]:
    if "prompt" not in row and "messages" not in row:
        raise error(f"{where}: a task needs 'prompt' or 'messages'")
    if "messages" in row and not (
        isinstance(row["messages"], list) and all(isinstance(m, dict) and "role" in m for m in row["messages"])
    ):
        raise error(f"{where}: 'messages' must be a list of {{'role', 'content'}} dicts")
    row["id"] = str(row["id"])
    return row


def _import_object(spec: str) -> Any:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"expected 'module:function' or 'file.py:function', got {spec!r}")
    if target.endswith(".py") or os.sep in target:
        path = Path(target)
        if not path.exists():
            raise FileNotFoundError(f"reward file not found: {path}")
        mod_spec = importlib.util.spec_from_file_location(f"toolgym_user_reward_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{target!r} has no attribute {attr!r}") from None


def resolve_reward(
    reward: RewardLike | str | None, tasks: Sequence[Mapping[str, Any]] = (), field: str | None = None
) -> RewardLike | None:
    """Turn ``reward`` (a rule name, ``"rule@field"``, ``"module:function"``, or an object) into a reward.

    Raises:
        ValueError: an unknown rule name, or no gold field to score against.
        ImportError / FileNotFoundError: a ``module:function`` that cannot be loaded.
    """
    if reward is None or not isinstance(reward, str):
        return reward
    name, _, at_field = reward.partition("@")
    key = name.strip().lower().replace("-", "_")
    if key in RULES:
        from toolgym.rewards import rules

        fld = at_field or field
        if fld is None:
            first = tasks[0] if tasks else {}
            fld = next((f for f in _GOLD_FIELDS if f in first), None)
            if fld is None:
                raise ValueError(
                    f"reward {reward!r} needs a gold field: pass reward_field=... or use '{name}@<field>' "
                    f"(tasks have none of {list(_GOLD_FIELDS)})"
                )
        return getattr(rules, RULES[key])(fld)
    if ":" in reward:
        obj = _import_object(reward)
        if inspect.isclass(obj) and issubclass(obj, Reward):
            return obj()
        if not callable(obj) and not isinstance(obj, Reward):
            raise ValueError(f"reward {reward!r} is not callable")
        return obj
    raise ValueError(f"unknown reward {reward!r}: use one of {sorted(RULES)}, 'rule@field', or 'module:function'")


class MCPEnv(ToolEnv):
    """Tool use over the tools of the MCP servers in ``mcp_config``, on the tasks of ``tasks``.

    Args:
        mcp_config: the MCP config (path to ``.json``/``.pydata``, JSON text, or dict).
        tasks: a JSONL path or a list of task dicts (see :func:`load_tasks`).
        reward: see :func:`resolve_reward` (default ``"exact_match"``).
        reward_field: the task field holding the gold answer(s) for rule rewards.
        prefix: tool naming on clashes across servers (``"auto"``, ``"always"``, ``"never"``).
        tool_timeout_s: per-call timeout for servers without their own ``timeout``.
        connection_kwargs: passed to each :class:`~toolgym.tools.mcp.MCPServerConnection`
            (``connect_timeout_s``, ``backoff_s``, ``max_backoff_s``, ``mode``).
        system_prompt: default :data:`DEFAULT_SYSTEM_PROMPT` (the ``<answer>`` convention).
        executor: a shared executor already holding the MCP tools (vector envs pass it; no new sessions).
        **kwargs: the rest of :class:`~toolgym.envs.base.ToolEnv` (tokenizer, parser, max_turns, ...).

    Attributes:
        toolset: the :class:`~toolgym.tools.mcp.MCPToolset` this env started (``None`` with a shared executor).
    """

    def __init__(
        self,
        mcp_config: ConfigSource,
        tasks: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
        reward: RewardLike | str | None = "exact_match",
        *,
        reward_field: str | None = None,
        prefix: str = "auto",
        tool_timeout_s: float | None = None,
        connection_kwargs: Mapping[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        executor: Any = None,
        **kwargs: Any,
    ) -> None:
        rows = load_tasks(tasks)
        resolved = resolve_reward(reward, rows, reward_field)
        self.toolset: MCPToolset | None = None
        tools: list[Any] = []
        if executor is None:
            self.toolset = MCPToolset(
                mcp_config, prefix=prefix, timeout_s=tool_timeout_s, **dict(connection_kwargs or {})
            )  # type: ignore[arg-type]
            tools = list(self.toolset.connect())
            if not tools:
                self.toolset.close()
                raise ValueError("the MCP servers in the config expose no tools")
        try:
            super().__init__(rows, tools, reward=resolved, system_prompt=system_prompt, executor=executor, **kwargs)
        except BaseException:
            if self.toolset is not None:
                self.toolset.close()
            raise

    def oracle(self, state: Any) -> str:
        """Replay the task's ``oracle_calls`` (one turn each), then answer with ``oracle_answer`` or the last
        successful tool result (see the module doc). A turn whose calls all failed is repeated while turns remain.

        Raises:
            NotImplementedError: the task row has neither ``oracle_calls`` nor ``oracle_answer``.
        """
        task = state.task
        turns = task.get("oracle_calls")
        if turns is None and "oracle_answer" not in task:
            raise NotImplementedError(
                f"no oracle for MCP-v0 task {task.get('id')!r}: give the task row 'oracle_calls' (one call or a list "
                "of calls per turn, each {'name', 'arguments'}) and/or 'oracle_answer'"
            )
        turns = [] if turns is None else [t if isinstance(t, list) else [t] for t in turns]
        traj = state.trajectory
        done = [t for t in (traj.turns if traj is not None else []) if t.calls and any(r.ok for r in t.results)]
        if len(done) < len(turns) and state.turn < self.max_turns - 1:  # a failed turn is not done: replayed
            calls = [(str(c["name"]), dict(c.get("arguments") or {})) for c in turns[len(done)]]
            return self.format.parser.format_calls(calls)
        if "oracle_answer" in task:
            return f"<answer>{task['oracle_answer']}</answer>"
        ok = [r for t in done[-1:] for r in t.results if r.ok]
        return f"<answer>{ok[-1].content.strip() if ok else ''}</answer>"
