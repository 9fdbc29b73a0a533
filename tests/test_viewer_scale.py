"""The viewer at GRPO scale, with 5,000 episodes of distinct tasks: the page size, paging in every
view, ``#open=N`` on a later page and below the sticky header, a side-by-side comparison that fits a 1,400 px
window, right-aligned numeric headers, the question in the task column, drift counted in the header.

The episodes are real Calculator-v0 rollouts (:mod:`tests.rollout_files`) given distinct questions: each
prompt keeps the real system prompt and tool list and gets its own user turn, as a real file of distinct tasks
has. Chromium comes from Debian (``apt-get install -y chromium chromium-driver``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.rollout_files import make_rollout_file
from tests.test_viewer import NEEDS_DRIVER, WebDriver, page_data
from toolgym.report.viewer import load_trajectory_rows, write_report

N = 5000
#: measured 8.6 MB for these rows; the decoded prompts were 6.7 MB of a 15.6 MB page of 5,000 distinct real tasks
#: before they shared their system prompt and tool list (9.5 MB after)
SIZE_BUDGET_MB = 10.0


def distinct_rows(rows: list[dict[str, Any]], tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """``n`` episodes of distinct tasks: the real prompt with its user turn replaced by task ``i``'s question."""
    base = rows[0]["prompt_ids"]
    marker = tokenizer.encode("<|im_start|>user", add_special_tokens=False)
    at = max(i for i in range(len(base) - len(marker) + 1) if base[i:i + len(marker)] == marker)
    head = base[: at + len(marker)]
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    out = []
    for i in range(n):
        r = json.loads(json.dumps(rows[i % len(rows)]))
        question = f"What is {1000 + i} * {37 + i % 50} - {i % 997}? Use the calculator."
        r["prompt_ids"] = head + tokenizer.encode("\n" + question, add_special_tokens=False) + tail
        r["task"] = {**r["task"], "id": f"task-{i:05d}", "prompt": question}
        r["outcome_reward"] = float(i % 3 == 0)
        r["reward"] = r["outcome_reward"]
        if i % 500 == 7:
            r["drift"] = {"index": 3, "built": [1, 2, 3], "expected": [1, 2, 4], "built_len": 9, "expected_len": 9}
        out.append(r)
    return out


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from toolgym.models import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> tuple[Path, Path, list[dict[str, Any]]]:
    d = tmp_path_factory.mktemp("scale")
    path, _ = make_rollout_file(d / "traj.jsonl", episodes=6)
    rows = distinct_rows(load_trajectory_rows(path), tokenizer, N)
    page = write_report(rows, d / "big.html", tokenizer=tokenizer)
    after = [dict(r, outcome_reward=float(i % 2 == 0), reward=float(i % 2 == 0)) for i, r in enumerate(rows)]
    cmp_page = write_report(rows, d / "cmp.html", tokenizer=tokenizer, compare=after, labels=("before", "after"))
    return page, cmp_page, rows


def test_distinct_tasks_share_the_system_prompt_in_the_page(big: tuple[Path, Path, list[dict[str, Any]]],
                                                             tokenizer: Any) -> None:
    page, _, rows = big
    size_mb = page.stat().st_size / 1e6
    assert size_mb < SIZE_BUDGET_MB, f"{size_mb:.1f} MB"
    data = page_data(page.read_text(encoding="utf-8"))
    texts = data["ptexts"]

    def text(i: int) -> str:
        e = texts[i]
        if isinstance(e, str):
            return e
        base = texts[e[0]].encode("utf-16-le")[: 2 * e[1]].decode("utf-16-le")
        return base + e[2]

    assert sum(isinstance(e, str) for e in texts) == 1  # one full prompt; the others share its start
    for k in (0, 1, 2499, N - 1):
        ep = data["runs"][0]["eps"][k]
        assert text(ep["pt"]) == tokenizer.decode(rows[k]["prompt_ids"], skip_special_tokens=False)


TASK_CELLS = "Array.from(document.querySelectorAll('table.grid > tbody > tr.row')).map(e => e.querySelector('td.task').textContent)"


@pytest.fixture
def wd(tmp_path: Path) -> Any:
    """A headless browser with its own profile, closed after the test."""
    d = WebDriver(tmp_path / "profile")
    yield d
    d.close()


@NEEDS_DRIVER
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_view_pages_and_opens_an_episode_below_the_header(big: tuple[Path, Path, list[dict[str, Any]]],
                                                                wd: WebDriver) -> None:
    page, _, rows = big
    wd.get(page.as_uri())
    assert wd.js("return document.querySelectorAll('table.eps > tbody > tr.ep').length") == 200
    assert wd.js(f"return {TASK_CELLS}")[:3] == [r["task"]["prompt"] for r in rows[:3]]  # the question
    summary = wd.js("return document.getElementById('summary').textContent")
    assert "drift 10" in summary, summary
    # numeric columns: header and cells both right-aligned
    align = wd.js("return Array.from(document.querySelectorAll('table.eps th')).map(t => "
                  "[t.dataset.key, getComputedStyle(t).textAlign])")
    assert dict(align)["r"] == "right" and dict(align)["tok"] == "right" and dict(align)["task"] == "left"

    wd.click("#tabs button[data-view='tasks']")
    assert wd.js("return document.querySelectorAll('table.groups > tbody > tr.group').length") == 200
    assert wd.js("return document.querySelector('.pager').textContent").count("of 25") == 1
    assert wd.js(f"return {TASK_CELLS}")[0] == rows[0]["task"]["prompt"]
    wd.click(".pager button[data-page='1']")
    assert wd.js(f"return {TASK_CELLS}")[0] == rows[200]["task"]["prompt"]

    wd.get("about:blank")
    wd.get(page.as_uri() + "#open=4321")  # on page 22 of the episodes view
    assert wd.js("return document.getElementById('page').textContent") == "22"
    assert wd.js("return document.querySelector('section.episode').dataset.index") == "4321"
    top = wd.js("return document.querySelector('tr.ep.open').getBoundingClientRect().top")
    header = wd.js("return document.querySelector('header').getBoundingClientRect().bottom")
    assert top >= header, (top, header)


@NEEDS_DRIVER
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compare_with_both_sides_open_fits_a_1400px_window(big: tuple[Path, Path, list[dict[str, Any]]],
                                                           wd: WebDriver) -> None:
    _, cmp_page, rows = big
    wd.cmd("POST", "/window/rect", {"width": 1400, "height": 1000})
    wd.get(cmp_page.as_uri() + "#view=compare")
    assert wd.js("return document.querySelectorAll('table.compare > tbody > tr.cmp').length") == 200
    assert wd.js(f"return {TASK_CELLS}")[0] == rows[0]["task"]["prompt"]
    wd.click("tr.cmp td.task")
    wd.click(".side .run-0 tr.ep td")
    wd.click(".side .run-1 tr.ep td")
    assert wd.js("return document.querySelectorAll('.side section.episode').length") == 2
    width = wd.js("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1] <= 1400, width
