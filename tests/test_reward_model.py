"""A learned reward model: training (trainers/reward_model.py, TRL RewardTrainer on the tiny model), agreement
metrics, and ``RewardModelReward`` served locally and over real HTTP on loopback (a fault-injecting aiohttp server
that answers well, hangs, refuses, or returns garbage)."""

from __future__ import annotations

import asyncio
import json
import math
import socket

import numpy as np
import pytest
from aiohttp import web

from toolgym.rewards import RewardModelErrorKind, RewardModelReward
from toolgym.trajectory import Trajectory, Turn

pytest.importorskip("trl", reason="the reward-model trainer needs the [train] extra (trl)")

from toolgym.envs.calculator import generate_task  # noqa: E402
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy  # noqa: E402
from trainers.reward_model import (  # noqa: E402
    Config,
    agreement,
    evaluate_agreement,
    load_reward_base,
    reward_pairs,
    roc_auc,
    run,
)
from trainers.sft import collect  # noqa: E402

ENV = "toolgym/Calculator-v0"


def odd_wrong(state: EpisodeState) -> str:
    return "<answer>-1</answer>" if state.index % 2 else state.env.oracle(state)


@pytest.fixture(scope="module")
def episodes() -> list:
    rng = np.random.default_rng(21)
    tasks = [generate_task(rng) for _ in range(6)]
    _, trajs = collect(ENV, ScriptedPolicy(odd_wrong), tasks, threshold=0.0, num_envs=6)
    return trajs


# ---------------------------------------------------------------------------------------------------------------
# Pairs and metrics
# ---------------------------------------------------------------------------------------------------------------


def test_reward_pairs_across_and_within_tasks(episodes):
    pairs = reward_pairs(episodes, margin=0.5)
    assert len(pairs) == 3  # 3 successes x 3 failures, each episode once
    seqs = {tuple(t.prompt_ids + t.completion_ids): t.reward for t in episodes}
    for p in pairs:
        assert seqs[tuple(p["chosen_ids"])] == 1.0 and seqs[tuple(p["rejected_ids"])] == 0.0
    assert reward_pairs(episodes, margin=1.5) == []
    assert len(reward_pairs(episodes, margin=0.5, max_pairs=2)) == 2
    assert all(p["margin"] == 1.0 for p in reward_pairs(episodes, use_margin=True))
    # within a task: one episode per task here, so nothing to pair
    assert reward_pairs(episodes, within_task=True) == []


def test_auc_and_agreement_by_hand():
    assert roc_auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False]) == 0.75
    assert roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert math.isnan(roc_auc([0.2, 0.4], [True, True]))
    a = agreement([0.9, 0.8, 0.3, 0.1], [1.0, 0.0, 1.0, 0.0])
    assert (a["n"], a["positives"], a["failed"], a["accuracy"], a["auc"]) == (4, 2, 0, 0.5, 0.75)
    b = agreement([0.9, float("nan"), 0.2], [1.0, 0.0, 0.0])
    assert b["failed"] == 1 and b["accuracy"] == pytest.approx(2 / 3) and b["auc"] == 1.0
    with pytest.raises(ValueError):
        agreement([0.1], [1.0, 0.0])


# ---------------------------------------------------------------------------------------------------------------
# Training (tiny model) and local serving
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    d = tmp_path_factory.mktemp("tiny_lm")
    tiny_random_model(tok, seed=8).save_pretrained(str(d))
    tok.save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def trained_rm(tiny_base, episodes, tmp_path_factory):
    from toolgym.rollout import write_trajectories

    d = tmp_path_factory.mktemp("rm")
    train = write_trajectories(d / "train.jsonl", episodes)
    held = write_trajectories(d / "held.jsonl", episodes[:4])
    cfg = Config(train_trajectories=str(train), heldout_trajectories=str(held), model=str(tiny_base),
                               max_steps=2, batch_size=2, learning_rate=1e-3, output_dir=str(d / "out"))
    result = run(cfg)
    assert result.algorithm == "reward_model" and result.model_dir == str(d / "out")
    return result.metrics, d / "out"


@pytest.mark.timeout(300)
def test_two_step_reward_model_run(trained_rm):
    summary, out = trained_rm
    assert summary["pairs"] == 3 and len(summary["loss"]) == 2
    assert all(math.isfinite(x) for x in summary["loss"])
    h = summary["heldout"]
    assert h["n"] == 4 and h["positives"] == 2 and h["failed"] == 0
    assert 0.0 <= h["accuracy"] <= 1.0 and 0.0 <= h["auc"] <= 1.0
    assert json.loads((out / "rm_summary.json").read_text())["pairs"] == 3
    from transformers import AutoModelForSequenceClassification

    m = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert m.config.num_labels == 1 and m.config.pad_token_id is not None


def test_load_reward_base_adds_a_one_output_head(tiny_base):
    model, tok = load_reward_base(str(tiny_base))
    assert model.config.num_labels == 1 and model.config.pad_token_id == tok.pad_token_id


def test_the_tiny_reward_base_is_the_tiny_lm_with_a_score_head():
    """``model: tiny`` (the base config's smoke-test model) works for the reward model too: the tiny LM's body in
    the requested dtype, seeded, with one new output."""
    import torch

    from toolgym.models import tiny_random_model

    model, tok = load_reward_base("tiny", dtype="bfloat16", seed=4)
    lm = tiny_random_model(tok, seed=4)
    assert model.config.num_labels == 1 and model.score.weight.dtype == torch.bfloat16
    assert torch.equal(model.model.embed_tokens.weight, lm.model.embed_tokens.weight.to(torch.bfloat16))
    assert model(torch.tensor([[5, 6, 7]])).logits.shape == (1, 1)


@pytest.mark.timeout(300)
def test_local_reward_model_scores_env_episodes_in_batches(trained_rm, episodes):
    import torch
    from transformers import AutoModelForSequenceClassification

    _, out = trained_rm
    rm = RewardModelReward(str(out), batch_size=4)
    rng = np.random.default_rng(3)
    tasks = [generate_task(rng) for _ in range(6)]
    trajs = RolloutDriver(ENV, ScriptedPolicy(lambda state: state.env.oracle(state)), num_envs=6, env_kwargs={"reward": rm}).run(tasks)
    assert all(0.0 < t.outcome_reward < 1.0 for t in trajs)  # a sigmoid score, from the env's own reward call
    assert rm.counts["scored"] == 6 and rm.counts["batches"] < 6 and rm.counts["failed"] == 0
    # the same score a plain forward gives
    m = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    with torch.no_grad():
        logit = m(input_ids=torch.tensor([trajs[0].prompt_ids + trajs[0].completion_ids])).logits[0, 0].item()
    assert trajs[0].outcome_reward == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-5)
    assert evaluate_agreement(rm, episodes[:4])["n"] == 4


def test_local_model_that_cannot_load_is_a_classified_error(tmp_path):
    rm = RewardModelReward(str(tmp_path / "missing"), failure_score=-1.0)
    t = Trajectory(prompt_ids=[1, 2], completion_ids=[3])

    async def go():
        return tuple(await rm.outcome(t, {}))

    value, comps = asyncio.run(go())
    assert value == -1.0
    assert comps == {"reward_model/failed": 1.0, "reward_model/error/model_error": 1.0}


# ---------------------------------------------------------------------------------------------------------------
# Remote: a real HTTP server on loopback
# ---------------------------------------------------------------------------------------------------------------


class FakeServer:
    """vLLM-shaped ``/classify`` and ``/pooling`` endpoints whose behaviour a test switches (fault injection)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        n = len(body["input"])
        if self.mode == "hang":
            await asyncio.sleep(3)  # far past the client timeout (0.5 s), short enough for a quick teardown
        if self.mode == "garbage":
            return web.Response(text="<html>definitely not json")
        if self.mode == "wrong_shape":
            return web.json_response({"data": [{"index": 0, "label": "x"}]})
        if self.mode == "nan":
            return web.Response(text=json.dumps({"data": [{"index": i, "probs": [float("nan")]} for i in range(n)]}),
                                content_type="application/json")
        if self.mode == "error":
            return web.Response(status=500, text="boom")
        if request.path == "/pooling":  # raw logit: len(ids) / 10
            return web.json_response({"data": [{"index": i, "data": [len(s) / 10]}
                                                for i, s in enumerate(body["input"])]})
        # classify: probs = [len(ids) / 100], answered in reverse order (the client must sort by index)
        return web.json_response({"data": [{"index": i, "probs": [len(s) / 100], "num_classes": 1}
                                           for i, s in reversed(list(enumerate(body["input"])))]})


@pytest.fixture
def server():
    import threading

    fake = FakeServer()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/classify", fake.handle)
    app.router.add_post("/pooling", fake.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    yield fake, f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(15)
    loop.call_soon_threadsafe(loop.stop)
    th.join(5)


def _trajs(n: int) -> list[Trajectory]:
    return [Trajectory(prompt_ids=[1] * (k + 1), completion_ids=[2, 3]) for k in range(n)]


async def _score_all(rm: RewardModelReward, trajs):
    async def one(t):
        return tuple(await rm.outcome(t, {}))

    try:
        return await asyncio.gather(*(one(t) for t in trajs))
    finally:
        await rm.aclose()


@pytest.mark.timeout(30)
def test_remote_classify_batches_and_keeps_order(server):
    fake, url = server
    rm = RewardModelReward(url + "/v1", model="rm", batch_size=4)
    got = asyncio.run(_score_all(rm, _trajs(6)))
    assert [v for v, _ in got] == [pytest.approx((k + 3) / 100) for k in range(6)]
    assert all(c == {} for _, c in got)
    assert len(fake.requests) == 2 and [len(r["input"]) for r in fake.requests] == [4, 2]
    assert fake.requests[0]["model"] == "rm" and fake.requests[0]["input"][0] == [1, 2, 3]


@pytest.mark.timeout(30)
def test_remote_pooling_and_per_turn(server):
    _, url = server
    rm = RewardModelReward(url, api="pooling", per_turn=True, outcome=False)
    t = Trajectory(prompt_ids=[1, 1], completion_ids=[5, 6, 7, 8, 9], turns=[Turn(0, 0, 2, 2, 3)])

    async def go():
        try:
            return (await rm.turn(t.turns[0], t, {})).value, (await rm.outcome(t, {})).value
        finally:
            await rm.aclose()

    turn_value, outcome_value = asyncio.run(go())
    assert turn_value == pytest.approx(1 / (1 + math.exp(-0.5)))  # prefix of 2 + 3 tokens: logit 0.5
    assert outcome_value == 0.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode,kind", [
    ("hang", RewardModelErrorKind.TIMEOUT),
    ("garbage", RewardModelErrorKind.BAD_RESPONSE),
    ("wrong_shape", RewardModelErrorKind.BAD_RESPONSE),
    ("nan", RewardModelErrorKind.BAD_RESPONSE),
    ("error", RewardModelErrorKind.HTTP_ERROR),
])
def test_remote_faults_are_classified_not_raised(server, mode, kind):
    fake, url = server
    fake.mode = mode
    rm = RewardModelReward(url, timeout_s=0.5, failure_score=0.0)
    got = asyncio.run(_score_all(rm, _trajs(3)))
    for value, comps in got:
        assert value == 0.0
        assert comps == {"reward_model/failed": 1.0, f"reward_model/error/{kind.value}": 1.0}
    assert rm.metrics()["failures"] == {kind.value: 3}


@pytest.mark.timeout(30)
def test_refused_connection_is_classified():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    rm = RewardModelReward(f"http://127.0.0.1:{port}", timeout_s=2)
    got = asyncio.run(_score_all(rm, _trajs(2)))
    assert all(c == {"reward_model/failed": 1.0, "reward_model/error/connection": 1.0} for _, c in got)


def test_bad_arguments():
    with pytest.raises(ValueError, match="api"):
        RewardModelReward("http://x", api="score")
    with pytest.raises(ValueError, match="activation"):
        RewardModelReward("x", activation="softmax")
