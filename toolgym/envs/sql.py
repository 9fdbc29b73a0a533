"""``toolgym/SQL-v0``: natural-language questions over the Chinook database, answered in SQL.

The model explores with the read-only ``execute_sql`` tool and ends with its final query inside
``<answer>...</answer>``. The reward is **execution accuracy**: the final query and the gold query are both run
(read-only, time-limited) and their result sets compared -- column names ignored, numbers equal within 0.01,
rows compared as a multiset unless the question asks for an order (then in order); a permutation of the columns
is accepted. The final query is the SQL in the last turn's ``<answer>`` tag (a ```` ```sql ```` fence inside is
fine); when the last turn has no ``<answer>``, the query of the episode's last ``execute_sql`` call is used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from toolgym.data.chinook import SCHEMA_TEXT, chinook_path, chinook_questions
from toolgym.envs.base import ToolEnv
from toolgym.rewards.verified import ToolVerified
from toolgym.tools.sql import SQLError, SQLTool, rows_match, run_query
from toolgym.trajectory import Trajectory

__all__ = ["SQLEnv", "SQLExecutionMatch", "execution_match", "final_sql"]

SYSTEM_PROMPT = """You answer questions about a music store's SQLite database by writing SQL.
Tables (PK = primary key, -> = foreign key):
{schema}

Call the execute_sql tool to run SELECT queries and check their results. When you are done, reply with your \
final SQL query (one SELECT statement) inside answer tags, for example \
<answer>SELECT COUNT(*) FROM Track</answer>. It is graded by running it: its rows must equal the correct result \
(column names do not matter; row order matters only when the question asks for an order)."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.DOTALL)


def final_sql(trajectory: Trajectory, tool_name: str = "execute_sql") -> str:
    """The episode's final SQL: the last turn's ``<answer>`` content (code fence stripped), else the query of the
    last ``tool_name`` call, else ``""``."""
    text = trajectory.turns[-1].text if trajectory.turns else ""
    found = _ANSWER.findall(text)
    if found:
        sql = found[-1].strip()
        m = _FENCE.match(sql)
        return (m.group(1) if m else sql).strip()
    for call in reversed(trajectory.tool_calls):
        if call.name == tool_name and isinstance(call.arguments.get("query"), str):
            return call.arguments["query"].strip()
    return ""


@lru_cache(maxsize=4096)
def _gold_rows(db_path: str, gold_sql: str) -> tuple[tuple[Any, ...], ...]:
    return tuple(run_query(db_path, gold_sql, max_rows=None, time_limit_s=10.0).rows)


def execution_match(
    sql: str, gold_sql: str, *, ordered: bool = False, db_path: str | Path | None = None, time_limit_s: float = 2.0,
    max_rows: int = 10_000,
) -> bool:
    """``True`` when ``sql`` returns the same rows as ``gold_sql`` on the database (see module doc for the rules).

    A query that fails (refused, syntax error, time limit) or returns more than ``max_rows`` rows does not match.
    """
    if not sql.strip():
        return False
    path = str(db_path or chinook_path())
    try:
        got = run_query(path, sql, time_limit_s=time_limit_s, max_rows=max_rows)
    except SQLError:
        return False
    if got.truncated:
        return False
    return rows_match(got.rows, _gold_rows(path, gold_sql), ordered=ordered)


class SQLExecutionMatch(ToolVerified):
    """Execution accuracy of the episode's :func:`final_sql` against ``task["gold_sql"]`` (1.0 or 0.0).

    ``task["ordered"]`` (default false) makes the comparison order-sensitive.
    """

    def __init__(self, db_path: str | Path | None = None, *, time_limit_s: float = 2.0, name: str = "execution_match",
                 tool_name: str = "execute_sql") -> None:
        self.db_path = str(db_path or chinook_path())
        self.time_limit_s = time_limit_s

        def verify(sql: str, task: Mapping[str, Any]) -> float:
            return float(execution_match(sql, task["gold_sql"], ordered=bool(task.get("ordered")),
                                         db_path=self.db_path, time_limit_s=self.time_limit_s))

        super().__init__(verify, name=name, prediction=lambda t: final_sql(t, tool_name),
                         timeout_s=time_limit_s + 10.0)


class SQLEnv(ToolEnv):
    """Text-to-SQL over Chinook with an ``execute_sql`` tool and an execution-accuracy reward.

    Args:
        split: ``"train"`` (about 80 % of the questions), ``"test"`` or ``"all"``.
        questions: task rows to use instead of the built-in ones (need ``id``, ``prompt``, ``gold_sql``, optional
            ``ordered``).
        db_path: a SQLite file to query instead of Chinook (then pass your own ``questions`` and ``system_prompt``).
        time_limit_s: per-query time limit (tool and reward).
        max_rows: rows the tool shows the model.
        **kwargs: :class:`~toolgym.envs.base.ToolEnv` options (tokenizer, max_turns, ...).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        questions: Sequence[Mapping[str, Any]] | None = None,
        db_path: str | Path | None = None,
        time_limit_s: float = 2.0,
        max_rows: int = 50,
        max_turns: int = 4,
        max_episode_tokens: int = 2048,
        **kwargs: Any,
    ) -> None:
        if split not in ("train", "test", "all"):
            raise ValueError("split must be 'train', 'test' or 'all'")
        self.split = split
        self.db_path = Path(db_path) if db_path is not None else chinook_path()
        rows = list(questions) if questions is not None else chinook_questions(None if split == "all" else split)
        kwargs.setdefault("reward", SQLExecutionMatch(self.db_path, time_limit_s=time_limit_s))
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT.format(schema=SCHEMA_TEXT))
        super().__init__(
            rows,
            [SQLTool(self.db_path, time_limit_s=time_limit_s, max_rows=max_rows)],
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            **kwargs,
        )

    def oracle(self, state: Any) -> str:
        """Run the task's ``gold_sql`` with ``execute_sql``; once it ran without error, answer with that query (the
        call is repeated while it fails and turns remain)."""
        sql = str(state.task["gold_sql"])
        ok = [r for r in self.last_results(state) if r.ok and r.call.name == "execute_sql"]
        if not ok and state.turn < self.max_turns - 1:
            return self.format.parser.format_calls([("execute_sql", {"query": sql})])
        return f"<answer>{ok[0].call.arguments.get('query', sql) if ok else sql}</answer>"
