"""``toolgym/CalculatorChain-v0``: multi-step arithmetic chains whose every intermediate value is checked.

A task is a chain of 2-4 dependent operations on a start number, e.g. *"Start with 4821. Multiply it by 37, then
subtract 9120, then add 55123. What is the result?"*; each step needs the previous step's value, so a model that
calls the calculator once per step makes 2-4 dependent calls, then answers ``<answer>NUMBER</answer>``.

Rewards (:class:`ChainReward`): the **outcome** is 1.0 for the exact final number; the **process** (per-turn)
reward of a turn is ``process_weight / n_steps`` for every chain value the turn's calculator calls *returned*, in
order (the next value not yet reached; each value counts once per episode). An episode's process rewards add up to
at most ``process_weight`` (0.5 by default), so answering right is always worth more than any amount of progress.

Why the process reward cannot be gamed: it is read from the **calculator's results**, not from the model's text,
and compared with the task's known intermediate values ``task["values"]`` (computed exactly at generation time).
The calculator computes exactly the expression the model sends, so a result equals the next value only if the
model asked for an expression that evaluates to it -- which is doing the step. The intermediate values never appear
in the prompt (generation redraws a chain where one would equal a number of the prompt), calling the calculator
more often earns nothing (a value counts once, and only the next one in order), and format alone (a well-formed
call, an ``<answer>`` tag) earns nothing. A call that computes several steps at once gets credit for the last
chain value it returns only if the earlier ones were reached first, so skipping steps forgoes their process reward
but not the outcome.

``train`` / ``test`` splits are disjoint by a hash of the chain text (10% ``test``), like Calculator-v0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from toolgym.envs.base import ToolEnv
from toolgym.rewards.base import Reward, Score
from toolgym.rewards.rules import exact_number, parse_exact_number
from toolgym.tools.calculator import calculator_tool
from toolgym.trajectory import Trajectory, Turn, extract_answer

__all__ = ["CalculatorChainEnv", "ChainReward", "chain_progress", "generate_chain"]

SYSTEM_PROMPT = (
    "You are a careful assistant. Solve the chain one step at a time: call the calculator tool once per step, "
    "using the previous result, then reply with the final number inside answer tags, for example "
    "<answer>12345</answer>."
)

_WORDS = {"+": "add {n}", "-": "subtract {n}", "*": "multiply it by {n}"}


def _split_of(text: str) -> str:
    return "test" if int(hashlib.sha256(text.encode()).hexdigest(), 16) % 10 == 0 else "train"


def generate_chain(rng: np.random.Generator, split: str = "train", steps: tuple[int, int] = (2, 4)) -> dict[str, Any]:
    """One chain task drawn from ``rng`` (redrawn until it falls in ``split``).

    Returns ``{"id", "prompt", "start", "ops": [[op, operand], ...], "values": [v1, ..., vn], "answer", "split",
    "steps"}``: ``values[k]`` is the exact value after step ``k + 1`` (integers as strings), ``answer ==
    values[-1]``. Start: 3-4 digits; ``+``/``-`` operands 3-5 digits (a subtraction keeps the value positive);
    at most one ``*``, by 11-99. No intermediate value equals a number written in the prompt.
    """
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    if not 1 <= steps[0] <= steps[1]:
        raise ValueError(f"steps must be 1 <= lo <= hi, got {steps}")
    while True:
        n = int(rng.integers(steps[0], steps[1] + 1))
        start = int(rng.integers(100, 10_000))
        cur, ops, values = start, [], []
        for _ in range(n):
            choices = ["+", "-"] if any(op == "*" for op, _ in ops) else ["+", "-", "*"]
            op = str(rng.choice(choices))
            if op == "*":
                x = int(rng.integers(11, 100))
                cur = cur * x
            elif op == "+":
                x = int(rng.integers(100, 100_000))
                cur = cur + x
            else:
                x = int(rng.integers(100, max(101, min(cur, 100_000))))
                cur = cur - x
            ops.append([op, x])
            values.append(cur)
        shown = {start, *(x for _, x in ops)}
        if cur <= 0 or any(v in shown for v in values) or len(set(values)) < len(values):
            continue
        steps_text = ", then ".join(_WORDS[op].format(n=x) for op, x in ops)
        prompt = f"Start with {start}. {steps_text[0].upper()}{steps_text[1:]}. What is the result?"
        if _split_of(prompt) != split:
            continue
        return {
            "id": "chain-" + hashlib.sha256(prompt.encode()).hexdigest()[:12],
            "prompt": prompt,
            "start": start,
            "ops": ops,
            "values": [str(v) for v in values],
            "answer": str(values[-1]),
            "split": split,
            "steps": n,
        }


def _advance(turn: Turn, values: Sequence[Fraction], reached: int) -> int:
    """``reached`` after ``turn``: each ok calculator result equal to the next chain value moves it by one."""
    for r in turn.results:
        if reached < len(values) and r.ok and parse_exact_number(r.content) == values[reached]:
            reached += 1
    return reached


def chain_progress(turns: Sequence[Turn], task: Mapping[str, Any]) -> int:
    """How many chain values (in order) the calculator returned over ``turns``."""
    values = [Fraction(v) for v in task["values"]]
    reached = 0
    for t in turns:
        reached = _advance(t, values, reached)
    return reached


class ChainReward(Reward):
    """Outcome: 1.0 for the exact final number. Process (per turn): ``process_weight / n_steps`` for each chain
    value this turn's calculator results reached, in order (see the module docstring).

    With ``answer_step=True`` the decision to stop is a step of its own: the process weight is shared by the
    ``n_steps`` chain values **and** the answer, ``process_weight / (n_steps + 1)`` each. The answer's share is
    earned by a turn that makes no tool call, comes after every chain value was reached, and answers the final value
    exactly; a turn that calls a tool (a parse error included) after every value was reached loses one share. The
    answer's share needs the verified chain before it and the exact final number, so it cannot be had without
    doing the task; the process rewards of an episode stay below ``process_weight``, under a right outcome (1.0).
    """

    name = "chain"
    per_turn = True

    def __init__(self, process_weight: float = 0.5, *, answer_step: bool = False) -> None:
        self.process_weight = float(process_weight)
        self.answer_step = bool(answer_step)

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> float:
        return exact_number(trajectory.answer, task["answer"])

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        values = [Fraction(v) for v in task["values"]]
        before = chain_progress(trajectory.turns[:-1], task)
        after = _advance(turn, values, before)
        if not self.answer_step:
            value = self.process_weight * (after - before) / len(values)
            return Score(value, {"steps_reached": float(after - before)})
        share = self.process_weight / (len(values) + 1)
        done_before = before == len(values)
        answered = float(done_before and not turn.calls
                         and exact_number(extract_answer(turn.content), task["answer"]) >= 1.0)
        extra_calls = float(done_before and bool(turn.calls))
        value = share * ((after - before) + answered - extra_calls)
        return Score(value, {"steps_reached": float(after - before), "answer_step": answered,
                             "calls_after_chain": extra_calls})


class CalculatorChainEnv(ToolEnv):
    """Dependent calculator chains with a verified per-step (process) reward. ``split`` selects train or the
    held-out test chains; ``steps`` the range of chain lengths; ``max_turns`` defaults to the longest chain + 2
    (one turn to answer, one spare); ``answer_step`` makes the answer a rewarded step (:class:`ChainReward`).

    Extra kwargs go to :class:`~toolgym.envs.base.ToolEnv` (tokenizer, system_prompt, chat_template, ...).
    """

    def __init__(
        self, split: str = "train", steps: tuple[int, int] | list[int] = (2, 4), max_turns: int | None = None,
        max_episode_tokens: int = 1024, process_weight: float = 0.5, answer_step: bool = False, **kwargs: Any,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        lo, hi = (int(steps[0]), int(steps[1]))
        self.split = split
        self.steps = (lo, hi)
        kwargs.setdefault("reward", ChainReward(process_weight, answer_step=answer_step))
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__(
            lambda rng: generate_chain(rng, split, (lo, hi)),
            [calculator_tool()],
            max_turns=max_turns if max_turns is not None else hi + 2,
            max_episode_tokens=max_episode_tokens,
            **kwargs,
        )

    def oracle(self, state: Any) -> str:
        """Call ``calculator`` for the next step of the chain (on the value the calculator last returned), one
        step per turn, then answer with the last value the calculator returned."""
        task = state.task
        traj = state.trajectory
        turns = traj.turns if traj is not None else []
        reached = chain_progress(turns, task)
        if reached < len(task["ops"]) and state.turn < self.max_turns - 1:
            if reached == 0:
                cur = str(task["start"])
            else:
                ok = [r for t in turns for r in t.results if r.ok]
                cur = ok[-1].content.strip()  # read from the tool, never from the task's values
            op, x = task["ops"][reached]
            return self.format.parser.format_calls([("calculator", {"expression": f"{cur} {op} {x}"})])
        ok = [r for t in turns for r in t.results if r.ok]
        return f"<answer>{ok[-1].content.strip() if ok else ''}</answer>"
