"""Every built-in env has an oracle (``env.oracle(state)``) that solves its held-out tasks through the real tools.

Each runs through :class:`~toolgym.rollout.RolloutDriver` + ``ScriptedPolicy(lambda s: s.env.oracle(s))`` on test
split tasks (real BM25 retriever, real subprocess sandbox, real SQLite, a real MCP server over stdio), and the
answers must come from the tool results: an oracle whose tool result is withheld does not score.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import toolgym  # noqa: F401 - registers the envs
from toolgym.data.chinook import chinook_questions
from toolgym.envs.base import ToolEnv
from toolgym.envs.search import load_tasks as search_tasks
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy
from toolgym.tools.python import SandboxLimits
from toolgym.trajectory import Trajectory

N_TASKS = 24


def oracle(state: EpisodeState) -> str:
    return state.env.oracle(state)


def _spread(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` distinct rows chosen reproducibly (seed 0)."""
    idx = np.random.default_rng(0).permutation(len(rows))[:n]
    return [rows[int(i)] for i in sorted(idx)]


def _run(env_id: str, rows: list[dict[str, Any]] | list[None], num_envs: int = 4, **env_kwargs: Any) -> list[Trajectory]:
    driver = RolloutDriver(env_id, ScriptedPolicy(oracle), max_turn_tokens=256, num_envs=num_envs,
                           env_kwargs={"split": "test", **env_kwargs} if env_id != "toolgym/MCP-v0" else env_kwargs)
    try:
        return driver.run(rows, seeds=list(range(len(rows))))
    finally:
        driver.venv.close()


def _check(trajs: list[Trajectory], n: int) -> float:
    assert len(trajs) == n
    success = float(np.mean([t.outcome_reward >= 1.0 for t in trajs]))
    for t in trajs:
        assert t.tool_calls, "the oracle must use the env's tool"
        assert t.terminated and t.drift == {}
        assert all(r.ok for r in t.tool_results), [r.content for r in t.tool_results]
    return success


@pytest.mark.timeout(300)
def test_calculator_oracle_solves_test_tasks():
    trajs = _run("toolgym/Calculator-v0", [None] * N_TASKS)  # seeded draws from the (procedural) test split
    assert len({t.task["id"] for t in trajs}) >= N_TASKS - 2
    assert all(t.task["split"] == "test" for t in trajs)
    assert _check(trajs, N_TASKS) >= 0.95
    for t in trajs:  # the answer is what the calculator returned
        assert t.answer == t.tool_results[-1].content.strip()


@pytest.mark.timeout(300)
def test_search_oracle_solves_one_and_two_hop_test_tasks():
    rows = _spread([r for r in search_tasks(split="test") if r["hops"] == 1], N_TASKS // 2)
    rows += _spread([r for r in search_tasks(split="test") if r["hops"] == 2], N_TASKS // 2)
    trajs = _run("toolgym/Search-v0", rows)
    assert _check(trajs, len(rows)) >= 0.95
    for t in trajs:
        assert len(t.tool_calls) == t.task["hops"]  # two-hop: the bridge country was read and searched
        if t.task["hops"] == 2:
            assert t.tool_calls[0].arguments["query"] == t.task["entity"]
            assert t.tool_calls[1].arguments["query"] == t.task["bridge"]  # read from the first results


@pytest.mark.timeout(300)
def test_search_oracle_on_rows_without_geo_fields_answers_from_the_results():
    rows = [{"id": f"q{i}", "question": r["question"], "golden_answers": r["golden_answers"]}
            for i, r in enumerate(_spread([r for r in search_tasks(split="test") if r["hops"] == 1], 8))]
    trajs = _run("toolgym/Search-v0", rows, num_envs=2)
    for t in trajs:
        assert t.tool_calls[0].arguments["query"] == t.task["question"]
        if t.outcome_reward:  # a gold answer is only given when the retrieved passages contain it
            assert t.answer.lower() in t.tool_results[0].content.lower()
    assert sum(t.outcome_reward for t in trajs) >= 1


@pytest.mark.timeout(300)
def test_sql_oracle_solves_test_questions():
    rows = _spread(chinook_questions("test"), N_TASKS)
    trajs = _run("toolgym/SQL-v0", rows)
    assert _check(trajs, len(rows)) >= 0.95
    for t, row in zip(trajs, rows, strict=True):
        assert t.tool_calls[0].name == "execute_sql" and t.tool_calls[0].arguments["query"] == row["gold_sql"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_python_oracle_solves_test_problems_in_the_sandbox():
    trajs = _run("toolgym/Python-v0", [None] * N_TASKS, num_envs=4, pool_size=2,
                 limits=SandboxLimits(wall_s=20.0))
    assert _check(trajs, N_TASKS) >= 0.95
    assert all(t.task["split"] == "test" for t in trajs)
    for t in trajs:  # the program ran in the sandbox and its printed result is the answer
        assert t.tool_calls[0].arguments["code"] == t.task["solution"]
        assert t.answer == t.tool_results[-1].content.strip().splitlines()[-1]


@pytest.mark.timeout(300)
def test_chart_oracle_solves_test_tasks_from_the_zoomed_images():
    trajs = _run("toolgym/Chart-v0", [None] * N_TASKS)
    assert _check(trajs, N_TASKS) == 1.0
    for t in trajs:  # every value was zoomed into (an image came back); the answer is the calculator's result
        zooms = [r for r in t.tool_results if r.call.name == "zoom"]
        assert len(zooms) == len(t.task["needed"]) and all(len(r.images) == 1 for r in zooms)
        assert t.answer == t.tool_results[-1].content.strip()


def test_word_problem_solutions_print_the_answer():
    import contextlib
    import io

    from toolgym.envs.python import TEMPLATES, generate_problem

    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(200):
        p = generate_problem(rng)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(p["solution"], {})
        assert out.getvalue().strip() == p["answer"]
        assert p["answer"] not in p["solution"]  # computed, not printed as a constant
        seen.add(p["template"])
    assert seen == set(TEMPLATES)


@pytest.mark.timeout(120)
def test_oracle_answer_depends_on_the_tool_result():
    """With the calculator's result replaced by an error, the oracle retries, then cannot answer correctly."""
    from toolgym.tools.function import tool

    @tool
    def calculator(expression: str) -> str:
        """Always fails.

        Args:
            expression: ignored.
        """
        raise RuntimeError("down")

    from toolgym.envs.calculator import CalculatorEnv
    from toolgym.envs.vector import ToolVectorEnv
    from toolgym.tools.executor import ToolExecutor

    venv = ToolVectorEnv(lambda **kw: CalculatorEnv(split="test", **kw), num_envs=2,
                         executor=ToolExecutor([calculator], max_retries=0))
    try:
        trajs = RolloutDriver(venv, ScriptedPolicy(oracle), max_turn_tokens=128).run([None] * 2, seeds=[0, 1])
    finally:
        venv.close()
    for t in trajs:
        assert t.outcome_reward == 0.0 and len(t.tool_calls) == 2  # retried once (max_turns=3), then gave up
        assert t.answer == ""


def test_an_env_without_oracle_says_so():
    env = ToolEnv([{"id": "t", "prompt": "hi"}])
    state = EpisodeState(0, {"id": "t"}, 0, env)
    with pytest.raises(NotImplementedError, match=r"no oracle for env 'ToolEnv'.*define oracle\(self, state\)"):
        env.oracle(state)
    # the pre-flight check (`toolgym eval --policy oracle`, trainers.sft.oracle_policy) sees it before any episode
    from toolgym.evaluation import has_oracle, oracle_policy

    assert not has_oracle(env)
    with pytest.raises(ValueError, match="has no oracle"):
        oracle_policy(env)
    env.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mcp_oracle_replays_oracle_calls_from_the_task_file(tmp_path: Path):
    cfg = {"mcpServers": {"calc": {"command": sys.executable,
                                   "args": ["-m", "toolgym.serve.mcp", "--tools", "calculator"],
                                   "stderr": "devnull"}}}
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        a, b, c = (int(x) for x in rng.integers(100, 99_999, 3))
        rows.append({"id": f"m{i}", "prompt": f"What is {a} * {b} + {c}?", "answer": str(a * b + c),
                     "oracle_calls": [{"name": "calculator", "arguments": {"expression": f"{a} * {b} + {c}"}}]})
    rows.append({"id": "m-const", "prompt": "Say 7.", "answer": "7", "oracle_answer": "7"})  # answer only
    rows.append({"id": "m-none", "prompt": "No oracle here.", "answer": "1"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trajs = _run("toolgym/MCP-v0", rows[:-1], num_envs=2, mcp_config=cfg, tasks=str(path),
                 reward="numeric@answer")
    assert [t.outcome_reward for t in trajs] == [1.0] * 7
    for t in trajs[:-1]:
        assert t.tool_calls[0].name == "calculator" and t.answer == t.tool_results[0].content.strip()
    assert trajs[-1].tool_calls == [] and trajs[-1].answer == "7"
    with pytest.raises(NotImplementedError, match="no oracle for MCP-v0 task 'm-none'"):
        _run("toolgym/MCP-v0", rows[-1:], num_envs=1, mcp_config=cfg, tasks=str(path), reward="numeric@answer")
