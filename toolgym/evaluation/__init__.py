"""Evaluation: which tasks run (:mod:`toolgym.evaluation.tasks`: each task of a split exactly once, or a seeded
draw) and the run with its statistics (:mod:`toolgym.evaluation.runner`: :func:`evaluate`, :class:`EvalReport`,
Wilson intervals, pass@k, paired before/after intervals, the envs' scripted oracles). ``toolgym eval`` and the
trainers' task draws go through here. Nothing here imports ``trainers/``, TRL or training code.
"""

from __future__ import annotations

from toolgym.evaluation import runner as _runner
from toolgym.evaluation import tasks as _tasks
from toolgym.evaluation.runner import *  # noqa: F403
from toolgym.evaluation.tasks import *  # noqa: F403

__all__ = sorted({*_runner.__all__, *_tasks.__all__})
