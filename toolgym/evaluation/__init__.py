"""Evaluation: which tasks run (:mod:`toolgym.evaluation.tasks`: each task of a split exactly once, or a seeded
draw) and the run with its statistics (:mod:`toolgym.evaluation.runner`: :func:`evaluate`, :class:`EvalReport`,
Wilson intervals, pass@k, paired before/after intervals, the envs' scripted oracles). ``toolgym eval`` and the
trainers' task draws go through here. Nothing here imports ``trainers/``, TRL or training code.
"""

from __future__ import annotations

from toolgym.evaluation.runner import (
    EvalReport,
    evaluate,
    has_oracle,
    mean_at_k,
    oracle_policy,
    paired_difference_ci,
    pass_at_k,
    wilson_interval,
)
from toolgym.evaluation.tasks import (
    TaskFileError,
    TaskSelectionError,
    draw_tasks,
    round_tasks,
    select_tasks,
    task_id,
)

__all__ = [
    "EvalReport",
    "TaskFileError",
    "TaskSelectionError",
    "draw_tasks",
    "evaluate",
    "has_oracle",
    "mean_at_k",
    "oracle_policy",
    "paired_difference_ci",
    "pass_at_k",
    "round_tasks",
    "select_tasks",
    "task_id",
    "wilson_interval",
]
