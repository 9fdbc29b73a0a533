"""Transitional alias of :mod:`toolgym.jsonl` (the one JSONL module).

Only ``toolgym.rollout.read_trajectories`` still imports this path; delete this file once it reads through
:func:`toolgym.trajectory.read_trajectories`. New code imports :mod:`toolgym.jsonl`.
"""

from toolgym.jsonl import JSONLStream, check_writable, iter_jsonl, read_jsonl, write_jsonl

__all__ = ["JSONLStream", "check_writable", "iter_jsonl", "read_jsonl", "write_jsonl"]
