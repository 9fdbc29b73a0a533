"""Iterating in the web UI, in headless Chromium over a real ``toolgym ui``: a Calculator episode played by hand
(the parsed call, the tool's result, the turn's tokens with their loss mask, the reward, a parse error as the
model reads it, the outcome, an expired session); env cards for every registered env (MCP-v0 from the MCP card's
config, BFCL-v0's tools per task, nothing kept across a switch); the Train form keeping its edits after Launch
with a free run name; an evaluation in the Register list without a reload; reward defaults that fit the file's
tasks with weighted contributions told apart from raw values; and the layout at 1024 px."""

from __future__ import annotations

import json
import sys

import pytest

from tests import test_ui
from tests.test_ui import FAULT, NEEDS_DRIVER, Server, open_page, set_value, tab, text, type_into, wait_for
from tests.test_viewer import WebDriver

pytest.importorskip("fastapi", reason="toolgym ui needs the [ui] extra")

server = test_ui.server  # the UI tests' fixtures (a server and a browser for this module)
browser = test_ui.browser


def _call(expression: str) -> str:
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression + '"}}\n</tool_call>'


def _send(d: WebDriver, turn_text: str, n_turns: int) -> str:
    d.js(f"document.querySelector('#hand-text').value = {json.dumps(turn_text)}")
    d.click("#hand-send")
    wait_for(d, f"return document.querySelectorAll('#hand-turns .hand-turn').length === {n_turns} || "
                "document.querySelector('#hand-error').textContent", timeout=60, what=f"turn {n_turns}")
    assert text(d, "#hand-error") == ""
    return text(d, f"#hand-turns .hand-turn:nth-child({n_turns})")


@NEEDS_DRIVER
def test_play_a_calculator_episode_by_hand(server: Server, browser: WebDriver) -> None:
    """A person's turns, answered by the env's own encode_action/step: a call, an unparsable call (the env's
    parse_error observation), the answer (outcome 1); then an ended episode, Reset, and an expired session."""
    d = browser
    open_page(d, server)
    tab(d, "play")
    wait_for(d, "return [...document.querySelectorAll('#hand-env option')].some(o => o.value === 'toolgym/Calculator-v0')")
    set_value(d, "#hand-env", "toolgym/Calculator-v0")
    type_into(d, "#hand-seed", "3")
    d.click("#hand-reset")
    wait_for(d, "return !document.querySelector('#hand-input').hidden", timeout=90, what="the episode to start")
    prompt = text(d, "#hand-prompt-shown")
    assert prompt.startswith("What is ") and prompt.endswith("?")
    assert "<tool_call>" in text(d, "#hand-prompt-text")  # the system prompt as the model reads it
    d.click("#hand-example")  # an example call in the env's own format
    assert '"name": "calculator"' in d.js("return document.querySelector('#hand-text').value")
    expression = prompt[len("What is "):-1]
    value = str(eval(expression, {"__builtins__": {}}))  # the task is integer arithmetic  # noqa: S307

    first = _send(d, _call(expression), 1)
    assert "parsed call calculator" in first and value in text(d, "#hand-turns .hand-result")
    assert text(d, "#hand-turns .hand-reward") == "0.000"
    model = d.js("return [...document.querySelectorAll('#hand-turns .tok .m1')].map(s => s.textContent).join('')")
    env = d.js("return [...document.querySelectorAll('#hand-turns .tok .m0')].map(s => s.textContent).join('')")
    assert model.startswith("<tool_call>") and expression in model and value not in model  # the action: mask 1
    assert value in env and "<tool_call>" not in env  # the observation: mask 0
    assert d.js("return getComputedStyle(document.querySelector('.tok .m1')).backgroundColor") != \
        d.js("return getComputedStyle(document.querySelector('.tok .m0')).backgroundColor")

    second = _send(d, '<tool_call>{"name": calculator</tool_call>', 2)
    assert "not parsed: invalid JSON" in second
    assert "Error (parse_error)" in text(d, "#hand-turns .hand-turn:nth-child(2) .hand-result")

    _send(d, f"<answer>{value}</answer>", 3)
    assert "no tool call parsed" in text(d, "#hand-turns .hand-turn:nth-child(3)")
    res = wait_for(d, "return document.querySelector('#hand-result')?.textContent", what="the outcome")
    assert res.startswith("episode ended: outcome reward 1.000") and value in res
    assert d.js("return document.querySelector('#hand-input').hidden")
    test_ui.shot(d, "hand", at="#hand-card")

    d.click("#hand-reset")  # starts over
    wait_for(d, "return !document.querySelector('#hand-input').hidden && !document.querySelector('#hand-turns').children.length")
    assert text(d, "#hand-end") == ""
    # the server keeps a bounded number of episodes: eight other tabs push this one out
    for k in range(8):
        code, body = server.request("/api/hand/reset", {"session": f"other-tab-{k}", "env": "calculator", "seed": k})
        assert code == 200, body
    d.js(f"document.querySelector('#hand-text').value = {json.dumps(_call('1+1'))}")
    d.click("#hand-send")
    err = wait_for(d, "return document.querySelector('#hand-error').textContent", what="the expiry")
    assert "expired" in err and "Reset" in err
    code, body = server.request("/api/hand/step", {"session": "../../etc", "text": "x"})
    assert code == 400 and "bad session id" in json.loads(body)["error"]


@NEEDS_DRIVER
def test_env_cards_for_every_registered_env(server: Server, browser: WebDriver) -> None:
    from toolgym.envs.registration import ENVS

    d = browser
    open_page(d, server)
    wait_for(d, "return document.querySelectorAll('#hand-env option').length > 0")
    for sel in ("#env-select", "#hand-env"):
        assert d.js(f"return [...document.querySelectorAll('{sel} option')].map(o => o.value)") == list(ENVS)
    # MCP-v0 without a config: what it needs, in words, never a raw constructor error
    set_value(d, "#env-select", "toolgym/MCP-v0")
    assert "MCP config" in text(d, "#env-note")
    d.js("document.querySelector('#mcp-config').value = ''")
    d.click("#env-load")
    err = wait_for(d, "return document.querySelector('#tools-error').textContent", timeout=60)
    assert "built from an MCP config" in err and "__init__" not in err and "positional" not in err
    # ... and from the MCP card's config
    type_into(d, "#mcp-config", json.dumps({"mcpServers": {"fault": {"command": sys.executable, "args": [str(FAULT)]}}}))
    d.click("#env-load")
    wait_for(d, "return document.querySelector('#tools-list tr.tool[data-name=add]')", timeout=90, what="MCP-v0's tools")
    assert text(d, "#tools-source") == "(toolgym/MCP-v0)"
    # a call and its result belong to the env they were made on: a switch clears them
    set_value(d, "#env-select", "toolgym/Calculator-v0")
    assert d.js("return document.querySelectorAll('#tools-list tr.tool').length") == 0
    d.click("#env-load")
    wait_for(d, "return document.querySelector('#tools-list tr.tool[data-name=calculator]')", timeout=90)
    set_value(d, "#call-tool", "calculator")
    type_into(d, "#call-args", '{"expression": "6*7"}')
    d.click("#call-run")
    assert wait_for(d, "return document.querySelector('#call-content')?.textContent") == "42"
    set_value(d, "#env-select", "toolgym/BFCL-v0")
    assert text(d, "#call-result") == "" and d.js("return document.querySelector('#call-args').value") == "{}"
    assert "per task" in text(d, "#env-note")
    # BFCL-v0: tools per task; none until a task is picked, then that task's
    d.click("#env-load")
    wait_for(d, "return !document.querySelector('#env-task-row').hidden", timeout=90, what="the task picker")
    assert d.js("return document.querySelectorAll('#tools-list tr.tool').length") == 0
    assert "pick one" in text(d, "#tools-source")
    set_value(d, "#env-task", "simple_python_0")
    wait_for(d, "return document.querySelector('#tools-list tr.tool[data-name=calculate_triangle_area]')", timeout=60)
    # a single-turn task's function is checked, not run: the unknown_tool result says so
    set_value(d, "#call-tool", "calculate_triangle_area")
    type_into(d, "#call-args", '{"base": 10, "height": 5}')
    d.click("#call-run")
    assert "nothing that runs it" in wait_for(d, "return document.querySelector('#call-note')?.textContent")
    assert text(d, "#call-kind") == "error: unknown_tool"
    set_value(d, "#env-task", "simple_python_1")
    wait_for(d, "return !document.querySelector('#tools-list tr.tool[data-name=calculate_triangle_area]') && "
                "document.querySelectorAll('#tools-list tr.tool').length > 0", timeout=60, what="another task's tools")
    # by hand, MCP-v0 plays the MCP card's servers on the prompt typed on the card
    tab(d, "play")
    set_value(d, "#hand-env", "toolgym/MCP-v0")
    assert "MCP config" in text(d, "#hand-note") and not d.js("return document.querySelector('#hand-prompt-l').hidden")
    type_into(d, "#hand-prompt", "Add 2 and 40.")
    d.click("#hand-reset")
    wait_for(d, "return !document.querySelector('#hand-input').hidden", timeout=90, what="the MCP episode")
    assert text(d, "#hand-prompt-shown") == "Add 2 and 40." and "add" in text(d, "#hand-start")
    _send(d, '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>', 1)
    assert text(d, "#hand-turns .hand-result") == "42"


@NEEDS_DRIVER
def test_train_form_keeps_edits_and_proposes_a_free_name(server: Server, browser: WebDriver) -> None:
    """After Launch the form keeps the user's values and moves the run name on; Launch again works. The jobs fail
    at once (a misspelt field): no training runs."""
    d = browser
    open_page(d, server)
    tab(d, "train")
    key, orig = d.js("const i = [...document.querySelectorAll('#train-fields input.tf[type=number]')][0];"
                     "return [i.dataset.key, i.value]")
    edited = str(int(float(orig or 0)) + 7)
    set_value(d, f"#train-fields .tf[data-key='{key}']", edited)
    type_into(d, "#train-name", "mine")
    d.js("const t = document.querySelector('#train-extra'); t.value = 'no_such_field_xyz=1';"
         "t.dispatchEvent(new Event('change'))")
    for k, name in enumerate(("mine", "mine-2")):
        d.click("#train-launch")
        wait_for(d, f"return document.querySelectorAll('#jobs tr.job').length >= {k + 1} && "
                    f"document.querySelector('#train-name').value !== {json.dumps(name)}", timeout=60,
                 what=f"launch {k + 1}")
        assert text(d, "#train-error") == ""
        assert d.js(f"return document.querySelector(\"#train-fields .tf[data-key='{key}']\").value") == edited
        assert d.js("return document.querySelector('#train-extra').value") == "no_such_field_xyz=1"
        assert d.js("return document.querySelector('#train-name').value") == f"mine-{k + 2}"
    titles = d.js("return [...document.querySelectorAll('#jobs .job-link')].map(a => a.textContent)")
    assert {t.split()[-1] for t in titles} >= {"mine", "mine-2"}
    cmd = text(d, "#train-command")
    assert f"--{key} {edited}" in cmd and "mine-3" in cmd


@NEEDS_DRIVER
def test_new_evaluations_appear_without_a_reload(server: Server, browser: WebDriver) -> None:
    d = browser
    open_page(d, server)
    tab(d, "registry")
    has = "return [...document.querySelectorAll('#rg-eval option')].some(o => o.value === {})"
    # written by another program: listed when the page regains focus (or at the next poll)
    (server.runs / "elsewhere").mkdir()
    (server.runs / "elsewhere" / "eval.json").write_text(json.dumps({"success": 1.0}))
    d.js("window.dispatchEvent(new Event('focus'))")
    wait_for(d, has.format(json.dumps("elsewhere/eval.json")), timeout=30, what="the written evaluation")
    # an evaluation the page ran: listed once it finishes
    set_value(d, "#ev-ckpt", "oracle")
    set_value(d, "#ev-env", "toolgym/Calculator-v0")
    type_into(d, "#ev-tasks", "2")
    type_into(d, "#ev-name", "fresh-eval")
    d.click("#ev-launch")
    wait_for(d, "return document.querySelector('#ev-result')", timeout=180, what="the evaluation")
    wait_for(d, has.format(json.dumps("fresh-eval/eval.json")), timeout=30, what="the finished evaluation listed")


@NEEDS_DRIVER
def test_reward_defaults_fit_the_tasks_and_contributions_are_weighted(server: Server, browser: WebDriver) -> None:
    from tests.rollout_files import EXPECTED, make_rollout_file

    make_rollout_file(server.runs / "rollouts" / "defaults.jsonl")  # Calculator tasks: a numeric `answer`
    d = browser
    open_page(d, server)
    tab(d, "rewards")
    test_ui.pick_reward_file(d, "rollouts/defaults.jsonl")
    used = d.js("return [...document.querySelectorAll('#rw-parts tbody tr')].filter(tr => tr.querySelector('.rw-use')"
                ".checked).map(tr => tr.dataset.name)")
    assert used == ["numeric_match", "tool_call_format"]
    assert d.js("return document.querySelector('#rw-parts tr[data-name=numeric_match] .rw-field').value") == "answer"
    assert "('answer') is a number" in text(d, "#rw-why")
    d.click("#rw-run")
    wait_for(d, "return document.querySelectorAll('#rw-table tr.rw-ep').length > 0", timeout=60)
    assert d.js("return document.querySelector('.rw-warning')") is None
    heads = d.js("return [...document.querySelectorAll('#rw-table th.rw-h')].map(t => t.textContent)")
    assert heads == ["numeric_match x 1: weighted (raw)", "tool_call_format x 0.5: weighted (raw)"]
    rows = d.js("return [...document.querySelectorAll('#rw-table tr.rw-ep')].map(tr => [+tr.children[2].textContent,"
                "[...tr.querySelectorAll('td.rw-c')].map(c => [+c.dataset.raw, +c.dataset.contrib])])")
    for k, (total, cells) in enumerate(rows):
        (nm_raw, nm), (tcf_raw, tcf) = cells
        assert nm == pytest.approx(nm_raw) and tcf == pytest.approx(0.5 * tcf_raw)
        assert total == pytest.approx(nm + tcf, abs=2e-3)  # the total is the sum of the weighted contributions
        assert nm_raw == (1.0 if EXPECTED[k % 6][0] else 0.0)  # solved episodes score: not 0 for all


@NEEDS_DRIVER
def test_layout_from_1024_px(server: Server, browser: WebDriver) -> None:
    """At 1024x768 every card of every page fits the viewport's width (the two-column cards stack)."""
    from tests.rollout_files import make_rollout_file

    # long names widen the lists that offer them (checkpoints, trajectory files, evaluations)
    deep = server.runs / ("a-run-with-a-rather-long-descriptive-name-" * 3 + "x") / "checkpoint-000100"
    deep.mkdir(parents=True)
    (deep / "config.json").write_text("{}")
    (deep / "eval_before_and_after_training_on_the_held_out_split.json").write_text(json.dumps({"success": 0.5}))
    make_rollout_file(deep / "trajectories_of_the_held_out_evaluation_after_training.jsonl")
    d = browser
    d.cmd("POST", "/window/rect", {"width": 1024, "height": 768})
    try:
        open_page(d, server)
        for page in ("tools", "play", "rewards", "train", "runs", "registry"):
            tab(d, page)
            over = d.js("const w = document.documentElement.clientWidth; return [...document.querySelectorAll("
                        "'section.page.on .card')].filter(c => c.getBoundingClientRect().right > w + 0.5)"
                        ".map(c => (c.querySelector('h3')?.textContent || c.id).slice(0, 40) + ': ' +"
                        " Math.round(c.getBoundingClientRect().right) + ' > ' + w)")
            assert over == [], f"{page}: {over}"
            assert d.js("return document.documentElement.scrollWidth <= document.documentElement.clientWidth"), page
    finally:
        d.cmd("POST", "/window/rect", {"width": 1400, "height": 1000})
