"""``toolgym/Python-v0``: arithmetic word problems solved with a sandboxed ``python`` tool.

Tasks are generated from the seed (:func:`generate_problem`): GSM8K-style multi-step problems with numbers too big
to do in one's head. A template (shop stock, ticket revenue, factory output, savings, shelves, bacteria, salary,
fleet distance) is filled with 2-5 digit numbers chosen so the answer is an exact integer. Same generator state ->
same problem. Ids are a hash of the question text and the split is a hash bucket (10 % ``test``), so train and test
never share a question. The model may run code with ``python`` (see :mod:`toolgym.tools.python` for the sandbox)
and answers with ``<answer>NUMBER</answer>``; the reward is 1.0 for exactly that number (thousands separators
allowed), else 0.0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from toolgym.envs.base import ToolEnv
from toolgym.rewards.rules import NumericMatch
from toolgym.tools.python import PythonTool, Sandbox, SandboxLimits

__all__ = ["TEMPLATES", "PythonEnv", "generate_problem"]

Template = Callable[[np.random.Generator], tuple[str, int, str]]
"""``fn(rng) -> (question, answer, solution)``: ``solution`` is a short Python program that prints ``answer``."""


def _r(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def _warehouse(rng: np.random.Generator) -> tuple[str, int]:
    a, b, c, d = _r(rng, 120, 980), _r(rng, 12, 96), _r(rng, 1000, 9000), _r(rng, 40, 400)
    return (f"A warehouse holds {a} boxes with {b} items in each box. On Monday it ships {c} items. On Tuesday it "
            f"receives {d} more boxes of {b} items each. How many items are in the warehouse now?",
            a * b - c + d * b,
            f"boxes = {a}\nper_box = {b}\nshipped = {c}\nreceived_boxes = {d}\n"
            "print(boxes * per_box - shipped + received_boxes * per_box)")


def _tickets(rng: np.random.Generator) -> tuple[str, int]:
    a, p, b, q, f = _r(rng, 1200, 9800), _r(rng, 35, 95), _r(rng, 150, 900), _r(rng, 180, 450), _r(rng, 2, 9)
    return (f"A concert sold {a} regular tickets at ${p} each and {b} VIP tickets at ${q} each. The ticketing "
            f"company keeps a fee of ${f} for every ticket sold. How many dollars does the organiser receive after "
            "fees?",
            a * p + b * q - f * (a + b),
            f"regular, regular_price = {a}, {p}\nvip, vip_price = {b}, {q}\nfee = {f}\n"
            "print(regular * regular_price + vip * vip_price - fee * (regular + vip))")


def _factory(rng: np.random.Generator) -> tuple[str, int]:
    a = 20 * _r(rng, 6, 60)
    h, d, p = _r(rng, 6, 22), _r(rng, 12, 30), int(rng.choice([5, 10, 15, 20, 25, 35, 45]))
    total = a * h * d
    return (f"A factory makes {a} widgets per hour and runs {h} hours a day for {d} days. Quality control rejects "
            f"{p}% of the widgets. How many widgets pass quality control?",
            total - total * p // 100,
            f"total = {a} * {h} * {d}\nrejected = total * {p} // 100\nprint(total - rejected)")


def _savings(rng: np.random.Generator) -> tuple[str, int]:
    a, w, k = _r(rng, 85, 640), _r(rng, 20, 52), _r(rng, 3, 9)
    each = _r(rng, 100, (a * w) // (k + 1))
    c = a * w - k * each
    return (f"Maria saves ${a} every week for {w} weeks. She then spends ${c} on a used car and splits the rest "
            f"equally among {k} savings accounts. How many dollars go into each account?",
            each, f"saved = {a} * {w}\ncar = {c}\nprint((saved - car) // {k})")


def _library(rng: np.random.Generator) -> tuple[str, int]:
    a, b, c, d, e = _r(rng, 4000, 25000), _r(rng, 15, 80), _r(rng, 24, 60), _r(rng, 300, 2500), _r(rng, 35, 90)
    return (f"A library owns {a} books. It buys {b} crates of {c} books each and donates {d} books to a school. "
            f"It then puts all its books on shelves that hold {e} books each. How many shelves are completely full?",
            (a + b * c - d) // e,
            f"books = {a} + {b} * {c} - {d}\nprint(books // {e})")


def _bacteria(rng: np.random.Generator) -> tuple[str, int]:
    a, h = _r(rng, 150, 950), _r(rng, 8, 16)
    k = _r(rng, 1000, a * 2 ** h // 3)
    return (f"A culture starts with {a} bacteria and doubles in size every hour. After {h} hours, {k} bacteria are "
            "removed for a test. How many bacteria are left?",
            a * 2 ** h - k,
            f"bacteria = {a} * 2 ** {h}\nprint(bacteria - {k})")


def _salary(rng: np.random.Generator) -> tuple[str, int]:
    a, b, m = _r(rng, 2800, 9500), _r(rng, 120, 900), _r(rng, 3, 18)
    y = m + _r(rng, 6, 30)
    return (f"An engineer earns ${a} per month. After her first {m} months she gets a raise of ${b} per month. "
            f"How many dollars does she earn in total over her first {y} months?",
            a * m + (a + b) * (y - m),
            f"first = {a} * {m}\nafter_raise = ({a} + {b}) * ({y} - {m})\nprint(first + after_raise)")


def _fleet(rng: np.random.Generator) -> tuple[str, int]:
    n, v, t1, u, t2 = _r(rng, 12, 85), _r(rng, 55, 95), _r(rng, 3, 11), _r(rng, 40, 70), _r(rng, 2, 9)
    return (f"A delivery company has {n} trucks. Each truck drives at {v} km/h for {t1} hours and then at {u} km/h "
            f"for {t2} hours. How many kilometres do all the trucks drive together?",
            n * (v * t1 + u * t2),
            f"per_truck = {v} * {t1} + {u} * {t2}\nprint({n} * per_truck)")


TEMPLATES: dict[str, Template] = {
    "warehouse": _warehouse, "tickets": _tickets, "factory": _factory, "savings": _savings,
    "library": _library, "bacteria": _bacteria, "salary": _salary, "fleet": _fleet,
}


def _split_of(question: str, test_fraction: float) -> str:
    h = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_fraction else "train"


def generate_problem(rng: np.random.Generator, split: str = "train", *, test_fraction: float = 0.1) -> dict[str, Any]:
    """One problem ``{"id", "prompt", "question", "answer", "template", "split", "solution"}`` drawn from ``rng``.

    ``answer`` is the exact integer answer as a string; ``solution`` a Python program that prints it (what
    :meth:`toolgym.envs.python.PythonEnv.oracle` runs; never shown to the model). Problems are redrawn until one falls in ``split``.
    """
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    names = sorted(TEMPLATES)
    while True:
        name = names[int(rng.integers(len(names)))]
        question, answer, solution = TEMPLATES[name](rng)
        if answer < 0 or _split_of(question, test_fraction) != split:
            continue
        return {
            "id": "wp-" + hashlib.sha256(question.encode()).hexdigest()[:12],
            "prompt": question, "question": question, "answer": str(answer), "template": name, "split": split,
            "solution": solution,
        }


SYSTEM_PROMPT = (
    "You solve math word problems. The numbers are large, so write a short Python program that computes the "
    "answer and run it with the python tool; print() the result. Each run starts fresh (no variables are kept). "
    "When you know the result, reply with the final number only, inside answer tags, for example "
    "<answer>12345</answer>."
)


class PythonEnv(ToolEnv):
    """Word problems with a sandboxed Python tool.

    Args:
        split: ``"train"`` or ``"test"`` (disjoint question sets).
        sandbox: a :class:`~toolgym.tools.python.Sandbox` to use (shared pools are fine); default: a new one
            with ``limits`` and ``pool_size``.
        limits: sandbox limits when building the sandbox.
        pool_size: warm interpreters kept ready.
        **kwargs: :class:`~toolgym.envs.base.ToolEnv` options (tokenizer, max_turns, ...).
    """

    def __init__(
        self,
        split: str = "train",
        *,
        sandbox: Sandbox | None = None,
        limits: SandboxLimits | None = None,
        pool_size: int = 2,
        max_turns: int = 4,
        max_episode_tokens: int = 2048,
        **kwargs: Any,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        kwargs.setdefault("reward", NumericMatch("answer", abs_tol=1e-6, rel_tol=0.0, name="exact_number"))
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        tool = PythonTool(sandbox or Sandbox(limits, pool_size=pool_size))
        super().__init__(
            lambda rng: generate_problem(rng, split),
            [tool],
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            **kwargs,
        )

    def oracle(self, state: Any) -> str:
        """Run the task's ``solution`` program with ``python``, then answer with the last line it printed (the run
        is repeated while it fails and turns remain). Rows without ``solution`` have no oracle."""
        code = state.task.get("solution")
        if not isinstance(code, str):
            raise NotImplementedError(f"Python-v0 task {state.task.get('id')!r} has no 'solution' program: no oracle")
        ok = [r for r in self.last_results(state) if r.ok and r.content.strip()]
        if not ok and state.turn < self.max_turns - 1:
            return self.format.parser.format_calls([("python", {"code": code})])
        return f"<answer>{ok[0].content.strip().splitlines()[-1].strip() if ok else ''}</answer>"
