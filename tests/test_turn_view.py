"""Per-turn reward and advantage in the trajectory viewer (rows written by the GRPO adapter carry
``turn_advantages``)."""

from __future__ import annotations

import json
import re

import pytest

from toolgym.report.viewer import build_data, render_html
from toolgym.rollout import RolloutDriver, ScriptedPolicy


@pytest.fixture(scope="module")
def rows():
    driver = RolloutDriver("toolgym/CalculatorChain-v0", ScriptedPolicy(lambda s: s.env.oracle(s)),
                           max_turn_tokens=128, num_envs=2, env_kwargs={"split": "test", "steps": (2, 2)})
    try:
        trajs = driver.run([None, None], seeds=[0, 1])
    finally:
        driver.venv.close()
    out = [t.to_dict() for t in trajs]
    out[0]["turn_advantages"] = [0.75, -0.25, 1.5]
    return out


def test_each_turn_shows_its_reward_and_advantage(rows):
    data = build_data(rows)
    ep0, ep1 = data["runs"][0]["eps"]
    assert [t["reward"] for t in ep0["turns"]] == pytest.approx([0.25, 0.25, 0.0])  # verified chain steps
    assert [t["adv"] for t in ep0["turns"]] == [0.75, -0.25, 1.5]
    assert all("adv" not in t for t in ep1["turns"])  # rows without advantages (eval, rollout) show none
    # the page carries the same per-turn values to its script (the JSON document it embeds)
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', render_html(rows), re.DOTALL)
    assert m is not None
    page_ep0, page_ep1 = json.loads(m.group(1))["runs"][0]["eps"]
    assert [t["adv"] for t in page_ep0["turns"]] == [0.75, -0.25, 1.5]
    assert all("adv" not in t for t in page_ep1["turns"])


def test_mismatched_advantages_are_not_shown(rows):
    bad = dict(rows[0], turn_advantages=[1.0])  # not one per turn: ignored rather than misattributed
    assert all("adv" not in t for t in build_data([bad])["runs"][0]["eps"][0]["turns"])
