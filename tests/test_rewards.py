"""Rewards: rules on edge cases, tool verification, combine weights, concurrency, per-turn rewards in a real env."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from toolgym.rewards import (
    F1,
    AnswerFormat,
    Combine,
    ExactMatch,
    NumericMatch,
    Reward,
    Score,
    ToolCallFormat,
    ToolVerified,
    answer_format,
    exact_match,
    f1_score,
    normalize_answer,
    numeric_match,
    outcome_score,
    parse_number,
    score_batch,
)
from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind, ToolResult
from toolgym.trajectory import Trajectory, Turn


def traj(final_text: str, task: dict | None = None, turns: list[Turn] | None = None) -> Trajectory:
    t = Trajectory(prompt_ids=[1], task=task or {})
    t.turns.extend(turns or [])
    t.turns.append(Turn(index=len(t.turns), action_start=0, action_end=1, text=final_text, content=final_text))
    return t


# --------------------------------------------------------------------------------------------------------- rules
def test_normalize_answer_is_squad():
    assert normalize_answer("  The  Eiffel-Tower!! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


@pytest.mark.parametrize(
    ("pred", "golds", "expected"),
    [
        ("Paris", ["paris"], 1.0),
        ("the Paris.", "Paris", 1.0),
        ("Paris, France", ["Paris"], 0.0),
        ("Lyon", ["Paris", "Lyon"], 1.0),  # any gold
        ("Paris", [], 0.0),
        ("Paris", None, 0.0),
        ("", [""], 1.0),
        ("42", [42], 1.0),  # non-string golds are compared as text
        ("b", np.array(["a", "b"]), 1.0),  # numpy arrays (HF datasets) work
    ],
)
def test_exact_match(pred, golds, expected):
    assert exact_match(pred, golds) == expected


def test_f1_edge_cases():
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)  # p=1, r=2/3
    assert f1_score("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # duplicates counted once each
    assert f1_score("dog", ["cat", "dog house"]) == pytest.approx(2 / 3)  # best gold
    assert f1_score("", [""]) == 1.0 and f1_score("", ["cat"]) == 0.0 and f1_score("a", ["cat"]) == 0.0
    assert f1_score("anything", []) == 0.0
    assert f1_score("Cat!", "the cat") == 1.0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42.0),
        ("1,234,567", 1234567.0),
        ("$5.50", 5.5),
        ("-3", -3.0),
        ("−3", -3.0),  # unicode minus
        ("3/4", 0.75),
        ("50%", 50.0),
        ("1e3", 1000.0),
        (".5", 0.5),
        ("so the answer is 7 apples, not 6. It is 12.", 12.0),  # last number
        ("\\boxed{17} and 4", 17.0),
        (7, 7.0),
        (2.5, 2.5),
        ("no digits", None),
        ("", None),
        (True, None),
        (float("nan"), None),
        (float("inf"), None),
        ("1/0", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_numeric_match_tolerances():
    assert numeric_match("1,234", ["1234"]) == 1.0
    assert numeric_match("The total is $1,234.00.", 1234) == 1.0
    assert numeric_match("100.005", 100, rel_tol=1e-4) == 1.0
    assert numeric_match("100.02", 100, rel_tol=1e-4, abs_tol=0) == 0.0
    assert numeric_match("0.0000005", 0, rel_tol=0, abs_tol=1e-6) == 1.0
    assert numeric_match("0.00002", 0, rel_tol=0.5, abs_tol=1e-6) == 0.0  # relative tol is useless near 0
    assert numeric_match("0.75", ["3/4"]) == 1.0
    assert numeric_match("seven", 7) == 0.0
    assert numeric_match("7", ["n/a", "7.0"]) == 1.0
    assert numeric_match("7", []) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thinking... <answer>Paris</answer>", 1.0),
        ("<answer> Paris </answer>", 1.0),
        ("<answer></answer>", 0.0),
        ("<answer>  </answer>", 0.0),
        ("Paris", 0.0),
        ("<answer>Paris", 0.0),
        ("<answer>a</answer><answer>b</answer>", 0.0),
        ("<answer>a</answer></answer>", 0.0),
        ("<answer><answer>a</answer>", 0.0),
    ],
)
def test_answer_format(text, expected):
    assert answer_format(text) == expected


async def test_rule_rewards_read_the_trajectory_and_task():
    task = {"golden_answers": ["Paris", "City of Light"], "answer": "12"}
    t = traj("I think <answer>the city of light</answer>", task)
    assert (await ExactMatch().outcome(t, task)).value == 1.0
    assert (await F1().outcome(traj("<answer>Paris France</answer>"), task)).value == pytest.approx(2 / 3)
    assert (await NumericMatch().outcome(traj("<answer>12.00001</answer>"), task)).value == 1.0
    assert (await NumericMatch(abs_tol=0, rel_tol=0).outcome(traj("<answer>12.00001</answer>"), task)).value == 0.0
    assert (await AnswerFormat(0.5).outcome(t, task)).value == 0.5
    assert (await AnswerFormat().outcome(traj("Paris"), task)).value == 0.0
    em = ExactMatch(field="missing")
    assert await em.outcome(t, task) == Score(0.0, {"exact_match/missing_gold": 1.0})
    custom = ExactMatch(prediction=lambda tr: tr.final_text)  # raw text instead of the <answer> content
    assert (await custom.outcome(traj("Paris"), task)).value == 1.0


def _turn(index: int, calls: list[ToolCall], kinds: list[ToolErrorKind | None]) -> Turn:
    t = Turn(index=index, action_start=0, action_end=1, calls=calls)
    t.results = [ToolResult(c, "out", k) for c, k in zip(calls, kinds, strict=True)]
    return t


async def test_tool_call_format_per_turn():
    r = ToolCallFormat(ok=0.1)
    ok = _turn(0, [ToolCall("calc", {"x": 1}), ToolCall("calc", {"x": 2})], [None, None])
    bad = _turn(
        1,
        [ToolCall("", parse_error="bad json"), ToolCall("nope"), ToolCall("calc")],
        [ToolErrorKind.PARSE_ERROR, ToolErrorKind.UNKNOWN_TOOL, None],
    )
    slow = _turn(2, [ToolCall("calc")], [ToolErrorKind.TIMEOUT])
    none = Turn(index=3, action_start=0, action_end=1)
    t = Trajectory(prompt_ids=[1])
    good = await r.turn(ok, t, {})
    assert good.value == pytest.approx(0.1) and good.components == {}
    wrong = await r.turn(bad, t, {})
    assert wrong.value == pytest.approx(-0.4)
    assert wrong.components == {"tool_call_format/parse_error": 1.0, "tool_call_format/unknown_tool": 1.0}
    assert (await r.turn(slow, t, {})).value == 0.0
    assert (await r.turn(none, t, {})).value == 0.0
    custom = ToolCallFormat(ok=1.0, penalties={ToolErrorKind.TIMEOUT: -2.0}, default_penalty=-0.5)
    assert (await custom.turn(slow, t, {})).value == -2.0
    assert (await custom.turn(bad, t, {})).value == -1.0  # two kinds not in the table: -0.5 each


# ------------------------------------------------------------------------------------------------------- combine
class Slow(Reward):
    def __init__(self, value: float, delay: float, name: str) -> None:
        self.value, self.delay, self.name = value, delay, name

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
        await asyncio.sleep(self.delay)
        return self.value


async def test_combine_weights_and_components():
    task = {"golden_answers": ["Paris"]}
    t = traj("<answer>Paris city</answer>", task)

    def length_penalty(trajectory, task):
        return -len(trajectory.answer) / 100

    combo = Combine({ExactMatch(): 2.0, F1(): 0.5, length_penalty: 1.0, ExactMatch(field="other"): 3.0})
    value, comps = await combo.outcome(t, task)
    f1 = 2 * 0.5 * 1 / 1.5
    assert value == pytest.approx(2.0 * 0.0 + 0.5 * f1 - len("Paris city") / 100 + 3.0 * 0.0)
    assert comps["exact_match"] == 0.0 and comps["f1"] == pytest.approx(f1)
    assert comps["length_penalty"] == pytest.approx(-0.1)
    assert comps["exact_match_2"] == 0.0 and comps["exact_match/missing_gold"] == 1.0
    assert combo.weights == {"exact_match": 2.0, "f1": 0.5, "length_penalty": 1.0, "exact_match_2": 3.0}
    assert not combo.per_turn and Combine([(ToolCallFormat(), 1.0)]).per_turn
    with pytest.raises(ValueError):
        Combine({})


async def test_combine_runs_children_concurrently():
    combo = Combine({Slow(1.0, 0.3, "a"): 1.0, Slow(2.0, 0.3, "b"): 1.0, Slow(3.0, 0.3, "c"): 1.0})
    t0 = time.monotonic()
    assert (await combo.outcome(traj("x"), {})).value == 6.0
    assert time.monotonic() - t0 < 0.75  # far less than the 0.9 s sequential sum


class EchoComponents(Reward):
    """Reports the trajectory's own answer in its components after a random-ish delay."""

    name = "echo"

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        n = int(trajectory.answer)
        await asyncio.sleep(0.001 * (n % 7))
        return Score(float(n), {"echo/n": float(n)})


async def test_score_batch_is_concurrent_and_components_stay_per_trajectory():
    trajs = [traj(f"<answer>{i}</answer>", {"golden_answers": [str(i % 3)]}) for i in range(40)]
    combo = Combine({EchoComponents(): 1.0, ExactMatch(): 10.0})
    results = await score_batch(combo, trajs)
    for i, (value, comps) in enumerate(results):
        em = float(str(i) == str(i % 3))
        assert value == pytest.approx(i + 10 * em)
        assert comps["echo/n"] == float(i) and comps["exact_match"] == em
    slow = await asyncio.gather(score_batch(Slow(1.0, 0.3, "s"), trajs[:10]))
    assert [v for v, _ in slow[0]] == [1.0] * 10
    with pytest.raises(ValueError):
        await score_batch(combo, trajs, tasks=[{}])


async def test_score_of_is_the_one_coercion_of_a_plain_number():
    """A user reward may return a number: it becomes Score(value, {}) (no components, as before Score existed);
    Combine merges it with the Score children; anything else is a TypeError naming the reward."""

    class PlainFloat(Reward):
        name = "plain"

        async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
            return np.float32(0.25)  # type: ignore[return-value]

    assert Score.of(1) == Score(1.0, {}) and type(Score.of(True).value) is float
    assert Score.of(np.array(0.5)) == Score(0.5, {})
    same = Score(2.0, {"a": 1.0})
    assert Score.of(same) == same and Score.of(same).components is not same.components
    value, comps = same
    assert (value, comps) == (2.0, {"a": 1.0}) and float(same) == 2.0
    combo = Combine({PlainFloat(): 2.0, ExactMatch(field="missing"): 1.0, (lambda t, k: 3): 1.0})
    got = await combo.outcome(traj("x"), {})
    assert got == Score(3.5, {"plain": 0.25, "exact_match": 0.0, "exact_match/missing_gold": 1.0, "<lambda>": 3.0})
    assert await outcome_score(PlainFloat(), traj("x"), {}) == Score(0.25, {})

    def broken(trajectory, task):
        return "1.0"

    with pytest.raises(TypeError, match="must return a Score or a number, got str from <function"):
        await score_batch(broken, [traj("x")])


async def test_outcome_score_across_loops():
    """Components survive a hop to toolgym's runtime loop when read inside the same task."""
    from toolgym import runtime

    em = ExactMatch(field="missing")
    value, comps = await runtime.run_async(outcome_score(em, traj("x"), {}))
    assert value == 0.0 and comps == {"exact_match/missing_gold": 1.0}


# ------------------------------------------------------------------------------------------------ tool-verified
class SQLiteTool(Tool):
    """A small read-only SQL tool over an in-memory database (a real sqlite3 engine)."""

    name = "execute_sql"
    description = "Run a read-only SQL query."

    def __init__(self) -> None:
        self.parameters = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
        self.calls = 0

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        self.calls += 1
        con = sqlite3.connect(":memory:")
        try:
            con.executescript("CREATE TABLE t(name TEXT, n INT);INSERT INTO t VALUES ('a', 1), ('b', 2), ('c', 3);")
            if not arguments["query"].lstrip().lower().startswith("select"):
                raise ToolError("only SELECT is allowed", kind=ToolErrorKind.INVALID_ARGUMENTS)
            try:
                rows = con.execute(arguments["query"]).fetchall()
            except sqlite3.Error as e:
                raise ToolError(f"SQL error: {e}") from e
            return json.dumps(rows)
        finally:
            con.close()


def same_rows_any_order(pred: str, gold: str, task: Mapping[str, Any]) -> float:
    p, g = json.loads(pred), json.loads(gold)
    if task.get("ordered"):
        return float(p == g)
    return float(sorted(map(tuple, p)) == sorted(map(tuple, g)))


async def test_tool_verified_compares_sql_results():
    tool = SQLiteTool()
    r = ToolVerified.compare_tool(tool, argument="query", gold_field="gold_sql", compare=same_rows_any_order)
    task = {"gold_sql": "SELECT name FROM t WHERE n >= 2 ORDER BY n"}
    good = traj("<answer>SELECT name FROM t WHERE n > 1 ORDER BY name DESC</answer>", task)
    assert await r.outcome(good, task) == Score(1.0, {})
    assert (await r.outcome(good, {**task, "ordered": True})).value == 0.0  # order matters when the question orders
    wrong = traj("<answer>SELECT name FROM t</answer>", task)
    assert await r.outcome(wrong, task) == Score(0.0, {})
    broken_sql = traj("<answer>SELEC name FRM t</answer>", task)
    assert await r.outcome(broken_sql, task) == Score(0.0, {})  # a wrong answer, not a failure
    # a broken *gold* is a verifier failure, classified
    bad_gold = {"gold_sql": "DROP TABLE t"}
    assert await r.outcome(good, bad_gold) == Score(0.0, {"verified_execute_sql/error/invalid_arguments": 1.0})
    assert r.name == "verified_execute_sql" and r.failures == {"invalid_arguments": 1}


async def test_tool_verified_failures_are_classified():
    def sync_check(pred, task):
        if pred == "boom":
            raise RuntimeError("verifier bug")
        return pred == task["gold"]

    r = ToolVerified(sync_check, failure_score=-1.0)
    task = {"gold": "yes"}
    assert (await r.outcome(traj("yes"), task)).value == 1.0
    assert (await r.outcome(traj("no"), task)).value == 0.0
    assert await r.outcome(traj("boom"), task) == Score(-1.0, {"verified/error/exception": 1.0})

    async def hang(pred, task):
        await asyncio.sleep(10)
        return 1.0

    slow = ToolVerified(hang, timeout_s=0.1)
    t0 = time.monotonic()
    assert await slow.outcome(traj("x"), task) == Score(0.0, {"verified/error/timeout": 1.0})
    assert time.monotonic() - t0 < 2


async def test_tool_verified_concurrency_cap():
    active = 0
    peak = 0

    async def check(pred, task):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return 1.0

    r = ToolVerified(check, max_concurrency=3)
    values = await asyncio.gather(*(r.outcome(traj(str(i)), {}) for i in range(10)))
    assert values == [Score(1.0)] * 10 and peak == 3


# ------------------------------------------------------------------------------------- per-turn in a real ToolEnv
def test_per_turn_rewards_reach_the_step_reward_and_trajectory():
    from toolgym.envs.base import ToolEnv
    from toolgym.format.parsers import get_parser
    from toolgym.tools.function import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first number.
            b: second number.
        """
        return a + b

    reward = Combine({ToolCallFormat(ok=0.25): 1.0, ExactMatch(field="answer"): 2.0, AnswerFormat(): 0.5})
    env = ToolEnv([{"id": "t0", "prompt": "What is 2 + 3?", "answer": "5"}], [add], reward=reward, max_turns=4)
    hermes = get_parser("hermes")
    env.reset(seed=0)
    step_rewards = []
    script = [
        hermes.format_calls([("add", {"a": 2, "b": 3})]),  # ok: +0.25
        hermes.format_calls([("subtract", {"a": 2, "b": 3})]),  # unknown tool: -0.2
        "<tool_call>{not json</tool_call>",  # parse error: -0.2
        "<answer>5</answer>",  # outcome: 2 * 1 + 0.5 * 1
    ]
    info: dict = {}
    for text in script:
        _, r, terminated, truncated, info = env.step(env.encode_action(text))
        step_rewards.append(r)
        if terminated or truncated:
            break
    t: Trajectory = info["trajectory"]
    assert t.turn_rewards == pytest.approx([0.25, -0.2, -0.2, 0.0])
    assert t.outcome_reward == pytest.approx(2.5)
    assert step_rewards == pytest.approx([0.25, -0.2, -0.2, 2.5])
    assert t.reward == pytest.approx(sum(step_rewards))
    assert t.turns[1].reward_components["tool_call_format/unknown_tool"] == 1.0
    assert t.turns[2].reward_components["tool_call_format/parse_error"] == 1.0
    assert t.reward_components["exact_match"] == 1.0 and t.reward_components["answer_format"] == 1.0
    env.close()
