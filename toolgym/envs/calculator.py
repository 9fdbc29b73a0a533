"""``toolgym/Calculator-v0``: multi-step arithmetic with large numbers and a calculator tool.

Tasks are generated from the seed: an expression of 2-3 operations over 3-5 digit numbers (too large for a
135M model to do in its head), with an exact integer answer. The model should call ``calculator`` and answer
with ``<answer>NUMBER</answer>``; the reward is 1.0 for the exact number, else 0.0.

The ``train`` and ``test`` splits are disjoint: a task belongs to ``test`` when a hash of its expression falls
in a fixed 10% bucket, so held-out evaluation never sees a training expression.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from toolgym.envs.base import ToolEnv
from toolgym.rewards.rules import NumericMatch
from toolgym.tools.calculator import calculator_tool, evaluate, format_number

__all__ = ["CalculatorEnv", "generate_task"]

SYSTEM_PROMPT = (
    "You are a careful assistant that solves arithmetic problems. Large numbers are hard to compute in your "
    "head, so call the calculator tool with the expression. After the tool answers, reply with the final "
    "number only, inside answer tags, for example <answer>12345</answer>."
)


def _split_of(expr: str) -> str:
    return "test" if int(hashlib.sha256(expr.encode()).hexdigest(), 16) % 10 == 0 else "train"


def generate_task(rng: np.random.Generator, split: str = "train", n_ops: tuple[int, int] = (2, 3)) -> dict[str, Any]:
    """One task row: ``{"id", "prompt", "expression", "answer", "split"}`` drawn from ``rng``.

    Numbers have 3-5 digits; operators are ``+``, ``-``, ``*`` with at most one ``*`` per task (keeps answers
    below ~10^10); parentheses group the first two operands half of the time.
    """
    while True:
        k = int(rng.integers(n_ops[0], n_ops[1] + 1))
        nums = [int(rng.integers(100, 100_000)) for _ in range(k + 1)]
        ops: list[str] = []
        for _ in range(k):
            choices = ["+", "-"] if "*" in ops else ["+", "-", "*"]
            ops.append(str(rng.choice(choices)))
        expr = str(nums[0])
        for op, n in zip(ops, nums[1:], strict=True):
            expr = f"{expr} {op} {n}"
            if len(ops) > 1 and op in "+-" and rng.random() < 0.5 and expr.count(" ") == 2:
                expr = f"({expr})"
        if _split_of(expr) != split:
            continue
        value = evaluate(expr)
        answer = format_number(value)
        return {
            "id": "calc-" + hashlib.sha256(expr.encode()).hexdigest()[:12],
            "prompt": f"What is {expr}?",
            "expression": expr,
            "answer": answer,
            "split": split,
        }


class CalculatorEnv(ToolEnv):
    """Arithmetic with a calculator tool. ``split`` selects the train or held-out test expressions.

    Extra kwargs go to :class:`~toolgym.envs.base.ToolEnv` (tokenizer, max_turns, ...).
    """

    def __init__(self, split: str = "train", max_turns: int = 3, max_episode_tokens: int = 1024, **kwargs: Any) -> None:
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        kwargs.setdefault("reward", NumericMatch("answer", exact=True))  # the exact number, name "exact_number"
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__(
            lambda rng: generate_task(rng, split),
            [calculator_tool()],
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            **kwargs,
        )

    def oracle(self, state: Any) -> str:
        """Call ``calculator`` with the task's expression, then answer with the number it returned (the call is
        repeated while it fails and turns remain)."""
        ok = [r for r in self.last_results(state) if r.ok]
        if not ok and state.turn < self.max_turns - 1:
            return self.format.parser.format_calls([("calculator", {"expression": state.task["expression"]})])
        return f"<answer>{ok[0].content.strip() if ok else ''}</answer>"
