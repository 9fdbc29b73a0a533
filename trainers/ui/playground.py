"""The web UI's in-process pages: the tool playground (a registered env's tools or an MCP ``mcpServers`` config:
list the tools, call one by hand through the same :class:`~toolgym.tools.executor.ToolExecutor` an env uses, and
read the classified result as the model would) and the reward composer (library rewards with weights, run on a
trajectory file; every component per episode and per turn).

Every failure is a :class:`UIError` with a one-line message for the page; nothing here raises a traceback at it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainers.ui.envcards import config_secrets
from trainers.ui.errors import UIError

__all__ = ["REWARD_LIBRARY", "ToolPlayground", "UIError", "config_secrets", "file_reward_defaults", "reward_defaults", "safe_name",
           "score_file"]


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def safe_name(name: str, what: str = "name") -> str:
    """A run / model / setup name: letters, digits, ``_.-`` (no path separators)."""
    name = (name or "").strip()
    if not _NAME.fullmatch(name) or ".." in name:
        raise UIError(f"bad {what} {name!r}: letters, digits, '_', '.', '-' (up to 64)")
    return name


class ToolPlayground:
    """One loaded tool source at a time (an env's executor or an MCP config's servers); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closer: Any = None
        self.executor: Any = None
        self.source = ""
        self.env: Any = None  # the loaded env (None for an MCP config)
        self.tasks: list[str] = []  # an env whose tools are per task: its task ids (the page's task picker)
        self.task = ""  # the picked task's id

    def _replace(self, executor: Any, closer: Any, source: str, env: Any = None) -> None:
        old = self._closer
        self.executor, self._closer, self.source = executor, closer, source
        self.env, self.tasks, self.task = env, [], ""
        if old is not None:
            try:
                old()
            except Exception:  # noqa: BLE001 - closing the previous source must not hide the new one
                pass

    def load_env(self, name: str, mcp_config: str = "") -> list[dict[str, Any]]:
        """Build env ``name`` (any spelling ``toolgym list`` accepts, or ``module:Env-v0``; an env built from an MCP
        config takes ``mcp_config``, the MCP card's text) and return its tools. An env whose tools are per task
        lists none until a task is picked (:meth:`pick_task`); :attr:`tasks` holds its task ids."""
        from trainers.ui.envcards import env_card, make_env, task_list

        with self._lock:
            self._replace(None, None, "")  # a failed load leaves nothing of the previous source callable
            env = make_env(name, mcp_config=mcp_config)
            env_id = env.spec.id if env.spec is not None else name
            self._replace(env.unwrapped.executor, env.close, env_id, env)
            if env_card(env_id)["tools_per_task"]:
                self.tasks = task_list(env)
            return self.schemas()

    def pick_task(self, task_id: str) -> list[dict[str, Any]]:
        """Start an episode of the loaded env on task ``task_id`` and return that task's tools."""
        from trainers.ui.envcards import task_by_id

        with self._lock:
            if self.env is None or not self.tasks:
                raise UIError("load an env whose tools are per task first")
            row = task_by_id(self.env, str(task_id))
            try:
                self.env.reset(options={"task": row})
            except Exception as e:  # noqa: BLE001 - a task the env refuses is one line on the page
                raise UIError(f"task {task_id!r}: {type(e).__name__}: {e}") from None
            self.task = str(task_id)
            return self.schemas()

    def load_mcp(self, text: str) -> list[dict[str, Any]]:
        """Start the servers of an MCP config (JSON text ``{"mcpServers": {...}}``) and return their tools."""
        from toolgym.runtime import run_sync
        from toolgym.tools.executor import ToolExecutor
        from toolgym.tools.mcp import MCPToolset

        text = (text or "").strip()
        if not text.startswith(("{", "[")):
            raise UIError('an MCP config is JSON: {"mcpServers": {"name": {"command": ..., "args": [...]}}}')
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UIError(f"MCP config is not valid JSON: {e}") from None
        hidden = config_secrets(data)
        with self._lock:
            self._replace(None, None, "")  # a failed load leaves nothing of the previous source callable
            try:
                ts = MCPToolset(data)
            except (ValueError, TypeError) as e:
                raise UIError(_hide(f"bad MCP config: {e}", hidden)) from None
            try:
                tools = ts.connect()
            except (ConnectionError, ValueError, OSError) as e:
                raise UIError(_hide(str(e), hidden)) from None
            executor = ToolExecutor(tools)
            self._replace(executor, lambda: run_sync(executor.aclose()), "MCP: " + ", ".join(ts.configs))
            return self.schemas()

    def schemas(self) -> list[dict[str, Any]]:
        """The loaded tools as the model sees them: ``[{"name", "description", "parameters"}]``."""
        from trainers.ui.envcards import schemas_of

        if self.executor is None:
            return []
        if self.tasks:  # per task: the picked task's (none before one is picked)
            return schemas_of(self.env.unwrapped.tool_schemas) if self.task else []
        return schemas_of(self.executor.schemas())

    def call(self, name: str, arguments: str) -> dict[str, Any]:
        """Call tool ``name`` with ``arguments`` (JSON object text) through the executor. Malformed arguments are
        a ``parse_error`` result, as for a model; the result is ``{"content", "error_kind", "latency_s", ...}``,
        with a ``"note"`` when the picked task describes ``name`` but the env has nothing that runs it."""
        from toolgym.runtime import run_sync
        from toolgym.tools.base import ToolCall, ToolErrorKind

        if self.executor is None:
            raise UIError("load an env or an MCP config first")
        raw = (arguments or "").strip() or "{}"
        try:
            args = json.loads(raw)
            error = None if isinstance(args, dict) else "arguments must be a JSON object"
        except json.JSONDecodeError as e:
            args, error = {}, f"arguments are not valid JSON: {e}"
        call = ToolCall(name=name or "", arguments=args if error is None else {}, raw=raw, id="call_ui_0",
                        parse_error=error)
        with self._lock:
            res = run_sync(self.executor.run(call))
            not_run = res.error_kind is ToolErrorKind.UNKNOWN_TOOL and bool(self.tasks) and \
                name in {t["name"] for t in self.schemas()}  # described to the model, not run by the env
        out = res.to_dict()
        if not_run:
            out["note"] = (f"{name} is one of task {self.task}'s functions as the model reads them, but this env "
                           "has nothing that runs it: the env checks the calls of the model's answer against the "
                           "task's expected ones instead (BFCL's single-turn categories). Play an episode to see "
                           "the verdict.")
        return out

    def close(self) -> None:
        with self._lock:
            self._replace(None, None, "")


def _hide(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


# ---------------------------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------------------------


def _library() -> dict[str, tuple[Any, str]]:
    from toolgym import rewards as R

    return {
        "exact_match": (R.ExactMatch, "outcome: 1 when the answer equals a gold answer (normalised); field: the "
                                      "task key with the golds (default golden_answers)"),
        "f1": (R.F1, "outcome: token F1 of the answer against the golds; field as exact_match"),
        "numeric_match": (R.NumericMatch, "outcome: 1 when the number in the answer matches the task's number "
                                          "(field default: answer)"),
        "answer_format": (R.AnswerFormat, "outcome: 1 when the last turn is a well-formed final answer"),
        "tool_call_format": (R.ToolCallFormat, "per turn: +0.1 for a turn whose calls all succeeded, penalties "
                                               "by error kind (parse_error -0.2, unknown_tool -0.2, ...)"),
    }


REWARD_LIBRARY = ("exact_match", "f1", "numeric_match", "answer_format", "tool_call_format")
"""The rewards the composer offers (classes of :mod:`toolgym.rewards`)."""


def reward_library() -> list[dict[str, Any]]:
    """``[{"name", "help", "per_turn", "has_field"}]`` for the page."""
    lib = _library()
    return [{"name": k, "help": h, "per_turn": k == "tool_call_format",
             "has_field": k in ("exact_match", "f1", "numeric_match")} for k, (_, h) in lib.items()]


def build_reward(parts: Sequence[Mapping[str, Any]]) -> Any:
    """A :class:`~toolgym.rewards.Combine` from ``[{"name", "weight", "field"?}]`` (library names)."""
    from toolgym.rewards import Combine

    lib = _library()
    items = []
    for p in parts:
        name = str(p.get("name", ""))
        if name not in lib:
            raise UIError(f"unknown reward {name!r}; the library has: {', '.join(lib)}")
        try:
            weight = float(p.get("weight", 1.0))
        except (TypeError, ValueError):
            raise UIError(f"{name}: weight {p.get('weight')!r} is not a number") from None
        if weight != weight or weight in (float("inf"), float("-inf")):
            raise UIError(f"{name}: weight must be finite")
        cls = lib[name][0]
        field = str(p.get("field") or "").strip()
        items.append((cls(field) if field and name in ("exact_match", "f1", "numeric_match") else cls(), weight))
    if not items:
        raise UIError("add at least one reward")
    return Combine(items)


def score_file(path: Path, parts: Sequence[Mapping[str, Any]], *, limit: int = 200) -> dict[str, Any]:
    """Run the composition on the trajectories of ``path`` (the first ``limit``): per episode the total (outcome +
    the per-turn rewards of every turn, as the env pays them) and every component (a per-turn one summed over the
    turns), and per turn the per-turn value and components. Returns ``{"weights", "n", "shown", "episodes"}``."""
    from toolgym.rewards.base import outcome_score, turn_score
    from toolgym.runtime import run_sync
    from toolgym.trajectory import Trajectory, TrajectoryFormatError, read_trajectories

    reward = build_reward(parts)
    try:
        rows = read_trajectories(path)
    except (TrajectoryFormatError, OSError, ValueError) as e:
        raise UIError(str(e)) from None
    if not rows:
        raise UIError(f"{path.name} holds no trajectories")

    async def one(k: int, row: Mapping[str, Any]) -> dict[str, Any]:
        traj = Trajectory.from_dict(dict(row))
        task = traj.task or {}
        out = await outcome_score(reward, traj, task)
        turns = []
        if reward.per_turn:
            for i, turn in enumerate(traj.turns):
                s = await turn_score(reward, turn, traj, task)
                turns.append({"turn": i, "value": s.value, "components": dict(s.components)})
        comps = dict(out.components)
        for t in turns:  # a per-turn reward counts once per turn: its episode value is the sum over turns
            for name, v in t["components"].items():
                if name not in out.components:
                    comps[name] = comps.get(name, 0.0) + v
        return {"episode": k, "task": task.get("id"), "value": out.value + sum(t["value"] for t in turns),
                "outcome": out.value, "components": comps, "turns": turns, "answer": (traj.answer or "")[:200]}

    async def all_() -> list[dict[str, Any]]:
        import asyncio

        return list(await asyncio.gather(*(one(k, r) for k, r in enumerate(rows[:limit]))))

    try:
        eps = run_sync(all_())
    except Exception as e:  # noqa: BLE001 - a reward that fails on this file is reported, not raised at the page
        raise UIError(f"the reward failed on {path.name}: {type(e).__name__}: {e}") from None
    return {"weights": reward.weights, "n": len(rows), "shown": len(eps), "episodes": eps,
            "warnings": missing_gold_warnings(parts, rows[:limit])}


def missing_gold_warnings(parts: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per gold-answer reward whose field some episodes' tasks lack (those score 0 whatever the
    answer), naming the field, the count and the task keys there are."""
    lib = _library()
    out = []
    for p in parts:
        name = str(p.get("name", ""))
        if name not in ("exact_match", "f1", "numeric_match"):
            continue
        field = str(p.get("field") or "").strip() or lib[name][0]().field
        tasks = [r.get("task") or {} for r in rows]
        missing = [t for t in tasks if field not in t]
        if missing:
            keys = sorted({k for t in missing for k in t})
            out.append(f"{name}: {len(missing)} of {len(tasks)} episodes' tasks have no {field!r} field, so they "
                       f"score 0 whatever the answer; their task keys: {', '.join(keys) or '(none)'} (set the "
                       "reward's field to the key holding the gold answer)")
    return out


_GOLD_FIELDS = ("golden_answers", "answers", "answer")


def _numeric(value: Any) -> bool:
    """Whether a gold answer (or every one of a list of them) reads as a number (``"1,234"`` included)."""
    values = value if isinstance(value, list) else [value]
    try:
        for v in values:
            if isinstance(v, bool):
                return False
            float(str(v).replace(",", ""))
    except (TypeError, ValueError):
        return False
    return bool(values)


def reward_defaults(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A composition that fits the file's tasks: a gold-answer reward on the field the tasks carry
    (``numeric_match`` when every gold is a number, else ``exact_match``), or ``answer_format`` when they carry
    none, plus the per-turn ``tool_call_format`` at 0.5. Returns ``{"parts": [{"name", "weight", "field",
    "use"}], "why"}`` (every library reward listed, the unused ones with ``use`` false)."""
    tasks = [r.get("task") or {} for r in rows]
    field = next((f for f in _GOLD_FIELDS if tasks and all(f in t for t in tasks)), None)
    if field is None:
        keys = sorted({k for t in tasks for k in t})
        chosen = {"answer_format": 1.0}
        why = (f"the tasks carry no gold answer ({', '.join(_GOLD_FIELDS)}; their keys: {', '.join(keys) or 'none'}):"
               " answer_format scores the answer's form")
    elif all(_numeric(t[field]) for t in tasks):
        chosen = {"numeric_match": 1.0}
        why = f"every task's gold answer ({field!r}) is a number: numeric_match on {field!r}"
    else:
        chosen = {"exact_match": 1.0}
        why = f"the tasks' gold answers are in {field!r}: exact_match on {field!r}"
    chosen["tool_call_format"] = 0.5
    parts = []
    for item in reward_library():
        name = item["name"]
        parts.append({"name": name, "use": name in chosen, "weight": chosen.get(name, 0.5 if item["per_turn"] else 1.0),
                      "field": field if item["has_field"] and field else ""})
    return {"parts": parts, "why": why + "; tool_call_format (x 0.5) scores each turn's calls"}


def file_reward_defaults(path: Path, limit: int = 200) -> dict[str, Any]:
    """:func:`reward_defaults` for the first ``limit`` trajectories of ``path``."""
    from toolgym.trajectory import TrajectoryFormatError, read_trajectories

    try:
        rows = read_trajectories(path)
    except (TrajectoryFormatError, OSError, ValueError) as e:
        raise UIError(str(e)) from None
    return reward_defaults(rows[:limit])
