"""Shared-prefix GRPO training (:mod:`trainers.grpo.prompt_packing`): the rows of a micro-batch that share a prompt,
packed into one row, give the per-token log-probabilities and gradients of TRL's unshared computation.

The embedded model (SmolLM2-135M, float32) on real-looking micro-batches: groups of completions of different
lengths (right padding) behind left-padded prompts of different lengths, rows of two groups interleaved, a
multi-turn completion with env tokens (``tool_mask`` 0) inside it. Gradients within 1e-4 relative, log-probabilities
within 5e-5: the packed forward runs other shapes (the attention's sums run over other key counts), and float32
rounding through 30 layers then differs by up to ~2e-5 (mean ~3e-6) on log-probabilities of -8 to -17, on short
prompts as on a 550-token one. In float64 the log-probabilities agree to 1e-10 and the gradients to 1e-6 (TRL's
fused LM head accumulates its backward in float32). With LoRA, with gradient
checkpointing, with per-token (turn-level) advantages, and over a generation batch laid out by
:func:`trainers.grpo.zero_advantage.regroup` with zero-advantage micro-batches left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the GRPO adapter needs the [train] extra (trl)")

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

LOGP_TOL = 5e-5
GRAD_TOL = 1e-4
TEXT = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tmp_path, *, lora: bool = False, gradient_checkpointing: bool = False, rows: int = 6,
             loss_type: str = "dapo"):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from toolgym.models import load_model
    from trainers.grpo.build import lora_config
    from trainers.grpo.trainer import TurnCreditGRPOTrainer

    torch.manual_seed(0)
    model, tok = load_model()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=rows, num_generations=rows,
                      max_completion_length=256, max_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                      seed=0, disable_tqdm=True, beta=0.0, loss_type=loss_type, bf16=False,
                      gradient_checkpointing=gradient_checkpointing)
    extra = {"peft_config": lora_config({"r": 8, "lora_alpha": 16, "target_modules": "all-linear",
                                         "lora_dropout": 0.0, "init_lora_weights": False})} if lora else {}
    trainer = TurnCreditGRPOTrainer(model=model, processing_class=tok, reward_funcs=[_reward], args=args,
                                    train_dataset=Dataset.from_list([{"prompt": "x"}] * rows), **extra)
    trainer.current_gradient_accumulation_steps = 1
    if gradient_checkpointing:  # what Trainer.train does before its first step
        trainer.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=dict(args.activation_checkpointing_kwargs or {}) or None)
    trainer.model.train()
    return trainer, tok


def _tokens(tok, start: int, n: int) -> list[int]:
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    return [int(x) for x in ids[start:start + n]]


def _micro_batch(tok, prompts: list[list[int]], completions: list[tuple[int, list[int], list[int]]],
                 advantages=None):
    """TRL's micro-batch: ``completions`` = ``(prompt index, token ids, tool mask)`` per row; prompts left-padded,
    completions right-padded to the longest; ``advantages``: ``(B,)`` or ``(B, C)`` (default: one per row)."""
    import torch

    pad = tok.pad_token_id
    p_w = max(len(prompts[i]) for i, _, _ in completions)
    c_w = max(len(c) for _, c, _ in completions)
    b = len(completions)
    prompt_ids = torch.full((b, p_w), pad, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_w), dtype=torch.long)
    completion_ids = torch.full((b, c_w), pad, dtype=torch.long)
    completion_mask = torch.zeros((b, c_w), dtype=torch.long)
    tool_mask = torch.ones((b, c_w), dtype=torch.long)
    for r, (i, comp, tools) in enumerate(completions):
        p = prompts[i]
        prompt_ids[r, p_w - len(p):] = torch.tensor(p)
        prompt_mask[r, p_w - len(p):] = 1
        completion_ids[r, :len(comp)] = torch.tensor(comp)
        completion_mask[r, :len(comp)] = 1
        tool_mask[r, :len(comp)] = torch.tensor(tools)
    if advantages is None:
        advantages = torch.linspace(-1.0, 1.0, b)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
            "num_items_in_batch": (completion_mask * tool_mask).sum().float(), "old_per_token_logps": None}


def _episodes(tok, *, prompt_len: int = 96, other_len: int = 80, lengths=(23, 9, 31)):
    """Two prompts of different lengths; per prompt one completion per ``lengths`` entry, the last one a
    multi-turn episode (policy tokens, env tokens, policy tokens); the two groups' rows interleaved."""
    prompts = [_tokens(tok, 0, prompt_len), _tokens(tok, 400, other_len)]
    rows = []
    for k, n in enumerate(lengths):
        for i in (0, 1):
            comp = _tokens(tok, 900 + 37 * k + 11 * i, n)
            tools = [1] * n
            if k == len(lengths) - 1:  # a tool call, the env's reply (not trained on), the answer
                tools = [1] * 8 + [0] * 12 + [1] * (n - 20)
            rows.append((i, comp, tools))
    return prompts, rows


def _run(trainer, inputs, shared: bool):
    """``(logps (B, C), loss, {name: grad})`` of the subclass's loss with shared-prefix packing on or off."""
    import torch

    model = trainer.model
    trainer.shared_prefix = shared
    before = trainer.shared_prefix_forwards
    model.zero_grad(set_to_none=True)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    assert (trainer.shared_prefix_forwards > before) is shared  # the packed path ran exactly when asked
    return logps * inputs["completion_mask"], entropies * inputs["completion_mask"], float(loss), grads


def _assert_same(trainer, inputs, logp_tol: float = LOGP_TOL, grad_tol: float = GRAD_TOL):
    ref_logps, ref_ent, ref_loss, ref_grads = _run(trainer, inputs, shared=False)
    logps, ent, loss, grads = _run(trainer, inputs, shared=True)
    assert float((logps - ref_logps).abs().max()) <= logp_tol
    assert float((ent - ref_ent).abs().max()) <= logp_tol * 10
    assert float(ref_logps.abs().max()) > 0.1  # log-probabilities of real tokens, not zeros
    assert loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    assert ref_grads and grads.keys() == ref_grads.keys()
    assert any(float(g.abs().max()) > 0 for g in ref_grads.values())
    # TRL's fused LM head accumulates its weight gradient in float32, over other row counts here: the (tied) output
    # embedding's gradient agrees to float32 rounding whatever the model's dtype
    head = trainer.model.get_output_embeddings().weight.data_ptr()
    for n, p in trainer.model.named_parameters():
        if n in grads:
            ref = ref_grads[n]
            tol = max(grad_tol, 1e-6) if p.data_ptr() == head else grad_tol
            assert float((grads[n] - ref).norm()) <= tol * float(ref.norm()) + 1e-12, n
    return ref_grads


def test_pack_lays_out_one_row_per_prompt_with_each_completion_seeing_only_the_prompt_and_itself():
    import torch

    from trainers.grpo.prompt_packing import pack, prompt_groups

    # prompts [5, 6, 7] (two rows) and [9, 7] (one row); completion widths 3
    ids = torch.tensor([[5, 6, 7, 1, 2, 0], [0, 9, 7, 3, 0, 0], [5, 6, 7, 4, 8, 2]])
    am = torch.tensor([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert prompt_groups(ids[:, :3], am[:, :3]) == [0, 1, 0]
    packed = pack(ids, am, 3, multiple=1)
    assert packed is not None
    # row 0: prompt[:-1] = [5, 6], then [7, 1] (row 0: 2 tokens) and [7, 4, 8] (row 2: 3 tokens)
    assert packed.input_ids[0].tolist() == [5, 6, 7, 1, 7, 4, 8]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 2, 3, 4]
    assert packed.shift_labels[0].tolist() == [-100, -100, 1, 2, 4, 8, 2]
    m = packed.attention_mask[0, 0]
    assert m[5].tolist() == [True, True, False, False, True, True, False]  # row 2's token 4 sees no row-0 token
    assert m[3].tolist() == [True, True, True, True, False, False, False]
    # row 1 (its own prompt): [9] then [7] predicting its one token 3; padding columns see only themselves
    assert packed.input_ids[1, :2].tolist() == [9, 7]
    assert packed.position_ids[1, :2].tolist() == [1, 2]
    assert packed.shift_labels[1].tolist() == [-100, 3, -100, -100, -100, -100, -100]
    assert packed.attention_mask[0, 0, 6].sum() == 5
    assert not bool(packed.attention_mask[1, 0, 4, :4].any()) and bool(packed.attention_mask[1, 0, 4, 4])
    assert pack(ids[:2], am[:2], 3) is None  # no prompt shared by two rows: nothing to pack


def test_shared_prefix_logps_and_gradients_equal_the_unshared_ones(tmp_path):
    trainer, tok = _trainer(tmp_path)
    prompts, rows = _episodes(tok)
    _assert_same(trainer, _micro_batch(tok, prompts, rows))


def test_shared_prefix_is_the_unshared_computation_in_float64(tmp_path):
    """In float64 what is left of a difference is not rounding: the packed forward computes the same function. The
    model keeps its first 4 decoder layers (the same function per layer; the whole float64 model and its two sets
    of gradients held 5.3 GB)."""
    trainer, tok = _trainer(tmp_path)
    inner = trainer.model.model
    inner.layers = inner.layers[:4]
    trainer.model.config.num_hidden_layers = 4
    if getattr(trainer.model.config, "layer_types", None):
        trainer.model.config.layer_types = trainer.model.config.layer_types[:4]
    trainer.model.double()
    prompts, rows = _episodes(tok, prompt_len=40, other_len=28, lengths=(7, 25))
    _assert_same(trainer, _micro_batch(tok, prompts, rows), logp_tol=1e-10, grad_tol=1e-6)


def test_shared_prefix_with_per_token_turn_advantages(tmp_path):
    """Turn-level estimators (``turn_return``, ``gigpo``) hand the loss ``(B, C)`` advantages: each turn's policy
    tokens get that turn's advantage (:func:`trainers.credit.token_advantages`)."""
    import numpy as np
    import torch

    from trainers.credit import token_advantages, turn_advantages

    trainer, tok = _trainer(tmp_path)
    prompts, rows = _episodes(tok)
    inputs = _micro_batch(tok, prompts, rows)
    width = inputs["completion_ids"].size(1)
    turn_rewards = [[0.5, 1.0] if len(c) > 25 else [0.0] for _, c, _ in rows]
    spans = [[(0, 8), (20, len(c))] if len(c) > 25 else [(0, len(c))] for _, c, _ in rows]
    for estimator in ("turn_return", "gigpo"):
        anchors = [[k for k in range(len(r))] for r in turn_rewards] if estimator == "gigpo" else None
        adv = turn_advantages(turn_rewards, [r[-1] for r in turn_rewards], [i for i, _, _ in rows],
                              estimator=estimator, anchors=anchors)
        mask = (inputs["completion_mask"] * inputs["tool_mask"]).numpy()
        tok_adv = np.stack([token_advantages(adv[r], spans[r], mask[r], length=width) for r in range(len(rows))])
        assert np.abs(tok_adv).max() > 0
        _assert_same(trainer, {**inputs, "advantages": torch.as_tensor(tok_adv)})


def test_shared_prefix_with_lora_and_gradient_checkpointing(tmp_path):
    trainer, tok = _trainer(tmp_path, lora=True, gradient_checkpointing=True)
    # the decoder layers recompute their forward in the backward
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.model.modules())
    prompts, rows = _episodes(tok, prompt_len=64, other_len=48, lengths=(15, 26))
    grads = _assert_same(trainer, _micro_batch(tok, prompts, rows))
    assert grads and all("lora_" in n for n in grads)  # only the adapters train


def test_shared_prefix_at_a_bfcl_length_group(tmp_path):
    """A group as on BFCL ``multiple``: a 550-token prompt and completions of 40-61 tokens, with activation
    checkpointing as GRPO runs BFCL (without it the unshared backward keeps ~10 GB of activations). Four
    completions (BFCL's protocol samples 4 a prompt): the unshared computation's logits grow with each row."""
    trainer, tok = _trainer(tmp_path, rows=4, gradient_checkpointing=True)
    prompts = [_tokens(tok, 0, 550)]
    rows = [(0, _tokens(tok, 1000 + 50 * k, 40 + 7 * k), [1] * (40 + 7 * k)) for k in range(4)]
    _assert_same(trainer, _micro_batch(tok, prompts, rows))


def test_regrouped_generation_batch_skipping_zero_advantages_gives_the_unshared_step_gradient(tmp_path):
    """A generation batch shuffled into micro-batches of 2 (TRL's layout), one group with all-zero advantages:
    regrouped by prompt with the zero-advantage rows last, then computed packed with the zero micro-batch left out,
    it sums to the gradient of TRL's micro-batches computed unshared."""
    import torch

    from trainers.grpo.zero_advantage import all_zero, regroup

    trainer, tok = _trainer(tmp_path, rows=2)
    prompts = [_tokens(tok, 0, 40), _tokens(tok, 300, 56), _tokens(tok, 600, 32)]
    rows = [(i, _tokens(tok, 900 + 13 * r, 6 + 5 * r), [1] * (6 + 5 * r)) for r, i in enumerate([0, 0, 1, 1, 2, 2])]
    adv = torch.tensor([0.7, -0.7, 0.0, 0.0, 1.0, -1.0])
    full = _micro_batch(tok, prompts, rows, advantages=adv)
    full["num_items_in_batch"] = full["num_items_in_batch"] / 3  # each micro-batch's share (one process)
    shuffle = [2, 4, 0, 3, 5, 1]
    trl_batches = [{k: (v[shuffle[j:j + 2]] if isinstance(v, torch.Tensor) and v.dim() else v)
                    for k, v in full.items()} for j in range(0, 6, 2)]
    laid_out = regroup(trl_batches, zeros_last=True, by_prompt=True)
    assert laid_out is not None
    groups = [[tuple(r.tolist()) for r in mb["prompt_ids"]] for mb in laid_out]
    assert all(g[0] == g[1] for g in groups)  # each micro-batch: one prompt's two rows
    assert all_zero(laid_out[-1]) and not any(all_zero(mb) for mb in laid_out[:-1])

    def step_grads(batches, shared: bool):
        trainer.shared_prefix = shared
        trainer.skip_zero_advantage = shared
        trainer.model.zero_grad(set_to_none=True)
        for mb in batches:
            trainer._compute_loss(trainer.model, mb).backward()
        out = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.model.zero_grad(set_to_none=True)
        return out

    skipped = trainer.skipped_micro_batches
    ref = step_grads(trl_batches, shared=False)
    got = step_grads(laid_out, shared=True)
    assert trainer.skipped_micro_batches == skipped + 1
    assert ref and got.keys() == ref.keys()
    for n, g in got.items():
        assert float((g - ref[n]).norm()) <= GRAD_TOL * float(ref[n].norm()) + 1e-12, n
