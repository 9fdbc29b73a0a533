"""Real rollout files for the viewer / CLI / plot tests: Calculator-v0 episodes played by a scripted policy.

The script covers every outcome the viewer must show: a solved episode, each tool error kind the calculator
can produce (unknown tool, invalid arguments, parse error, exception), a solved episode that had an error, and a
wrong answer without any tool call. The episodes run through the real env, executor and tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy, write_trajectories

#: episode index -> (expected success, expected error kinds)
EXPECTED: dict[int, tuple[bool, set[str]]] = {
    0: (True, set()),
    1: (False, {"unknown_tool"}),
    2: (False, {"invalid_arguments"}),
    3: (False, {"parse_error"}),
    4: (True, {"exception"}),
    5: (False, set()),
}


def script(state: EpisodeState) -> str:
    """Turn text for episode ``state.index`` (see :data:`EXPECTED`)."""
    p = state.env.format.parser
    k = state.index % 6
    task = state.task
    if state.turn == 0:
        if k == 0:
            return p.format_calls([("calculator", {"expression": task["expression"]})])
        if k == 1:
            return p.format_calls([("abacus", {"expression": task["expression"]})])
        if k == 2:
            return p.format_calls([("calculator", {"expr": 3})])
        if k == 3:
            return '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
        if k == 4:
            return p.format_calls([("calculator", {"expression": "1/0"})])
        return "I think it is <answer>42</answer>"
    results = state.trajectory.turns[-1].results
    if k == 0:
        return f"<answer>{results[0].content.strip()}</answer>"
    if k == 4:
        return f"The tool failed; computing by hand. <answer>{task['answer']}</answer>"
    return "<answer>0</answer>"


def make_rollout_file(path: Path, episodes: int = 6, seed: int = 0) -> tuple[Path, list[Any]]:
    """Run ``episodes`` scripted Calculator-v0 episodes and write them as JSONL; returns ``(path, trajectories)``."""
    driver = RolloutDriver("toolgym/Calculator-v0", ScriptedPolicy(script), num_envs=min(episodes, 6),
                           max_turn_tokens=96)
    try:
        trajs = driver.run([None] * episodes, seeds=seed)
    finally:
        driver.venv.close()
    write_trajectories(path, trajs)
    return path, trajs
