"""Protocol v2 of the BFCL learning experiment (docs/bfcl.md, "Protocol v2"): the sweep's choice on validation, the
stages it reuses from v1, and a report whose gains are the differences of the scores printed beside them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.bfcl.protocol import eval_plan, parser, protocol, warmstart_config
from benchmarks.bfcl.protocol_v2 import (
    GRPO_V2,
    SWEEP_SEED,
    SWEEP_STEPS,
    add_arguments,
    arm_name,
    arm_score,
    choose,
    grpo_v2_config,
    sweep_arms,
)
from benchmarks.bfcl.report_v2 import category_mean_gain, collect_v2, goal_v2, report_v2
from benchmarks.common.stages import Stage


def _args(*extra: str) -> argparse.Namespace:
    p = parser()
    add_arguments(p)
    return p.parse_args(["--protocol", "v2", *extra])


def test_an_arms_score_leaves_out_the_warm_start_step() -> None:
    hist = [{"step": 0, "success": 0.9}, {"step": 8, "success": 0.2}, {"step": 16, "success": 0.4}]
    assert arm_score(hist) == pytest.approx((0.4, 0.3))
    assert arm_score([{"step": 0, "success": 0.5}]) is None


def test_the_choice_takes_the_best_validation_score_and_breaks_ties_in_the_protocols_order() -> None:
    arms = sweep_arms()
    assert len(arms) == 6 and {a["beta"] for a in arms} == {1e-3}
    assert [a["lr"] for a in arms[:2]] == [1e-6, 1e-6] and [a["reward"] for a in arms[:2]] == ["binary", "partial"]
    scores = [(0.30, 0.20), (0.35, 0.30), (0.35, 0.30), (0.35, 0.31), (0.10, 0.05), (0.20, 0.1)]
    assert choose(list(zip(arms, scores, strict=True))) == arms[3]  # the best mean among the tied best scores
    tied = [(0.35, 0.30)] * 6
    assert choose(list(zip(arms, tied, strict=True))) == arms[0]  # lowest lr, binary
    assert choose(list(zip(arms, [*scores[:5], None], strict=True))) is None  # an arm not finished
    second = sweep_arms(arms[3])[6:]
    assert [(a["lr"], a["reward"], a["beta"]) for a in second] == [(3e-6, "partial", 0.0), (3e-6, "partial", 1e-2)]
    assert len({arm_name(a) for a in sweep_arms(arms[3])}) == 8


def test_v2_reuses_v1s_warm_starts_and_their_committed_evaluations() -> None:
    """The default command line keys every seed's warm start as v1 did: the report finds their records."""
    args = _args("--seeds", "0", "1", "2")
    r = collect_v2(args)
    for seed in (0, 1, 2):
        w = r["seeds"][seed]["warm_table"]
        assert w is not None and w["complete"], seed
    assert r["untrained"] is not None and r["untrained"]["complete"]
    proto = protocol(args)
    ws = Stage(Path("/nonexistent"), "warmstart-seed0", warmstart_config(args, proto, 0), Path(args.results))
    a = grpo_v2_config(proto, 0, ws.key, sweep_arms()[0], SWEEP_STEPS, args.grpo_v2_tasks)
    b = grpo_v2_config(proto, 0, ws.key, sweep_arms()[1], SWEEP_STEPS, args.grpo_v2_tasks)
    assert a["warmstart"] == ws.key and a["partial_credit"] is False and b["partial_credit"] is True
    assert a["prompts_per_step"] >= 8 and a["validation_tasks"] == GRPO_V2["validation_tasks"]


def _table(rows: dict[str, list[bool]]) -> dict[str, object]:
    entries = {(c, f"{c}_{i}"): float(v) for c, vs in rows.items() for i, v in enumerate(vs)}
    return {"rows": {c: {"accuracy": sum(vs) / len(vs), "n": len(vs)} for c, vs in rows.items()},
            "entries": entries}


def test_the_category_mean_gain_is_the_difference_of_the_category_means_not_the_pooled_one() -> None:
    # a big category that does not move and a small one that gains 50 points
    warm = _table({"simple_python": [i < 50 for i in range(200)], "parallel": [i < 5 for i in range(20)]})
    grpo = _table({"simple_python": [i < 50 for i in range(200)], "parallel": [i < 15 for i in range(20)]})
    g = category_mean_gain(warm, grpo, ("simple_python", "parallel"))
    assert g is not None
    assert g["mean"] == pytest.approx(0.25)  # (0 + 0.5) / 2
    assert g["pooled"] == pytest.approx(10 / 220)
    assert g["lo"] < g["mean"] < g["hi"]
    assert category_mean_gain(warm, grpo, ("simple_python", "multiple")) is None


def _record_eval(out: Path, results: Path, proto: dict, tag: str, key: str, verdicts: dict[str, list[bool]]) -> None:
    for ev in eval_plan(proto, tag, key):
        cat = ev["config"]["category"]
        vs = verdicts.get(cat)
        if vs is None:
            continue
        st = Stage(out, ev["name"], ev["config"], results)
        st.start()
        st.finish({"row": {"n": len(vs), "correct": sum(vs), "accuracy": sum(vs) / len(vs), "ci95": [0, 1],
                           "truncated": 0.0, "errors": {}},
                   "entries": [{"category": cat, "id": f"{cat}_{i}", "valid": v, "error_type": None if v else "x"}
                               for i, v in enumerate(vs)]})


def test_the_report_chooses_from_the_sweep_and_prints_gains_that_are_the_printed_differences(tmp_path: Path) -> None:
    out, r1, r2 = tmp_path / "out", tmp_path / "r1", tmp_path / "r2"
    args = _args("--seeds", "0", "--categories", "simple_python,parallel", "--ood-ast", "1", "--ood-irrelevance", "0",
                 "--tasks", "4", "--out", str(out), "--results", str(r1), "--results-v2", str(r2))
    proto = protocol(args)
    ws = Stage(out, "warmstart-seed0", warmstart_config(args, proto, SWEEP_SEED), r1)

    def sweep_record(arm: dict, best: float) -> None:
        st = Stage(out, f"sweep-{arm_name(arm)}", grpo_v2_config(proto, SWEEP_SEED, ws.key, arm, SWEEP_STEPS,
                                                                 args.grpo_v2_tasks), r2)
        st.start()
        st.finish({"validation_history": [{"step": 0, "success": 0.3}, {"step": 8, "success": best},
                                          {"step": 16, "success": best - 0.05}], "log_history": []})

    first = sweep_arms()
    for arm, best in zip(first, (0.31, 0.33, 0.40, 0.35, 0.2, 0.1), strict=True):
        sweep_record(arm, best)
    r = collect_v2(args)
    assert r["first_choice"] == first[2] and r["choice"] is None  # the second phase has not run
    for arm, best in zip(sweep_arms(first[2])[6:], (0.38, 0.45), strict=True):
        sweep_record(arm, best)
    r = collect_v2(args)
    assert r["choice"] == {"lr": 3e-6, "reward": "binary", "beta": 1e-2}

    gr = Stage(out, "grpo-seed0", grpo_v2_config(proto, 0, ws.key, r["choice"], GRPO_V2["steps"],
                                                 args.grpo_v2_tasks), r2)
    gr.start()
    rebuild = {"max_abs_loss_diff": 0.0123, "machine": {"cpu": "AMD EPYC"}, "recorded_machine": {"cpu": "Intel"}}
    gr.finish({"global_step": 48, "selected_step": 16, "validation_history": [], "log_history": [],
               "warmstart_rebuild": rebuild})
    warm = {"simple_python": [True, False, False, False], "parallel": [False] * 4}
    sel = {"simple_python": [True, True, False, False], "parallel": [True, True, True, False]}
    last = {"simple_python": [False] * 4, "parallel": [False] * 4}
    _record_eval(out, r1, proto, "warmstart-seed0", ws.key, warm)
    _record_eval(out, r2, proto, "grpo-seed0", f"{gr.key}:selected", sel)
    _record_eval(out, r2, proto, "grpolast-seed0", f"{gr.key}:last", last)
    text = report_v2(args)
    row = next(line for line in text.splitlines() if line.startswith("| 0 |"))
    cells = [c.strip() for c in row.split("|")]
    scores = [float(x) for x in cells[2].split(" / ")[1:]]  # warm start / selected / last (untrained not run)
    assert scores == [12.5, 62.5, 0.0]
    assert cells[3].startswith(f"{scores[1] - scores[0]:+.1f} [")  # the gain is the printed difference
    assert cells[5].startswith(f"{scores[2] - scores[0]:+.1f} [")
    assert cells[4] == f"{100 * 4 / 8:+.1f}"  # pooled over the 8 entries: 1 -> 5 correct
    assert cells[6] == "16 of 48"
    assert "Chosen: lr3e-06-binary-beta0.01" in text
    assert "| seed 0 GRPO | AMD EPYC | Intel | 0.0123 |" in text  # trained from a warm start rebuilt elsewhere
    assert "not met" not in goal_v2(collect_v2(args)) and "met: 1 of 1" in goal_v2(collect_v2(args))


def test_a_rebuilt_warm_start_records_how_far_its_losses_are_from_the_recorded_run() -> None:
    from benchmarks.bfcl.compute import rebuild_fidelity

    recorded = {"loss": [0.66688, 0.22923, 0.11202], "machine": {"cpu": "Intel(R) Xeon(R) Processor", "amx": True}}
    out = rebuild_fidelity(recorded, [0.6669, 0.22, 0.11202])
    assert out["max_abs_loss_diff"] == pytest.approx(0.00923)
    assert out["recorded_machine"]["amx"] is True and out["machine"]["cores"] >= 1
    assert out["loss"] == [0.6669, 0.22, 0.11202] and out["recorded_loss"] == recorded["loss"]
    assert rebuild_fidelity({}, [0.5])["max_abs_loss_diff"] is None  # no record to compare with
