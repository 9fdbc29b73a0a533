"""Comparing and watching in ``toolgym ui``, in headless Chromium: two runs of a real MLflow store side by side
(every parameter of both, the differing ones first and marked, the shared ones folded, the page a screen high), the
statuses finished / stopped (MLflow's ``KILLED`` and a run whose UI job was stopped), the viewer's compare mode
naming its two files apart, and a training job's progress from its config's ``max_steps``."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import test_ui
from tests.test_ui import NEEDS_DRIVER, Server, open_page, tab, wait_for
from tests.test_viewer import WebDriver

pytest.importorskip("fastapi", reason="toolgym ui needs the [ui] extra")
mlflow = pytest.importorskip("mlflow", reason="the Runs page needs the [registry] extra")

browser = test_ui.browser  # the UI tests' browser fixture (one for this module)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    runs = tmp_path_factory.mktemp("ui-compare") / "runs"
    runs.mkdir()
    s = Server(runs)
    yield s
    s.stop()


def _store(runs: Path) -> Any:
    from trainers.tracking import ensure_store, store_lock

    uri = f"sqlite:///{runs / 'mlflow.db'}"
    with store_lock(uri):
        ensure_store(uri)
    return mlflow.MlflowClient(uri)


def _run(client: Any, exp: str, name: str, params: dict[str, str], rewards: list[float], status: str) -> str:
    from mlflow.entities import Metric, Param

    run = client.create_run(exp, run_name=name)
    rid = run.info.run_id
    client.log_batch(rid, params=[Param(k, v) for k, v in params.items()],
                     metrics=[Metric("reward", r, 0, i + 1) for i, r in enumerate(rewards)])
    client.set_terminated(rid, status)
    return rid


def _until(check: Any, what: str, timeout: float = 120.0) -> None:
    """Poll ``check()`` until true (fails after ``timeout`` seconds naming ``what``)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_compare_labels_tell_two_files_apart(tmp_path: Path) -> None:
    from trainers.ui.commands import compare_labels

    a, b = tmp_path / "run-a" / "trajectories" / "eval.jsonl", tmp_path / "run-b" / "trajectories" / "eval.jsonl"
    assert compare_labels(tmp_path, a, b) == ("run-a/trajectories/eval.jsonl", "run-b/trajectories/eval.jsonl")
    c = tmp_path / "demo" / "trajectories" / "eval_before.jsonl"
    d = tmp_path / "demo" / "trajectories" / "eval_after_grpo.jsonl"
    assert compare_labels(tmp_path, c, d) == ("eval_before.jsonl", "eval_after_grpo.jsonl")
    assert compare_labels(tmp_path, c, c) == ("A: eval_before.jsonl", "B: eval_before.jsonl")


@NEEDS_DRIVER
def test_side_by_side_shows_every_parameter_and_stopped_runs_say_so(server: Server, browser: WebDriver) -> None:
    from trainers.ui.jobs import JobStore

    client = _store(server.runs)
    exp = client.create_experiment("compare", artifact_location=(server.runs / "mlartifacts").as_uri())
    shared = {f"p{i:02d}": str(i) for i in range(80)}
    _run(client, exp, "lr-small", {**shared, "learning_rate": "1e-05", "only_small": "x"}, [0.1, 0.3, 0.6],
                 "FINISHED")
    _run(client, exp, "lr-large", {**shared, "p07": "seven", "learning_rate": "3e-05"}, [0.2, 0.2, 0.4], "KILLED")
    # a run whose training the UI stopped: MLflow says FINISHED, the job (and the run's lineage file) say stopped
    cut = _run(client, exp, "cut-short", shared, [0.1], "FINISHED")
    out = server.runs / "cut-short"
    out.mkdir()
    (out / "toolgym_run.json").write_text(json.dumps({"training_run_id": cut}))
    jobs = JobStore(server.runs)
    job = jobs.launch("train", [sys.executable, "-c", "import time; time.sleep(120)", "--output_dir", str(out)],
                      title="grpo cut-short")
    _until(lambda: jobs.state(job["id"])["status"] == "running", "the job to run")
    jobs.stop(job["id"])
    _until(lambda: jobs.state(job["id"])["status"] == "stopped", "the job to stop")

    d = browser
    open_page(d, server)
    tab(d, "runs")
    wait_for(d, "return document.querySelectorAll('#runs-table tbody tr[data-id]').length >= 3", what="the runs")
    status = d.js("return Object.fromEntries([...document.querySelectorAll('#runs-table tbody tr[data-id]')]"
                  ".map(r => [r.children[1].firstChild.textContent, r.children[3].textContent]))")
    assert status["lr-small"] == "finished" and status["lr-large"] == "stopped" and status["cut-short"] == "stopped"

    d.js("[...document.querySelectorAll('#runs-table tbody tr[data-id]')].filter(r => r.textContent.includes('lr-'))"
         ".forEach(r => r.querySelector('.run-pick').click())")
    wait_for(d, "return document.querySelectorAll('#runs-compare tr.differ').length > 0", what="the parameter diff")
    heads = d.js("return [...document.querySelectorAll('#runs-compare thead th')].map(e => e.textContent)")
    assert heads[1:] == ["lr-large", "lr-small"] or heads[1:] == ["lr-small", "lr-large"]
    small_col = heads.index("lr-small")
    differ = d.js("return [...document.querySelectorAll('#runs-compare tr.differ')].map(r => "
                  "[...r.children].map(c => c.textContent))")
    keys = [r[0] for r in differ]
    assert keys[:3] == ["param learning_rate", "param only_small", "param p07"], keys
    lr = differ[0]
    assert lr[small_col] == "1e-05" and lr[3 - small_col] == "3e-05"
    only = differ[1]
    assert only[small_col] == "x" and only[3 - small_col] == "(not set)"
    assert d.js("return document.querySelector('#runs-same summary').textContent").startswith(
        "79 parameters the same in both")
    assert d.js("return document.querySelector('#runs-same').open") is False
    assert d.js("return [...document.querySelectorAll('#runs-same td')].some(c => c.textContent === 'p42')")
    # every shared parameter is there, folded: the page stays about a screen high
    assert d.js("return document.documentElement.scrollHeight") < 2600
    # the curves of both runs, labelled
    wait_for(d, "return document.querySelectorAll('#runs-curves polyline.curve').length === 2", what="two curves")
    legend = d.js("return [...document.querySelectorAll('#runs-curves text.legend')].map(t => t.textContent)")
    assert sorted(legend) == ["lr-large", "lr-small"]
    assert d.js("return document.querySelector('#runs-curves text.xlabel').textContent") == "step"


@NEEDS_DRIVER
def test_the_viewer_names_the_two_files_it_compares(server: Server, browser: WebDriver) -> None:
    row = {"completion_ids": [1, 2], "loss_mask": [1, 0], "turns": [{"text": "hello"}], "task": {"id": "t1"}}
    for run in ("run-a", "run-b"):
        p = server.runs / run / "trajectories" / "eval.jsonl"
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(row) + "\n")
    browser.get(server.url + "/view?file=run-a/trajectories/eval.jsonl&compare=run-b/trajectories/eval.jsonl")
    wait_for(browser, "return window.toolgymViewer && window.toolgymViewer.ready", what="the served viewer")
    labels = browser.js("return [...document.querySelectorAll('#f-run option')].map(o => o.textContent)")
    assert labels[-2:] == ["run-a/trajectories/eval.jsonl", "run-b/trajectories/eval.jsonl"], labels


def test_step_budget_comes_from_the_command_line_else_the_config() -> None:
    from trainers.ui.commands import CONFIG_DIR, step_budget

    cfg = str(CONFIG_DIR / "grpo_calculator_cpu.yaml")
    import yaml

    in_file = yaml.safe_load(Path(cfg).read_text())["max_steps"]
    assert step_budget(["toolgym", "train", "grpo", "--config", cfg]) == in_file
    assert step_budget(["toolgym", "train", "grpo", "--config", cfg, "--max_steps", "7"]) == 7
    assert step_budget(["toolgym", "train", "grpo", "--max_steps", "-1"]) is None  # an epoch budget
    assert step_budget(["toolgym", "train", "grpo", "--config", str(CONFIG_DIR / "missing.yaml")]) is None


@NEEDS_DRIVER
def test_a_job_shows_its_progress_from_the_config_and_its_latest_metrics(server: Server,
                                                                       browser: WebDriver) -> None:
    """A training job whose step budget is only in its config (``max_steps: 10`` in grpo_calculator_cpu.yaml):
    the page shows step 2 of 10 with a bar and a time estimate, and the latest metrics as a table."""
    from trainers.ui.commands import CONFIG_DIR
    from trainers.ui.jobs import JobError, JobStore

    script = ("import time\nfor s in (1, 2):\n    print({'loss': '0.5', 'reward': str(0.25 * s), "
              "'toolgym/success': str(0.25 * s), 'toolgym/errors/timeout': '0.125', 'epoch': str(0.1 * s)}, "
              "flush=True)\ntime.sleep(120)\n")
    jobs = JobStore(server.runs)
    job = jobs.launch("train", [sys.executable, "-c", script, "--config", str(CONFIG_DIR / "grpo_calculator_cpu.yaml")],
                      title="grpo from-config")
    try:
        _until(lambda: len(jobs.state(job["id"])["metrics"]) == 2, "two metric rows")
        d = browser
        open_page(d, server)
        tab(d, "train")
        wait_for(d, f"return document.querySelector('#jobs tr[data-id=\"{job['id']}\"] .job-link')", what="the job")
        d.js(f"document.querySelector('#jobs tr[data-id=\"{job['id']}\"] .job-link').click()")
        wait_for(d, "return document.querySelector('#job-progress').textContent === 'step 2 of 10'",
                 what="the progress from the config")
        assert d.js("return !document.querySelector('#job-bar').hidden")
        width = d.js("return parseFloat(document.querySelector('#job-bar').firstElementChild.style.width)")
        assert width == 20, width  # 2 of 10 steps
        assert "left" in d.js("return document.querySelector('#job-eta').textContent")
        latest = d.js("return Object.fromEntries([...document.querySelectorAll('#job-latest tr')]"
                      ".map(r => [r.children[0].textContent, r.children[1].textContent]))")
        assert latest["toolgym/success"] == "0.5" and latest["reward"] == "0.5" and latest["loss"] == "0.5"
        order = d.js("return [...document.querySelectorAll('#job-latest tr')].map(r => r.children[0].textContent)")
        assert order == ["toolgym/errors/timeout", "toolgym/success", "epoch", "loss", "reward"], order
        # the raw log is one click away, folded
        assert d.js("return document.querySelector('#job-raw').open") is False
        assert "'toolgym/success'" in d.js("return document.querySelector('#job-log').textContent")
        assert d.js("return document.querySelector('#job-curves text.xlabel').textContent") == "step"
    finally:
        with contextlib.suppress(JobError):
            jobs.stop(job["id"])
