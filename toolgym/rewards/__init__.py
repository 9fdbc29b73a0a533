"""Rewards: the async :class:`Reward` protocol returning a :class:`Score` (value + components), rules, tool
verification, an LLM judge, a learned reward model, and combinations.

See ``docs/rewards.md``.
"""

from toolgym.rewards.base import (
    FunctionReward,
    Reward,
    RewardLike,
    Score,
    as_reward,
    outcome_score,
    turn_score,
)
from toolgym.rewards.combine import Combine, score_batch
from toolgym.rewards.judge import DEFAULT_JUDGE_PROMPT, JudgeErrorKind, JudgeResult, LLMJudge, parse_score
from toolgym.rewards.reward_model import RewardModelError, RewardModelErrorKind, RewardModelReward
from toolgym.rewards.rules import (
    F1,
    AnswerFormat,
    ExactMatch,
    NumericMatch,
    RuleReward,
    ToolCallFormat,
    answer_format,
    exact_match,
    exact_number,
    f1_score,
    normalize_answer,
    numeric_match,
    parse_exact_number,
    parse_number,
)
from toolgym.rewards.verified import ToolVerified

__all__ = [
    "DEFAULT_JUDGE_PROMPT",
    "F1",
    "AnswerFormat",
    "Combine",
    "ExactMatch",
    "FunctionReward",
    "JudgeErrorKind",
    "JudgeResult",
    "LLMJudge",
    "NumericMatch",
    "Reward",
    "RewardLike",
    "RewardModelError",
    "RewardModelErrorKind",
    "RewardModelReward",
    "RuleReward",
    "Score",
    "ToolCallFormat",
    "ToolVerified",
    "answer_format",
    "as_reward",
    "exact_match",
    "exact_number",
    "f1_score",
    "normalize_answer",
    "numeric_match",
    "outcome_score",
    "parse_exact_number",
    "parse_number",
    "parse_score",
    "score_batch",
    "turn_score",
]
