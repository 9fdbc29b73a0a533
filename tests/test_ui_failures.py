"""Every failure is shown where the user acted, in a real browser over a real ``toolgym ui``: an evaluation that
exits with an error says so on the Evaluate page; a failed MCP load leaves no previous tool listed or callable;
the reward composer warns when a gold-answer field is missing from the tasks; and a training launch is named in
the tracker and never writes into another run's directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import test_ui
from tests.test_ui import NEEDS_DRIVER, Server, open_page, set_value, shot, tab, text, type_into, wait_for
from tests.test_viewer import WebDriver

pytest.importorskip("fastapi", reason="toolgym ui needs the [ui] extra")

server = test_ui.server  # the UI tests' fixtures (a server and a browser for this module)
browser = test_ui.browser


@NEEDS_DRIVER
def test_a_failing_evaluation_says_so_on_the_evaluate_page(server: Server, browser: WebDriver) -> None:
    d = browser
    open_page(d, server)
    tab(d, "registry")
    assert d.js("return document.querySelector('#ev-tasks').value") != "all"  # the defaults run
    set_value(d, "#ev-ckpt", "oracle")
    set_value(d, "#ev-env", "toolgym/Calculator-v0")
    type_into(d, "#ev-tasks", "all")  # an infinite split: toolgym eval refuses it (exit 2)
    type_into(d, "#ev-name", "bad-eval")
    d.click("#ev-launch")
    err = wait_for(d, "return document.querySelector('#ev-error').textContent", timeout=120, what="the failure")
    assert "failed (exit 2)" in err and "'all' is undefined" in err
    assert text(d, "#ev-summary") == ""  # no "started" left standing


@NEEDS_DRIVER
def test_a_failed_mcp_load_leaves_no_previous_tool(server: Server, browser: WebDriver) -> None:
    d = browser
    open_page(d, server)
    set_value(d, "#env-select", "toolgym/Calculator-v0")
    d.click("#env-load")
    wait_for(d, "return document.querySelector('#tools-list tr.tool[data-name=calculator]')", timeout=90)
    type_into(d, "#mcp-config", '{"mcpServers": {"bad": {"command": "/nonexistent/mcp-server"}}}')
    d.click("#mcp-load")
    err = wait_for(d, "return document.querySelector('#tools-error').textContent", timeout=60)
    assert "bad" in err
    assert d.js("return document.querySelectorAll('#tools-list tr.tool').length") == 0
    assert text(d, "#tools-source") == "(load failed)"
    status, body = server.request("/api/tools/call", {"name": "calculator", "arguments": '{"expression": "1+1"}'})
    assert status == 400 and "load an env" in json.loads(body)["error"]


@NEEDS_DRIVER
def test_rewards_warn_when_the_gold_field_is_missing(server: Server, browser: WebDriver) -> None:
    from tests.rollout_files import make_rollout_file

    make_rollout_file(server.runs / "rollouts" / "calc.jsonl")  # Calculator tasks: `answer`, no golden_answers
    d = browser
    open_page(d, server)
    tab(d, "rewards")
    test_ui.pick_reward_file(d, "rollouts/calc.jsonl")
    # exact_match alone, its field cleared (its default, golden_answers: these tasks lack it)
    d.js("document.querySelectorAll('#rw-parts tbody tr').forEach(tr => {"
         "tr.querySelector('.rw-use').checked = tr.dataset.name === 'exact_match'; });"
         "document.querySelector('#rw-parts tr[data-name=exact_match] .rw-field').value = ''")
    d.click("#rw-run")
    warn = wait_for(d, "return document.querySelector('.rw-warning')?.textContent", timeout=60, what="the warning")
    assert warn.startswith("exact_match:") and "'golden_answers'" in warn and "answer" in warn
    # with the field set to the key that holds the gold, the warning goes
    d.js("document.querySelector('#rw-parts tr[data-name=exact_match] .rw-field').value = 'answer'")
    d.click("#rw-run")
    wait_for(d, "return document.querySelector('#rw-table') && !document.querySelector('.rw-warning')", timeout=60)


def test_a_launch_is_named_and_never_reuses_another_runs_directory(tmp_path: Path) -> None:
    from trainers.ui import commands as C
    from trainers.ui.playground import UIError

    runs = tmp_path / "runs"
    runs.mkdir()
    argv = C.train_argv(runs, "grpo", "grpo_calculator_cpu.yaml", {}, "my-run", fresh=True)
    assert argv[argv.index("--run_name") + 1] == "my-run"
    (runs / "my-run").mkdir()
    (runs / "my-run" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UIError, match=r"taken.*'my-run-2'"):
        C.train_argv(runs, "grpo", "grpo_calculator_cpu.yaml", {}, "my-run", fresh=True)
    assert C.free_run_name(runs, "my-run") == "my-run-2"
    assert (runs / "my-run" / "model.safetensors").read_bytes() == b"x"
    argv = C.train_argv(runs, "grpo", "grpo_calculator_cpu.yaml", {"run_name": "other"}, "my-run-2")
    assert argv.count("--run_name") == 1 and argv[argv.index("--run_name") + 1] == "other"
    assert sys.executable in argv[0]


@NEEDS_DRIVER
def test_play_one_episode_turn_by_turn(server: Server, browser: WebDriver) -> None:
    """The oracle on one Calculator task: the page shows the first turn (a tool call and its observation), then
    the next turns one at a time, then the outcome; the trajectory is the one ``toolgym eval`` wrote."""
    d = browser
    open_page(d, server)
    tab(d, "play")
    set_value(d, "#play-env", "toolgym/Calculator-v0")
    set_value(d, "#play-policy", "oracle")
    type_into(d, "#play-seed", "3")
    d.click("#play-run")
    wait_for(d, "return document.querySelector('#play-out .turn[data-turn=\"0\"]')", timeout=120, what="turn 1")
    first = text(d, "#play-out .turn[data-turn='0']")
    assert "tool call" in first and "calculator" in first
    res = wait_for(d, "return document.querySelector('#play-result')?.textContent", timeout=30, what="the outcome")
    assert res.startswith("episode ended: outcome reward 1.000")
    assert d.js("return document.querySelector('#play-result').className") == "ok"
    n = d.js("return document.querySelectorAll('#play-out .turn').length")
    assert n >= 2 and text(d, "#play-at") == f"turn {n} of {n}"
    shot(d, "play")
    d.click("#play-prev")
    assert d.js("return document.querySelectorAll('#play-out .turn').length") == n - 1
    files = list((server.runs / "ui" / "play").glob("*.jsonl"))
    assert len(files) == 1
    row = json.loads(files[0].read_text().splitlines()[0])
    assert len(row["turns"]) == n and row["outcome_reward"] == 1.0
    # a failure (an env that does not exist) is shown where the user pressed Play
    d.js("const o = document.createElement('option'); o.value = o.textContent = 'toolgym/Nope-v0';"
         "document.querySelector('#play-env').appendChild(o)")
    set_value(d, "#play-env", "toolgym/Nope-v0")
    d.click("#play-run")
    err = wait_for(d, "return document.querySelector('#play-error').textContent", timeout=120, what="the failure")
    assert "Nope-v0" in err


@NEEDS_DRIVER
def test_typed_form_markdown_help_and_saved_setups(server: Server, browser: WebDriver) -> None:
    """The Train form's widgets follow each field's type in the Config (TRL's included), help texts are rendered
    from markdown without letting markup through, and a named setup saved on the page loads back."""
    d = browser
    open_page(d, server)
    tab(d, "train")
    set_value(d, "#train-config", "grpo_calculator_cpu.yaml")
    wait_for(d, "return document.querySelector('.tf[data-key=max_steps]')")
    kinds = d.js("return Object.fromEntries([...document.querySelectorAll('#train-fields .tf')].map(i =>"
                 "[i.dataset.key, i.tagName === 'SELECT' ? 'select' : i.type]))")
    assert kinds["use_cpu"] == "checkbox" and kinds["max_steps"] == "number" and kinds["learning_rate"] == "number"
    assert kinds["save_strategy"] == "select" and kinds["toolgym.env_id"] == "text"
    assert d.js("return document.querySelector('.tf[data-key=max_steps]').step") == "1"
    # markdown: TRL's `code` spans become <code>, and no element comes from a help text's own markup
    assert d.js("return document.querySelectorAll('#train-fields td.help code').length") > 0
    assert "`" not in text(d, "#train-fields tr:has(.tf[data-key=num_generations]) td.help")
    # change typed fields, save the setup under a name, change them again, load it back
    d.js("document.querySelector('.tf[data-key=use_cpu]').click()")
    set_value(d, ".tf[data-key=max_steps]", "3")
    set_value(d, ".tf[data-key=save_strategy]", "steps")
    type_into(d, "#train-extra", "toolgym.model=tiny")
    wait_for(d, "const c = document.querySelector('#train-command').textContent;"
                "return c.includes('--max_steps 3') && c.includes('--use_cpu false')")
    type_into(d, "#setup-name", "my-setup")
    d.click("#setup-save")
    wait_for(d, "return document.querySelector('#setup-msg').textContent === 'saved my-setup'")
    saved = json.loads((server.runs / "ui" / "setups" / "my-setup.json").read_text())
    assert saved["overrides"] == {"use_cpu": "false", "max_steps": "3", "save_strategy": "steps",
                                  "report_to": "[mlflow]", "toolgym.model": "tiny"}  # report_to: the page's default
    open_page(d, server)  # a new page: nothing of the form is left but what is saved
    tab(d, "train")
    wait_for(d, "return [...document.querySelectorAll('#setup-list option')].some(o => o.value === 'my-setup')")
    set_value(d, "#setup-list", "my-setup")
    d.click("#setup-load")
    wait_for(d, "return document.querySelector('#setup-msg').textContent === 'loaded my-setup'")
    assert d.js("return [document.querySelector('.tf[data-key=use_cpu]').checked,"
                "document.querySelector('.tf[data-key=max_steps]').value,"
                "document.querySelector('.tf[data-key=save_strategy]').value,"
                "document.querySelector('.tf[data-key=\"toolgym.model\"]').value]") == [False, "3", "steps", "tiny"]
    wait_for(d, "return document.querySelector('#train-command').textContent.includes('--max_steps 3')")
    # a GPU config on a machine without one says so
    set_value(d, "#train-config", "qwen3_4b_search_8xa100.yaml")
    gpu = wait_for(d, "return document.querySelector('#train-gpu').textContent", timeout=60)
    assert "bf16" in gpu and "has none" in gpu
