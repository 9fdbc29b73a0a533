"""``toolgym/Python-v0``: arithmetic word problems solved with a sandboxed ``python`` tool.

Tasks are generated from the seed (:mod:`toolgym.data.word_problems`): multi-step problems with 2-5 digit
numbers and an exact integer answer. The model may run code with ``python`` (see :mod:`toolgym.tools.python`
for the sandbox) and answers with ``<answer>NUMBER</answer>``; the reward is 1.0 for exactly that number
(thousands separators allowed), else 0.0.
"""

from __future__ import annotations

from typing import Any

from toolgym.data.word_problems import generate_problem
from toolgym.envs.base import ToolEnv
from toolgym.rewards.rules import NumericMatch
from toolgym.tools.python import PythonTool, Sandbox, SandboxLimits

__all__ = ["PythonEnv"]

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
