"""Trajectory files (toolgym/trajectory.py over toolgym/jsonl.py): the round trip of real episodes, the one validated
reader (bad rows name the line and the field; rows of older versions and extra keys are accepted), atomic writes
that never empty an existing file, ``Trajectory.clip`` and ``summarize``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.rollout_files import EXPECTED, make_rollout_file
from toolgym.errors import InputFileError
from toolgym.jsonl import read_jsonl, write_jsonl
from toolgym.report.viewer import load_trajectory_rows
from toolgym.tools.base import ToolErrorKind
from toolgym.trajectory import (
    Trajectory,
    TrajectoryFileError,
    TrajectoryFormatError,
    Turn,
    check_trajectory_row,
    read_trajectories,
    summarize,
    write_trajectories,
)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> list[Trajectory]:
    """Six real Calculator-v0 episodes (every tool error kind, solved and failed; see tests/rollout_files.py)."""
    _, trajs = make_rollout_file(tmp_path_factory.mktemp("rollout") / "traj.jsonl")
    return trajs


def _with_logprobs(t: Trajectory) -> Trajectory:
    t = copy.deepcopy(t)
    t.logprobs = [-0.25 * (i % 7) if m else 0.0 for i, m in enumerate(t.loss_mask)]
    return t


# ---------------------------------------------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------------------------------------------


def test_real_episodes_round_trip_through_a_file(episodes: list[Trajectory], tmp_path: Path) -> None:
    trajs = [*episodes, _with_logprobs(episodes[0])]
    path = write_trajectories(tmp_path / "sub" / "t.jsonl", trajs)
    rows = read_trajectories(path)
    back = [Trajectory.from_dict(r) for r in rows]
    assert back == trajs  # dataclass equality: ids, mask, logprobs, turns, calls, results, messages, task, ...
    assert [json.loads(json.dumps(b.to_dict())) for b in back] == rows  # (latencies are Seconds: compare as JSON)
    assert back[-1].logprobs == trajs[-1].logprobs and any(back[-1].logprobs)
    # what the episodes are made of survives: error kinds per episode, rewards, answers, turn spans
    for k, (ok, kinds) in EXPECTED.items():
        assert set(back[k].error_kinds) == kinds and (back[k].outcome_reward == 1.0) is ok
    assert all(isinstance(r.error_kind, ToolErrorKind) for b in back for r in b.tool_results if r.error_kind)
    assert [(u.action_start, u.action_end, u.obs_start, u.obs_end) for u in back[0].turns] == [
        (u.action_start, u.action_end, u.obs_start, u.obs_end) for u in trajs[0].turns]
    assert [b.answer for b in back] == [t.answer for t in trajs]
    assert [b.reward for b in back] == [t.reward for t in trajs]
    assert Turn.from_dict(rows[0]["turns"][1], 7) == trajs[0].turns[1]


def test_rows_of_older_versions_and_extra_keys_are_accepted(episodes: list[Trajectory], tmp_path: Path) -> None:
    """The viewer and the trainers read the same rows: only completion_ids / loss_mask / turns are required, keys
    toolgym does not know (an eval row's ``eval``) stay in the rows, and from_dict fills the defaults."""
    minimal = {"completion_ids": [5, 6, 7], "loss_mask": [1, 1, 0], "turns": [{"text": "hi", "content": "hi"}]}
    eval_row = {**json.loads(json.dumps(episodes[0].to_dict())), "eval": {"task_index": 0, "task_id": "t", "sample": 1}}
    path = write_jsonl(tmp_path / "old.jsonl", [minimal, eval_row])
    (tmp_path / "old.jsonl").write_text(path.read_text().replace("\n", "\n\n", 1))  # a blank line is skipped
    rows = read_trajectories(path)
    assert rows == [minimal, eval_row] and load_trajectory_rows(path) == rows
    t = Trajectory.from_dict(rows[0])
    assert t.prompt_ids == [] and t.logprobs is None and t.task == {} and t.final_text == "hi"
    assert (t.turns[0].index, t.turns[0].action_start, t.turns[0].calls) == (0, 0, [])
    assert Trajectory.from_dict(rows[1]) == episodes[0]


# ---------------------------------------------------------------------------------------------------------------
# Bad rows
# ---------------------------------------------------------------------------------------------------------------


def _break(row: dict[str, Any], how: str) -> None:
    if how == "missing":
        del row["loss_mask"], row["turns"]
    elif how == "short_mask":
        row["loss_mask"] = row["loss_mask"][:-1]
    elif how == "mask_value":
        row["loss_mask"][3] = 2
    elif how == "id_type":
        row["completion_ids"][1] = "x"
    elif how == "logprobs_len":
        row["logprobs"] = [0.0] * (len(row["completion_ids"]) + 1)
    elif how == "error_kind":
        row["turns"][0]["results"][0]["error_kind"] = "boom"
    elif how == "arguments":
        row["turns"][0]["calls"][0]["arguments"] = "{}"
    elif how == "span":
        row["turns"][1]["obs_span"] = [3]
    elif how == "terminated":
        row["terminated"] = "yes"
    elif how == "task":
        row["task"] = ["not", "an", "object"]


@pytest.mark.parametrize("how,field,what", [
    ("missing", "", "missing loss_mask, turns"),
    ("short_mask", "loss_mask", r"95 values, but completion_ids has 96"),
    ("mask_value", r"loss_mask\[3\]", "expected 0 or 1, got 2"),
    ("id_type", r"completion_ids\[1\]", "expected an int, got 'x'"),
    ("logprobs_len", "logprobs", r"97 values, but completion_ids has 96"),
    ("error_kind", r"turns\[0\]\.results\[0\]\.error_kind", "'boom' is not one of"),
    ("arguments", r"turns\[0\]\.calls\[0\]\.arguments", "expected an object, got str"),
    ("span", r"turns\[1\]\.obs_span", r"expected \[start, end\] ints"),
    ("terminated", "terminated", "expected a boolean, got str"),
    ("task", "task", "expected an object, got list"),
])
def test_a_bad_row_names_its_line_and_field(episodes: list[Trajectory], tmp_path: Path, how: str, field: str,
                                            what: str) -> None:
    good = episodes[0].to_dict()
    bad = copy.deepcopy(good)
    _break(bad, how)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")  # the bad row is on line 3
    where = rf"bad\.jsonl:3: {field}: " if field else r"bad\.jsonl:3: not a trajectory row: "
    with pytest.raises(TrajectoryFileError, match=where + what):
        read_trajectories(path)
    with pytest.raises(TrajectoryFileError, match=where + what):
        load_trajectory_rows(path)  # the viewer reads through the same reader
    with pytest.raises(TrajectoryFormatError, match=(f"^{field}: " if field else "^not a trajectory row: ") + what):
        Trajectory.from_dict(bad)
    check_trajectory_row(good)  # the unbroken row passes


def test_file_errors_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_trajectories(tmp_path / "missing.jsonl")
    p = tmp_path / "t.jsonl"
    p.write_text('{"completion_ids": [], "loss_mask": [], "turns": []}\n[1, 2]\n')
    with pytest.raises(InputFileError, match=r"t\.jsonl:2: expected a JSON object, got list"):
        read_trajectories(p)
    p.write_text("{oops\n")
    with pytest.raises(TrajectoryFileError, match=r"t\.jsonl:1: not valid JSON"):
        read_trajectories(p)
    with pytest.raises(TrajectoryFormatError, match="expected a trajectory object, got list"):
        check_trajectory_row([1])


# ---------------------------------------------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------------------------------------------


def _failing(trajs: list[Trajectory], after: int):
    for i, t in enumerate(trajs):
        if i == after:
            raise RuntimeError("the producer died")
        yield t


def test_writes_never_empty_or_cut_an_existing_file(episodes: list[Trajectory], tmp_path: Path) -> None:
    path = write_trajectories(tmp_path / "t.jsonl", episodes[:2])
    before = path.read_bytes()
    # replacing: the producer dies after 3 rows; the old file is intact and no temporary file is left behind
    with pytest.raises(RuntimeError, match="producer died"):
        write_trajectories(path, _failing(episodes, 3))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]
    # appending: nothing is written unless every row was produced; then the rows follow the old ones
    with pytest.raises(RuntimeError, match="producer died"):
        write_trajectories(path, _failing(episodes, 2), append=True)
    assert path.read_bytes() == before
    write_trajectories(path, episodes[2:4], append=True)
    assert path.read_bytes().startswith(before)
    assert [Trajectory.from_dict(r) for r in read_trajectories(path)] == episodes[:4]
    # replacing for real: exactly the new rows; rows given as dicts are written as they are
    write_trajectories(path, [episodes[5], {**episodes[4].to_dict(), "eval": {"sample": 0}}])
    rows = read_trajectories(path)
    assert Trajectory.from_dict(rows[0]) == episodes[5] and rows[1]["eval"] == {"sample": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_write_jsonl_encodes_numpy_and_keeps_non_ascii_as_asked(tmp_path: Path) -> None:
    import numpy as np

    rows = [{"a": np.int64(3), "b": np.arange(3), "c": np.float32(0.5), "s": "Zürich"}]
    p = write_jsonl(tmp_path / "x.jsonl", rows)
    assert read_jsonl(p) == [{"a": 3, "b": [0, 1, 2], "c": 0.5, "s": "Zürich"}] and b"\\u00fc" in p.read_bytes()
    write_jsonl(p, rows, ensure_ascii=False)
    assert "Zürich".encode() in p.read_bytes() and read_jsonl(p)[0]["s"] == "Zürich"
    write_jsonl(p, [], append=True)  # appending nothing leaves the file as it is
    assert len(read_jsonl(p)) == 1


# ---------------------------------------------------------------------------------------------------------------
# clip and summarize
# ---------------------------------------------------------------------------------------------------------------


def test_clip_cuts_ids_mask_and_logprobs_together(episodes: list[Trajectory]) -> None:
    t = _with_logprobs(episodes[0])
    n = len(t.completion_ids)
    reward, turns = t.reward, copy.deepcopy(t.turns)
    assert t.clip(None) is t and len(t.completion_ids) == n
    assert t.clip(n + 5) is t and len(t.completion_ids) == n
    full = (list(t.completion_ids), list(t.loss_mask), list(t.logprobs))
    t.clip(n - 4)
    assert (t.completion_ids, t.loss_mask, t.logprobs) == (full[0][: n - 4], full[1][: n - 4], full[2][: n - 4])
    assert t.reward == reward and t.turns == turns  # rewards and turn records stay those of the whole episode
    u = copy.deepcopy(episodes[0])
    u.logprobs = None
    assert u.clip(3).logprobs is None and len(u.completion_ids) == len(u.loss_mask) == 3


def test_summarize_counts_outcomes_calls_and_errors(episodes: list[Trajectory]) -> None:
    s = summarize(episodes)
    assert s["episodes"] == 6
    assert s["success"] == pytest.approx(sum(ok for ok, _ in EXPECTED.values()) / 6)
    assert s["tool_call_rate"] == pytest.approx(5 / 6)  # every episode but the one that answers at once
    assert s["errors"] == {k: 1 for _, kinds in EXPECTED.values() for k in kinds}
    assert summarize([]) == {"episodes": 0}
    assert summarize(episodes, success_threshold=2.0)["success"] == 0.0
