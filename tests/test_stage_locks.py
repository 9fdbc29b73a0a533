"""Experiment stages run under a per-stage lock (``benchmarks.common.stages``): two processes that share an output
directory never compute one stage at once, a killed holder leaves nothing locked, and a process that waited for a
stage finds it finished and skips it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from benchmarks.common.stages import stage_lock
with stage_lock({path!r}) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(600)
"""


def _hold_in_another_process(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_held_by_another_process_is_refused_and_freed_when_that_process_is_killed(tmp_path: Path) -> None:
    from benchmarks.common.stages import stage_lock

    path = tmp_path / "out" / "grpo-seed0-abc.lock"
    holder = _hold_in_another_process(path)
    try:
        with stage_lock(path, wait=False) as held:
            assert held is False
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        with stage_lock(path, wait=False) as held:  # the kernel dropped the dead holder's lock
            assert held is True
            with stage_lock(path, wait=False) as again:  # and this process now excludes any other holder
                assert again is False
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert path.exists()  # the lock file stays: a waiter on the old file and a newcomer lock the same one


def test_a_training_stage_finished_while_a_process_waited_is_skipped(tmp_path: Path, capsys) -> None:
    """``benchmarks/bfcl/``'s warm start waits for another holder of its stage, then finds the stage finished
    and returns without training or writing anything."""
    from benchmarks.bfcl.compute import _warmstart_stage
    from benchmarks.common.stages import Stage

    spec = {"out": str(tmp_path / "out"), "results": str(tmp_path / "results"), "name": "warmstart-seed0",
            "config": {"seed": 0, "steps": 1}, "rematerialise": False, "threads": 1, "device": "cpu"}
    stage = Stage(tmp_path / "out", spec["name"], spec["config"], tmp_path / "results")
    errors: list[BaseException] = []

    def other() -> None:
        try:
            _warmstart_stage(spec)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    with stage.lock() as held:  # this thread plays the process that computes the stage
        assert held
        waiter = threading.Thread(target=other)
        waiter.start()
        deadline = time.monotonic() + 120
        seen = ""
        while "[stages] waiting" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capsys.readouterr().out
        assert "[stages] waiting: another process is running warmstart-seed0-" in seen
        assert waiter.is_alive()
        stage.start()
        stage.finish({"train_ids": ["simple_1"], "kept_episodes": 1, "loss": [0.5]})
    waiter.join(timeout=120)
    assert not waiter.is_alive() and not errors, errors
    assert "warmstart-seed0: finished by another process" in capsys.readouterr().out
    assert sorted(p.name for p in stage.dir.iterdir()) == ["done.json"]  # no model was trained or saved


def test_claim_each_takes_the_free_stages_first_and_waits_for_a_held_one_last(tmp_path: Path) -> None:
    from benchmarks.common.stages import claim_each, stage_lock

    paths = [tmp_path / f"eval-{c}.lock" for c in "abc"]
    holder = _hold_in_another_process(paths[0])
    got: list[str] = []
    try:
        for path in claim_each(paths, lambda p, wait: stage_lock(p, wait=wait)):
            got.append(path.stem)
            with stage_lock(path, wait=False) as again:  # held while the caller works on it
                assert again is False
            if len(got) == 2:  # both free ones are done: the held one is next, once its holder is gone
                holder.send_signal(signal.SIGKILL)
                holder.wait(timeout=60)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert got == ["eval-b", "eval-c", "eval-a"]


def test_free_first_gives_the_stages_no_other_driver_holds_first_and_skips_finished_ones(tmp_path: Path) -> None:
    """Two drivers sharing ``OUT`` (protocol v2's sweep) run different arms side by side: a driver is handed the
    arms no other process holds, then the held one, and never an arm finished meanwhile."""
    from benchmarks.common.stages import Stage, free_first

    out, res = tmp_path / "out", tmp_path / "results"
    stages = [Stage(out, f"sweep-{c}", {"arm": c}, res) for c in "abcd"]
    stages[3].start()
    stages[3].finish({"validation_history": []})  # finished before the driver starts
    lock_path = stages[0].dir.with_name(stages[0].dir.name + ".lock")
    holder = _hold_in_another_process(lock_path)  # another driver's child trains arm a
    got: list[str] = []
    try:
        for st in free_first(stages):
            got.append(st.name)
            if st.name == "sweep-b":  # while b trains here, the other driver finishes arm c
                stages[2].start()
                stages[2].finish({"validation_history": []})
            if st.name == "sweep-a":
                with st.lock(wait=False) as held:
                    assert held is False  # handed over while still held: its child waits, then skips it
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert got == ["sweep-b", "sweep-a"]
    # with every lock free, the order is the given one
    assert [st.name for st in free_first(stages[:2])] == ["sweep-a", "sweep-b"]
