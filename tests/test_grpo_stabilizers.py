"""GRPO stabilizers: optimizer steps without signal leave the weights alone (:mod:`trainers.grpo.no_signal`), and
the KL term to the warm start (``beta`` > 0) is computed with the shared prefix (:mod:`trainers.grpo.prompt_packing`).

A real TRL ``GRPOTrainer`` (:class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`) on a tiny random model, CPU.
Episodes on CalculatorChain-v0 follow its oracle for some rows (``tests.test_turn_grpo.OraclePolicy``: fault
injection of "a model that solves some tasks"), so a step's groups have a reward spread or none as the test needs.
"""

from __future__ import annotations

import copy
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="the GRPO trainer needs the [train] extra (trl)")

import torch  # noqa: E402

from tests.procs import torchrun_two_ranks
from tests.test_shared_prefix import LOGP_TOL, _assert_same, _episodes, _micro_batch  # noqa: E402
from tests.test_turn_grpo import ENV, OraclePolicy, chain_tasks  # noqa: E402
from trainers.grpo.rollout_adapter import ToolgymRollout, env_reward, make_dataset  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parent.parent

MIXED = [99, 1, 2, 0, 99, 99, 99, 99]  # group 1: a reward spread; group 2: every sample solves its task
SOLVED = [99] * 8  # every sample solves its task: no spread, every advantage 0


def _trainer(out, *, beta: float = 0.0, skip_no_signal_steps: bool = True, rollout: bool = True, batch: int = 2,
             gradient_accumulation_steps: int = 4, **cfg: Any):
    """A GRPO trainer on the tiny model (by default 2 prompts x 4 generations a step, 4 micro-batches of 2); with
    ``beta`` > 0 its reference model is loaded from the policy's weights, saved as ``build_trainer`` does."""
    from datasets import Dataset
    from trl import GRPOConfig

    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo.preflight import ensure_model_dir
    from trainers.grpo.trainer import TurnCreditGRPOTrainer

    torch.manual_seed(0)
    tok = load_tokenizer()
    model = tiny_random_model(tok)
    if beta:
        ensure_model_dir(model, tok, out / "base_model")
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=batch, num_generations=4,
        gradient_accumulation_steps=gradient_accumulation_steps,
        max_completion_length=320, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
        disable_tqdm=True, beta=beta, gradient_checkpointing=False, bf16=False, learning_rate=1e-3, **cfg,
    )
    if not rollout:
        trainer = TurnCreditGRPOTrainer(model=model, processing_class=tok, reward_funcs=[env_reward], args=args,
                                        train_dataset=Dataset.from_list([{"prompt": "x"}] * 8),
                                        skip_no_signal_steps=skip_no_signal_steps)
        return trainer, None
    tasks = chain_tasks()
    roll = ToolgymRollout(ENV, tasks, env_kwargs={"split": "train", "steps": (2, 3)}, max_turn_tokens=48)
    trainer = TurnCreditGRPOTrainer(model=model, processing_class=tok, reward_funcs=[env_reward], args=args,
                                    train_dataset=make_dataset(tasks), rollout_func=roll,
                                    skip_no_signal_steps=skip_no_signal_steps)
    roll.policy = OraclePolicy(trainer, lambda i, task: 0)
    return trainer, roll


def _train(trainer, rollout, plan: list[list[int]]):
    """Train ``len(plan)`` steps, step ``s`` following ``plan[s]`` (oracle turns per episode); returns the weights
    and the optimizer state after each step (index 0: before training)."""
    from transformers import TrainerCallback

    trainer.args.max_steps = len(plan)
    rollout.policy.steps = lambda i, task: plan[min(trainer.state.global_step, len(plan) - 1)][i]
    weights = [{n: p.detach().clone() for n, p in trainer.model.named_parameters()}]
    states: list[dict] = [{}]

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
            states.append(copy.deepcopy(optimizer.state_dict()))

    trainer.add_callback(Snapshot())
    try:
        trainer.train()
    finally:
        rollout.close()
    return weights, states


def _logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if "loss" in h and key in h]


def _same_state(a: dict, b: dict) -> bool:
    """Whether two optimizer ``state_dict()``s are bit-identical (every moment tensor and step count)."""
    if a["state"].keys() != b["state"].keys():
        return False
    for k, sa in a["state"].items():
        sb = b["state"][k]
        if sa.keys() != sb.keys():
            return False
        for name, va in sa.items():
            vb = sb[name]
            same = torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb
            if not same:
                return False
    return True


def _moved(a: dict, b: dict) -> int:
    return sum(int(not torch.equal(a[n], b[n])) for n in a)


def test_a_step_without_signal_leaves_weights_and_optimizer_state_bit_identical(tmp_path):
    plan = [MIXED, SOLVED, MIXED]
    trainer, rollout = _trainer(tmp_path / "skip", weight_decay=0.01)
    weights, states = _train(trainer, rollout, plan)
    assert _logged(trainer, "frac_reward_zero_std") == [0.5, 1.0, 0.5]
    # step 1: its last micro-batches hold the solved group (zero advantages) but the first ones have signal:
    # the decision covers every micro-batch of the step
    assert _moved(weights[0], weights[1]) > 0
    # step 2: no signal anywhere: weights and AdamW's moments and step counts bit-identical
    assert _moved(weights[1], weights[2]) == 0
    assert states[1]["state"] and _same_state(states[1], states[2])
    # step 3: signal again, the weights move
    assert _moved(weights[2], weights[3]) > 0 and not _same_state(states[2], states[3])
    assert trainer.skipped_optimizer_steps == 1
    assert _logged(trainer, "toolgym/skipped_optimizer_step") == [0.0, 1.0, 0.0]
    assert _logged(trainer, "toolgym/skipped_optimizer_steps") == [0.0, 1.0, 1.0]
    assert _logged(trainer, "grad_norm")[1] == 0.0

    # the same run without the rule: AdamW's momentum and weight decay move every weight through step 2
    base, rollout = _trainer(tmp_path / "all", weight_decay=0.01, skip_no_signal_steps=False)
    base_weights, base_states = _train(base, rollout, plan)
    assert _moved(base_weights[1], base_weights[2]) > 0 and not _same_state(base_states[1], base_states[2])
    assert all(torch.equal(base_weights[1][n], weights[1][n]) for n in weights[1])  # the same first step
    assert base.skipped_optimizer_steps == 0 and _logged(base, "toolgym/skipped_optimizer_step") == []
    # the learning-rate schedule advances through a skipped step: the same learning rate at every step
    lrs = _logged(trainer, "learning_rate")
    assert lrs == _logged(base, "learning_rate") and lrs[0] > lrs[1] > lrs[2]


def test_a_step_with_a_kl_term_is_not_skipped(tmp_path):
    """With ``beta`` > 0 a zero-advantage step still pulls toward the reference: it is trained."""
    from trainers.grpo.no_signal import has_signal

    trainer, rollout = _trainer(tmp_path, beta=1e-3)
    assert trainer.ref_model is not None
    zero = {"advantages": torch.zeros(4)}
    assert has_signal(trainer, zero)
    weights, _ = _train(trainer, rollout, [MIXED, SOLVED])
    assert _logged(trainer, "frac_reward_zero_std") == [0.5, 1.0]
    assert _moved(weights[1], weights[2]) > 0
    assert trainer.skipped_optimizer_steps == 0
    assert _logged(trainer, "toolgym/skipped_optimizer_step") == [0.0, 0.0]
    assert _logged(trainer, "kl")[1] > 0  # the policy left the reference at step 1
    trainer.beta = 0.0  # without the KL term the same micro-batch has no signal
    assert not has_signal(trainer, zero) and has_signal(trainer, {"advantages": torch.tensor([0.0, 1.0])})


def test_kl_to_the_reference_with_the_shared_prefix_equals_the_unshared_one(tmp_path):
    """The reference model's log-probabilities (TRL computes them through the overridden
    ``_get_per_token_logps_and_entropies``) come out of the packed forward equal to the unshared ones, and so do
    the loss with its KL term, its gradients and the logged ``kl``."""
    trainer, _ = _trainer(tmp_path, beta=0.1, rollout=False)
    tok = trainer.processing_class
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    with torch.no_grad():  # the policy a few steps away from its warm start
        gen = torch.Generator().manual_seed(1)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    prompts, rows = _episodes(tok, prompt_len=48, other_len=40, lengths=(11, 5, 29))
    inputs = _micro_batch(tok, prompts, rows)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].size(1)
    mask = inputs["completion_mask"]

    def ref_logps(shared: bool) -> torch.Tensor:
        trainer.shared_prefix = shared
        before = trainer.shared_prefix_forwards
        with torch.no_grad():
            lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, am, width,
                                                                  batch_size=len(rows))
        assert (trainer.shared_prefix_forwards > before) is shared  # the reference forward ran packed
        return lp * mask

    unshared, shared = ref_logps(False), ref_logps(True)
    assert float(unshared.abs().max()) > 0.1
    assert float((shared - unshared).abs().max()) <= LOGP_TOL
    with torch.no_grad():
        policy, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, width)
    assert float((policy * mask - unshared).abs().max()) > 1e-3  # a KL term that is not zero

    kl = trainer._metrics["train"]["kl"]
    n = len(kl)
    _assert_same(trainer, {**inputs, "ref_per_token_logps": shared})
    assert len(kl) == n + 2 and kl[-2] > 0
    assert kl[-1] == pytest.approx(kl[-2], rel=1e-4)


_WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.test_grpo_stabilizers import SOLVED, _logged, _train, _trainer

    rank = int(os.environ["RANK"])
    # 2 ranks x 2 micro-batches of 2 rows: each rank holds one whole group of 4. Step 1: rank 0's group has a
    # reward spread, rank 1's none; step 2: no spread anywhere
    trainer, rollout = _trainer(Path({out!r}) / f"r{{rank}}", batch=2, gradient_accumulation_steps=2)
    plan = [[99, 1, 2, 0] if rank == 0 else SOLVED[:4], SOLVED[:4]]
    tasks = []
    generate = rollout.policy.generate
    def record(requests):
        first = {{r.episode.task["id"] for r in requests if r.episode is not None and r.episode.turn == 0}}
        if first:
            tasks.append(sorted(first))
        return generate(requests)
    rollout.policy.generate = record
    weights, _ = _train(trainer, rollout, plan)
    digest = [hashlib.sha256(b"".join(w[n].numpy().tobytes() for n in sorted(w))).hexdigest() for w in weights]
    with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as fh:
        json.dump({{"world": trainer.accelerator.num_processes, "digest": digest, "tasks": tasks,
                    "skipped": _logged(trainer, "toolgym/skipped_optimizer_step"),
                    "zero_std": _logged(trainer, "frac_reward_zero_std")}}, fh)
    trainer.accelerator.end_training()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_take_the_same_decision(tmp_path):
    """torchrun, gloo, 2 CPU processes: at step 1 only rank 0's micro-batches have signal, yet DDP averages the
    gradients into rank 1's too, so both ranks must step (a rank that skipped alone would leave the replicas
    apart); at step 2 neither has signal and both skip."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=str(ROOT), out=str(tmp_path)))
    r = torchrun_two_ranks(script, tmp_path, timeout=560)
    assert r[0]["world"] == r[1]["world"] == 2
    assert r[0]["tasks"] and all(len(t) == 1 for t in r[0]["tasks"] + r[1]["tasks"])  # one group per rank
    assert r[0]["zero_std"] == r[1]["zero_std"] == [0.5, 1.0]  # the logged share is over both ranks' groups
    assert r[0]["skipped"] == r[1]["skipped"] == [0.0, 1.0]
    assert r[0]["digest"] == r[1]["digest"]  # the replicas never part
    before, after_1, after_2 = r[0]["digest"]
    assert after_1 != before and after_2 == after_1
