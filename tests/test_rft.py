"""RFT (trainers/rft.py) and the shared masked-SFT loss (trainers/sft.py): the model's own samples only, above the
threshold, and only mask-1 tokens trained."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("trl", reason="RFT needs the [train] extra")

import torch
from gymnasium.vector import AutoresetMode

from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.models import load_tokenizer, tiny_random_model
from toolgym.tools.function import tool
from trainers.rft import Config, rft_round, select_samples
from trainers.sft import masked_sft, masked_sft_loss


@tool
def echo(text: str) -> str:
    """Echo the text back.

    Args:
        text: what to echo.
    """
    return text


TASKS = [{"id": f"t{i}", "prompt": f"Say {i}."} for i in range(4)]


def _even_first_token(trajectory, task) -> float:
    """1.0 when the model's first sampled token id is even: about half the samples of any model clear it."""
    return float(bool(trajectory.completion_ids) and trajectory.completion_ids[0] % 2 == 0)


def _venv(n: int) -> ToolVectorEnv:
    return ToolVectorEnv(functools.partial(ToolEnv, TASKS, [echo], reward=_even_first_token, max_turns=1),
                         num_envs=n, autoreset_mode=AutoresetMode.DISABLED)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.mark.timeout(120)
def test_rft_round_keeps_only_own_samples_above_threshold(tok):
    model = tiny_random_model(tok, seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kept, sampled, stats = rft_round(model, tok, _venv(8), TASKS, k=4, threshold=1.0, temperature=1.0,
                                     max_turn_tokens=4, lr=1e-2, batch_size=4, seed=0)
    assert len(sampled) == 16 and stats["sampled"] == 16
    # every kept episode is one of the model's own samples, and exactly those that cleared the threshold
    assert all(any(k is s for s in sampled) for k in kept)
    assert [id(t) for t in kept] == [id(t) for t in sampled if t.reward >= 1.0]
    assert 0 < len(kept) < 16, [t.reward for t in sampled]  # a random tiny model's first token is even ~half the time
    assert stats["kept"] == len(kept) and stats["sft_steps"] == -(-len(kept) // 4)
    assert stats["tasks_with_kept"] == len({t.task["id"] for t in kept}) / 4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it trained on them
    # nothing clears an impossible threshold: no training step, weights untouched
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    kept2, _, stats2 = rft_round(model, tok, _venv(8), TASKS, k=2, threshold=2.0, max_turn_tokens=4, seed=1)
    assert kept2 == [] and stats2["sft_steps"] == 0 and stats2["tasks_with_kept"] == 0
    assert all(torch.equal(frozen[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="temperature"):
        rft_round(model, tok, _venv(2), TASKS, k=1, threshold=1.0, temperature=0.0)


class _T:
    def __init__(self, task_id: str, reward: float) -> None:
        self.task, self.reward = {"id": task_id}, reward


def test_select_samples_threshold_and_best_per_task():
    a, b, c, d = _T("x", 0.5), _T("x", 0.9), _T("y", 0.2), _T("x", 0.9)
    assert select_samples([a, b, c, d], 0.5) == [a, b, d]
    assert select_samples([a, b, c, d], 0.5, best_per_task=True) == [b]  # ties: the first sampled
    assert select_samples([a, b, c, d], 0.0, best_per_task=True) == [b, c]


def _episode(mask_last: int) -> dict:
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 5000, 12).tolist()
    completion = rng.integers(10, 5000, 10).tolist()
    mask = [1, 1, 1, 0, 0, 0, 1, 1, 1, mask_last]  # policy tokens, env tokens, policy tokens, last token
    return {"prompt_ids": prompt, "completion_ids": completion, "loss_mask": mask}


def _loss_and_grad(model, episode):
    from trainers.sft import pad_sft_batch

    model.zero_grad()
    loss = masked_sft_loss(model, *pad_sft_batch([episode]))
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()
    return loss.item(), grad


def test_masked_sft_trains_only_mask_one_tokens(tok):
    model = tiny_random_model(tok, seed=4)
    model.train()
    # the last completion token is an env token (mask 0): its id is nobody's context, and it is not a target
    env_last = _episode(mask_last=0)
    changed = {**env_last, "completion_ids": [*env_last["completion_ids"][:-1], 4242]}
    l1, g1 = _loss_and_grad(model, env_last)
    l2, g2 = _loss_and_grad(model, changed)
    assert l1 == pytest.approx(l2, abs=1e-6) and torch.allclose(g1, g2, atol=1e-7)
    # the same position as a policy token (mask 1) is a target: changing it changes loss and gradients
    pol_last = _episode(mask_last=1)
    changed = {**pol_last, "completion_ids": [*pol_last["completion_ids"][:-1], 4242]}
    l3, g3 = _loss_and_grad(model, pol_last)
    l4, g4 = _loss_and_grad(model, changed)
    assert abs(l3 - l4) > 1e-4 and not torch.allclose(g3, g4)
    # and the loss is HF's full-logits cross-entropy with every mask-0 / prompt position labelled -100
    ep = _episode(mask_last=0)
    ids = torch.tensor([ep["prompt_ids"] + ep["completion_ids"]])
    labels = torch.tensor([[-100] * 12 + [c if m else -100 for c, m in zip(ep["completion_ids"], ep["loss_mask"],
                                                                             strict=True)]])
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels).loss.item()
    assert l1 == pytest.approx(ref, rel=1e-5)


def test_masked_sft_learns_and_validates(tok):
    model = tiny_random_model(tok, seed=5)
    eps = [_episode(mask_last=1)]
    losses = masked_sft(model, eps, steps=30, lr=1e-2, batch_size=1, schedule="constant")
    assert losses[-1] < 0.2 * losses[0], losses
    assert not model.training
    with pytest.raises(ValueError, match="no trajectories"):
        masked_sft(model, [], steps=1)
    with pytest.raises(ValueError, match="schedule"):
        masked_sft(model, eps, steps=1, schedule="cosine-ish")


def test_rft_help_lists_every_config_field(capsys):
    from trainers.cli import main

    assert main(["rft", "--help"]) == 0
    text = capsys.readouterr().out
    for name in ("--k", "--threshold", "--rounds", "--temperature", "--best_per_task", "--eval_tasks"):
        assert name in text
    assert Config().temperature > 0


def test_masked_sft_micro_batches_take_the_same_step(tok):
    """Micro-batching (gradient accumulation weighted by policy tokens) is the whole batch's step, rounding aside:
    ``make demo`` uses it to bound activation memory."""
    rng = np.random.default_rng(1)
    eps = []
    for n in (6, 9, 14, 4, 11):  # different lengths and numbers of policy tokens
        completion = rng.integers(10, 5000, n).tolist()
        mask = rng.integers(0, 2, n).tolist()
        mask[0] = 1
        eps.append({"prompt_ids": rng.integers(10, 5000, 7).tolist(), "completion_ids": completion,
                    "loss_mask": mask})
    runs = {}
    start = torch.cat([p.detach().flatten() for p in tiny_random_model(tok, seed=6).parameters()])
    for mbs in (None, 2, 1):
        model = tiny_random_model(tok, seed=6)
        losses = masked_sft(model, eps, steps=3, lr=1e-3, batch_size=5, micro_batch_size=mbs)
        runs[mbs] = (losses, torch.cat([p.detach().flatten() for p in model.parameters()]))
    for mbs in (2, 1):
        assert runs[mbs][0] == pytest.approx(runs[None][0], rel=1e-5)
        # AdamW turns a rounding-level gradient difference on a near-zero gradient into a visible update: compare
        # the parameters against the size of the step itself
        moved = (runs[None][1] - start).abs()
        assert (runs[mbs][1] - runs[None][1]).abs().max() < 0.05 * moved.max()
        assert float((runs[mbs][1] - runs[None][1]).abs().mean()) < 0.01 * float(moved.mean())
    assert runs[None][0][-1] < runs[None][0][0]


def test_masked_sft_with_8bit_adamw_and_bf16_autocast_learns_with_float32_weights(tok):
    """``make demo``'s warm start: bfloat16 autocast for forward/backward, AdamW with 8-bit moments
    (bitsandbytes, on the CPU). The weights and gradients stay float32, the moments are uint8, and the loss falls
    about as it does with float32 AdamW."""
    pytest.importorskip("bitsandbytes")
    from trainers.sft import make_optimizer

    rng = np.random.default_rng(2)
    eps = [{"prompt_ids": rng.integers(10, 5000, 7).tolist(), "completion_ids": rng.integers(10, 5000, 8).tolist(),
            "loss_mask": [1] * 8} for _ in range(4)]
    seen: list = []
    ref = masked_sft(tiny_random_model(tok, seed=6), eps, steps=6, lr=1e-3, batch_size=4)
    model = tiny_random_model(tok, seed=6)
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    try:
        losses = masked_sft(model, eps, steps=6, lr=1e-3, batch_size=4, optim="adamw_bnb_8bit", autocast="bfloat16")
    finally:
        hook.remove()
    assert set(seen) == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert losses[0] - losses[-1] > 0.3 and ref[0] - ref[-1] > 0.3  # ~10.8 -> ~10.2 on this tiny random model
    assert losses[-1] == pytest.approx(ref[-1], rel=0.02)
    big = torch.nn.Parameter(torch.zeros(64, 128))
    opt = make_optimizer([big], "adamw_bnb_8bit", lr=1e-3)
    big.grad = torch.ones_like(big)
    opt.step()
    assert {v.dtype for v in opt.state[big].values() if torch.is_tensor(v) and v.numel() == big.numel()} == {torch.uint8}
    with pytest.raises(ValueError, match="unknown optim"):
        make_optimizer([big], "sgd", lr=1e-3)
