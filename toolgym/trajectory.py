"""Trajectory: what trainers consume, built by the env token by token and never re-tokenised.

``completion_ids`` = action_1 + obs_1 + action_2 + obs_2 + ... and ``loss_mask`` has the same length: 1 on
tokens the policy sampled, 0 on tokens the env wrote (tool responses, next-turn headers, an end-of-turn
token closing a turn cut by its budget).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from toolgym.tools.base import ToolCall, ToolResult

__all__ = ["Trajectory", "Turn", "extract_answer"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The final answer in ``text``: the content of the last ``<answer>...</answer>`` if present, else ``text``
    stripped."""
    found = _ANSWER.findall(text)
    return (found[-1] if found else text).strip()


@dataclass
class Turn:
    """One assistant turn and the env's answer to it.

    Attributes:
        index: 0-based turn number.
        action_start, action_end: the action's span ``[start, end)`` in ``completion_ids`` (mask 1; plus one
            mask-0 end-of-turn token at ``action_end - 1`` when ``cut`` is true).
        obs_start, obs_end: the observation's span (mask 0); equal when nothing was appended.
        text: the decoded action text (end-of-turn token removed).
        content: the text outside tool calls / reasoning (the answer on the last turn).
        calls: parsed calls (malformed ones have ``parse_error``); results: one per call, same order.
        cut: the action hit its token budget without an end-of-turn token; the env closed the turn.
        reward: the process (per-turn) reward of this turn.
    """

    index: int
    action_start: int
    action_end: int
    obs_start: int = 0
    obs_end: int = 0
    text: str = ""
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    cut: bool = False
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)

    @property
    def error_kinds(self) -> list[str]:
        return [r.error_kind.value for r in self.results if r.error_kind is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "action_span": [self.action_start, self.action_end],
            "obs_span": [self.obs_start, self.obs_end],
            "text": self.text,
            "content": self.content,
            "reasoning": self.reasoning,
            "calls": [c.to_dict() for c in self.calls],
            "results": [r.to_dict() for r in self.results],
            "cut": self.cut,
            "reward": self.reward,
            "reward_components": self.reward_components,
        }


@dataclass
class Trajectory:
    """A whole episode at token level.

    Attributes:
        prompt_ids: the prompt token ids (system + tools + user turn + assistant header).
        completion_ids: every token after the prompt (actions and observations, interleaved).
        loss_mask: ``len(completion_ids)`` ints: 1 = sampled by the policy, 0 = written by the env.
        logprobs: optional per-completion-token sampling logprobs (0.0 on env tokens), when the policy gave them.
        turns: per-turn records (spans, calls, results, rewards).
        messages: the conversation as chat messages (for humans and drift checks).
        task: the task row.
        outcome_reward: the outcome reward (set on the last step).
        reward: outcome + sum of per-turn rewards (what the episode's step rewards add up to).
        terminated / truncated: how the episode ended.
        drift: ``{}`` when ``prompt_ids + completion_ids`` equal the chat template's tokens for ``messages``;
            otherwise the first differing index and the token windows around it.
    """

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    task: dict[str, Any] = field(default_factory=dict)
    outcome_reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    drift: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        return self.outcome_reward + sum(t.reward for t in self.turns)

    @property
    def turn_rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def final_text(self) -> str:
        """The content of the last turn (the model's answer when it stopped calling tools)."""
        return self.turns[-1].content if self.turns else ""

    @property
    def answer(self) -> str:
        """:func:`extract_answer` of the last turn's content."""
        return extract_answer(self.final_text)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.calls]

    @property
    def tool_results(self) -> list[ToolResult]:
        return [r for t in self.turns for r in t.results]

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.calls) for t in self.turns)

    @property
    def error_kinds(self) -> list[str]:
        return [k for t in self.turns for k in t.error_kinds]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (one JSONL line of a trajectory file)."""
        return {
            "task": self.task,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": self.logprobs,
            "turns": [t.to_dict() for t in self.turns],
            "turn_rewards": self.turn_rewards,
            "outcome_reward": self.outcome_reward,
            "reward": self.reward,
            "reward_components": self.reward_components,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "drift": self.drift,
            "messages": self.messages,
        }
