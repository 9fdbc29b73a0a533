"""Read-only SQLite execution: the ``execute_sql`` tool.

Three independent guards keep a model's SQL harmless:

* the database is opened through a URI with ``mode=ro`` (SQLite itself refuses every write);
* an authorizer (``Connection.set_authorizer``) allows only what a ``SELECT`` needs (read, select, recursive CTE,
  and the functions of an allow-list, :data:`ALLOWED_FUNCTIONS`) and denies everything else -- writes, DDL,
  ``ATTACH``/``DETACH``, ``PRAGMA``, transactions, ``fts3_tokenizer`` and any function not on the list -- with a
  message that names what was refused;
* a progress handler aborts a query that runs past ``time_limit_s`` (e.g. a runaway recursive CTE), and
  ``SQLITE_LIMIT_LENGTH`` caps the size of any string or blob a query can build.

Each call opens a fresh connection (about 50 µs) in a thread of the tool's own lane (:class:`ThreadLane`, as many
threads as ``max_concurrency``, not asyncio's small shared default pool), so concurrent calls never share state,
never block the event loop, and a fast query never queues behind slow ones for a thread (SQLite releases the GIL
while it runs a query; the OS shares the cores). At most ``max_rows`` rows are fetched; the result is a
compact text table.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from toolgym.tools.base import Tool, ToolError, ToolErrorKind
from toolgym.tools.threads import ThreadLane

__all__ = ["ALLOWED_FUNCTIONS", "QueryResult", "SQLError", "SQLTool", "connect_readonly", "format_table", "rows_match", "run_query"]

#: authorizer action codes a plain SELECT needs (functions are checked by name: :data:`ALLOWED_FUNCTIONS`)
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}

#: SQL functions a query may call: SQLite's core scalar, aggregate, window, date/time, math and JSON functions and the
#: FTS auxiliary functions. Anything else is refused by name: ``fts3_tokenizer`` (it returns a library address, and
#: its two-argument form overwrites an internal pointer with bytes the query chooses), ``fts5``,
#: ``load_extension``, ``sqlite_compileoption_*``, testing hooks, functions an extension may add.
ALLOWED_FUNCTIONS = frozenset("""
    -> ->> abs changes char coalesce concat concat_ws format glob hex ifnull iif if instr last_insert_rowid length like
    likelihood likely lower ltrim max min nullif octet_length printf quote random randomblob replace round rtrim
    sign soundex sqlite_version substr substring total_changes trim typeof unhex unicode unlikely upper zeroblob
    avg count group_concat string_agg sum total median percentile percentile_cont percentile_disc
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    date time datetime julianday unixepoch strftime timediff current_date current_time current_timestamp
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log10 log2 mod pi pow power
    radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_error_position json_extract json_insert json_object json_patch json_pretty
    json_quote json_remove json_replace json_set json_type json_valid json_group_array json_group_object json_each
    json_tree jsonb jsonb_array jsonb_extract jsonb_insert jsonb_object jsonb_patch jsonb_remove jsonb_replace
    jsonb_set jsonb_group_array jsonb_group_object
    match bm25 highlight snippet matchinfo offsets
""".split())
_ACTION_NAMES: dict[int, str] = {}
_ACTION_NAMES.update({
    sqlite3.SQLITE_INSERT: "INSERT", sqlite3.SQLITE_UPDATE: "UPDATE", sqlite3.SQLITE_DELETE: "DELETE",
    sqlite3.SQLITE_PRAGMA: "PRAGMA", sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_TRANSACTION: "TRANSACTION", sqlite3.SQLITE_CREATE_TABLE: "CREATE TABLE",
    sqlite3.SQLITE_DROP_TABLE: "DROP TABLE", sqlite3.SQLITE_ALTER_TABLE: "ALTER TABLE",
    sqlite3.SQLITE_CREATE_TEMP_TABLE: "CREATE TEMP TABLE", sqlite3.SQLITE_CREATE_VIEW: "CREATE VIEW",
    sqlite3.SQLITE_CREATE_INDEX: "CREATE INDEX", sqlite3.SQLITE_SAVEPOINT: "SAVEPOINT",
    sqlite3.SQLITE_ANALYZE: "ANALYZE", sqlite3.SQLITE_REINDEX: "REINDEX",
    sqlite3.SQLITE_CREATE_VTABLE: "CREATE VIRTUAL TABLE",
})


class SQLError(Exception):
    """A query that could not run. ``kind`` is ``"refused"``, ``"timeout"`` or ``"error"``."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


@dataclass
class QueryResult:
    """Rows of one query.

    Attributes:
        columns: column names, in SELECT order.
        rows: at most ``max_rows`` row tuples.
        truncated: ``True`` when the query had more rows than were fetched.
        elapsed_s: wall time of execute + fetch, seconds.
    """

    columns: list[str]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    truncated: bool = False
    elapsed_s: float = 0.0


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` read-only (URI ``mode=ro``); raises :class:`SQLError` if it does not exist."""
    path = Path(path)
    if not path.exists():
        raise SQLError(f"database file not found: {path}")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    con = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    return con


def _read_only_authorizer(denied: list[str]) -> Any:
    """A SQLite authorizer that allows reading and the functions of :data:`ALLOWED_FUNCTIONS`; what it denies is
    appended to ``denied`` (for the error message)."""

    def authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action in _ALLOWED:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:  # arg2: the function's name
            if (arg2 or "").lower() in ALLOWED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            denied.append(f"the function {arg2}()")
            return sqlite3.SQLITE_DENY
        what = _ACTION_NAMES.get(action, f"action {action}")
        if action == sqlite3.SQLITE_PRAGMA and arg1:
            what = f"PRAGMA {arg1}"
        denied.append(what)
        return sqlite3.SQLITE_DENY

    return authorizer


def run_query(
    path: str | Path,
    sql: str,
    *,
    time_limit_s: float = 2.0,
    max_rows: int | None = 50,
    max_length: int = 1_000_000,
) -> QueryResult:
    """Run one read-only SQL statement against the SQLite file at ``path``.

    Args:
        path: the database file.
        sql: a single SQL statement (a trailing ``;`` is fine).
        time_limit_s: wall-clock budget in seconds; the progress handler interrupts the query after it.
        max_rows: fetch at most this many rows (``None``: all rows; used for scoring, not for the model).
        max_length: largest string/blob in bytes any expression may build (``SQLITE_LIMIT_LENGTH``).

    Raises:
        SQLError: ``kind="refused"`` for anything but reading (writes, DDL, ATTACH, PRAGMA, transactions),
            ``kind="timeout"`` past the time limit, ``kind="error"`` for syntax errors and the like.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise SQLError("empty query")
    con = connect_readonly(path)
    denied: list[str] = []
    authorizer = _read_only_authorizer(denied)
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    timed_out = False

    def progress() -> int:
        nonlocal timed_out
        if time.perf_counter() > deadline:
            timed_out = True
            return 1
        return 0

    try:
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_length)
        con.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        con.set_authorizer(authorizer)
        con.set_progress_handler(progress, 1000)
        try:
            cur = con.execute(sql)
            columns = [d[0] for d in cur.description] if cur.description else []
            if max_rows is None:
                rows = cur.fetchall()
                truncated = False
            else:
                rows = cur.fetchmany(max_rows + 1)
                truncated = len(rows) > max_rows
                rows = rows[:max_rows]
        except sqlite3.Warning as e:  # "You can only execute one statement at a time."
            raise SQLError(f"{e} Send exactly one SELECT statement per call.") from None
        except (sqlite3.DatabaseError, sqlite3.ProgrammingError, OverflowError, MemoryError) as e:
            if denied:
                raise SQLError(
                    f"refused: {_describe(sql, denied)} is not allowed; the database is read-only and only "
                    "SELECT queries (with WITH / JOIN / subqueries) may run.", "refused",
                ) from None
            if timed_out:
                raise SQLError(
                    f"query stopped: it ran longer than the time limit of {time_limit_s:g} s. "
                    "Simplify it, add a LIMIT, or check for an unbounded recursive CTE.", "timeout",
                ) from None
            msg = str(e)
            if "readonly" in msg or "read-only" in msg:
                raise SQLError(f"refused: {msg}; the database is read-only.", "refused") from None
            raise SQLError(f"SQL error: {msg}") from None
        if not columns:
            raise SQLError("the statement returned no result columns; send a SELECT query.")
        return QueryResult(columns, rows, truncated, time.perf_counter() - t0)
    finally:
        con.close()


_STATEMENTS = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "ATTACH", "DETACH", "PRAGMA",
               "BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "VACUUM", "REINDEX", "ANALYZE")


def _describe(sql: str, denied: list[str]) -> str:
    """A readable name for what the authorizer refused (the statement keyword when there is one)."""
    words = sql.strip().split(None, 2)
    first = words[0].upper() if words else ""
    if denied[0].startswith("the function "):
        return denied[0]
    if first in _STATEMENTS:
        if first in ("CREATE", "DROP") and len(words) > 1:
            return f"{first} {words[1].upper()}"
        return first
    if "pragma" in sql.lower():
        return "PRAGMA"
    return denied[0]


def _cell(v: Any, max_cell_chars: int) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        s = f"{v:.10g}" if abs(v) < 1e15 else repr(v)
    elif isinstance(v, bytes):
        s = f"<{len(v)} bytes>"
    else:
        s = str(v).replace("\n", " ")
    return s if len(s) <= max_cell_chars else s[: max_cell_chars - 1] + "…"


def format_table(result: QueryResult, max_cell_chars: int = 80) -> str:
    """A compact text table: a ``col | col`` header, one line per row, and a row-count footer.

    Example::

        Name | n
        Rock | 1297
        (1 row)
    """
    lines = [" | ".join(result.columns)]
    lines += [" | ".join(_cell(v, max_cell_chars) for v in row) for row in result.rows]
    n = len(result.rows)
    if result.truncated:
        lines.append(f"(showing the first {n} rows; the result has more -- aggregate or add a LIMIT)")
    else:
        lines.append(f"({n} row{'s' if n != 1 else ''})")
    return "\n".join(lines)


class SQLTool(Tool):
    """``execute_sql(query)``: run a read-only SQL query on a SQLite database and see the rows.

    Args:
        db_path: the SQLite file.
        name: tool name (default ``execute_sql``).
        description: shown to the model; a default mentions SQLite and the limits.
        time_limit_s: per-query time limit in seconds (progress handler).
        max_rows: rows shown to the model.
        max_cell_chars: longest cell text shown.
        timeout_s: the executor's timeout for the call (a little above ``time_limit_s``).
        max_concurrency: queries running at once; each has its own thread of the tool's lane.

    Errors are raised as :class:`ToolError`: refused statements and SQL errors as ``exception`` (with the
    reason), queries stopped by the time limit as ``timeout``.
    """

    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "one SQLite SELECT statement"}},
        "required": ["query"],
    }

    def __init__(
        self,
        db_path: str | Path,
        *,
        name: str = "execute_sql",
        description: str | None = None,
        time_limit_s: float = 2.0,
        max_rows: int = 50,
        max_cell_chars: int = 80,
        timeout_s: float | None = None,
        max_concurrency: int | None = 64,
    ) -> None:
        self.db_path = Path(db_path)
        self.name = name
        self.time_limit_s = time_limit_s
        self.max_rows = max_rows
        self.max_cell_chars = max_cell_chars
        self.timeout_s = timeout_s if timeout_s is not None else time_limit_s + 5.0
        self.max_concurrency = max_concurrency
        self._lane = ThreadLane(name, max_workers=max_concurrency or 64)
        self.description = description or (
            f"Run one read-only SQLite SELECT query on the database and return the result rows as a table "
            f"(at most {max_rows} rows; queries are stopped after {time_limit_s:g} s)."
        )

    def run(self, query: str) -> QueryResult:
        """Run ``query`` synchronously (raises :class:`SQLError`)."""
        return run_query(self.db_path, query, time_limit_s=self.time_limit_s, max_rows=self.max_rows)

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str):
            raise ToolError("argument 'query' must be a string", kind=ToolErrorKind.INVALID_ARGUMENTS)
        try:
            result = await self._lane.run(self.run, query)
        except SQLError as e:
            kind = ToolErrorKind.TIMEOUT if e.kind == "timeout" else ToolErrorKind.EXCEPTION
            raise ToolError(e.message, kind=kind) from None
        return format_table(result, self.max_cell_chars)


def rows_match(
    predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]], *, ordered: bool = False,
    abs_tol: float = 1e-2, rel_tol: float = 1e-6,
) -> bool:
    """Execution-accuracy comparison of two result sets.

    Rows are compared as tuples (column names ignored); numbers are equal within ``abs_tol``/``rel_tol``
    (``5 == 5.0``, sums that differ only by float rounding match); ``ordered=False`` compares them as multisets.
    When the column counts agree (at most 4 columns) a permutation of the predicted columns is also accepted,
    so ``SELECT name, n`` matches ``SELECT n, name``.
    """
    import itertools
    import math

    if len(predicted) != len(gold):
        return False
    if not gold:
        return True
    ncols = len(gold[0])
    if any(len(r) != ncols for r in predicted) or any(len(r) != ncols for r in gold):
        return False

    def eq(a: Any, b: Any) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
        if isinstance(a, str) and isinstance(b, str):
            return a.strip() == b.strip()
        return a == b

    def key(row: Sequence[Any]) -> tuple:
        return tuple((0, round(float(v), 1), "") if isinstance(v, (int, float)) else
                     (1, 0.0, "" if v is None else str(v).strip()) for v in row)

    def row_eq(pr: Sequence[Any], gr: Sequence[Any]) -> bool:
        return all(eq(a, b) for a, b in zip(pr, gr, strict=True))

    def same(p: Sequence[Sequence[Any]], g: Sequence[Sequence[Any]]) -> bool:
        if ordered:
            return all(row_eq(pr, gr) for pr, gr in zip(p, g, strict=True))
        if all(row_eq(pr, gr) for pr, gr in zip(sorted(p, key=key), sorted(g, key=key), strict=True)):
            return True
        if len(g) > 500:  # sorting is exact unless numbers straddle a rounding edge; greedy match below
            return False
        left = list(p)
        for gr in g:
            i = next((i for i, pr in enumerate(left) if row_eq(pr, gr)), None)
            if i is None:
                return False
            left.pop(i)
        return True

    perms = itertools.permutations(range(ncols)) if ncols <= 4 else [tuple(range(ncols))]
    for perm in perms:
        p = [tuple(r[i] for i in perm) for r in predicted]
        if same(p, gold):
            return True
    return False
