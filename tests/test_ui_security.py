"""A trajectory file is data, never code: a crafted file opened in the viewer (a file written by ``toolgym view``,
or ``/view`` in ``toolgym ui``) runs none of its script, in a real headless Chromium; the row check refuses a drift
record that is not ids; the pages carry a Content-Security-Policy; and a UI job whose runner died is never taken
for the unrelated process that reuses its pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import test_ui
from tests.test_ui import NEEDS_DRIVER, Server, wait_for
from tests.test_viewer import WebDriver
from toolgym.trajectory import TrajectoryFormatError, check_trajectory_row

server = test_ui.server  # the UI tests' server fixture (one for this module)

PAYLOAD = "0\"><img src=x onerror=\"document.title='pwned';window.pwned=1\">"


def crafted_row(**drift: Any) -> dict[str, Any]:
    """A row that passes the row check of a viewer that only checks ``drift`` is an object."""
    return {"completion_ids": [1, 2], "loss_mask": [1, 0], "turns": [{"text": "hello"}],
            "task": {"id": "t<script>window.pwned=2</script>", "prompt": "<img src=x onerror=window.pwned=3>"},
            "drift": {"index": 0, "built": [PAYLOAD], "expected": [5], **drift}}


@pytest.mark.parametrize("bad", [{"built": [PAYLOAD]}, {"expected": ["1"]}, {"index": "0\" onclick=x"},
                                 {"built_len": [1]}, {"onmouseover": 1}, {"built_text": 3}])
def test_the_row_check_refuses_a_drift_record_that_is_not_ids(bad: dict[str, Any]) -> None:
    row = crafted_row(**{"built": [1], **bad})
    with pytest.raises(TrajectoryFormatError, match=r"drift\."):
        check_trajectory_row(row)
    check_trajectory_row(crafted_row(built=[1, 2], built_text="a", expected_text="b", built_len=9, expected_len=9))


def test_the_page_drops_non_integer_drift_ids_and_carries_a_script_hash_policy() -> None:
    from toolgym.report.viewer import build_data, content_security_policy, render_html

    data = build_data([crafted_row()])
    assert data["runs"][0]["eps"][0]["drift"]["built"] == []  # the string is gone, not passed on to the page
    page = render_html([crafted_row()])
    csp = content_security_policy()
    assert f'<meta http-equiv="Content-Security-Policy" content="{csp}">' in page
    assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    d = WebDriver(tmp_path_factory.mktemp("chrome") / "profile")
    yield d
    d.close()


@NEEDS_DRIVER
def test_a_crafted_page_opened_from_disk_runs_none_of_its_script(browser: WebDriver, tmp_path: Path) -> None:
    """The page ``toolgym view`` writes, with a crafted row and an extra inline script spliced in (as a page
    missing an escape would carry one): the episode expands, its drift table shows, and nothing of the data runs."""
    from toolgym.report.viewer import render_html

    page = render_html([crafted_row()], title="crafted")
    page = page.replace("</body>", "<script>window.pwned = 4; document.title = 'pwned';</script></body>")
    out = tmp_path / "crafted.html"
    out.write_text(page, encoding="utf-8")
    browser.get(out.as_uri() + "#open=0")
    wait_for(browser, "return window.toolgymViewer && window.toolgymViewer.ready", what="the viewer's own script")
    wait_for(browser, "return document.querySelector('details.drift')", what="the expanded episode's drift")
    time.sleep(0.5)  # an injected <img onerror> would have fired by now
    assert browser.js("return [window.pwned === undefined, document.title]") == [True, "crafted"]
    assert "window.pwned=2" in browser.js("return document.querySelector('section.episode h2').textContent")


def test_the_ui_refuses_a_crafted_file_and_every_page_has_a_policy(server: Server) -> None:
    import http.client

    content = json.dumps(crafted_row()) + "\n"
    status, body = server.request("/api/upload", {"name": "crafted.jsonl", "content": content})
    assert status == 200, body
    status, body = server.request("/view?file=" + json.loads(body)["path"])
    assert status == 400 and "drift.built[0]" in json.loads(body)["error"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    for path in ("/", "/api/info"):
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        assert "script-src 'self'" in (r.getheader("Content-Security-Policy") or ""), path
    conn.request("GET", "/")
    html = conn.getresponse().read().decode()
    assert "<script>" not in html and '<script src="/static/page.js"></script>' in html
    assert 'sandbox="allow-scripts"' in html  # the viewer's frame: an opaque origin, without the UI's API


@NEEDS_DRIVER
def test_the_served_viewer_runs_in_a_sandbox_of_its_own(server: Server, browser: WebDriver) -> None:
    row = {"completion_ids": [1, 2], "loss_mask": [1, 0], "turns": [{"text": "hello"}], "task": {"id": "t1"},
           "drift": {"index": 0, "built": [1], "expected": [5], "built_len": 2, "expected_len": 2}}
    status, body = server.request("/api/upload", {"name": "fine.jsonl", "content": json.dumps(row) + "\n"})
    assert status == 200, body
    browser.get(server.url + "/view?file=" + json.loads(body)["path"] + "#open=0")
    wait_for(browser, "return window.toolgymViewer && window.toolgymViewer.ready", what="the served viewer")
    wait_for(browser, "return document.querySelector('details.drift')", what="the drift table")
    # an opaque origin: the UI's API is not same-origin for anything running in the viewer
    assert browser.js("return window.origin") == "null"


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_job_whose_pid_is_reused_is_lost_and_stop_leaves_the_process_alone(tmp_path: Path) -> None:
    """A job dir whose runner died without an exit record, its pid now held by an unrelated process (simulated by
    pointing it at a live process that started at another time): the job is "lost", Stop refuses and signals
    nothing."""
    from trainers.ui.jobs import JobError, JobStore, start_ticks

    store = JobStore(tmp_path / "runs", {})
    d = store.root / "20260101-000000-abcdef"
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"id": d.name, "kind": "train", "title": "t", "argv": ["x"],
                                            "cwd": str(tmp_path), "created": time.time() - 3600}))
    other = _sleeper()
    try:
        ticks = start_ticks(other.pid)
        assert ticks is not None
        (d / "runner.json").write_text(json.dumps({"runner_pid": other.pid, "runner_start": ticks - 1,
                                                   "pid": other.pid, "started": time.time() - 3600}))
        assert store.state(d.name)["status"] == "lost"
        with pytest.raises(JobError, match="not running"):
            store.stop(d.name)
        time.sleep(0.3)
        assert other.poll() is None  # never signalled
        # the same record with the process's own start time: that is the runner, alive
        (d / "runner.json").write_text(json.dumps({"runner_pid": other.pid, "runner_start": ticks,
                                                   "pid": other.pid, "started": time.time()}))
        assert store.state(d.name)["status"] == "running"
    finally:
        other.kill()
        other.wait()
    assert os.path.isdir("/proc")
