"""The trajectory viewer: a self-contained HTML page over REAL rollout files, checked statically (the embedded
data) and in headless Chromium (screenshot, DOM dump, and the table, sorting, expansion, per-token view, drift
diff, group-by-task and two-file comparison driven through chromedriver's WebDriver API), plus a 5,000-episode
file that must load within a stated budget.

Chromium comes from Debian: ``apt-get install -y chromium chromium-driver``.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.rollout_files import EXPECTED, make_rollout_file
from toolgym.report.viewer import TrajectoryFileError, build_data, load_trajectory_rows, render_html, write_report

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




def page_data(page: str) -> dict[str, Any]:
    """The JSON document a page embeds."""
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def run_text(data: dict[str, Any], ep: dict[str, Any]) -> list[tuple[int, str]]:
    """The loss-mask runs of an episode as the page draws them: ``[(mask, decoded text)]``."""
    if "segs" in ep:
        return [(m, t) for m, t, _ in ep["segs"]]
    out, at = [], 0
    for m, n in ep["mask"]:
        out.append((m, "".join(data["vocab"][str(i)] for i in ep["ids"][at : at + n])))
        at += n
    return out


# ---------------------------------------------------------------------------------------------------------------
# Static checks: the embedded data
# ---------------------------------------------------------------------------------------------------------------


def test_report_is_self_contained(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert not re.search(r"(?i)<(link|iframe|img|object|embed)\b", page)
    assert not re.search(r"(?i)\b(src|href)\s*=", page)
    assert "@import" not in page and "url(" not in page and "http://" not in page and "https://" not in page
    assert page.count("<script>") == 1 and page.count('<script type="application/json" id="data">') == 1
    assert page.count("<style>") == 1 and page.count("</script>") == 2


def test_data_holds_every_episode_call_and_reward(report: Path, rollout: tuple[Path, list[Any]]) -> None:
    _, trajs = rollout
    data = page_data(report.read_text(encoding="utf-8"))
    [run] = data["runs"]
    assert len(run["eps"]) == len(trajs) == len(EXPECTED)
    for k, (ep, traj) in enumerate(zip(run["eps"], trajs, strict=True)):
        want_success, want_errors = EXPECTED[k]
        assert ep["s"] == int(want_success) and set(ep["errs"]) == want_errors, k
        assert ep["r"] == pytest.approx(traj.reward) and ep["o"] == traj.outcome_reward
        assert ep["end"] == ("terminated" if traj.terminated else "truncated")
        assert ep["tok"] == len(traj.completion_ids) and ep["nt"] == len(traj.turns)
        assert ep["lat"] == pytest.approx(sum(r.latency_s for r in traj.tool_results), abs=1e-5)
        assert data["tasks"][ep["t"]]["id"] == traj.task["id"] == ep["task"]
        calls = [c for t in ep["turns"] for c in t["calls"]]
        assert len(calls) == len(traj.tool_results)
        for c, res in zip(calls, traj.tool_results, strict=True):
            assert c["content"] == res.content and c["lat"] == pytest.approx(res.latency_s)
            assert c["err"] == (res.error_kind.value if res.error_kind else None)
            assert (c["perr"] is None) == (res.call.parse_error is None)
            if res.call.parse_error is None:
                assert c["args"] == res.call.arguments


def test_mask_runs_match_the_loss_mask(report: Path, rollout: tuple[Path, list[Any]], tokenizer: Any) -> None:
    """Model runs (mask 1) hold exactly the actions; env runs (mask 0) hold the tool responses; the run-length
    mask expands to the loss mask; per-token strings decode the ids."""
    _, trajs = rollout
    data = page_data(report.read_text(encoding="utf-8"))
    for ep, traj in zip(data["runs"][0]["eps"], trajs, strict=True):
        assert [m for m, n in ep["mask"] for _ in range(n)] == traj.loss_mask
        assert ep["ids"] == traj.completion_ids
        runs = run_text(data, ep)
        assert "".join(t for _, t in runs) == tokenizer.decode(traj.completion_ids, skip_special_tokens=False)
        model_text = "".join(t for m, t in runs if m == 1)
        env_text = "".join(t for m, t in runs if m == 0)
        for turn in traj.turns:
            assert turn.text in model_text
        for t in traj.turns:
            if t.obs_end > t.obs_start:
                assert all(r.content.strip() in env_text for r in t.results)
        assert all(a[0] != b[0] for a, b in itertools.pairwise(runs)) and runs[0][0] == 1


def test_without_tokenizer_uses_turn_texts(rollout: tuple[Path, list[Any]]) -> None:
    rows = load_trajectory_rows(rollout[0])
    data = page_data(render_html(rows, tokenizer=None))
    assert data["decoded"] is False and data["vocab"] == {}
    for ep, traj in zip(data["runs"][0]["eps"], rollout[1], strict=True):
        model_text = "".join(t for m, t in run_text(data, ep) if m == 1)
        assert all(turn.text in model_text for turn in traj.turns)


def test_prompts_and_tasks_are_stored_once(rollout: tuple[Path, list[Any]], tokenizer: Any) -> None:
    rows = load_trajectory_rows(rollout[0])
    one = build_data(rows, tokenizer=tokenizer)
    four = build_data(rows * 4, tokenizer=tokenizer)
    assert len(four["runs"][0]["eps"]) == 4 * len(rows)
    assert len(four["prompts"]) == len(one["prompts"]) and len(four["tasks"]) == len(one["tasks"]) == len(rows)
    assert four["vocab"] == one["vocab"]


def test_hostile_text_is_escaped() -> None:
    row = {
        "task": {"id": "x</script><script>alert(1)</script>", "prompt": "<b>hi</b>\u2028"},
        "completion_ids": [], "loss_mask": [], "reward": 0.0, "outcome_reward": 0.0,
        "turns": [{"index": 0, "action_span": [0, 0], "obs_span": [0, 0], "text": "<!--<script>evil()</script>",
                   "calls": [], "results": []}],
    }
    page = render_html([row], title="</title><script>t()</script>")
    assert "<script>alert(1)" not in page and "<script>evil()" not in page and "<script>t()" not in page
    assert page.count("<script>") == 1 and page.count("</script>") == 2
    data = page_data(page)
    assert data["runs"][0]["eps"][0]["task"] == row["task"]["id"]
    assert data["runs"][0]["eps"][0]["turns"][0]["text"] == row["turns"][0]["text"]


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


VISIBLE = "return Array.from(document.querySelectorAll('#content table.eps > tbody > tr.ep')).map(e => +e.dataset.index)"


@NEEDS_CHROMIUM
def test_chromium_renders_the_table_and_an_expanded_episode(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    r = _chromium([f"--screenshot={shot}", f"{report.as_uri()}#open=0"], tmp_path)
    assert shot.is_file(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] == 2000 and img.shape[1] == 1280
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05, "blank screenshot"
    # the expanded episode shows both mask colours: model green (#d9f2dd) and env blue-grey (#e8ebf5)
    px = (rgb * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(p) for p in px[::7]}
    assert (0xD9, 0xF2, 0xDD) in colours and (0xE8, 0xEB, 0xF5) in colours

    r = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    assert len(re.findall(r'<tr class="row ep [a-z]+" data-index="\d+"', dom)) == len(EXPECTED)
    assert 'id="shown">6<' in dom and "<svg" in dom  # the script ran: table, count and histograms
    assert not re.search(r'<section class="episode [a-z]+" data-index', dom)  # rendered on demand only


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
    visible = [int(k) for k in re.findall(r'<tr class="row ep [a-z]+" data-index="(\d+)"', r.stdout)]
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
def test_table_filters_sorting_expansion_and_token_view(report: Path, rollout: tuple[Path, list[Any]],
                                                         tmp_path: Path) -> None:
    """Real clicks and key presses through chromedriver: filters, sorting, one episode expanded on click with
    its calls, mask runs and per-token view (id, mask, logprob on hover)."""
    _, trajs = rollout
    wd = WebDriver(tmp_path / "profile")
    try:
        wd.get(report.as_uri())
        assert wd.js(VISIBLE) == list(EXPECTED)
        wd.click("#f-error option[value='exception']")
        assert wd.js(VISIBLE) == [4]
        assert wd.js("return location.hash") == "#error=exception"
        wd.click("#f-reset")
        wd.click("#f-outcome option[value='failure']")
        wd.type("#f-q", "<answer>0</answer>")
        assert wd.js(VISIBLE) == [1, 2, 3]
        assert wd.js("return document.getElementById('shown').textContent") == "3"
        wd.type("#f-q", "no such text anywhere")
        assert wd.js(VISIBLE) == []
        assert wd.js("return getComputedStyle(document.getElementById('empty')).display") != "none"
        for fragment, expected in FRAGMENTS.items():  # deep links: every filter from the URL fragment
            wd.get("about:blank")
            wd.get(f"{report.as_uri()}#{fragment}")
            assert wd.js(VISIBLE) == expected, fragment
        wd.get("about:blank")
        wd.get(report.as_uri())
        # sorting: reward ascending, then descending (ties keep episode order), tokens ascending
        rewards = [t.reward for t in trajs]
        wd.click("th[data-key='r']")
        asc = sorted(range(len(trajs)), key=lambda k: (rewards[k], k))
        assert wd.js(VISIBLE) == asc and wd.js("return location.hash") == "#sort=r"
        wd.click("th[data-key='r']")
        assert wd.js(VISIBLE) == sorted(range(len(trajs)), key=lambda k: (-rewards[k], -k))
        wd.click("th[data-key='tok']")
        assert wd.js(VISIBLE) == sorted(range(len(trajs)), key=lambda k: (len(trajs[k].completion_ids), k))
        # expanding: only the clicked episode is rendered, with its calls and results
        assert wd.js("return document.querySelectorAll('section.episode').length") == 0
        wd.click("tr.ep[data-index='4'] td.task")
        assert wd.js("return document.querySelectorAll('section.episode').length") == 1
        sec = "document.querySelector('section.episode[data-index=\"4\"]')"
        results = wd.js(f"return Array.from({sec}.querySelectorAll('pre.result')).map(e => e.textContent)")
        assert results == [r.content for r in trajs[4].tool_results]
        assert wd.js(f"return {sec}.querySelector('.call .badge.err').textContent") == "exception"
        spans = wd.js(f"return Array.from({sec}.querySelectorAll('.mask .tok span')).map(e => [e.className, "
                      "e.textContent])")
        assert "".join(t for c, t in spans if c == "m1").count(trajs[4].turns[0].text) == 1
        # per-token view: built when opened; one span per completion token, id and mask on hover
        assert wd.js(f"return {sec}.querySelectorAll('.tokview span').length") == 0
        wd.click("tr.detail details.tokens > summary")
        titles = wd.js(f"return Array.from({sec}.querySelectorAll('.tokview span.t')).map(e => e.title)")
        ids, mask = trajs[4].completion_ids, trajs[4].loss_mask
        assert len(titles) == len(ids)
        for i in (0, len(ids) // 2, len(ids) - 1):
            assert f"id {ids[i]} · mask {mask[i]}" in titles[i]
        wd.click("tr.ep[data-index='4'] td.task")  # a second click collapses it
        assert wd.js("return document.querySelectorAll('section.episode').length") == 0
        png = base64.b64decode(wd.cmd("GET", "/screenshot"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    finally:
        wd.close()


def _grpo_rows(rows: list[dict[str, Any]], k: int, *, solved: set[int]) -> list[dict[str, Any]]:
    """``k`` samples per task (a GRPO group): copies of real episodes; sample ``j`` of task ``i`` succeeds when
    ``(i, j)`` is in ``solved`` encoded as ``i * k + j``."""
    out = []
    for i, row in enumerate(rows):
        for j in range(k):
            r = copy.deepcopy(row)
            ok = (i * k + j) in solved
            r["outcome_reward"] = 1.0 if ok else 0.0
            r["reward"] = r["outcome_reward"] + sum(t.get("reward", 0.0) for t in r["turns"])
            out.append(r)
    return out


@NEEDS_DRIVER
def test_group_by_task_and_two_file_comparison(rollout: tuple[Path, list[Any]], tokenizer: Any,
                                               tmp_path: Path) -> None:
    """Tasks view: one row per task with its pass@1 / pass@k; compare view: per task, before vs after, side by
    side; the CLI writes the comparison with ``--compare``."""
    from toolgym.cli import main

    rows = load_trajectory_rows(rollout[0])
    k = 4
    before = _grpo_rows(rows, k, solved={0, 4, 5, 17})  # task 0: 2/4, task 1: 1/4, task 4: 1/4
    after = _grpo_rows(rows, k, solved={0, 1, 2, 3, 4, 8, 9, 17, 18, 19})  # task 0: 4/4, 1: 1/4, 2: 2/4, 4: 3/4
    a, b = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    for path, rs in ((a, before), (b, after)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rs))
    out = tmp_path / "cmp.html"
    assert main(["view", str(a), "--compare", str(b), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert [r["label"] for r in page_data(page)["runs"]] == ["before.jsonl", "after.jsonl"]
    ids = [r["task"]["id"] for r in rows]

    def succ(rs: list[dict[str, Any]], i: int) -> int:
        return sum(r["outcome_reward"] >= 1 for r in rs[i * k : (i + 1) * k])

    wd = WebDriver(tmp_path / "profile")
    try:
        wd.get(out.as_uri() + "#view=tasks")
        got = wd.js("return Array.from(document.querySelectorAll('table.groups > tbody > tr.group')).map(e => "
                    "[e.dataset.key, ...Array.from(e.children).slice(1, 7).map(c => c.textContent)])")
        assert [g[0] for g in got] == ids
        for i, g in enumerate(got):
            s = succ(before, i)
            assert g[1] == str(k) and g[4] == str(s), g
            assert g[5] == f"{100 * s / k:.1f}%" and g[6] == ("100.0%" if s else "0.0%"), g
        wd.click("th[data-key='succ']")
        order = wd.js("return Array.from(document.querySelectorAll('table.groups > tbody > tr.group'))"
                      ".map(e => e.dataset.key)")
        assert order == sorted(ids, key=lambda t: succ(before, ids.index(t)))  # stable: ties keep file order
        wd.click(f"tr.group[data-key='{ids[0]}'] td")  # a task expands to its k episodes
        assert wd.js("return document.querySelectorAll('tr.detail table.eps tr.ep').length") == k
        wd.click("#f-run option[value='1']")  # the same view of the other file
        got = wd.js("return Array.from(document.querySelectorAll('table.groups > tbody > tr.group')).map(e => "
                    "e.children[4].textContent)")
        assert sorted(map(int, got)) == sorted(succ(after, i) for i in range(len(rows)))

        wd.click("#tabs button[data-view='compare']")
        assert "view=compare" in wd.js("return location.hash")
        cmp = wd.js("return Array.from(document.querySelectorAll('table.compare > tbody > tr.cmp')).map(e => "
                    "[e.dataset.key, e.querySelector('td.dp').textContent])")
        assert [c[0] for c in cmp] == ids
        for i, (_, dp) in enumerate(cmp):
            d = (succ(after, i) - succ(before, i)) / k
            assert dp == ("+" if d > 0 else "") + f"{100 * d:.1f}%", (i, dp)
        better = sum(succ(after, i) > succ(before, i) for i in range(len(rows)))
        assert wd.js("return document.querySelector('b.better').textContent") == str(better)
        wd.click(f"tr.cmp[data-key='{ids[2]}'] td")  # both files' episodes of one task, side by side
        side = wd.js("return Array.from(document.querySelectorAll('tr.detail .side > div')).map(d => "
                     "d.querySelectorAll('tr.ep').length)")
        assert side == [k, k]
        wd.click(".side .run-1 tr.ep td")
        assert wd.js("return document.querySelector('.side .run-1 section.episode').dataset.run") == "1"
        assert wd.js("return document.querySelectorAll('#hists svg').length") == 2
    finally:
        wd.close()


@NEEDS_DRIVER
def test_drift_is_an_aligned_token_diff(rollout: tuple[Path, list[Any]], tokenizer: Any, tmp_path: Path) -> None:
    """``drift`` as ``check_drift`` writes it: the page aligns both windows and marks the first difference."""
    row = load_trajectory_rows(rollout[0])[0]
    built = row["prompt_ids"] + row["completion_ids"]
    idx = len(row["prompt_ids"]) + 5
    expected = list(built)
    expected[idx] = tokenizer.convert_tokens_to_ids("<think>") if "<think>" in tokenizer.get_vocab() else 0
    lo, hi = idx - 8, idx + 8
    row["drift"] = {"index": idx, "built": built[lo:hi], "expected": expected[lo:hi],
                    "built_text": tokenizer.decode(built[lo:hi]), "expected_text": tokenizer.decode(expected[lo:hi]),
                    "built_len": len(built), "expected_len": len(expected)}
    out = write_report([row], tmp_path / "drift.html", tokenizer=tokenizer)
    wd = WebDriver(tmp_path / "profile")
    try:
        wd.get(out.as_uri() + "#drift=drift&open=0")
        assert wd.js(VISIBLE) == [0]
        assert wd.js("return document.querySelector('.drift-index').textContent") == str(idx)
        heads = wd.js("return Array.from(document.querySelectorAll('table.diff tr:first-child th')).slice(1)"
                      ".map(e => +e.textContent)")
        assert heads == list(range(lo, hi))
        classes = wd.js("return Array.from(document.querySelectorAll('table.diff tr:nth-child(2) td'))"
                        ".map(e => e.className)")
        assert classes == ["same"] * 8 + ["first"] + ["same"] * 7
        first = wd.js("return document.querySelector('table.diff tr:nth-child(2) td.first').title")
        assert first == f"id {built[idx]}"
    finally:
        wd.close()


def _big_rows(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` episodes from the real ones: distinct task ids in groups of 8, varied rewards."""
    out = []
    for i in range(n):
        r = dict(rows[i % len(rows)])
        r["task"] = {**r["task"], "id": f"task-{i // 8:04d}"}
        r["outcome_reward"] = float((i * 7919) % 3 == 0)
        r["reward"] = r["outcome_reward"] + (i % 10) / 100
        out.append(r)
    return out


#: The budget for a 5,000-episode page (GRPO scale) in headless Chromium on a shared 2-core machine: parsing
#: the data, drawing the first table page and the histograms; sorting 5,000 rows; the file size.
BIG_EPISODES = 5000
LOAD_BUDGET_S = 5.0
SORT_BUDGET_S = 1.5
SIZE_BUDGET_MB = 12.0


@NEEDS_DRIVER
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_5000_episodes_load_within_budget(rollout: tuple[Path, list[Any]], tokenizer: Any, tmp_path: Path) -> None:
    rows = _big_rows(load_trajectory_rows(rollout[0]), BIG_EPISODES)
    out = write_report(rows, tmp_path / "big.html", tokenizer=tokenizer)
    size_mb = out.stat().st_size / 1e6
    assert size_mb < SIZE_BUDGET_MB, f"{size_mb:.1f} MB"
    wd = WebDriver(tmp_path / "profile")
    try:
        t0 = time.monotonic()
        wd.get(out.as_uri())
        wall = time.monotonic() - t0
        load = wd.js("const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd / 1000")
        assert wd.js("return window.toolgymViewer.ready") is True
        assert wd.js("return document.getElementById('total').textContent") == str(BIG_EPISODES)
        assert wd.js("return document.querySelectorAll('table.eps > tbody > tr.ep').length") == 200  # one page
        assert load < LOAD_BUDGET_S, f"loaded in {load:.2f} s (wall {wall:.2f} s)"
        t = wd.js("const t = performance.now(); document.querySelector(\"th[data-key='r']\").click(); "
                  "return (performance.now() - t) / 1000")
        assert t < SORT_BUDGET_S, f"sorting took {t:.2f} s"
        first = wd.js("return +document.querySelector('table.eps > tbody > tr.ep').dataset.reward")
        assert first == min(r["reward"] for r in rows)
        t = wd.js("const t = performance.now(); document.querySelector(\"#tabs button[data-view='tasks']\").click(); "
                  "return (performance.now() - t) / 1000")
        assert t < SORT_BUDGET_S, f"grouping took {t:.2f} s"
        assert wd.js("return document.querySelectorAll('tr.group').length") == 200  # one page of 625 tasks
        assert "of 4" in wd.js("return document.querySelector('.pager').textContent")
        print(f"5,000 episodes: {size_mb:.1f} MB, load {load:.2f} s (wall {wall:.2f} s)")
    finally:
        wd.close()
