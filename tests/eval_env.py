"""A user-defined env for the eval/CLI tests: registered by importing this module (``tests.eval_env:EvalEcho-v0``)
with plain ``gym.register`` (no toolgym vector entry point), a finite task list and an ``oracle(state)``.

``EVAL_ECHO_DELAY_S`` (environment variable) makes the oracle sleep before each turn (interrupt tests).
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym

from toolgym.envs.base import ToolEnv
from toolgym.tools.function import tool

N_TASKS = 12


@tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: what to echo.
    """
    return text


def _reward(trajectory: Any, task: dict[str, Any]) -> float:
    return float(trajectory.answer == task["answer"])


class EvalEchoEnv(ToolEnv):
    """Echo the word of the task through the ``echo`` tool, then answer it. ``split``: ``train``/``test``."""

    def __init__(self, split: str = "test", n_tasks: int = N_TASKS, **kwargs: Any) -> None:
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        rows = [{"id": f"{split}-{i}", "prompt": f"Echo w{i}.", "answer": f"w{i}"} for i in range(n_tasks)]
        kwargs.setdefault("max_turns", 3)
        super().__init__(rows, [echo], reward=_reward, **kwargs)

    def oracle(self, state: Any) -> str:
        delay = float(os.environ.get("EVAL_ECHO_DELAY_S", "0") or 0)
        if delay:
            time.sleep(delay)
        if state.turn == 0:
            return self.format.parser.format_calls([("echo", {"text": state.task["answer"]})])
        return f"<answer>{state.trajectory.turns[-1].results[0].content}</answer>"


class NoOracleEnv(EvalEchoEnv):
    """The same env without an oracle."""

    oracle = None  # type: ignore[assignment]


if "EvalEcho-v0" not in gym.registry:
    gym.register(id="EvalEcho-v0", entry_point=EvalEchoEnv, disable_env_checker=True)
    gym.register(id="EvalNoOracle-v0", entry_point=NoOracleEnv, disable_env_checker=True)
