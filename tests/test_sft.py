"""RFT/SFT on trajectories (trainers/sft.py): rejection sampling and masked fine-tuning with TRL's SFTTrainer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl", reason="SFT needs the [train] extra (trl)")

from toolgym.envs.calculator import generate_task
from toolgym.evaluation import oracle_policy
from toolgym.rollout import EpisodeState, ScriptedPolicy, read_trajectories
from trainers.sft import collect, sft_dataset, train_sft

ENV = "toolgym/Calculator-v0"


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(5)
    return [generate_task(rng) for _ in range(6)]


def half_wrong(state: EpisodeState) -> str:
    return "<answer>-1</answer>" if state.index % 2 else state.env.oracle(state)


def test_collect_keeps_only_episodes_above_threshold(tasks, tmp_path):
    kept, alltr = collect(ENV, ScriptedPolicy(half_wrong), tasks, num_envs=3, trajectory_path=tmp_path / "a.jsonl")
    assert len(alltr) == 6 and len(kept) == 3
    assert [t.task["id"] for t in kept] == [tasks[k]["id"] for k in (0, 2, 4)]
    assert len(read_trajectories(tmp_path / "a.jsonl")) == 6
    kept0, _ = collect(ENV, ScriptedPolicy(half_wrong), tasks, threshold=0.0, num_envs=3)
    assert len(kept0) == 6


def test_oracle_policy_solves_calculator(tasks):
    kept, alltr = collect(ENV, oracle_policy(), tasks, num_envs=3)
    assert len(kept) == len(alltr) == 6


def test_sft_dataset_masks_prompt_and_env_tokens(tasks):
    kept, _ = collect(ENV, oracle_policy(), tasks[:2], num_envs=2)
    ds = sft_dataset(kept)
    for row, t in zip(ds, kept, strict=True):
        assert row["input_ids"] == t.prompt_ids + t.completion_ids
        assert row["assistant_masks"] == [0] * len(t.prompt_ids) + t.loss_mask
    # JSONL dicts work as well as Trajectory objects
    assert sft_dataset([t.to_dict() for t in kept])["input_ids"] == ds["input_ids"]
    bad = kept[0].to_dict()
    bad["loss_mask"] = bad["loss_mask"][:-1]
    with pytest.raises(ValueError, match="differ"):
        sft_dataset([bad])


def test_train_sft_trains_only_model_tokens_and_learns(tasks, tmp_path):
    import torch

    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=2)
    kept, _ = collect(ENV, oracle_policy(), tasks[:2], num_envs=2)
    trainer = train_sft(model, tok, kept, output_dir=tmp_path, max_steps=48, learning_rate=5e-3, batch_size=2,
                        logging_steps=4, disable_tqdm=True, save=True)
    labels = trainer.train_dataset["labels"]
    for lab, t in zip(labels, kept, strict=True):
        trained = [x for x in lab if x != -100]
        assert trained == [c for c, m in zip(t.completion_ids, t.loss_mask, strict=True) if m]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.5 * losses[0], losses
    assert (tmp_path / "config.json").exists()
    # the model now opens its first turn like the oracle (a tool call)
    t = kept[0]
    with torch.no_grad():
        out = model.generate(torch.tensor([t.prompt_ids]), max_new_tokens=3, do_sample=False)
    assert out[0, len(t.prompt_ids):].tolist() == t.completion_ids[:3]
    with pytest.raises(ValueError, match="no trajectories"):
        train_sft(model, tok, [], output_dir=tmp_path)
