"""Rounds that end at a budget of generated tokens, fed from a task pool (``tasks=``): what
``benchmarks/algorithms.py`` runs through ``trainers.ALGORITHMS[name].run``. Each ``run`` must stop and train where
a plain hand-written loop (collect / sample -> count tokens -> train, ``while tokens < budget``)
stops, with the same weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl", reason="SFT/RFT need the [train] extra")

import torch

from toolgym.envs.calculator import generate_task
from toolgym.evaluation import oracle_policy
from toolgym.models import load_tokenizer, tiny_random_model
from trainers import ALGORITHMS
from trainers.sft import collect, masked_sft

ENV = "toolgym/Calculator-v0"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def pool() -> list[dict]:
    rng = np.random.default_rng(11)
    return [generate_task(rng) for _ in range(7)]


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sft_masked_rounds_stop_at_the_budget_like_a_plain_loop(tok, pool, tmp_path):
    per_round, budget = 3, 0
    # the plain loop: oracle episodes in rounds of `per_round` pool tasks, one masked-SFT epoch each
    first, _ = collect(ENV, oracle_policy(), pool[:per_round], seeds=0, num_envs=4,
                       env_kwargs={"split": "train", "tokenizer": tok})
    budget = sum(sum(t.loss_mask) for t in first) + 1  # crossed in round 2: exactly 2 rounds
    ref = tiny_random_model(tok, seed=3)
    tokens = rounds = episodes = pos = 0
    while tokens < budget:
        rows = [pool[(pos + i) % len(pool)] for i in range(per_round)]
        pos += per_round
        kept, alltr = collect(ENV, oracle_policy(), rows, seeds=0, num_envs=4,
                              env_kwargs={"split": "train", "tokenizer": tok})
        tokens += sum(sum(t.loss_mask) for t in alltr)
        episodes += len(alltr)
        masked_sft(ref, kept, steps=max(1, -(-len(kept) // 2)), lr=1e-3, batch_size=2, seed=0)
        rounds += 1
    assert rounds == 2

    sft = ALGORITHMS["sft"]
    model = tiny_random_model(tok, seed=3)
    cfg = sft.Config(env_id=ENV, env_kwargs={"split": "train"}, episodes=per_round, task_seed=0, num_envs=4,
                     update="masked", rounds=100, max_generated_tokens=budget, save_model=False,
                     trl={"output_dir": str(tmp_path), "learning_rate": 1e-3, "per_device_train_batch_size": 2,
                          "num_train_epochs": 1.0, "seed": 0, "use_cpu": True, "report_to": []})
    res = sft.run(cfg, model=model, tokenizer=tok, tasks=pool)
    m = res.metrics
    assert (m["rounds"], m["generated_tokens"], m["episodes"]) == (rounds, tokens, episodes)
    assert m["global_step"] == len(m["loss"]) == 2 * 2  # 3 kept per round, batch 2: 2 steps a round
    assert _same_weights(model, ref)
    assert res.model_dir is None
    # the rounds took consecutive pool rows (wrapping): 0-2, then 3-5
    from toolgym.rollout import read_trajectories

    ids = [t["task"]["id"] for t in read_trajectories(res.artifacts["trajectories"])]
    assert ids == [t["id"] for t in pool[:6]]


def test_sft_rounds_need_the_masked_update():
    sft = ALGORITHMS["sft"]
    with pytest.raises(ValueError, match="update: masked"):
        sft.Config(rounds=2)
    with pytest.raises(ValueError, match="update: masked"):
        sft.Config(max_generated_tokens=100)
    with pytest.raises(ValueError, match="update must be"):
        sft.Config(update="full")
    assert (sft.Config().update, sft.Config().rounds, sft.Config().max_generated_tokens) == ("trl", 1, 0)


@pytest.mark.timeout(300)
def test_rft_rounds_stop_at_the_budget_and_take_the_pool_in_order(tok, pool, tmp_path):
    from toolgym.rollout import RolloutDriver, TransformersPolicy

    rft = ALGORITHMS["rft"]
    kw = dict(env_id=ENV, output_dir=str(tmp_path), tasks=2, k=1, temperature=1.0, max_turn_tokens=6, num_envs=4,
              seed=5, env_seed_stride=1000, sft_seed=5, save=False)
    # the plain loop, sampling only (a random tiny model solves nothing, so nothing is kept)
    model = tiny_random_model(tok, seed=1)
    per_round = []
    for r in range(3):
        driver = RolloutDriver(ENV, TransformersPolicy(model, tok, temperature=1.0, seed=5 + r, return_logprobs=False),
                               max_turn_tokens=6, num_envs=4, env_kwargs={"split": "train", "tokenizer": tok})
        trajs = driver.run([pool[(2 * r + i) % len(pool)] for i in range(2)], seeds=5 + 1000 * r)
        driver.venv.close()
        assert not [t for t in trajs if t.reward >= 1.0]
        per_round.append(driver.stats.generated_tokens)
    budget = per_round[0] + per_round[1]  # reached exactly at the end of round 2: no third round
    res = rft.run(rft.Config(**kw, rounds=50, max_generated_tokens=budget), model=model, tokenizer=tok,
                  tasks=pool, log=lambda _: None)
    rounds = res.metrics["rounds"]
    assert [r["generated_tokens"] for r in rounds] == per_round[:2]
    assert res.metrics["generated_tokens"] == budget and [r["kept"] for r in rounds] == [0, 0]
    # without a budget: `rounds` rounds
    res = rft.run(rft.Config(**kw, rounds=3), model=model, tokenizer=tok, tasks=pool, log=lambda _: None)
    assert [r["generated_tokens"] for r in res.metrics["rounds"]] == per_round
