"""Plots: training curves from every training-log shape the trainers write, latency histograms from a real
rollout file and a real executor."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.rollout_files import make_rollout_file
from toolgym.report import plots
from toolgym.runtime import run_sync
from toolgym.tools.base import ToolCall
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.function import tool


def read_png(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    assert float(img[..., :3].std()) > 0.02, "blank image"
    return img


STEPS = [
    {"step": 1, "reward": 0.1, "success": 0.0, "tool_call_rate": 0.5, "errors": {"parse_error": 0.25}},
    {"step": 2, "reward": 0.4, "success": 0.25, "tool_call_rate": 0.75, "errors": {"parse_error": 0.0}},
    {"step": 3, "reward": 0.9, "success": 0.875, "tool_call_rate": 1.0, "errors": {}},
]


def test_jsonl_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in STEPS))
    rows = plots.load_training_log(log)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["reward"] for r in rows] == [0.1, 0.4, 0.9]
    out = plots.plot_training_curves(log, tmp_path / "png" / "curves.png", smooth=2)
    img = read_png(out)
    assert img.shape[1] > 1000  # error panel present (parse_error was non-zero): two panels side by side


def test_trainer_state_log_history(tmp_path: Path) -> None:
    """TRL writes ``trainer_state.json`` with ``log_history``: long names, a final summary row without metrics."""
    history = [
        {"step": 1, "reward": 0.25, "toolgym/success": 0.125, "toolgym/tool_call_rate": 0.5, "loss": 0.01,
         "toolgym/errors/timeout": 0.0, "toolgym/errors/parse_error": 0.5},
        {"step": 2, "rewards/env_reward/mean": 0.5, "toolgym/success": 0.5, "toolgym/tool_call_rate": 1.0,
         "toolgym/errors/timeout": 0.125, "toolgym/errors/parse_error": 0.0},
        {"step": 2, "train_runtime": 12.5, "train_loss": 0.02},
    ]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 2, "log_history": history}))
    rows = plots.load_training_log(path)
    assert len(rows) == 2
    assert rows[1]["reward"] == 0.5 and rows[1]["success"] == 0.5
    assert rows[0]["errors"] == {"timeout": 0.0, "parse_error": 0.5}
    read_png(plots.plot_training_curves(path, tmp_path / "c.png"))


def test_demo_metrics_json(tmp_path: Path) -> None:
    metrics = {"eval_before": {"success": 0.0}, "grpo": {"steps": STEPS, "wall_s": 10.0}}
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics))
    assert [r["success"] for r in plots.load_training_log(path)] == [0.0, 0.25, 0.875]
    read_png(plots.plot_training_curves(metrics, tmp_path / "c.png", metrics=["success"]))


def test_bad_logs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        plots.load_training_log(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{oops\n')
    with pytest.raises(ValueError, match="neither JSON nor JSONL"):
        plots.load_training_log(bad)
    with pytest.raises(ValueError, match="none of the metrics"):
        plots.plot_training_curves([{"step": 1, "loss": 0.5}], tmp_path / "x.png", metrics=["reward"])
    assert not (tmp_path / "x.png").exists()


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    return make_rollout_file(tmp_path_factory.mktemp("rollout") / "traj.jsonl")


def test_latency_from_a_rollout_file(rollout: tuple[Path, list[Any]], tmp_path: Path) -> None:
    path, trajs = rollout
    lat = plots.latencies_from(path)
    # calls that reached the tool: the successful one and the division by zero (an exception inside the tool)
    ran = [r for t in trajs for r in t.tool_results
           if r.error_kind is None or r.error_kind.value in ("timeout", "exception")]
    assert sorted(lat) == ["calculator"]
    assert sorted(lat["calculator"]) == pytest.approx(sorted(r.latency_s for r in ran))
    read_png(plots.plot_latency_histogram([path, path], tmp_path / "lat.png"))
    assert len(plots.latencies_from([path, path])["calculator"]) == 2 * len(ran)


def test_latency_from_a_real_executor(tmp_path: Path) -> None:
    @tool
    async def nap(ms: int) -> str:
        """Sleep.

        Args:
            ms: milliseconds to sleep.
        """
        await asyncio.sleep(ms / 1000)
        return "ok"

    @tool
    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to echo.
        """
        return text

    ex = ToolExecutor([nap, echo])
    calls = [ToolCall("nap", {"ms": ms}) for ms in (1, 5, 20, 40)] + [ToolCall("echo", {"text": "x"})] * 5
    results = run_sync(ex.run_many(calls))
    assert all(r.error_kind is None for r in results)
    lat = plots.latencies_from(ex)
    assert len(lat["nap"]) == 4 and len(lat["echo"]) == 5
    assert max(lat["nap"]) >= 0.04
    read_png(plots.plot_latency_histogram(ex, tmp_path / "lat.png", log_scale=True))
    js = tmp_path / "lat.json"
    js.write_text(json.dumps({"latencies_s": lat}))
    assert plots.latencies_from(js) == lat
    read_png(plots.plot_latency_histogram(js, tmp_path / "lat2.png", log_scale=False))
    with pytest.raises(ValueError, match="no tool-call latencies"):
        plots.plot_latency_histogram({}, tmp_path / "none.png")


def _has_colour(img: np.ndarray, hex_colour: str, min_px: int = 30) -> bool:
    want = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    return int((np.abs(img[..., :3] - want).max(-1) < 0.02).sum()) >= min_px


def test_several_runs_overlaid(tmp_path: Path) -> None:
    """``plot curves LOG1 LOG2``: one panel per metric, one line (one colour) per run, runs named by their paths."""
    import subprocess
    import sys

    a = tmp_path / "runs" / "baseline" / "trainer_state.json"
    a.parent.mkdir(parents=True)
    a.write_text(json.dumps({"log_history": [{"step": s, "reward": 0.1 * s, "toolgym/success": 0.05 * s}
                                             for s in range(1, 6)]}))
    b = tmp_path / "grpo-lr3e-5.jsonl"
    b.write_text("".join(json.dumps({"step": s, "reward": 1 - 0.1 * s, "success": 0.5}) + "\n" for s in range(1, 9)))
    assert plots.run_names([a, b]) == ["baseline", "grpo-lr3e-5"]
    assert plots.run_names(["x/a/log.jsonl", "y/a/log.jsonl", "z.jsonl", "z.jsonl"]) == ["x/a", "y/a", "z", "z #2"]

    img = read_png(plots.plot_runs([a, b], tmp_path / "two.png", metrics=["reward", "success"]))
    one = read_png(plots.plot_runs({"only": b}, tmp_path / "one.png", metrics=["reward"]))
    assert img.shape[1] > 1.6 * one.shape[1]  # two panels (reward, success) side by side vs one
    blue, orange, green = "#1f77b4", "#ff7f0e", "#2ca02c"  # matplotlib's first three cycle colours
    assert _has_colour(img, blue) and _has_colour(img, orange) and not _has_colour(img, green)
    three = read_png(plots.plot_runs([a, b, _steps_file(tmp_path)], tmp_path / "three.png", metrics=["reward"]))
    assert _has_colour(three, green)
    with pytest.raises(ValueError, match="none of the 2 training logs"):
        plots.plot_runs([a, b], tmp_path / "x.png", metrics=["loss"])
    assert not (tmp_path / "x.png").exists()

    # the CLI overlays when given several logs
    out = tmp_path / "cli.png"
    r = subprocess.run([sys.executable, "-m", "toolgym.cli", "plot", "curves", str(a), str(b), "--out", str(out),
                        "--metrics", "reward,success"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    cli = read_png(out)
    assert cli.shape == img.shape and _has_colour(cli, orange)


def _steps_file(tmp_path: Path) -> Path:
    p = tmp_path / "steps.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in STEPS))
    return p
