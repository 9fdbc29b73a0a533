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
from toolgym import plots
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
