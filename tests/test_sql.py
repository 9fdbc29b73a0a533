"""toolgym/SQL-v0: Chinook data, the read-only execute_sql tool, execution-accuracy reward, oracle episodes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time

import gymnasium as gym
import pytest

import toolgym  # noqa: F401 - registers the envs
from toolgym.data.chinook import chinook_path, chinook_questions
from toolgym.envs.sql import SQLEnv, SQLExecutionMatch, execution_match, final_sql
from toolgym.format.parsers import get_parser
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.sql import SQLError, SQLTool, rows_match, run_query

TABLES = {"Album": 347, "Artist": 275, "Customer": 59, "Employee": 8, "Genre": 25, "Invoice": 412,
          "InvoiceLine": 2240, "MediaType": 5, "Playlist": 18, "PlaylistTrack": 8715, "Track": 3503}


def _digest() -> str:
    return hashlib.sha256(chinook_path().read_bytes()).hexdigest()


# -- data -----------------------------------------------------------------------------------------------
def test_chinook_has_the_eleven_tables_with_their_row_counts():
    con = sqlite3.connect(f"{chinook_path().as_uri()}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names == set(TABLES)
    for t, n in TABLES.items():
        assert con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] == n
    con.close()


def test_questions_are_many_deterministic_stable_and_split():
    qs = chinook_questions()
    assert len(qs) >= 300
    ids = [q["id"] for q in qs]
    assert len(set(ids)) == len(ids)
    train, test = chinook_questions("train"), chinook_questions("test")
    assert len(train) + len(test) == len(qs)
    assert 0.1 < len(test) / len(qs) < 0.3
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    # stable ids: derived from template + parameters only
    year = hashlib.sha1(json.dumps({"year": "2009"}, sort_keys=True).encode()).hexdigest()[:10]
    by_id = {q["id"]: q for q in qs}
    assert by_id[f"year_invoice_count:{year}"]["question"] == "How many invoices were issued in the year 2009?"
    # every kind of question is represented
    sqls = " ".join(q["gold_sql"] for q in qs)
    for kw in ("JOIN", "COUNT(", "SUM(", "AVG(", "ORDER BY", "DISTINCT", "strftime", "LIMIT", "GROUP BY"):
        assert kw in sqls
    assert any(q["ordered"] for q in qs) and not all(q["ordered"] for q in qs)
    with pytest.raises(ValueError):
        chinook_questions("dev")


# -- the tool -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sql", "what"),
    [
        ("INSERT INTO Genre (GenreId, Name) VALUES (99, 'x')", "INSERT"),
        ("UPDATE Track SET Name = 'x'", "UPDATE"),
        ("DELETE FROM Invoice", "DELETE"),
        ("DROP TABLE Track", "DROP TABLE"),
        ("CREATE TABLE t (x)", "CREATE TABLE"),
        ("CREATE TEMP TABLE t (x)", "CREATE TEMP"),
        ("ATTACH DATABASE '/tmp/toolgym-evil.db' AS evil", "ATTACH"),
        ("PRAGMA table_info(Track)", "PRAGMA"),
        ("PRAGMA writable_schema = 1", "PRAGMA"),
        ("SELECT * FROM pragma_table_info('Track')", "PRAGMA"),
        ("BEGIN", "BEGIN"),
        ("VACUUM", "VACUUM"),
        ("WITH x AS (SELECT 1) DELETE FROM Track", "DELETE"),
    ],
)
async def test_writes_attach_and_pragma_are_refused_with_a_clear_error(sql, what):
    before = _digest()
    ex = ToolExecutor([SQLTool(chinook_path())])
    res = await ex.run(ToolCall("execute_sql", {"query": sql}, id="c0"))
    assert res.error_kind is ToolErrorKind.EXCEPTION
    assert f"refused: {what}" in res.content and "read-only" in res.content
    with pytest.raises(SQLError) as e:
        run_query(chinook_path(), sql)
    assert e.value.kind == "refused"
    assert _digest() == before


async def test_runaway_recursive_cte_is_stopped_by_the_time_limit():
    tool = SQLTool(chinook_path(), time_limit_s=0.3)
    ex = ToolExecutor([tool])
    t0 = time.perf_counter()
    res = await ex.run(ToolCall("execute_sql", {
        "query": "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"}))
    assert res.error_kind is ToolErrorKind.TIMEOUT
    assert "time limit of 0.3 s" in res.content
    assert time.perf_counter() - t0 < 10  # stopped by the progress handler, not left running
    # a huge cross join is stopped too, and the tool still works afterwards
    res = await ex.run(ToolCall("execute_sql", {
        "query": "SELECT COUNT(*) FROM Track a, Track b, Track c WHERE a.Name || b.Name || c.Name = 'x'"}))
    assert res.error_kind is ToolErrorKind.TIMEOUT
    ok = await ex.run(ToolCall("execute_sql", {"query": "SELECT COUNT(*) AS n FROM Genre"}))
    assert ok.ok and ok.content.splitlines() == ["n", "25", "(1 row)"]


async def test_row_limit_errors_and_concurrency():
    ex = ToolExecutor([SQLTool(chinook_path(), max_rows=10)])
    res = await ex.run(ToolCall("execute_sql", {"query": "SELECT TrackId, Name FROM Track ORDER BY TrackId"}))
    lines = res.content.splitlines()
    assert res.ok and lines[0] == "TrackId | Name" and len(lines) == 1 + 10 + 1
    assert lines[1].startswith("1 | For Those About To Rock") and "has more" in lines[-1]
    bad = await ex.run(ToolCall("execute_sql", {"query": "SELEC 1"}))
    assert bad.error_kind is ToolErrorKind.EXCEPTION and "syntax error" in bad.content
    two = await ex.run(ToolCall("execute_sql", {"query": "SELECT 1; SELECT 2"}))
    assert two.error_kind is ToolErrorKind.EXCEPTION and "one statement" in two.content
    missing = await ex.run(ToolCall("execute_sql", {"sql": "SELECT 1"}))
    assert missing.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    many = await ex.run_many([ToolCall("execute_sql", {"query": f"SELECT {i} + COUNT(*) FROM Genre"})
                              for i in range(32)])
    assert [r.content.splitlines()[1] for r in many] == [str(25 + i) for i in range(32)]


def test_rows_match_rules():
    assert rows_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")])
    assert not rows_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=True)
    assert rows_match([("a", 1)], [(1, "a")])  # column permutation
    assert rows_match([(5,)], [(5.0,)]) and rows_match([(1.0000001,)], [(1.0,)])
    assert not rows_match([(1,)], [(1,), (1,)])  # multiset, not set
    assert not rows_match([(1, 2)], [(1,)])
    assert not rows_match([(2.5,)], [(2.6,)])


# -- reward: the oracle scores 1.0 on every question -------------------------------------------------------
async def test_oracle_gold_sql_scores_one_on_every_question_and_wrong_sql_scores_zero():
    qs = chinook_questions()
    reward = SQLExecutionMatch()
    scores = [s.value for s in await asyncio.gather(*(reward.check(q["gold_sql"], q) for q in qs))]
    assert [q["id"] for q, s in zip(qs, scores, strict=True) if s != 1.0] == []
    # the score can fail: another question's gold SQL whose result differs, an empty answer, a write -> 0
    path = str(chinook_path())
    pairs = []
    for i, q in enumerate(qs[::4]):
        gold = run_query(path, q["gold_sql"], max_rows=None).rows
        for other in qs[i + 1:] + qs[:i]:
            if run_query(path, other["gold_sql"], max_rows=None).rows != gold:
                pairs.append((other["gold_sql"], q))
                break
    wrong = [s.value for s in await asyncio.gather(*(reward.check(sql, q) for sql, q in pairs))]
    assert len(pairs) == len(qs[::4]) and sum(wrong) == 0
    assert (await reward.check("", qs[0])).value == 0.0
    assert (await reward.check("DELETE FROM Track", qs[0])).value == 0.0


def test_order_sensitivity_follows_the_question():
    ordered = next(q for q in chinook_questions() if q["ordered"] and q["template"] == "top_artists_by_tracks")
    reversed_sql = f"SELECT * FROM ({ordered['gold_sql']}) ORDER BY 2 ASC, 1 DESC"
    assert execution_match(ordered["gold_sql"], ordered["gold_sql"], ordered=True)
    assert not execution_match(reversed_sql, ordered["gold_sql"], ordered=True)
    unordered = next(q for q in chinook_questions() if q["template"] == "country_customers"
                     and "USA" in q["question"])
    shuffled = unordered["gold_sql"] + " ORDER BY LastName DESC"
    assert execution_match(shuffled, unordered["gold_sql"], ordered=False)
    # an equivalent but differently written query matches (execution accuracy, not string match)
    assert execution_match("SELECT COUNT(*) FROM Customer WHERE Country IN ('USA')",
                           "SELECT COUNT(*) FROM Customer WHERE Country = 'USA'")


# -- full env episodes ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env():
    e = gym.make("toolgym/SQL-v0", split="test")
    yield e
    e.close()


def _episode(env, task, turns):
    env.reset(seed=0, options={"task": task})
    for i, text in enumerate(turns):
        _obs, reward, terminated, truncated, info = env.step(env.unwrapped.encode_action(text))
        if terminated or truncated:
            assert i == len(turns) - 1
            return reward, info
    raise AssertionError("episode did not end")


def test_oracle_episodes_through_the_env(env):
    parser = get_parser("hermes")
    tasks = chinook_questions("test")[:4]
    for task in tasks:
        call = parser.format_calls([("execute_sql", {"query": task["gold_sql"]})])
        reward, info = _episode(env, task, [call, f"<answer>{task['gold_sql']}</answer>"])
        traj = info["trajectory"]
        assert reward == 1.0 and traj.outcome_reward == 1.0
        assert traj.turns[0].results[0].ok and "row" in traj.turns[0].results[0].content
        assert final_sql(traj) == task["gold_sql"]
    # a wrong final answer scores 0; a refused write shows up as an error observation and also scores 0
    task = tasks[0]
    reward, info = _episode(env, task, [parser.format_calls([("execute_sql", {"query": "DROP TABLE Track"})]),
                                        "<answer>```sql\nSELECT 'nope'\n```</answer>"])
    assert reward == 0.0
    assert info["trajectory"].turns[0].results[0].error_kind is ToolErrorKind.EXCEPTION
    assert final_sql(info["trajectory"]) == "SELECT 'nope'"
    # no <answer>: the last execute_sql query is the final SQL
    reward, info = _episode(env, task, [parser.format_calls([("execute_sql", {"query": task["gold_sql"]})]),
                                        "I ran the query above."])
    assert reward == 1.0
    prompt = info["trajectory"].messages[0]["content"]
    assert "InvoiceLine(" in prompt and "<answer>" in prompt


def test_splits_and_custom_questions():
    env = SQLEnv(split="all", questions=[{"id": "q1", "prompt": "How many genres?",
                                          "gold_sql": "SELECT COUNT(*) FROM Genre"}])
    obs, info = env.reset(seed=1)
    assert info["task"]["id"] == "q1" and len(obs) > 100
    reward, _ = _episode(env, info["task"], ["<answer>SELECT 25</answer>"])
    assert reward == 1.0
    env.close()
    with pytest.raises(ValueError):
        SQLEnv(split="dev")
