"""trainers.grpo.zero_advantage: GRPO micro-batches whose advantages are all zero are left out, with the same training.

A real TRL ``GRPOTrainer`` (:class:`trainers.grpo.trainer.TurnCreditGRPOTrainer`) on a tiny random model, CPU; the
episodes follow CalculatorChain-v0's oracle for some rows (``tests.test_turn_grpo.OraclePolicy``), so one group of
4 has different rewards and the other none.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl", reason="the GRPO adapter needs the [train] extra (trl)")

import torch  # noqa: E402

from tests.devices import UnplacedFactories  # noqa: E402
from tests.test_turn_grpo import make_trainer  # noqa: E402
from trainers.grpo.zero_advantage import all_zero, regroup, skippable  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_regroup_moves_zero_advantage_rows_to_the_last_micro_batches():
    adv = torch.tensor([0.0, 1.0, 0.0, -1.0, 0.0, 0.5])
    rows = torch.arange(6)
    mbs = [{"advantages": adv[i:i + 2], "row": rows[i:i + 2], "ids": rows[i:i + 2, None].repeat(1, 3),
            "names": [f"r{j}" for j in range(i, i + 2)], "num_items_in_batch": torch.tensor(7.0), "none": None}
           for i in (0, 2, 4)]
    out = regroup(mbs)
    assert out is not None and len(out) == 3
    assert [mb["row"].tolist() for mb in out] == [[1, 3], [5, 0], [2, 4]]  # non-zero first, each part in order
    for mb in out:  # every per-row field moved with its row; the rest as it was
        assert mb["names"] == [f"r{j}" for j in mb["row"].tolist()]
        assert torch.equal(mb["ids"][:, 0], mb["row"]) and torch.equal(mb["advantages"], adv[mb["row"]])
        assert float(mb["num_items_in_batch"]) == 7.0 and mb["none"] is None
    assert [all_zero(mb) for mb in out] == [False, False, True]
    # per-token advantages (B, T): a row is zero when every token's is
    tok = [{"advantages": torch.tensor([[0.0, 0.0], [0.0, 2.0]]), "row": torch.tensor([0, 1])},
           {"advantages": torch.tensor([[0.0, 0.0], [3.0, 0.0]]), "row": torch.tensor([2, 3])}]
    assert [mb["row"].tolist() for mb in regroup(tok)] == [[1, 3], [0, 2]]
    assert regroup(regroup(tok)) is None  # already in place: nothing to move
    assert regroup(mbs[:1]) is None  # one micro-batch
    assert regroup([{**mbs[0], "pixel_values": [1, 2, 3]}, mbs[1]]) is None  # something it cannot lay out


def test_regroup_makes_every_tensor_on_the_device_of_the_batch():
    """A GPU batch meets no tensor regroup makes on the default device (the CUDA-index-vs-CPU-arange crash)."""
    adv = torch.tensor([0.0, 1.0, 0.0, -1.0])
    mbs = [{"advantages": adv[i:i + 2], "row": torch.arange(4)[i:i + 2], "names": ["a", "b"]} for i in (0, 2)]
    with UnplacedFactories() as record:
        out = regroup(mbs)
        assert regroup(out) is None  # the already-in-place comparison runs too
    assert out is not None and record.calls == []


def _train(tmp_path, *, skip: bool, loss_type: str = "dapo"):
    """Two GRPO steps (4 micro-batches of 2 each): step 1 = one group with a reward spread and one where every
    sample solves the task (zero advantages); step 2 = every sample solves it (all zero). Returns the trainer, its
    weights before training, and the gradients the optimizer got at each step."""
    from transformers import TrainerCallback

    trainer, rollout, _ = make_trainer(tmp_path, advantage="outcome", batch=2, gradient_accumulation_steps=4,
                                       learning_rate=1e-3, loss_type=loss_type, bf16=False)
    trainer.args.max_steps = 2
    trainer.model.double()  # float64: regrouping changes the micro-batches' shapes, and so float32's rounding
    trainer.skip_zero_advantage = skip and skippable(trainer)
    trainer.no_signal.enabled = False  # every step reaches the optimizer (trainers/grpo/no_signal.py would skip step 2)
    rollout.policy.steps = lambda i, task: [99, 1, 2, 0, 99, 99, 99, 99][i] if trainer.state.global_step == 0 else 99
    grads: list[dict[str, torch.Tensor | None]] = []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.append({n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()})

    trainer.add_callback(Grads())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        trainer.train()
    finally:
        rollout.close()
    return trainer, before, grads


def _rewards(trainer, key="reward"):
    return [h[key] for h in trainer.state.log_history if "reward" in h]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_zero_advantage_rows_are_regrouped_and_skipped_with_the_same_gradients(tmp_path, loss_type):
    base, _, base_grads = _train(tmp_path / "all", skip=False, loss_type=loss_type)
    fast, _, fast_grads = _train(tmp_path / "skip", skip=True, loss_type=loss_type)
    assert _rewards(fast) == _rewards(base)  # the same episodes
    assert _rewards(fast, "frac_reward_zero_std") == [0.5, 1.0]
    assert base.skipped_micro_batches == 0
    # step 1: the zero-advantage group's 4 rows, regrouped, fill 2 micro-batches; step 2: all 4 are zero
    assert fast.skipped_micro_batches == 6
    assert len(base_grads) == len(fast_grads) == 2
    # step 1: the same sum, added in another order (float64; TRL's fused head accumulates the tied output
    # embedding's gradient in float32, so that one agrees to float32 rounding)
    head = dict(base.model.named_parameters())["model.embed_tokens.weight"]
    assert head is base.model.get_output_embeddings().weight
    for name, g in base_grads[0].items():
        assert g is not None and fast_grads[0][name] is not None, name
        tol = 1e-6 if name == "model.embed_tokens.weight" else 1e-9
        assert float((fast_grads[0][name] - g).norm()) <= tol * float(g.norm()) + 1e-15, name
    assert any(float(g.abs().max()) > 0 for g in base_grads[0].values())
    for name, g in base_grads[1].items():  # step 2: zeros (not None: AdamW moves on by its momentum)
        assert fast_grads[1][name] is not None and not fast_grads[1][name].any() and not g.any(), name


def test_skipping_without_regrouping_trains_bit_identical_weights(tmp_path):
    """``bnpo`` normalises by a micro-batch's own token count: its rows are not regrouped, only micro-batches that
    happen to be all zero are skipped. Zero gradients add nothing, so the weights are bit-identical, through a
    second step where AdamW moves every weight by its momentum alone."""
    base, before, _ = _train(tmp_path / "all", skip=False, loss_type="bnpo")
    fast, _, _ = _train(tmp_path / "skip", skip=True, loss_type="bnpo")
    assert fast.skipped_micro_batches >= 4 and base.skipped_micro_batches == 0
    moved = 0
    for (name, p), (_, q) in zip(base.model.named_parameters(), fast.model.named_parameters(), strict=True):
        assert torch.equal(q, p), name
        moved += int(not torch.equal(p, before[name]))
    assert moved > 0


def test_not_skipped_where_a_zero_advantage_still_has_a_gradient(tmp_path):
    trainer, rollout, _ = make_trainer(tmp_path, advantage="outcome")
    rollout.close()
    assert skippable(trainer) and trainer.skip_zero_advantage
    trainer.beta = 0.1  # the KL term
    assert not skippable(trainer)
    trainer.beta, trainer.entropy_coef = 0.0, 0.01  # an entropy bonus
    assert not skippable(trainer)
    trainer.entropy_coef, trainer.loss_type = 0.0, "some_future_loss"  # a loss this module does not know
    assert not skippable(trainer)
    trainer.loss_type = "dapo"
    assert skippable(trainer)
