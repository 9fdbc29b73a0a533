"""benchmarks/credit.py --smoke runs the whole protocol end to end (tiny random model: the pipeline, not a result)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl", reason="the benchmark trains with TRL")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_credit_benchmark_smoke(tmp_path):
    from benchmarks.credit import main

    assert main(["--smoke", "--model", "tiny", "--threads", "1", "--output-dir", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert set(r["arms"]) == {"outcome/seed0", "turn_return/seed0"}
    for arm in r["arms"].values():
        assert arm["steps"] == 1 and arm["tokens"] > 0 and len(arm["eval"]["wins"]) == 4
        assert arm["curve"] and arm["curve"][0]["tokens"] == arm["tokens"]
    assert "vs_outcome_pooled" in r["summary"]["turn_return"]
    assert (tmp_path / "credit.png").stat().st_size > 0
    assert main(["--report", "--output-dir", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "trajectories" / "turn_return_seed0" / "rank0.jsonl").read_text()
            .splitlines()]
    assert rows and all(len(x["turn_advantages"]) == len(x["turns"]) for x in rows)
    # a rerun resumes: finished arms are not trained again
    assert main(["--smoke", "--model", "tiny", "--threads", "1", "--output-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["arms"] == r["arms"]
