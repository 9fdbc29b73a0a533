"""DPO on env preference pairs (trainers/dpo/__init__.py): pair construction, the loss-mask collator, 2-step runs.

Episodes come from the real Calculator-v0 env with scripted policies (the oracle, and a policy that answers wrong);
training uses a tiny random model over the embedded tokenizer and TRL's real ``DPOTrainer``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

pytest.importorskip("trl", reason="DPO needs the [train] extra (trl)")

import torch
import torch.nn.functional as F
from trl.trainer.dpo_trainer import DataCollatorForPreference

from toolgym.envs.calculator import generate_task
from toolgym.rollout import EpisodeState, ScriptedPolicy, write_trajectories
from trainers.cli import main as train_main
from trainers.dpo import Config, load_pairs, make_pairs, run, save_pairs
from trainers.dpo.trainer import MaskedPreferenceCollator, build_dpo_trainer
from trainers.sft import collect

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ENV = "toolgym/Calculator-v0"


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(11)
    return [generate_task(rng) for _ in range(3)]


def odd_wrong(state: EpisodeState) -> str:
    """Episodes with an odd index answer wrong without calling the tool; even ones run the oracle."""
    return "<answer>-1</answer>" if state.index % 2 else state.env.oracle(state)


@pytest.fixture(scope="module")
def episodes(tasks) -> list:
    rows = [t for t in tasks for _ in range(4)]  # 4 episodes per task: 2 right (reward 1), 2 wrong (reward 0)
    _, trajs = collect(ENV, ScriptedPolicy(odd_wrong), rows, threshold=0.0, num_envs=6)
    return trajs


def test_pairs_share_the_prompt_and_chosen_beats_rejected(episodes, tasks):
    assert sorted(t.reward for t in episodes) == [0.0] * 6 + [1.0] * 6
    pairs = make_pairs(episodes, margin=0.5, pairs_per_task=1)
    assert len(pairs) == len(tasks)
    by_id = {}
    for t in episodes:
        by_id.setdefault(t.task["id"], []).append(t)
    for p in pairs:
        group = by_id[p["task_id"]]
        assert all(p["prompt_ids"] == t.prompt_ids for t in group)
        assert p["chosen_reward"] == 1.0 and p["rejected_reward"] == 0.0
        chosen = next(t for t in group if t.completion_ids == p["chosen_ids"])
        rejected = next(t for t in group if t.completion_ids == p["rejected_ids"])
        assert chosen.reward > rejected.reward
        assert p["chosen_mask"] == chosen.loss_mask and p["rejected_mask"] == rejected.loss_mask
        assert 0 in p["chosen_mask"]  # the oracle's episode has env tokens (the tool result) to mask
    # pairs_per_task: 2 right x 2 wrong episodes give at most 2 disjoint pairs per task
    assert len(make_pairs(episodes, margin=0.5, pairs_per_task=2)) == 2 * len(tasks)
    assert len(make_pairs(episodes, margin=0.5, pairs_per_task=5)) == 2 * len(tasks)
    # the margin is honoured: a gap of 1.0 never clears 1.5
    assert make_pairs(episodes, margin=1.5) == []
    # JSONL dicts pair the same way as Trajectory objects
    assert make_pairs([t.to_dict() for t in episodes], margin=0.5) == pairs


def _row(task_id: str, prompt: list[int], reward: float, comp: list[int]) -> dict:
    return {"task": {"id": task_id}, "prompt_ids": prompt, "completion_ids": comp, "loss_mask": [1] * len(comp),
            "reward": reward}


def test_margin_and_prompt_grouping_on_graded_rewards():
    rows = [_row("a", [1, 2], r, [10 + k]) for k, r in enumerate([0.0, 0.3, 0.6, 1.0])]
    rows.append(_row("a", [1, 3], 0.0, [99]))  # same task id, different prompt ids: never paired with the others
    got = make_pairs(rows, margin=0.5, pairs_per_task=3)
    gaps = [(p["chosen_reward"], p["rejected_reward"]) for p in got]
    assert gaps == [(1.0, 0.0)]  # widest first; 0.6 - 0.3 < 0.5; each episode used once
    got = make_pairs(rows, margin=0.25, pairs_per_task=3)
    assert [(p["chosen_reward"], p["rejected_reward"]) for p in got] == [(1.0, 0.0), (0.6, 0.3)]
    assert all(p["prompt_ids"] == [1, 2] for p in got)
    # margin 0 still needs a strictly higher reward
    assert make_pairs([_row("b", [1], 1.0, [5]), _row("b", [1], 1.0, [6])], margin=0.0) == []
    with pytest.raises(ValueError, match="pairs_per_task"):
        make_pairs(rows, pairs_per_task=0)
    bad = _row("c", [1], 1.0, [1, 2])
    bad["loss_mask"] = [1]
    with pytest.raises(ValueError, match="differ in length"):
        make_pairs([bad])


def test_pairs_saved_as_a_hf_dataset(episodes, tmp_path):
    from datasets import load_from_disk

    pairs = make_pairs(episodes, margin=0.5, pairs_per_task=2)
    save_pairs(pairs, tmp_path / "pairs")
    ds = load_from_disk(str(tmp_path / "pairs"))
    assert len(ds) == len(pairs)
    assert ds[0]["chosen_mask"] == pairs[0]["chosen_mask"] and ds[1]["rejected_ids"] == pairs[1]["rejected_ids"]
    assert len(load_pairs(tmp_path / "pairs")) == len(pairs)


# ---------------------------------------------------------------------------------------------------------------
# The loss mask reaches TRL's DPO loss
# ---------------------------------------------------------------------------------------------------------------

PROMPT = [1, 520, 33, 700, 2, 1, 611]
#               policy   policy  env   env   policy  env    env
CHOSEN = [4001, 4002, 4003, 4004, 4005, 4006, 4007]
CHOSEN_MASK = [1, 1, 0, 0, 1, 0, 0]
REJECTED = [5001, 5002, 5003, 5004, 5005]
REJECTED_MASK = [1, 0, 0, 1, 0]


def _pair(chosen=CHOSEN, rejected=REJECTED) -> dict:
    return {"prompt_ids": PROMPT, "chosen_ids": list(chosen), "rejected_ids": list(rejected),
            "chosen_mask": CHOSEN_MASK, "rejected_mask": REJECTED_MASK}


@pytest.fixture(scope="module")
def dpo_trainer(tmp_path_factory):
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    model, ref = tiny_random_model(tok, seed=3), tiny_random_model(tok, seed=4)  # ref != policy: a non-trivial loss
    tr = build_dpo_trainer(model, tok, [_pair()], ref_model=ref, output_dir=tmp_path_factory.mktemp("dpo"),
                           beta=0.5, max_steps=1, disable_tqdm=True)
    return tr, model, ref


def _loss(trainer, rows, collator=None) -> float:
    batch = (collator or trainer.data_collator)(rows)
    with torch.no_grad():
        return float(trainer.compute_loss(trainer.model, batch))


def _masked_logp(model, prompt, comp, mask) -> float:
    """Sum of log p(token) over the mask-1 completion tokens, computed here independently of TRL."""
    ids = torch.tensor([prompt + comp])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    comp_lp = lp[len(prompt) - 1:]
    return float(sum(x for x, m in zip(comp_lp.tolist(), mask, strict=True) if m))


def test_dpo_loss_counts_only_policy_tokens(dpo_trainer):
    trainer, model, ref = dpo_trainer
    model.eval()
    base = _loss(trainer, [_pair()])
    # the loss is DPO's over mask-1 tokens only
    c = _masked_logp(model, PROMPT, CHOSEN, CHOSEN_MASK) - _masked_logp(ref, PROMPT, CHOSEN, CHOSEN_MASK)
    r = _masked_logp(model, PROMPT, REJECTED, REJECTED_MASK) - _masked_logp(ref, PROMPT, REJECTED, REJECTED_MASK)
    assert base == pytest.approx(float(-F.logsigmoid(torch.tensor(0.5 * (c - r)))), rel=1e-4, abs=1e-5)
    assert abs(base - math.log(2)) > 1e-3  # not the trivial policy == reference value

    # changing an env token (mask 0) leaves the loss unchanged; changing a policy token (mask 1) changes it
    env_changed = list(CHOSEN)
    env_changed[-1] = 777  # the last env token: no later token conditions on it, so only its own log-prob could count
    rej_env_changed = list(REJECTED)
    rej_env_changed[-1] = 778
    assert _loss(trainer, [_pair(env_changed, rej_env_changed)]) == pytest.approx(base, abs=1e-6)
    pol_changed = list(CHOSEN)
    pol_changed[4] = 777  # a policy token
    assert abs(_loss(trainer, [_pair(pol_changed)]) - base) > 1e-4
    rej_pol_changed = list(REJECTED)
    rej_pol_changed[3] = 778
    assert abs(_loss(trainer, [_pair(rejected=rej_pol_changed)]) - base) > 1e-4

    # TRL's own collator marks the whole completion: there the same env-token change does move the loss
    trl_collator = DataCollatorForPreference(pad_token_id=0)
    assert abs(_loss(trainer, [_pair(env_changed, rej_env_changed)], trl_collator)
               - _loss(trainer, [_pair()], trl_collator)) > 1e-4


def test_collator_pads_and_truncates_the_mask_like_the_ids():
    rows = [_pair(), {**_pair(), "prompt_ids": PROMPT[:3]}]
    out = MaskedPreferenceCollator(pad_token_id=0)(rows)
    assert out["completion_mask"].shape == out["input_ids"].shape
    assert out["completion_mask"][0].tolist() == [0] * 7 + CHOSEN_MASK
    assert out["completion_mask"][1].tolist() == [0] * 3 + CHOSEN_MASK + [0] * 4  # right padding
    assert out["completion_mask"][2].tolist() == [0] * 7 + REJECTED_MASK + [0] * 2
    cut = MaskedPreferenceCollator(pad_token_id=0, max_length=9)([_pair()])
    assert cut["completion_mask"][0].tolist() == [0] * 7 + CHOSEN_MASK[:2]
    no_mask = {k: v for k, v in _pair().items() if not k.endswith("_mask")}  # TRL's behaviour without masks
    assert MaskedPreferenceCollator(pad_token_id=0)([no_mask])["completion_mask"][0].tolist() == [0] * 7 + [1] * 7
    with pytest.raises(ValueError, match="differ in length"):
        MaskedPreferenceCollator(pad_token_id=0)([{**_pair(), "chosen_mask": [1]}])


# ---------------------------------------------------------------------------------------------------------------
# 2-step runs
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_two_step_offline_dpo_run_from_a_trajectory_file(episodes, tmp_path):
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    model_dir = tmp_path / "tiny"
    tiny_random_model(tok, seed=5).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    traj_file = write_trajectories(tmp_path / "episodes.jsonl", episodes)
    cfg_file = tmp_path / "dpo.yaml"
    cfg_file.write_text(f"model: {model_dir}\ntrajectories: {traj_file}\nbatch_size: 2\nlearning_rate: 1.0e-3\n"
                        f"output_dir: {tmp_path / 'out'}\n")
    assert train_main(["dpo", "--config", str(cfg_file), "--max_steps", "2", "--pairs_per_task", "2"]) == 0
    pairs = load_pairs(tmp_path / "out" / "pairs")
    assert len(pairs) == 6
    import json

    summary = json.loads((tmp_path / "out" / "dpo_summary.json").read_text())
    losses = summary["rounds"][0]["loss"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    start = tiny_random_model(tok, seed=5)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), start.parameters(), strict=True))


@pytest.mark.timeout(300)
def test_online_round_samples_from_the_model(tasks, tmp_path):
    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=6)
    cfg = Config(num_tasks=2, samples_per_task=2, rounds=1, max_turn_tokens=6, num_envs=4, max_steps=2,
                 output_dir=str(tmp_path / "online"), save_model=False)
    result = run(cfg, model=model, tokenizer=tok)
    assert result.algorithm == "dpo" and result.model_dir is None and "pairs_round0" in result.artifacts
    summary = result.metrics
    row = summary["rounds"][0]
    assert row["episodes"] == 4 and summary["generated_tokens"] > 0
    # a random model earns reward 0 everywhere: no pair clears the margin, and the empty dataset is still saved
    assert row["pairs"] == 0 and "loss" not in row
    assert len(load_pairs(tmp_path / "online" / "pairs_round0")) == 0
    with pytest.raises(ValueError, match="no preference pairs"):
        build_dpo_trainer(model, tok, [], output_dir=tmp_path)


def test_config_flags_and_unknown_keys(tmp_path):
    from toolgym.errors import ConfigError
    from trainers.cli import load

    f = tmp_path / "c.yaml"
    f.write_text("margin: 0.9\nenv_kwargs: {split: test}\n")
    cfg = load("dpo", f, ["--pairs-per-task", "3", "--max_length", "null", "--save_model", "false"])
    assert (cfg.margin, cfg.pairs_per_task, cfg.env_kwargs, cfg.max_length, cfg.save_model) == \
        (0.9, 3, {"split": "test"}, None, False)
    assert Config().env_kwargs == {} and Config().env_kwargs is not Config().env_kwargs
    f.write_text("bogus: 1\n")
    with pytest.raises(ConfigError, match="unknown key bogus"):
        load("dpo", f)


# ---------------------------------------------------------------------------------------------------------------
# benchmarks/algorithms.py: its own pieces (the trainers it drives are tested above and in their own files)
# ---------------------------------------------------------------------------------------------------------------


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "algorithms.py"
    spec = importlib.util.spec_from_file_location("toolgym_bench_algorithms", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_algorithms_tasks_are_held_out_and_the_same_for_every_method():
    bench = _bench()
    test_tasks = bench._tasks("test", 100, 10_000)
    assert len({t["id"] for t in test_tasks}) == 100 and all(t["split"] == "test" for t in test_tasks)
    assert bench._tasks("test", 100, 10_000) == test_tasks  # every row is evaluated on the same tasks
    a, b = bench.TaskStream(7, n=64), bench.TaskStream(7, n=64)
    assert a.take(5) == b.take(5) and a.take(3) == b.take(3)  # every method sees the same training tasks
    train_exprs = {t["expression"] for t in bench.TaskStream(7, n=512).rows}
    assert not train_exprs & {t["expression"] for t in test_tasks}
    # the demo's held-out tasks and prompt: the GRPO row is the demo's GRPO, the warm row its warm start
    from trainers.demo import DemoConfig, prompt_kwargs

    cfg = DemoConfig()
    assert [t["id"] for t in bench._tasks("test", cfg.eval_tasks, cfg.eval_seed)] == [t["id"] for t in test_tasks]
    assert bench.prompt_kwargs() == prompt_kwargs(True)


def test_algorithms_table_format():
    bench = _bench()
    rows = [
        {"method": "warm", "success": 0.3, "success_ci95": [0.22, 0.4], "tool_call_rate": 0.9, "train_wall_s": 0,
         "tokens": 0},
        {"method": "dpo", "success": 0.5, "success_ci95": [0.4, 0.6], "tool_call_rate": 1.0, "train_wall_s": 61.2,
         "train_cpu_s": 120.4, "tokens": 6100, "delta": {"mean": 0.2, "lo": 0.1, "hi": 0.3}, "notes": "rounds 6, pairs 20"},
    ]
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| method | held-out success [95% CI]")
    assert lines[2].startswith("| warm start") and "| — |" in lines[2]
    assert lines[3] == "| DPO | 50.0% [40.0%, 60.0%] | +20.0% [+10.0%, +30.0%] | 100.0% | 61 | 120 | 6100 | rounds 6, pairs 20 |"
