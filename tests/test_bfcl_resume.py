"""`python -m benchmarks.bfcl` keeps each finished stage and resumes: a killed run recomputes nothing that finished, and an
interrupted GRPO stage continues from its last saved step; the report reads the committed results alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

#: a tiny protocol: one in-distribution category, one live entry, 2 GRPO steps saved after each
TINY = ["--seeds", "0", "--categories", "simple_python", "--tasks", "1", "--ood-ast", "1", "--ood-irrelevance", "0",
        "--max-turn-tokens", "96", "--num-envs", "2", "--warmstart-episodes", "4", "--warmstart-steps", "1",
        "--warmstart-micro-batch", "4", "--grpo-steps", "2", "--grpo-tasks", "2", "--grpo-prompts-per-step", "1",
        "--grpo-num-generations", "2", "--grpo-save-steps", "1", "--dtype", "none", "--threads", "1"]


def _cmd(out: Path, results: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bfcl", *TINY, "--out", str(out), "--results", str(results),
            *extra]


def _done(out: Path) -> dict[str, float]:
    """``{stage directory: mtime of its done.json}``."""
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/done.json")}


def test_a_killed_run_resumes_without_recomputing_finished_stages(tmp_path: Path) -> None:
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "first.log").open("w")
    # the first run: killed (its whole process group) once GRPO has saved its first step
    proc = subprocess.Popen(_cmd(out, results), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 900
    try:
        while not list(out.glob("grpo-seed0-*/trl/checkpoint-1/trainer_state.json")):
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "GRPO never saved its first step"
            time.sleep(1)
        time.sleep(1)  # let the save finish writing (TRL writes trainer_state.json last)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _done(out)
    names = sorted(before)
    assert any(n.startswith("eval-untrained-simple_python-") for n in names), names
    assert any(n.startswith("warmstart-seed0-") for n in names), names
    assert any(n.startswith("eval-warmstart-seed0-") for n in names), names
    assert not any(n.startswith("grpo-seed0-") for n in names), "GRPO had not finished when it was killed"
    committed = sorted(p.name for p in results.glob("*.json"))
    assert len(committed) == len(before)

    second = subprocess.run(_cmd(out, results), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = _done(out)
    # nothing that had finished ran again: same done.json files, untouched
    assert {k: after[k] for k in before} == before
    assert "warm start, seed 0" not in second.stdout
    assert "untrained: 2 of 2 evaluations done" in second.stdout
    # GRPO continued from its save at step 1 and finished at step 2
    grpo = next(json.loads((out / n / "done.json").read_text()) for n in after if n.startswith("grpo-seed0-"))
    assert grpo["resumed_from"] and grpo["resumed_from"].endswith("checkpoint-1")
    assert grpo["global_step"] == 2
    assert [r["step"] for r in grpo["log_history"] if "loss" in r] == [1, 2]  # step 1's log came with its save
    assert any(n.startswith("eval-grpo-seed0-") for n in after)

    # the report comes from the committed results alone (no --out), every stage present
    rep = subprocess.run([sys.executable, "-m", "benchmarks.bfcl", *TINY, "--results", str(results),
                          "--out", str(tmp_path / "elsewhere"), "--report"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    row = next(line for line in rep.stdout.splitlines() if line.startswith("| 0 |"))
    assert " - " not in row.split("|")[2], row  # untrained / warm start / GRPO all present
    lines = rep.stdout.splitlines()
    # GRPO's training log (2 steps) and every stage's cost come from the records too
    assert any(line.startswith("| 0 | 2 | ") for line in lines), rep.stdout
    behaviour = lines.index(next(line for line in lines if line.startswith("| seed | episodes that call a tool")))
    assert lines[behaviour + 2].startswith("| 0 | ") and " -> " in lines[behaviour + 2], rep.stdout
    for stage in ("untrained evaluation | 2/2", "seed 0 warm start | yes", "seed 0 warm start evaluation | 2/2",
                  "seed 0 GRPO | yes", "seed 0 GRPO evaluation | 2/2"):
        assert any(line.startswith(f"| {stage} |") for line in lines), (stage, rep.stdout)
    total = next(line for line in lines if line.startswith("One seed's warm start, GRPO and their evaluations"))
    assert "seed 0 " in total and " h wall, " in total, total
    assert not (tmp_path / "elsewhere").exists()


def test_a_committed_result_is_not_recomputed_on_a_new_machine(tmp_path: Path) -> None:
    """With the committed results of the untrained evaluation and an empty ``--out`` (a new machine), the run
    does not evaluate the untrained model again."""
    from benchmarks.bfcl.protocol import eval_plan, parser, protocol
    from benchmarks.common.stages import Stage

    args = parser().parse_args([*TINY, "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results")])
    proto = protocol(args)
    plan = eval_plan(proto, "untrained", None)
    assert plan[0]["config"]["category"] == "simple_python" and len(plan) == 2
    for ev in plan:  # results as a finished run on another machine left them (no files under out)
        st = Stage(tmp_path / "other", ev["name"], ev["config"], tmp_path / "results")
        st.start()
        st.finish({"row": {"n": 1, "correct": 0, "accuracy": 0.0, "ci95": [0, 1], "truncated": 0.0, "errors": {}},
                   "entries": [{"category": ev["config"]["category"], "id": "x", "valid": False}]})
    fresh = Stage(tmp_path / "out", plan[0]["name"], plan[0]["config"], tmp_path / "results")
    assert fresh.result() is not None and not fresh.files_ready()
    # a different configuration is a different stage: nothing to reuse
    other = Stage(tmp_path / "out", plan[0]["name"], {**plan[0]["config"], "max_turn_tokens": 17},
                  tmp_path / "results")
    assert other.key != fresh.key and other.result() is None


@pytest.mark.parametrize(("ws_evals", "grpo", "grpo_evals", "grpo_files", "needed"), [
    (False, True, True, True, True),     # the warm start's own evaluations remain
    (True, False, False, False, True),   # GRPO starts from the warm start
    (True, True, False, False, True),    # GRPO finished elsewhere, its evaluations remain, its checkpoint is gone
    (True, True, False, True, False),    # GRPO's checkpoint is here: its evaluations need nothing else
    (True, True, True, False, False),    # everything of the seed is recorded
])
def test_the_warm_start_checkpoint_is_rebuilt_only_when_a_remaining_stage_needs_it(
        ws_evals: bool, grpo: bool, grpo_evals: bool, grpo_files: bool, needed: bool) -> None:
    from benchmarks.bfcl.protocol import warmstart_files_needed

    assert warmstart_files_needed(ws_evals, grpo, grpo_evals, grpo_files) is needed


def test_the_report_gives_the_in_distribution_gain_before_the_live_categories_finish(tmp_path: Path) -> None:
    """Once the warm start and GRPO are evaluated on every in-distribution category, the report has the non-live
    AST column and GRPO's paired gain; the live columns wait for their categories."""
    from benchmarks.bfcl.protocol import eval_plan, grpo_config, parser, protocol, warmstart_config
    from benchmarks.bfcl.report import collect_results, report
    from benchmarks.common.stages import Stage

    results = tmp_path / "results"
    args = parser().parse_args([*TINY, "--out", str(tmp_path / "out"), "--results", str(results)])
    proto = protocol(args)
    ws = Stage(tmp_path / "o", "warmstart-seed0", warmstart_config(args, proto, 0), results)
    gr = Stage(tmp_path / "o", "grpo-seed0", grpo_config(args, proto, 0, ws.key), results)
    for tag, key, valid in (("warmstart-seed0", ws.key, False), ("grpo-seed0", gr.key, True)):
        ev = eval_plan(proto, tag, key)[0]  # simple_python only: the live entry is not evaluated
        assert ev["config"]["category"] == "simple_python"
        st = Stage(tmp_path / "o", ev["name"], ev["config"], results)
        st.start()
        st.finish({"row": {"n": 1, "correct": int(valid), "accuracy": float(valid), "ci95": [0, 1], "truncated": 0.0,
                           "errors": {}}, "entries": [{"category": "simple_python", "id": "simple_python_0",
                                                       "valid": valid, "error_type": None if valid else "x"}]})
    s = collect_results(args)["seeds"][0]
    assert s["grpo_gain_non_live_ast"]["mean"] == 1.0
    assert s["grpo_gain_ood_ast"] is None  # the live categories are not evaluated yet
    row = next(line for line in report(args).splitlines() if line.startswith("| 0 |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[2] == "- / 0.0 / 100.0" and cells[3].startswith("+100.0") and cells[5] == "- / - / -", row


def _evaluated(tmp_path: Path, args: object, seed: int, warm: list[bool], grpo: list[bool]) -> None:
    """Record one seed's warm start and GRPO evaluations of ``simple_python`` (one verdict per entry)."""
    from benchmarks.bfcl.protocol import eval_plan, grpo_config, protocol, warmstart_config
    from benchmarks.common.stages import Stage

    results, proto = Path(args.results), protocol(args)  # type: ignore[attr-defined]
    ws = Stage(tmp_path / "o", f"warmstart-seed{seed}", warmstart_config(args, proto, seed), results)
    gr = Stage(tmp_path / "o", f"grpo-seed{seed}", grpo_config(args, proto, seed, ws.key), results)
    for tag, key, verdicts in ((f"warmstart-seed{seed}", ws.key, warm), (f"grpo-seed{seed}", gr.key, grpo)):
        ev = eval_plan(proto, tag, key)[0]
        st = Stage(tmp_path / "o", ev["name"], ev["config"], results)
        st.start()
        st.finish({"row": {"n": len(verdicts), "correct": sum(verdicts), "accuracy": sum(verdicts) / len(verdicts),
                           "ci95": [0, 1], "truncated": 0.0, "errors": {}},
                   "entries": [{"category": "simple_python", "id": f"simple_python_{i}", "valid": v,
                                "error_type": None if v else "x"} for i, v in enumerate(verdicts)]})


def test_the_report_states_the_gain_across_seeds_and_whether_the_goal_is_met(tmp_path: Path) -> None:
    """Across seeds: each seed's paired gain, their mean and intervals; the goal (+10 points with a CI above 0 on
    every seed) is undecided while the evaluated seeds reach it, not met once one misses it, met when all reach it."""
    from benchmarks.bfcl.protocol import parser
    from benchmarks.bfcl.report import collect_results, goal, report

    args = parser().parse_args([*TINY, "--seeds", "0", "1", "2", "--out", str(tmp_path / "out"),
                                "--results", str(tmp_path / "results")])
    n = 40
    warm = [i < 10 for i in range(n)]       # 25%
    better = [i < 20 for i in range(n)]     # 50%: +25 points, every changed entry a win
    _evaluated(tmp_path, args, 0, warm, better)
    r = collect_results(args)
    assert "undecided" in goal(r) and "1 of 3" in goal(r)
    assert r["across_seeds"]["non_live_ast"]["seeds"] == [0]

    _evaluated(tmp_path, args, 1, warm, [i < 12 for i in range(n)])  # +5 points: short of the goal
    r = collect_results(args)
    assert goal(r).split(": ", 1)[1].startswith("not met: 1 of 2 evaluated seeds reach it")
    a = r["across_seeds"]["non_live_ast"]
    assert a["seeds"] == [0, 1] and a["per_seed"] == pytest.approx([0.25, 0.05]) and a["positive"] == 2
    assert a["mean"] == pytest.approx(0.15) and a["t_lo"] < a["mean"] < a["t_hi"]
    lines = report(args).splitlines()
    row = next(line for line in lines if line.startswith("| non-live AST |"))
    assert "| +25.0, +5.0 | +15.0 |" in row and "| 2 of 2 |" in row, row

    _evaluated(tmp_path, args, 2, warm, [i < 14 for i in range(n)])  # exactly +10 points
    assert goal(collect_results(args)).split(": ", 1)[1].startswith("not met: 2 of 3")
    _evaluated(tmp_path, args, 1, warm, better)  # seed 1 re-recorded with the +25-point result
    r = collect_results(args)
    assert r["seeds"][2]["grpo_gain_non_live_ast"]["lo"] > 0
    assert goal(r).split(": ", 1)[1].startswith("met: 3 of 3"), goal(r)


def test_the_training_summary_counts_the_steps_that_had_anything_to_learn_from() -> None:
    """A step whose groups all have one reward gives every sample advantage 0: the summary counts the steps with
    any spread and names the last one."""
    from benchmarks.bfcl.report import grpo_training

    log = [{"step": i + 1, "reward": r, "frac_reward_zero_std": z, **({"entropy": 0.1} if z < 1 else {})}
           for i, (r, z) in enumerate([(0.5, 0.5), (0.0, 1.0), (0.25, 0.0), (0.5, 1.0), (0.0, 1.0)])]
    t = grpo_training({"log_history": [*log, {"train_runtime": 1.0}]}, window=2)
    assert t["steps"] == 5 and t["spread_steps"] == 2 and t["last_spread_step"] == 3
    assert t["entropy"] == (0.1, None)  # no step of the last two trained
    assert grpo_training({"log_history": [{"reward": 0.0, "frac_reward_zero_std": 1.0}]})["last_spread_step"] is None
