"""The trajectory viewer: a self-contained HTML report of a REAL rollout file, checked statically and in
headless Chromium (screenshot + DOM dump, and the filters driven through chromedriver's WebDriver API).

Chromium comes from Debian: ``apt-get install -y chromium chromium-driver``.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.rollout_files import EXPECTED, make_rollout_file
from toolgym.viewer import TrajectoryFileError, load_trajectory_rows, render_html, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium chromium-driver)"
)
NEEDS_DRIVER = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromedriver not installed (apt-get install -y chromium chromium-driver)",
)


def chrome_flags(profile: Path) -> list[str]:
    return [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={profile}",
        "--hide-scrollbars", "--window-size=1280,2000",
    ]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    return make_rollout_file(tmp_path_factory.mktemp("rollout") / "traj.jsonl")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from toolgym.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def report(rollout: tuple[Path, list[Any]], tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(rollout[0], tmp_path_factory.mktemp("report") / "report.html", tokenizer=tokenizer)


class _Collector(HTMLParser):
    """Collects episodes (data-* attributes), mask spans per episode, and every src/href/link."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes: list[dict[str, str]] = []
        self.spans: list[list[tuple[str, str]]] = []
        self.external: list[str] = []
        self._span: str | None = None
        self._buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section" and "episode" in a.get("class", ""):
            self.episodes.append(a)
            self.spans.append([])
        if tag == "span" and a.get("class") in ("m0", "m1") and self.spans:
            self._span, self._buf = a["class"], []
        for key in ("src", "href"):
            if key in a:
                self.external.append(a[key])
        if tag in ("link", "iframe", "img", "object", "embed"):
            self.external.append(tag)

    def handle_data(self, data: str) -> None:
        if self._span is not None:
            self._buf.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._span is not None:
            self.spans[-1].append((self._span, "".join(self._buf)))
            self._span = None


def parse(page: str) -> _Collector:
    c = _Collector()
    c.feed(page)
    return c


# ---------------------------------------------------------------------------------------------------------------
# Static checks
# ---------------------------------------------------------------------------------------------------------------


def test_report_is_self_contained(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    c = parse(page)
    assert c.external == [], f"external resources in the report: {c.external}"
    assert "<script src" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"(?i)<(link|iframe|img)\b", page)
    assert page.count("<script>") == 1 and page.count("<style>") == 1


def test_every_episode_call_and_reward_is_rendered(report: Path, rollout: tuple[Path, list[Any]]) -> None:
    _, trajs = rollout
    page = report.read_text(encoding="utf-8")
    c = parse(page)
    assert len(c.episodes) == len(trajs) == len(EXPECTED)
    for k, (ep, traj) in enumerate(zip(c.episodes, trajs, strict=True)):
        want_success, want_errors = EXPECTED[k]
        assert ep["data-success"] == str(int(want_success)), k
        assert set(filter(None, ep["data-errors"].split(" "))) == want_errors, k
        assert float(ep["data-reward"]) == pytest.approx(traj.reward)
        assert ep["data-ended"] == ("terminated" if traj.terminated else "truncated")
    # each tool call: name, arguments, result, error kind and latency appear
    for traj in trajs:
        for res in traj.tool_results:
            assert html.escape(res.content) in page
            if res.error_kind is not None:
                assert f'<span class="badge err">{res.error_kind.value}</span>' in page
            if res.call.parse_error is None:
                assert html.escape(json.dumps(res.call.arguments, indent=2)) in page
            assert f"{res.latency_s * 1e3:.1f} ms" in page
        for turn in traj.turns:
            assert f'data-turn="{turn.index}"' in page
    assert "outcome <b>1</b>" in page and "outcome <b>0</b>" in page


def test_mask_view_matches_the_loss_mask(report: Path, rollout: tuple[Path, list[Any]], tokenizer: Any) -> None:
    """Model spans (mask 1) hold exactly the actions; env spans (mask 0) hold the tool responses; the counts
    in the span titles add up to the loss mask."""
    _, trajs = rollout
    page = report.read_text(encoding="utf-8")
    c = parse(page)
    titles = re.findall(r'<span class="m([01])" title="(?:model|env): (\d+) tokens', page)
    for k, traj in enumerate(trajs):
        spans = c.spans[k]
        model_text = "".join(t for m, t in spans if m == "m1")
        env_text = "".join(t for m, t in spans if m == "m0")
        for turn in traj.turns:
            assert turn.text in model_text
        for res in traj.tool_results:
            if any(t.obs_end > t.obs_start and res in t.results for t in traj.turns):
                assert res.content.strip() in env_text
        # runs alternate between model and env
        assert all(a[0] != b[0] for a, b in itertools.pairwise(spans))
        assert spans[0][0] == "m1"  # a completion starts with the model's first action
    n1 = sum(int(n) for m, n in titles if m == "1")
    n0 = sum(int(n) for m, n in titles if m == "0")
    assert n1 == sum(sum(t.loss_mask) for t in trajs)
    assert n0 == sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs)


def test_without_tokenizer_uses_turn_texts(rollout: tuple[Path, list[Any]]) -> None:
    rows = load_trajectory_rows(rollout[0])
    page = render_html(rows, tokenizer=None)
    c = parse(page)
    assert len(c.episodes) == len(rows)
    assert "rebuilt from turn texts" in page
    for k, traj in enumerate(rollout[1]):
        model_text = "".join(t for m, t in c.spans[k] if m == "m1")
        assert all(turn.text in model_text for turn in traj.turns)


def test_hostile_text_is_escaped() -> None:
    row = {
        "task": {"id": "x</section><script>alert(1)</script>", "prompt": "<b>hi</b>"},
        "completion_ids": [], "loss_mask": [], "reward": 0.0, "outcome_reward": 0.0,
        "turns": [{"index": 0, "action_span": [0, 0], "obs_span": [0, 0], "text": "<script>evil()</script>",
                   "calls": [], "results": []}],
    }
    page = render_html([row])
    assert "<script>alert(1)</script>" not in page and "<script>evil()</script>" not in page
    assert page.count("<script>") == 1
    assert len(parse(page).episodes) == 1


def test_bad_files_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_trajectory_rows(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completion_ids": [], "loss_mask": [], "turns": []}\n{not json\n')
    with pytest.raises(TrajectoryFileError, match=r"bad.jsonl:2: not valid JSON"):
        load_trajectory_rows(bad)
    bad.write_text('{"reward": 1}\n')
    with pytest.raises(TrajectoryFileError, match="missing completion_ids"):
        load_trajectory_rows(bad)


# ---------------------------------------------------------------------------------------------------------------
# Headless Chromium
# ---------------------------------------------------------------------------------------------------------------


def _chromium(args: list[str], tmp: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *chrome_flags(tmp / "profile"), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@NEEDS_CHROMIUM
def test_chromium_renders_the_rollout_and_takes_a_screenshot(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    r = _chromium([f"--screenshot={shot}", report.as_uri()], tmp_path)
    assert shot.is_file(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] == 2000 and img.shape[1] == 1280
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05, "blank screenshot"
    # both mask colours are on screen: model green (#d9f2dd) and env blue-grey (#e8ebf5)
    px = (rgb * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(p) for p in px[:: 7]}
    assert (0xD9, 0xF2, 0xDD) in colours and (0xE8, 0xEB, 0xF5) in colours

    r = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    c = parse(dom)
    assert len(c.episodes) == len(EXPECTED)
    assert 'id="shown">6<' in dom  # the filter script ran over every episode


FRAGMENTS: dict[str, list[int]] = {
    "outcome=success": [k for k, (s, _) in EXPECTED.items() if s],
    "outcome=failure": [k for k, (s, _) in EXPECTED.items() if not s],
    "error=unknown_tool": [1],
    "error=any": [k for k, (_, e) in EXPECTED.items() if e],
    "error=none&outcome=failure": [5],
    "min=0.5": [0, 4],
    "max=0.5&ended=terminated": [k for k, (s, _) in EXPECTED.items() if not s],
    "ended=truncated": [],
}


@NEEDS_CHROMIUM
@pytest.mark.parametrize("fragment", ["error=none&outcome=failure", "min=0.5"])
def test_filters_from_the_url_fragment(report: Path, tmp_path: Path, fragment: str) -> None:
    """A filtered view is a link: the fragment sets the filters when the page opens (no driver needed)."""
    expected = FRAGMENTS[fragment]
    r = _chromium(["--dump-dom", f"{report.as_uri()}#{fragment}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    c = parse(r.stdout)
    visible = [int(e["data-index"]) for e in c.episodes if "hidden" not in e["class"].split()]
    assert visible == expected
    assert f'id="shown">{len(expected)}<' in r.stdout


class WebDriver:
    """A minimal W3C WebDriver client over chromedriver's HTTP API (no selenium needed)."""

    W3C_ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, profile: Path) -> None:
        assert CHROMEDRIVER is not None and CHROMIUM is not None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self._req("GET", "/status")["value"].get("ready"):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.2)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": chrome_flags(profile)}}}}
        self.sid = self._req("POST", "/session", caps)["value"]["sessionId"]

    def _req(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def cmd(self, method: str, path: str, body: Any = None) -> Any:
        return self._req(method, f"/session/{self.sid}{path}", body)["value"]

    def get(self, url: str) -> None:
        self.cmd("POST", "/url", {"url": url})

    def js(self, script: str) -> Any:
        return self.cmd("POST", "/execute/sync", {"script": script, "args": []})

    def find(self, css: str) -> str:
        return self.cmd("POST", "/element", {"using": "css selector", "value": css})[self.W3C_ELEMENT]

    def click(self, css: str) -> None:
        self.cmd("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css: str, text: str) -> None:
        self.cmd("POST", f"/element/{self.find(css)}/value", {"text": text})

    def close(self) -> None:
        try:
            self.cmd("DELETE", "")
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@NEEDS_DRIVER
def test_filters_respond_to_user_input(report: Path, tmp_path: Path) -> None:
    """Real clicks and key presses through chromedriver: the shown episodes and the URL fragment follow."""
    wd = WebDriver(tmp_path / "profile")
    try:
        wd.get(report.as_uri())
        visible = "return Array.from(document.querySelectorAll('.episode:not(.hidden)')).map(e => +e.dataset.index)"
        assert wd.js(visible) == list(EXPECTED)
        wd.click("#f-error option[value='exception']")
        assert wd.js(visible) == [4]
        assert wd.js("return location.hash") == "#error=exception"
        wd.click("#f-reset")
        assert wd.js(visible) == list(EXPECTED)
        wd.click("#f-outcome option[value='failure']")
        wd.type("#f-q", "<answer>0</answer>")
        assert wd.js(visible) == [1, 2, 3]
        assert wd.js("return document.getElementById('shown').textContent") == "3"
        wd.type("#f-q", "no such text anywhere")
        assert wd.js(visible) == []
        assert wd.js("return getComputedStyle(document.getElementById('empty')).display") != "none"
        for fragment, expected in FRAGMENTS.items():  # deep links: every filter from the URL fragment
            wd.get("about:blank")
            wd.get(f"{report.as_uri()}#{fragment}")
            assert wd.js(visible) == expected, fragment
        png = base64.b64decode(wd.cmd("GET", "/screenshot"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    finally:
        wd.close()
