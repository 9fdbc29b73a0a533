"""`python -m benchmarks.credit` resumes: a killed run keeps its finished arms, an interrupted arm continues from its last
checkpoint, and the verdict comes from the results records alone (tiny random model: the mechanics, not a result)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the benchmark trains with TRL")

ROOT = Path(__file__).resolve().parent.parent
#: a tiny protocol: 2 seeds x (outcome, turn_return), 4 GRPO steps per arm, a checkpoint every 2 steps
TINY = ["--smoke", "--model", "tiny", "--threads", "1", "--max-steps", "4", "--save-steps", "2",
        "--token-budget", "1000000", "--seeds", "0", "1", "--estimators", "outcome", "turn_return"]
ARMS = ["outcome/seed0", "turn_return/seed0", "outcome/seed1", "turn_return/seed1"]


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.credit", *TINY, "--output-dir", str(out), *extra]


def _env(fault: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("TOOLGYM_CREDIT_FAULT", None)
    if fault:
        env["TOOLGYM_CREDIT_FAULT"] = fault
    return env


def _run(out: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(out, *extra), cwd=ROOT, env=_env(fault), capture_output=True, text=True, timeout=600)


def _main(capsys, out: Path, *extra: str) -> str:
    """The benchmark in this process (its imports are paid once); returns what it printed."""
    from benchmarks.credit.run import main

    capsys.readouterr()
    assert main([*TINY, "--output-dir", str(out), *extra]) == 0
    return capsys.readouterr().out


def _comparable(arm: dict) -> dict:
    """What an arm computes (its tokens, steps, learning curve and per-task verdicts), without times."""
    ev = {k: v for k, v in arm["eval"].items() if k != "wall_s"}
    return {"tokens": arm["tokens"], "steps": arm["steps"], "curve": arm["curve"], "eval": ev, "key": arm["key"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The tiny protocol run once, never interrupted."""
    from benchmarks.credit.run import main

    out = tmp_path_factory.mktemp("credit-ref")
    assert main([*TINY, "--output-dir", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_run_resumes_without_recomputing_finished_arms(tmp_path, reference, capsys):
    out = tmp_path / "run"
    proc = subprocess.Popen(_cmd(out), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # SIGKILL as soon as the first arm's done marker exists
        while proc.poll() is None and not list(out.glob("arm-*/done.json")):
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    finished = {p.parent.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.glob("arm-*/done.json")}
    records = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (out / "results").glob("arm-*.json")}
    assert 1 <= len(finished) < len(ARMS) and len(records) == len(finished)

    printed = _main(capsys, out)
    names = {json.loads(b)["name"] for b, _ in finished.values()}
    for name in names:  # finished arms: skipped, neither trained nor evaluated again, their files untouched
        assert f"[credit] skip {name}: finished" in printed
        assert f"[credit] {name}: train" not in printed and f"[credit] {name}: resume" not in printed
    for d, (data, mtime) in finished.items():
        assert (out / d / "done.json").read_bytes() == data and (out / d / "done.json").stat().st_mtime_ns == mtime
    for f, (data, mtime) in records.items():
        assert (out / "results" / f).read_bytes() == data and (out / "results" / f).stat().st_mtime_ns == mtime
    assert "skip warm start: weights from" in printed  # the shared warm start is read back, not trained again
    r = json.loads((out / "results.json").read_text())
    assert sorted(r["arms"]) == sorted(ARMS)
    # what every arm computed equals the uninterrupted run's (CPU, fp32, fixed seeds)
    assert {k: _comparable(a) for k, a in r["arms"].items()} == {k: _comparable(a) for k, a in reference["arms"].items()}

    # a new machine: the committed records alone; nothing is trained, loaded or evaluated again
    fresh = tmp_path / "fresh"
    shutil.copytree(out / "results", fresh / "results")
    printed = _main(capsys, fresh)
    assert all(f"[credit] skip {name}: finished" in printed for name in ARMS)
    assert not list(fresh.glob("warmstart-*/")) and not list(fresh.glob("arm-*/"))
    assert json.loads((fresh / "results.json").read_text())["summary"] == r["summary"]
    # the verdict is recomputed from the records alone
    printed = _main(capsys, tmp_path / "elsewhere", "--report", "--results-dir", str(out / "results"))
    from benchmarks.credit.verdict import verdict

    assert "4/4 arms finished" in printed and f"Verdict: {verdict(r['summary'], 'turn_return')}" in printed


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_interrupted_arm_continues_from_its_last_checkpoint(tmp_path, reference, capsys):
    out = tmp_path / "run"
    one = ("--seeds", "0", "--estimators", "turn_return")  # later flags win: one arm of the reference's four
    p = _run(out, *one, fault="save:2")  # killed right after the checkpoint of step 2
    assert p.returncode == -signal.SIGKILL and "SIGKILL at save:2" in p.stdout
    p = _run(out, *one, fault="trained")  # resumes at step 2; killed after training, before the evaluation
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    assert "turn_return/seed0: resume from step 2" in p.stdout and "turn_return/seed0: train\n" not in p.stdout
    printed = _main(capsys, out, *one)  # the trained weights come from the last checkpoint; no step trained again
    assert "turn_return/seed0: trained (4 steps); weights from" in printed
    arm = json.loads((out / "results.json").read_text())["arms"]["turn_return/seed0"]
    assert [(r["from_step"], r["to_step"]) for r in arm["runs"]] == [(0, 2), (2, 4)]
    assert [c["step"] for c in arm["curve"]] == [1, 2, 3, 4]
    assert _comparable(arm) == _comparable(reference["arms"]["turn_return/seed0"])
    assert not list(out.glob("arm-*/grpo/checkpoint-*"))  # a finished arm's checkpoints are removed


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_on_one_output_directory_train_each_arm_once(tmp_path, reference):
    """The same command started twice shares the work: every stage runs under its lock, a process leaves an arm
    the other is training for later and skips it once finished, so each arm is trained by exactly one of them."""
    out = tmp_path / "run"
    procs = [subprocess.Popen(_cmd(out), cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) for _ in range(2)]
    printed = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], printed
    for name in ARMS:
        trained = [f"[credit] {name}: train\n" in text for text in printed]
        assert trained.count(True) == 1, (name, printed)
        skipped = [f"[credit] skip {name}: finished by another process" in text for text in printed]
        assert skipped == [not t for t in trained], (name, printed)
    # the warm start is trained once: the other process waits for it and reads its weights back
    assert sum("skip warm start: weights from" in text for text in printed) == 1, printed
    r = json.loads((out / "results.json").read_text())
    assert {k: _comparable(a) for k, a in r["arms"].items()} == {k: _comparable(a) for k, a in reference["arms"].items()}


def test_stage_keys_follow_what_a_stage_computes(tmp_path):
    from dataclasses import replace

    from benchmarks.credit.protocol import CreditBenchConfig, plan
    from benchmarks.credit.stages import Stage, latest_checkpoint, write_json

    cfg = CreditBenchConfig()
    keys = {name: s.key for name, s, *_ in plan(cfg).arms}
    assert len(set(keys.values())) == 15
    # thread counts, checkpoint frequency, the output directory and the arm list leave every key as it is
    same = replace(cfg, threads=1, save_steps=9, output_dir=str(tmp_path), seeds=(3, 0))
    assert {n: s.key for n, s, *_ in plan(same).arms}.items() <= keys.items()
    # a knob that changes training changes every arm's key, and the warm start's key reaches its arms
    assert all(s.key != keys[n] for n, s, *_ in plan(replace(cfg, lr=2 * cfg.lr)).arms)
    assert all(s.key != keys[n] for n, s, *_ in plan(replace(cfg, warmstart_lr=1e-4)).arms)
    # gamma changes the turn-level arms only (outcome ignores it)
    g = {n: s.key for n, s, *_ in plan(replace(cfg, gamma=0.9)).arms}
    assert all((g[n] == keys[n]) == n.startswith("outcome") for n in keys)
    assert Stage("a", {"x": 1, "y": [1, 2]}).key == Stage("a", {"y": [1, 2], "x": 1}).key

    # a checkpoint counts once complete: trainer state written and the arm's progress at that step kept
    grpo, prog = tmp_path / "grpo", tmp_path / "progress"
    for step in (2, 4, 6):
        (grpo / f"checkpoint-{step}").mkdir(parents=True)
    write_json(grpo / "checkpoint-2" / "trainer_state.json", {"global_step": 2})
    write_json(grpo / "checkpoint-4" / "trainer_state.json", {"global_step": 4})
    (grpo / "checkpoint-6" / "trainer_state.json").write_text('{"global_st')  # killed while saving
    write_json(prog / "step-2.json", {"tokens": 10})
    assert latest_checkpoint(grpo, prog)[1] == 2  # 4 lacks its progress, 6 is cut
    assert not (grpo / "checkpoint-6").exists() and not (grpo / "checkpoint-4").exists()
