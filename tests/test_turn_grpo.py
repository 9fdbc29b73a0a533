"""trainers.grpo.trainer: per-token advantages in TRL 1.16's GRPO (a real GRPOTrainer on CPU, tiny random model).

A random model never calls a tool, so episodes that need several turns follow CalculatorChain-v0's oracle through
:class:`OraclePolicy` (fault injection of "a model that solves some steps"): the trainer's real generation runs for
every request and some episodes' rows are replaced by the oracle's tokens; env, rewards, TRL's masks and loss are
real.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("trl", reason="the turn-level trainer needs the [train] extra (trl)")

from tests.procs import torchrun_two_ranks
from toolgym.envs.calculator_chain import generate_chain
from toolgym.rollout import Generation
from trainers.credit import token_advantages, turn_advantages
from trainers.grpo.rollout_adapter import ToolgymRollout, TRLPolicy, env_reward, make_dataset

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parent.parent
ENV = "toolgym/CalculatorChain-v0"


class OraclePolicy(TRLPolicy):
    """The trainer's real generation; then episode ``i`` follows the oracle for its first ``steps(i)`` turns."""

    def __init__(self, trainer: Any, steps: Any) -> None:
        super().__init__(trainer)
        self.steps = steps

    def generate(self, requests):
        out = super().generate(requests)
        for j, r in enumerate(requests):
            st = r.episode
            if st is not None and st.turn < self.steps(st.index, st.task):
                ids = [int(x) for x in st.env.encode_action(st.env.oracle(st))]
                out[j] = Generation.from_sampled(ids, None, r.stop_ids, r.max_new_tokens)
        return out


def default_steps(index: int, task: dict) -> int:
    """Within each group of 4: a full oracle, a one-step-then-stop, a two-step, and the random model."""
    return [99, 1, 2, 0][index % 4]


def chain_tasks(n: int = 4, seed: int = 5) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [generate_chain(rng, "train", (2, 3)) for _ in range(n)]


def make_trainer(out: Path, *, advantage: str = "turn_return", batch: int = 8, num_generations: int = 4,
                 steps: Any = default_steps, gamma: float = 1.0, **cfg: Any):
    import torch
    from trl import GRPOConfig

    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo.trainer import TurnCreditGRPOTrainer

    torch.manual_seed(0)
    tok = load_tokenizer()
    tasks = chain_tasks()
    rollout = ToolgymRollout(ENV, tasks, env_kwargs={"split": "train", "steps": (2, 3)}, max_turn_tokens=48,
                             trajectory_dir=out / "traj")
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=batch, num_generations=num_generations,
        max_completion_length=320, max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
        seed=0, disable_tqdm=True, beta=0.0, gradient_checkpointing=False, **cfg,
    )
    trainer = TurnCreditGRPOTrainer(model=tiny_random_model(tok), processing_class=tok, reward_funcs=[env_reward],
                                    args=args, train_dataset=make_dataset(tasks), rollout_func=rollout,
                                    advantage=advantage, gamma=gamma)
    rollout.policy = OraclePolicy(trainer, steps)
    return trainer, rollout, tasks


def batch_inputs(tasks: list[dict], num_generations: int = 4, n_prompts: int = 2) -> list[dict]:
    return [{"prompt": t["id"], "task_id": t["id"]} for t in tasks[:n_prompts] for _ in range(num_generations)]


def _loss(trainer, out: dict) -> float:
    import torch

    if not hasattr(trainer, "current_gradient_accumulation_steps"):  # set by Trainer.training_step
        trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        return float(trainer._compute_loss(trainer.model, out))


@pytest.fixture(scope="module")
def turn_batch(tmp_path_factory):
    out = tmp_path_factory.mktemp("turn")
    trainer, rollout, tasks = make_trainer(out, advantage="turn_return")
    trainer.model.train()
    result = trainer._generate_and_score_completions(batch_inputs(tasks))
    return trainer, rollout, result, out


def test_turn_return_advantages_per_token_match_the_estimator(turn_batch):
    trainer, rollout, out, _ = turn_batch
    trajs = rollout.last_trajectories
    assert {len(t.turns) for t in trajs} >= {1, 2, 3}  # groups with different turn counts
    want = turn_advantages([t.turn_rewards for t in trajs], [t.outcome_reward for t in trajs],
                           [i // 4 for i in range(len(trajs))], estimator="turn_return")
    adv = out["advantages"].numpy()
    assert adv.shape == out["completion_ids"].shape  # (B, T)
    for i, t in enumerate(trajs):
        for k, u in enumerate(t.turns):
            pol = [p for p in range(u.action_start, u.action_end) if t.loss_mask[p] == 1]
            assert np.allclose(adv[i, pol], want[i][k], atol=1e-6)
    flat = [x for a in want for x in a]
    assert [x for a in trainer.last_turn_advantages for x in a] == pytest.approx(flat)
    # a full-oracle episode's later turns beat the one-step-then-stop episode's at the same index
    assert want[0][0] > want[3][0]


def test_env_tokens_get_zero_and_changing_them_changes_nothing(turn_batch):
    import torch

    trainer, rollout, out, _ = turn_batch
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    adv = out["advantages"]
    assert torch.all(adv[~mask] == 0)
    assert torch.any(adv[mask] != 0)
    base = _loss(trainer, out)
    poked = dict(out)
    poked["advantages"] = torch.where(mask, adv, torch.full_like(adv, 123.0))
    assert _loss(trainer, poked) == pytest.approx(base, abs=0, rel=0)
    # while changing a policy token's advantage does change the loss
    moved = dict(out)
    moved["advantages"] = torch.where(mask, adv + 1.0, adv)
    assert _loss(trainer, moved) != pytest.approx(base)


def test_turn_metrics_and_trajectory_rows_carry_each_turns_advantage(turn_batch):
    trainer, rollout, out, path = turn_batch
    metrics = trainer._metrics["train"]
    assert "toolgym/turn0/reward" in metrics and "toolgym/turn1/advantage" in metrics
    rows = [json.loads(line) for line in (path / "traj" / "rank0.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row, t in zip(rows, rollout.last_trajectories, strict=True):
        assert len(row["turn_advantages"]) == len(row["turns"]) == len(t.turns)


def test_outcome_is_trls_advantage_and_loss(tmp_path):
    import torch

    trainer, rollout, tasks = make_trainer(tmp_path, advantage="outcome")
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch_inputs(tasks))
    assert out["advantages"].dim() == 1  # TRL's own tensor, untouched
    trajs = rollout.last_trajectories
    ours = turn_advantages([t.turn_rewards for t in trajs], [t.outcome_reward for t in trajs],
                           [i // 4 for i in range(8)], estimator="outcome")
    assert [a[0] for a in ours] == pytest.approx(out["advantages"].tolist(), abs=1e-5)
    assert len({round(a, 4) for a in out["advantages"].tolist()}) > 1  # a batch with signal
    # the same numbers spread over tokens give the same loss as TRL's per-sequence tensor
    mask = (out["completion_mask"] * out["tool_mask"]).numpy()
    width = mask.shape[1]
    spans = [[[u.action_start, u.action_end] for u in t.turns] for t in trajs]
    tok = np.stack([token_advantages(ours[i], spans[i], mask[i], length=width) for i in range(8)])
    expanded = dict(out)
    expanded["advantages"] = torch.as_tensor(tok)
    assert _loss(trainer, expanded) == pytest.approx(_loss(trainer, out), rel=1e-6, abs=1e-8)
    assert trainer.last_turn_advantages[0] == pytest.approx([out["advantages"][0].item()] * len(trajs[0].turns))


def test_gigpo_uses_the_anchor_states_of_the_turns(tmp_path):
    from trainers.credit import anchor_key

    trainer, rollout, tasks = make_trainer(tmp_path, advantage="gigpo")
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch_inputs(tasks))
    trajs = rollout.last_trajectories
    anchors = [[anchor_key(list(t.prompt_ids) + list(t.completion_ids[: u.action_start])) for u in t.turns]
               for t in trajs]
    # the oracle episodes of a group share their first two states (same calls, same tool results)
    assert anchors[0][1] == anchors[2][1] and anchors[0][0] == anchors[3][0]
    want = turn_advantages([t.turn_rewards for t in trajs], [t.outcome_reward for t in trajs],
                           [i // 4 for i in range(8)], estimator="gigpo", anchors=anchors)
    assert [x for a in trainer.last_turn_advantages for x in a] == pytest.approx([x for a in want for x in a])
    adv = out["advantages"].numpy()
    mask = (out["completion_mask"] * out["tool_mask"]).numpy()
    assert np.all(adv[mask == 0] == 0)
    t0 = trajs[0]
    u = t0.turns[1]
    assert np.allclose(adv[0, [p for p in range(u.action_start, u.action_end) if t0.loss_mask[p]]], want[0][1])


@pytest.mark.parametrize("cfg, match", [
    ({"off_policy_mask_threshold": 0.5}, "off_policy_mask_threshold"),
    ({"loss_type": "vespo"}, "vespo"),
])
def test_per_sequence_options_are_refused(tmp_path, cfg, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(tmp_path, advantage="gigpo", **cfg)
    make_trainer(tmp_path, advantage="outcome", **cfg)  # outcome is TRL's own computation: accepted


def test_other_reward_functions_are_refused():
    from types import SimpleNamespace

    from trainers.grpo.trainer import check_turn_credit_args

    args = SimpleNamespace(off_policy_mask_threshold=None, loss_type="dapo")
    check_turn_credit_args(args, "turn_return", ["env_reward"])
    with pytest.raises(ValueError, match="reward functions"):
        check_turn_credit_args(args, "turn_return", ["env_reward", "length_penalty"])
    with pytest.raises(ValueError, match="unknown advantage"):
        check_turn_credit_args(args, "turn-return", ["env_reward"])


_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.test_turn_grpo import make_trainer

    rank = int(os.environ["RANK"])
    # rank 0's episodes follow the oracle (several turns), rank 1's are the random model (one turn): with 2 rows
    # per rank and num_generations 4, each group of 4 spans both ranks
    trainer, rollout, tasks = make_trainer(Path({out!r}) / f"r{{rank}}", advantage={adv!r}, batch=2,
                                           steps=lambda i, t: [99, 1][i] if rank == 0 else 0)
    trainer.train()
    trajs = rollout.last_trajectories
    with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as fh:
        json.dump({{"world": trainer.accelerator.num_processes, "turn_rewards": [t.turn_rewards for t in trajs],
                    "outcome": [t.outcome_reward for t in trajs], "task": [t.task["id"] for t in trajs],
                    "adv": trainer.last_turn_advantages}}, fh)
    rollout.close()
    trainer.accelerator.end_training()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_groups_spanning_ranks_get_the_whole_groups_baseline(tmp_path):
    """torchrun, gloo, 2 CPU processes, 1 thread each: per_device batch 2 and num_generations 4 put each group on
    both ranks; each rank's per-turn advantages must equal the estimator run on the whole group at once."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=str(ROOT), out=str(tmp_path), adv="turn_return"))
    r = torchrun_two_ranks(script, tmp_path, timeout=560)
    assert r[0]["world"] == r[1]["world"] == 2
    # TRL splits the group of 4 across the ranks: its rows carry the same task on both ranks
    n = len(r[0]["turn_rewards"])
    assert n == 2 and len(set(r[0]["task"] + r[1]["task"])) == 1
    tr = r[0]["turn_rewards"] + r[1]["turn_rewards"]
    oc = r[0]["outcome"] + r[1]["outcome"]
    assert max(map(len, r[0]["turn_rewards"])) >= 2 and max(map(len, r[1]["turn_rewards"])) == 1
    want = turn_advantages(tr, oc, [i // 4 for i in range(len(tr))], estimator="turn_return")
    got = r[0]["adv"] + r[1]["adv"]
    assert [x for a in got for x in a] == pytest.approx([x for a in want for x in a], abs=1e-6)
    # and not what each rank would compute alone (the gather matters)
    alone = turn_advantages(r[1]["turn_rewards"], r[1]["outcome"], [0] * n, estimator="turn_return")
    assert [x for a in alone for x in a] != pytest.approx([x for a in r[1]["adv"] for x in a], abs=1e-6)


def test_toolgym_train_grpo_advantage_flags(capsys):
    from trainers.cli import main

    cfg = str(ROOT / "trainers/configs/grpo_chain_turn_cpu.yaml")
    assert main(["grpo", "--config", cfg, "--advantage", "gigpo", "--gamma", "0.9", "--dry-run"]) == 0
    tg = json.loads(capsys.readouterr().out)["config"]["toolgym"]
    assert tg["advantage"] == "gigpo" and tg["gamma"] == 0.9 and tg["env_id"] == "toolgym/CalculatorChain-v0"
    assert main(["grpo", "--config", cfg, "--advantage", "per_token", "--dry-run"]) == 2
    assert "unknown advantage estimator 'per_token'" in capsys.readouterr().err
    assert main(["grpo", "--config", cfg, "--gamma", "1.5", "--dry-run"]) == 2
    assert main(["grpo", "--help"]) == 0
    assert "--toolgym.advantage (str, default 'outcome'): credit assignment" in capsys.readouterr().out
