"""``toolgym ui`` end to end: a real server process (``python -m toolgym.cli ui``) driven by headless Chromium through
chromedriver (the WebDriver client of ``tests/test_viewer.py``), plus its security rules over plain HTTP.

In the browser: the tool playground starts a real MCP server over stdio and calls its tools; the reward composer
scores a real rollout file; a 2-step GRPO (tiny model) launched from the Train page runs to completion and its
curve is drawn, the same run appears in the MLflow store on the Runs page, a job with a bad field fails with its
error lines and a running job stops cleanly; an oracle evaluation, a registration, a promotion, a refused promotion
(with its reason) and a forced one go through the Evaluate and registry page. Set ``TOOLGYM_UI_SHOTS=DIR`` to keep a
screenshot of every page (``docs/img/ui-*.png`` are made that way).

Chromium comes from Debian: ``apt-get install -y chromium chromium-driver``.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs import free_port
from tests.test_viewer import CHROMEDRIVER, CHROMIUM, WebDriver

pytest.importorskip("fastapi", reason="toolgym ui needs the [ui] extra")
pytest.importorskip("mlflow", reason="the registry page needs the [registry] extra")

ROOT = Path(__file__).resolve().parent.parent
FAULT = ROOT / "tests" / "mcp_servers" / "fault_server.py"
NEEDS_DRIVER = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                  reason="headless Chromium not installed (apt-get install -y chromium chromium-driver)")
TOKEN = "t0k3n-for-the-ui-test-0123456789"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "TOOLGYM_UI_TOKEN")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


class Server:
    """``toolgym ui`` in a process of its own, on a free loopback port."""

    def __init__(self, runs: Path, *args: str, env: dict[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.runs = runs
        self.proc = subprocess.Popen([sys.executable, "-m", "toolgym.cli", "ui", "--host", host, "--port",
                                      str(self.port), "--runs", str(runs), *args], cwd=runs.parent,
                                     env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=5):
                    break
            except urllib.error.HTTPError:
                break  # it answers (401 with a token)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    out = self.proc.stdout.read() if self.proc.stdout else ""
                    self.proc.kill()
                    raise RuntimeError(f"toolgym ui did not start: {out[-2000:]}") from None
                time.sleep(0.3)

    def request(self, path: str, body: Any = None, headers: dict[str, str] | None = None,
                data: bytes | None = None) -> tuple[int, str]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=hdrs, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> str:
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out or ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    runs = tmp_path_factory.mktemp("ui") / "runs"
    runs.mkdir()
    s = Server(runs)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    d = WebDriver(tmp_path_factory.mktemp("chrome") / "profile")
    d.cmd("POST", "/window/rect", {"width": 1400, "height": 1000})
    yield d
    d.close()


def wait_for(d: WebDriver, script: str, timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``return ...`` JS until it is truthy; fails with the page's visible errors."""
    deadline = time.monotonic() + timeout
    while True:
        v = d.js(script)
        if v:
            return v
        if time.monotonic() > deadline:
            errs = d.js("return [...document.querySelectorAll('.err')].map(e => e.textContent).join(' | ')")
            raise AssertionError(f"timed out waiting for {what or script}; page errors: {errs}")
        time.sleep(0.5)


def text(d: WebDriver, css: str) -> str:
    return d.js(f"return document.querySelector({json.dumps(css)})?.textContent ?? ''")


def set_value(d: WebDriver, css: str, value: str) -> None:
    """Set a form control's value as a user would, with the change event the page listens to."""
    d.js(f"const e = document.querySelector({json.dumps(css)}); e.value = {json.dumps(value)};"
         "e.dispatchEvent(new Event('change', {bubbles: true}));")


def type_into(d: WebDriver, css: str, value: str) -> None:
    el = d.find(css)
    d.cmd("POST", f"/element/{el}/clear", {})
    d.cmd("POST", f"/element/{el}/value", {"text": value})


def tab(d: WebDriver, name: str) -> None:
    d.click(f"#tab-{name}")
    wait_for(d, f"return document.querySelector('#page-{name}').classList.contains('on')")


def shot(d: WebDriver, name: str, at: str | None = None) -> None:
    """Screenshot of the viewport (from the top, or from element ``at``): kept under ``$TOOLGYM_UI_SHOTS`` when
    set; always checked not blank."""
    d.js("window.scrollTo(0, 0)" if not at else
         f"window.scrollTo(0, document.querySelector({json.dumps(at)}).getBoundingClientRect().top + window.scrollY - 8)")
    time.sleep(0.3)
    png = base64.b64decode(d.cmd("GET", "/screenshot"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "blank screenshot"
    out = os.environ.get("TOOLGYM_UI_SHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"ui-{name}.png").write_bytes(png)


def pick_reward_file(d: WebDriver, file: str) -> None:
    """Pick a trajectory file on the Rewards page and wait for the composition proposed for it (set before any
    test changes it)."""
    wait_for(d, f"return [...document.querySelectorAll('#rw-file option')].some(o => o.value === {json.dumps(file)})")
    set_value(d, "#rw-file", file)
    wait_for(d, f"return document.querySelector('#rw-why').dataset.file === {json.dumps(file)}", what="the defaults")


def open_page(d: WebDriver, server: Server) -> None:
    d.get(server.url + "/")
    wait_for(d, "return document.querySelectorAll('#train-fields .tf').length > 0", what="the page to load")


# ---------------------------------------------------------------------------------------------------------------
# Security and bad input (plain HTTP)
# ---------------------------------------------------------------------------------------------------------------


def test_non_loopback_bind_without_token_is_refused(tmp_path: Path) -> None:
    for args, env in ((["--host", "0.0.0.0"], _env()), (["--host", "192.0.2.1"], _env()),
                      (["--host", "0.0.0.0"], _env(TOOLGYM_UI_TOKEN="short"))):
        p = subprocess.run([sys.executable, "-m", "toolgym.cli", "ui", *args, "--port", str(free_port()), "--runs",
                            str(tmp_path / "runs")], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert ("needs a token" in p.stderr or "16 characters" in p.stderr) and len(p.stderr.splitlines()) == 1
        assert "Traceback" not in p.stderr and not (tmp_path / "runs").exists()


def test_a_token_guards_every_request_and_is_never_echoed(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    s = Server(runs, env=_env(TOOLGYM_UI_TOKEN=TOKEN))
    try:
        assert s.request("/api/info")[0] == 401
        assert s.request("/api/info", headers={"Authorization": "Bearer wrong-token-000000000"})[0] == 401
        code, body = s.request("/api/info", headers={"Authorization": f"Bearer {TOKEN}"})
        assert code == 200 and TOKEN not in body
        # opening /?token=... once sets an HttpOnly cookie and redirects to the bare URL (no token kept in it)
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("GET", "/?token=" + TOKEN)
        r = conn.getresponse()
        cookie = r.getheader("set-cookie") or ""
        assert r.status == 303 and r.getheader("location") == "/" and "httponly" in cookie.lower()
        r.read()
        conn.request("GET", "/api/info", headers={"Cookie": cookie.split(";")[0]})
        r = conn.getresponse()
        assert r.status == 200 and TOKEN not in r.read().decode()
        conn.close()
    finally:
        out = s.stop()
    assert TOKEN not in out


def test_bad_requests_get_clear_refusals(server: Server, tmp_path: Path) -> None:
    with urllib.request.urlopen(server.url + "/", timeout=30) as r:
        assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["Referrer-Policy"] == "no-referrer"
    # DNS rebinding: a foreign Host name is refused; a foreign origin cannot post; form posts are refused
    assert server.request("/api/info", headers={"Host": "evil.example"})[0] == 403
    assert server.request("/api/tools/load", {"env": "calculator"}, headers={"Origin": "http://evil.example"})[0] == 403
    assert server.request("/api/tools/load", data=b"env=calculator",
                          headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
    # uploads are size-limited (20 MB default) and plain names
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/api/upload")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "21000000")
    conn.endheaders()
    conn.send(b'{"name": "a.jsonl", "content": "xxxx')  # refused on its announced size, before the body is read
    r = conn.getresponse()
    assert r.status == 413 and "limit is 20000000" in r.read().decode()
    conn.close()
    code, body = server.request("/api/upload", {"name": "../../etc/x.jsonl", "content": "{}"})
    assert code == 200 and json.loads(body)["path"] == "ui/uploads/x.jsonl"  # the name only, inside runs/
    # paths stay inside the runs directory
    outside = tmp_path / "t.jsonl"
    outside.write_text("{}\n")
    for p in (str(outside), "../t.jsonl", "../../../../etc/passwd"):
        code, body = server.request("/api/rewards/score", {"file": p, "parts": [{"name": "exact_match", "weight": 1}]})
        assert code == 400 and "outside the runs directory" in json.loads(body)["error"], p
    code, body = server.request("/api/train/fields?algorithm=ppo")
    assert code == 400 and "unknown algorithm" in body
    code, body = server.request("/view?file=../../etc/passwd")
    assert code == 400 and "outside" in body
    # bad input: one clear line each
    bad = [("/api/tools/load", {"env": "NoSuchEnv-v0"}, "unknown env"),
           ("/api/tools/load", {"config": "{not json"}, "not valid JSON"),
           ("/api/tools/load", {"config": '{"mcpServers": {"x": {"command": "/nonexistent/srv", "env": '
                                          '{"API_KEY": "sk-hidden-123456"}}}}'}, "x"),
           ("/api/tools/load", {"config": '{"mcpServers": {"y": {"url": "http://127.0.0.1:1/mcp", "headers": '
                                          '{"Authorization": "Bearer sk-hidden-123456"}}}}'}, "y"),
           ("/api/train/command", {"algorithm": "ppo", "config": "grpo_calculator_cpu.yaml", "run_name": "a"},
            "unknown algorithm"),
           ("/api/train/command", {"algorithm": "grpo", "config": "../../etc/passwd", "run_name": "a"},
            "unknown config"),
           ("/api/train/command", {"algorithm": "grpo", "config": "grpo_calculator_cpu.yaml", "run_name": "../x"},
            "bad run name"),
           ("/api/train/command", {"algorithm": "grpo", "config": "grpo_calculator_cpu.yaml", "run_name": "a",
                                   "overrides": {"max_steps; rm -rf /": "1"}}, "bad field name"),
           ("/api/registry/promote", {"name": "m", "version": "x"}, "bad version"),
           ("/api/train/launch", {"algorithm": "grpo", "config": "grpo_calculator_cpu.yaml", "run_name": "a",
                                  "overrides": {"max_steps": "--output_dir=/etc"}}, "may not start with '--'"),
           ("/api/registry/promote", {"name": "m", "version": "1", "force": True}, "needs a reason"),
           ("/api/rewards/score", {"file": "ui/uploads/x.jsonl", "parts": [{"name": "bogus"}]}, "unknown reward")]
    for path, body_, want in bad:
        code, out = server.request(path, body_)
        assert code == 400, (path, out)
        msg = json.loads(out)["error"]
        assert want in msg and "Traceback" not in msg and "sk-hidden" not in msg, (path, msg)


def test_the_command_shown_is_the_argument_list_run(server: Server) -> None:
    req = {"algorithm": "grpo", "config": "grpo_calculator_cpu.yaml", "run_name": "r1",
           "overrides": {"max_steps": "2", "toolgym.model": "tiny; echo pwned", "output_dir": "/etc"}}
    code, body = server.request("/api/train/command", req)
    cmd = json.loads(body)["command"]
    assert code == 200 and cmd.startswith("toolgym train grpo --config ")
    assert "--max_steps 2 --toolgym.model 'tiny; echo pwned'" in cmd  # one argument, quoted for reading
    assert f"--output_dir {server.runs.resolve() / 'r1'}" in cmd and "/etc" not in cmd


# ---------------------------------------------------------------------------------------------------------------
# In the browser
# ---------------------------------------------------------------------------------------------------------------


@NEEDS_DRIVER
def test_tool_playground_calls_a_real_mcp_server_over_stdio(server: Server, browser: WebDriver) -> None:
    d = browser
    open_page(d, server)
    cfg = json.dumps({"mcpServers": {"fault": {"command": sys.executable, "args": [str(FAULT)]}}})
    type_into(d, "#mcp-config", cfg)
    d.click("#mcp-load")
    names = wait_for(d, "const r = [...document.querySelectorAll('#tools-list tr.tool')].map(t => t.dataset.name);"
                        "return r.length ? r : null", timeout=90, what="the MCP tools")
    assert {"echo", "add", "fail", "sleep_ms"} <= set(names)
    assert "text" in text(d, "#tools-list tr.tool[data-name=echo] pre")  # the input schema
    set_value(d, "#call-tool", "add")
    type_into(d, "#call-args", '{"a": 2, "b": 40}')
    d.click("#call-run")
    wait_for(d, "return document.querySelector('#call-content')?.textContent === '42'", what="add(2, 40)")
    assert text(d, "#call-kind") == "ok"
    # errors as the model reads them: a schema violation and a tool failure, classified
    type_into(d, "#call-args", '{"a": "two"}')
    d.click("#call-run")
    wait_for(d, "return (document.querySelector('#call-kind')?.textContent || '').includes('invalid_arguments')")
    assert text(d, "#call-content").startswith("Error (invalid_arguments)")
    set_value(d, "#call-tool", "fail")
    type_into(d, "#call-args", '{"message": "boom"}')
    d.click("#call-run")
    kind = wait_for(d, "const k = document.querySelector('#call-kind')?.textContent || '';"
                       "return k.startsWith('error:') && !k.includes('invalid_arguments') ? k : null")
    assert kind == "error: exception" and text(d, "#call-content").startswith("Error (exception): ")
    shot(d, "tools")
    # a config error is a message, not a traceback
    type_into(d, "#mcp-config", '{"mcpServers": {"bad": {"command": "/nonexistent/mcp-server"}}}')
    d.click("#mcp-load")
    err = wait_for(d, "return document.querySelector('#tools-error').textContent", timeout=60)
    assert "bad" in err and "Traceback" not in err
    # a registered env's tools
    set_value(d, "#env-select", "toolgym/Calculator-v0")
    d.click("#env-load")
    wait_for(d, "return document.querySelector('#tools-list tr.tool[data-name=calculator]')", timeout=90)


@NEEDS_DRIVER
def test_rewards_compose_and_score_a_trajectory_file(server: Server, browser: WebDriver) -> None:
    from tests.rollout_files import make_rollout_file

    path, trajs = make_rollout_file(server.runs / "rollouts" / "calc.jsonl")
    d = browser
    open_page(d, server)
    tab(d, "rewards")
    pick_reward_file(d, "rollouts/calc.jsonl")
    # exact_match (1.0) + numeric_match (weight 2, on the task's `answer`) + the per-turn tool_call_format (0.5)
    d.js("document.querySelectorAll('#rw-parts tbody tr').forEach(tr => { const n = tr.dataset.name;"
         "tr.querySelector('.rw-use').checked = ['exact_match', 'numeric_match', 'tool_call_format'].includes(n);"
         "if (n === 'numeric_match') tr.querySelector('.rw-weight').value = '2'; })")
    # picking the same file again, or coming back to the page, keeps the user's choices
    d.js("document.querySelector('#rw-file').dispatchEvent(new Event('change'))")
    tab(d, "tools")
    tab(d, "rewards")
    chosen = "return [...document.querySelectorAll('#rw-parts tbody tr')].filter(tr => tr.querySelector('.rw-use')" \
             ".checked).map(tr => tr.dataset.name).join(',')"
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert d.js(chosen) == "exact_match,numeric_match,tool_call_format"
        time.sleep(0.1)
    d.click("#rw-run")
    wait_for(d, "return document.querySelectorAll('#rw-table tr.rw-ep').length > 0", timeout=60)
    heads = d.js("return [...document.querySelectorAll('#rw-table th.rw-h')].map(t => t.dataset.name)")
    assert heads == ["exact_match", "numeric_match", "tool_call_format"]
    rows = d.js("return [...document.querySelectorAll('#rw-table tr.rw-ep')].map(tr => [tr.children[2].textContent, "
                "...[...tr.querySelectorAll('td.rw-c')].map(c => c.dataset.raw), tr.children[6].textContent])")
    assert len(rows) == len(trajs)
    for row in rows:  # each cell's raw value; the total is the weighted sum
        total, em, nm, tcf = (float(x) for x in row[:4])
        assert total == pytest.approx(em + 2 * nm + 0.5 * tcf, abs=2e-3)
        assert row[4].startswith("t0:")  # per-turn values
    shot(d, "rewards")


@NEEDS_DRIVER
@pytest.mark.slow
def test_train_grpo_from_the_page_to_its_curve_then_runs_and_jobs_survive(server: Server, browser: WebDriver) -> None:
    d = browser
    open_page(d, server)
    tab(d, "train")
    set_value(d, "#train-config", "grpo_calculator_cpu.yaml")
    wait_for(d, "return document.querySelector('.tf[data-key=max_steps]')")
    # every field of the algorithm with its help text (the Config's and TRL's), one click adds it to the form
    d.click("#train-all summary")
    wait_for(d, "return document.querySelector(\".add-field[data-key='toolgym.schedule']\")", timeout=90)
    helps = d.js("return Object.fromEntries([...document.querySelectorAll('#train-all-fields tr')].map(tr =>"
                 "[tr.querySelector('.add-field').dataset.key, tr.children[1].textContent]))")
    assert "lockstep" in helps["toolgym.schedule"] and "KL" in helps["beta"] and len(helps) > 100
    d.click(".add-field[data-key='toolgym.schedule']")
    assert d.js("return document.querySelector('#train-extra').value") == "toolgym.schedule="
    type_into(d, "#train-name", "grpo-ui")
    for key, value in {"max_steps": "2", "toolgym.num_train_tasks": "2", "toolgym.max_turn_tokens": "8",
                       "toolgym.threads": "1", "per_device_train_batch_size": "4", "num_generations": "4",
                       "max_completion_length": "32"}.items():
        set_value(d, f".tf[data-key='{key}']", value)
    type_into(d, "#train-extra", "toolgym.model=tiny\nreport_to=mlflow\nrun_name=grpo-ui\ndisable_tqdm=true")
    d.js("document.querySelector('#train-extra').dispatchEvent(new Event('change'))")
    wait_for(d, "return document.querySelector('#train-command').textContent.includes('--toolgym.model tiny')")
    cmd = text(d, "#train-command")
    assert cmd.startswith("toolgym train grpo --config ") and "--max_steps 2" in cmd
    d.click("#train-launch")
    wait_for(d, "return ['running', 'finished'].includes(document.querySelector('#job-status').textContent)")
    status = wait_for(d, "const s = document.querySelector('#job-status').textContent;"
                         "return ['finished', 'failed', 'lost'].includes(s) ? s : null", timeout=420, what="the job")
    assert status == "finished", text(d, "#job-error") + text(d, "#job-log")[-2000:]
    # the reward's curve (series on the same points share one line, named "reward = toolgym/success = ...")
    pts = d.js("const p = document.querySelector('#job-curves polyline.curve[data-name^=reward]');"
               "return p ? p.getAttribute('points').trim().split(' ').length : 0")
    assert pts == 2  # one point per step
    assert text(d, "#job-progress") == "step 2 of 2"
    # one series per error kind (kinds on the same points share a line: "timeout = parse_error = ...")
    kinds = d.js("return [...document.querySelectorAll('#job-errors polyline.curve')]"
                 ".flatMap(p => p.dataset.name.split(' = '))")
    assert len(kinds) >= 5 and "parse_error" in kinds and "timeout" in kinds
    shot(d, "train", at="#job-card")
    job_id = text(d, "#job-id").rsplit("(", 1)[1].rstrip(")")
    assert (server.runs / "grpo-ui" / "model.safetensors").is_file()

    # the run is in the MLflow store: the Runs page overlays its curve
    tab(d, "runs")
    wait_for(d, "return [...document.querySelectorAll('#runs-table tbody tr')].some(r => r.textContent.includes('grpo-ui'))")
    d.js("[...document.querySelectorAll('#runs-table tbody tr')].find(r => r.textContent.includes('grpo-ui'))"
         ".querySelector('.run-pick').click()")
    wait_for(d, "return document.querySelector('#runs-curves polyline.curve')", what="the run's curve")
    # GRPO's trajectories landed in the runs directory (2 steps x 4 samples); a rollout file opens in the viewer
    rows = (server.runs / "grpo-ui" / "trajectories" / "rank0.jsonl").read_text().splitlines()
    assert len(rows) == 8
    from tests.rollout_files import make_rollout_file

    make_rollout_file(server.runs / "grpo-ui" / "rollout.jsonl")
    tab(d, "train")
    tab(d, "runs")  # refreshes the file lists
    wait_for(d, "return [...document.querySelectorAll('#view-file option')].some(o => o.value === "
                "'grpo-ui/rollout.jsonl')", what="the rollout file in the list")
    assert d.js("return document.querySelector('.run-pick').checked")  # ticks survive a refresh
    set_value(d, "#view-file", "grpo-ui/rollout.jsonl")
    d.click("#view-open")
    # the viewer runs sandboxed (an opaque origin: the page cannot reach into it, nor it into the page's API)
    wait_for(d, "return document.querySelector('#viewer').getAttribute('src')", what="the viewer's frame")
    assert d.js("return document.querySelector('#viewer').contentDocument") is None
    d.cmd("POST", "/frame", {"id": {WebDriver.W3C_ELEMENT: d.find("#viewer")}})
    try:
        wait_for(d, "return document.querySelectorAll('tr.row.ep').length > 0", timeout=60, what="the viewer")
    finally:
        d.cmd("POST", "/frame/parent", {})
    shot(d, "runs")

    # a failing job shows its error lines; a running job stops cleanly; a reload (a new page) shows them all
    tab(d, "train")
    type_into(d, "#train-name", "bad-field")
    type_into(d, "#train-extra", "max_stepz=2")
    d.js("document.querySelector('#train-extra').dispatchEvent(new Event('change'))")
    d.click("#train-launch")
    wait_for(d, "return document.querySelector('#job-status').textContent === 'failed'", timeout=120)
    assert "max_stepz" in text(d, "#job-error")
    type_into(d, "#train-name", "to-stop")
    type_into(d, "#train-extra", "toolgym.model=tiny\nmax_steps=500")
    d.js("document.querySelector('#train-extra').dispatchEvent(new Event('change'))")
    d.click("#train-launch")
    wait_for(d, "return document.querySelector('#job-status').textContent === 'running'", timeout=60)
    d.click("#job-stop")
    wait_for(d, "return document.querySelector('#job-status').textContent === 'stopped'", timeout=90)
    open_page(d, server)
    tab(d, "train")
    statuses = wait_for(d, "const r = [...document.querySelectorAll('#jobs tr.job')].map(t => [t.dataset.id,"
                           "t.querySelector('.badge').textContent]); return r.length >= 3 ? r : null")
    assert dict(statuses)[job_id] == "finished" and sorted(s for _, s in statuses)[:3] == ["failed", "finished",
                                                                                          "stopped"]


def _tiny_checkpoint(path: Path, seed: int) -> None:
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    tiny_random_model(tok, seed=seed, num_hidden_layers=1).save_pretrained(path)
    tok.save_pretrained(path)


def _eval_file(path: Path, rate: float, ckpt: Path, n: int = 40) -> None:
    from toolgym.weights import weights_hash

    ids = [f"calc-test-{i}" for i in range(n)]
    per = [1.0 if k < round(rate * n) else 0.0 for k in range(n)]
    s = sum(per) / n
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env_id": "toolgym/Calculator-v0", "split": "test", "n_tasks": n, "k": 1, "seed": 0,
                                "policy": "ckpt", "success": s, "success_ci95": [max(0, s - .15), min(1, s + .15)],
                                "pass_at_k": s, "mean_at_k": s, "reward": s, "tool_call_rate": 1.0, "errors": {},
                                "drift": 0, "task_ids": ids, "per_task_success": per, "wall_s": 1.0,
                                "evaluated": {"kind": "checkpoint", "path": str(ckpt),
                                              "weights_sha256": weights_hash(ckpt)}}))


@NEEDS_DRIVER
@pytest.mark.slow
def test_evaluate_register_and_promote_from_the_page_with_a_refusal(server: Server, browser: WebDriver) -> None:
    _tiny_checkpoint(server.runs / "ckpts" / "tiny1", 1)
    _tiny_checkpoint(server.runs / "ckpts" / "tiny2", 2)
    _eval_file(server.runs / "evals" / "tiny1_eval.json", 0.9, server.runs / "ckpts" / "tiny1")
    _eval_file(server.runs / "evals" / "tiny2_eval.json", 0.5, server.runs / "ckpts" / "tiny2")
    d = browser
    open_page(d, server)
    tab(d, "registry")
    wait_for(d, "return [...document.querySelectorAll('#rg-ckpt option')].some(o => o.value === 'ckpts/tiny2')")

    # evaluate: the oracle on 5 test tasks, as a job; its summary is saved as an eval.json in the runs directory
    set_value(d, "#ev-ckpt", "oracle")
    set_value(d, "#ev-env", "toolgym/Calculator-v0")
    type_into(d, "#ev-tasks", "5")
    type_into(d, "#ev-name", "oracle-eval")
    d.click("#ev-launch")
    res = wait_for(d, "return document.querySelector('#ev-result')?.textContent", timeout=240, what="the evaluation")
    assert res.startswith("success 100.0%") and "on 5 tasks of toolgym/Calculator-v0/test" in res
    saved = json.loads((server.runs / "oracle-eval" / "eval.json").read_text())
    assert saved["n_tasks"] == 5 and saved["evaluated"] == {"kind": "oracle"}  # what it evaluated, for the registry

    def register(ckpt: str, ev: str) -> str:
        set_value(d, "#rg-ckpt", ckpt)
        set_value(d, "#rg-eval", ev)
        type_into(d, "#rg-name", "calc")
        d.click("#rg-register")
        return wait_for(d, "const t = document.querySelector('#rg-result').textContent;"
                           "return t.startsWith('registering') ? null : t", timeout=120)

    def promote() -> str:
        d.click("#pr-promote")
        return wait_for(d, "const t = document.querySelector('#pr-result').textContent;"
                           "return t.startsWith('comparing') ? null : t", timeout=120)

    assert register("ckpts/tiny1", "evals/tiny1_eval.json").startswith("registered calc v1, success 0.900")
    assert promote().startswith("promoted: champion is now v1")
    assert register("ckpts/tiny2", "evals/tiny2_eval.json").startswith("registered calc v2, success 0.500")
    refused = promote()
    assert "refused: calc v2 does not beat the champion v1" in refused and "exit 1" in refused
    assert d.js("return !!document.querySelector('#pr-result .refused')")
    shot(d, "registry")
    d.click("#pr-force")
    d.click("#pr-promote")  # forced without a reason: refused by the page's own check
    wait_for(d, "return document.querySelector('#pr-result').textContent.includes('needs a reason')")
    type_into(d, "#pr-reason", "canary test")
    forced = promote()
    assert forced.startswith("promoted: champion is now v2 (forced: canary test)")
    d.click("#rg-list")
    rows = wait_for(d, "const r = [...document.querySelectorAll('#rg-versions tr')].slice(1).map(t => t.textContent);"
                       "return r.length ? r : null")
    assert len(rows) == 2 and any(r.startswith("2champion") for r in rows)


def test_jobs_live_on_disk_survive_a_restart_and_stop_cleanly(tmp_path: Path) -> None:
    """The job store read by a new process (a UI restart) sees a running job, then its end; a stop interrupts the
    command (Ctrl-C) and is recorded; secrets never reach the log shown."""
    from trainers.ui.jobs import JobStore

    runs = tmp_path / "runs"
    code = ("import os, sys, time; print({'loss': '0.5', 'reward': 1}); print(os.environ.get('MY_API_KEY')); "
            "sys.stdout.flush(); time.sleep(float(sys.argv[1])); print('Traceback (most recent call last):');"
            "print('ValueError: the last error line'); sys.exit(int(sys.argv[2]))")
    env = {**_env(), "MY_API_KEY": "sk-very-secret-value"}
    job = JobStore(runs, env).launch("train", [sys.executable, "-c", code, "3", "1"])
    store = JobStore(runs, env)  # "a restart": a new store over the same directory
    deadline = time.monotonic() + 30
    while not store.state(job["id"])["metrics"] and time.monotonic() < deadline:
        time.sleep(0.1)
    st = store.state(job["id"], log=True)
    assert st["status"] == "running" and st["metrics"] == [{"loss": 0.5, "reward": 1.0, "step": 1.0}]
    while store.state(job["id"])["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MY_API_KEY", "sk-very-secret-value")  # the UI's own environment holds the secret
        st = store.state(job["id"], log=True)
    assert st["status"] == "failed" and st["rc"] == 1 and "sk-very-secret-value" not in st["log"] and "***" in st["log"]
    assert st["error"].splitlines()[-1] == "ValueError: the last error line"
    long = store.launch("train", [sys.executable, "-c", code, "60", "0"])
    while not store.state(long["id"])["metrics"] and time.monotonic() < deadline + 30:  # it is in its sleep
        time.sleep(0.1)
    t0 = time.monotonic()
    store.stop(long["id"])
    while store.state(long["id"])["status"] == "running" and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    st = store.state(long["id"], log=True)
    assert st["status"] == "stopped" and time.monotonic() - t0 < 10 and "KeyboardInterrupt" in st["log"]
    assert [j["id"] for j in JobStore(runs).list()] == [long["id"], job["id"]]


def test_stop_interrupts_the_command_even_when_the_ui_ignores_sigint(tmp_path: Path) -> None:
    """A UI started with SIGINT ignored (`nohup toolgym ui &`) hands that disposition down; the runner restores the
    default for the command, so a stop is still a Ctrl-C (KeyboardInterrupt in the log, status "stopped")."""
    from trainers.ui.jobs import JobStore

    code = "import sys, time; print({'loss': '0.5'}); sys.stdout.flush(); time.sleep(60)"
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        store = JobStore(tmp_path / "runs", _env())
        job = store.launch("train", [sys.executable, "-c", code])
    finally:
        signal.signal(signal.SIGINT, old)
    deadline = time.monotonic() + 60
    while not store.state(job["id"])["metrics"] and time.monotonic() < deadline:
        time.sleep(0.1)
    store.stop(job["id"])
    while store.state(job["id"])["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    st = store.state(job["id"], log=True)
    assert st["status"] == "stopped" and "KeyboardInterrupt" in st["log"]
