"""What GRPO's training step holds and computes, on a real TRL ``GRPOTrainer`` (tiny random model, CPU):

* :func:`trainers.grpo.trainer.trim_padding`: a micro-batch's loss runs over its own width, not the generation
  batch's, and its loss and gradients are those of the padded micro-batch;
* :func:`trainers.grpo.trainer.scored_positions_only`: TRL's fused LM head projects only the completion positions
  on a CPU (as it does on Triton devices), with the same loss and gradients;
* :func:`trainers.grpo.no_autocast_weight_cache`: under bf16 autocast the training forward keeps no bf16 copy of
  the weights, and generation (run without Accelerate's wrapper, under one autocast context) gives the tokens it
  gave with the wrapper.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl", reason="the GRPO adapter needs the [train] extra (trl)")

from tests.test_turn_grpo import batch_inputs, make_trainer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _loss_and_grads(trainer, loss_fn, inputs):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad(set_to_none=True)
    loss = loss_fn(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return float(loss), grads


def _tiny_grpo(tmp_path, *, task_seed: int, max_turn_tokens: int, trim_heap: bool = False,
               skip_zero_advantage: bool = True, **trl_fields):
    """A GRPO trainer from :func:`trainers.grpo.build_trainer` on a tiny random model, 2 Calculator-v0 tasks, groups
    of 2, one step; ``trl_fields`` override the GRPOConfig fields. Returns ``(trainer, rollout, model, tok)``."""
    import numpy as np
    import torch

    from toolgym.envs.calculator import generate_task
    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo import Config, build_trainer

    torch.manual_seed(0)
    tok = load_tokenizer()
    model = tiny_random_model(tok)
    tasks = [generate_task(np.random.default_rng(task_seed)) for _ in range(2)]
    trl = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=16,
               max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
               disable_tqdm=True, temperature=1.0) | trl_fields
    trainer, rollout = build_trainer(
        Config(max_turn_tokens=max_turn_tokens, save_model=False, trim_heap=trim_heap,
               skip_zero_advantage=skip_zero_advantage, trl=trl),
        model=model, tokenizer=tok, tasks=tasks)
    return trainer, rollout, model, tok


@pytest.mark.parametrize("advantage", ["outcome", "turn_return"])
def test_a_micro_batch_trains_on_its_own_width_with_the_same_loss_and_gradients(tmp_path, advantage):
    import torch
    from trl import GRPOTrainer

    from trainers.grpo.trainer import trim_padding

    trainer, rollout, tasks = make_trainer(tmp_path, advantage=advantage)
    try:
        trainer.model.train()
        out = trainer._generate_and_score_completions(batch_inputs(tasks))
        lengths = out["completion_mask"].sum(1)
        prompt_lengths = out["prompt_mask"].sum(1)
        assert len(set(lengths.tolist())) > 1 and len(set(prompt_lengths.tolist())) > 1  # padding on both sides
        # a micro-batch of the two shortest completions, cut from the batch the way TRL's split_tensor_dict does
        rows = torch.argsort(lengths)[:2]
        mb = {k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v) for k, v in out.items()}
        trimmed = trim_padding(mb, multiple=1)
        assert trimmed["completion_ids"].shape == (2, int(lengths[rows].max()))
        assert trimmed["prompt_ids"].shape == (2, int(prompt_lengths[rows].max()))
        assert trimmed["completion_ids"].shape[1] < out["completion_ids"].shape[1]
        bucketed = trim_padding(mb, multiple=8)  # widths in multiples of 8 columns (or the batch's own)
        for k, w in (("completion_ids", int(lengths[rows].max())), ("prompt_ids", int(prompt_lengths[rows].max()))):
            assert bucketed[k].shape[1] == min(mb[k].shape[1], -(-w // 8) * 8)
        for k in ("completion_mask", "tool_mask"):
            assert trimmed[k].shape == trimmed["completion_ids"].shape
        if advantage == "turn_return":  # per-token advantages are cut with the completion
            assert trimmed["advantages"].shape == trimmed["completion_ids"].shape
        assert mb["completion_ids"].shape[1] == out["completion_ids"].shape[1]  # the input dict is not modified

        trainer.model.double()  # float64: what is left of any difference is the trim's, not float32 rounding
        ref_loss, ref_grads = _loss_and_grads(trainer, lambda m, x: GRPOTrainer._compute_loss(trainer, m, x), mb)
        loss, grads = _loss_and_grads(trainer, lambda m, x: GRPOTrainer._compute_loss(trainer, m, trimmed), mb)
        assert out["completion_ids"].shape[1] > 64  # so the subclass (multiples of 64 columns) trims too
        loss64, grads64 = _loss_and_grads(trainer, trainer._compute_loss, mb)  # trimmed, completion rows scored
        assert loss64 == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
        assert grads64.keys() == ref_grads.keys()
        # TRL's head accumulates its weight gradient in float32 (``_addmm_fp32``), over the rows it scores: the
        # (tied) output embedding's gradient sums fewer rows (no all-zero ones), so it agrees to float32 rounding
        head = trainer.model.get_output_embeddings().weight.data_ptr()
        for n, p in trainer.model.named_parameters():
            if n in grads64:
                tol = 1e-6 if p.data_ptr() == head else 1e-9
                assert float((grads64[n] - ref_grads[n]).norm()) <= tol * float(ref_grads[n].norm()) + 1e-15, n
        assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
        assert ref_grads and grads.keys() == ref_grads.keys()
        assert any(float(g.abs().max()) > 0 for g in ref_grads.values())  # a micro-batch with a signal
        for n, g in grads.items():
            assert float((g - ref_grads[n]).norm()) <= 1e-9 * float(ref_grads[n].norm()) + 1e-15, n
    finally:
        rollout.close()


def test_trim_padding_leaves_a_batch_it_cannot_slice_whole():
    import torch

    from trainers.grpo.trainer import trim_padding

    mb = {"prompt_ids": torch.tensor([[0, 5, 6], [0, 0, 7]]), "prompt_mask": torch.tensor([[0, 1, 1], [0, 0, 1]]),
          "completion_ids": torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]]),
          "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]), "advantages": torch.tensor([0.5, -0.5])}
    trimmed = trim_padding(mb, multiple=1)
    assert trimmed["prompt_ids"].tolist() == [[5, 6], [0, 7]]
    assert trimmed["completion_ids"].tolist() == [[1, 2], [3, 0]]
    assert trimmed["advantages"].tolist() == [0.5, -0.5]  # per sequence: untouched
    assert trim_padding(mb, multiple=3)["completion_ids"].tolist() == [[1, 2, 0], [3, 0, 0]]
    assert trim_padding(mb, multiple=3)["prompt_ids"].shape == (2, 3)  # 2 used columns -> 3 (all of them)
    assert trim_padding(mb)["completion_ids"].shape == (2, 4)  # 64: the batch's own width
    # a tensor laid out over the whole sequence that trim_padding does not know: nothing is cut
    whole = {**mb, "token_type_ids": torch.zeros(2, 7, dtype=torch.long)}
    assert trim_padding(whole, multiple=1) is whole
    # no padding column anywhere: the same dict back
    full = {k: (v[:, 2:] if k.startswith("prompt") else v[:, :1] if k.startswith("completion") else v)
            for k, v in mb.items()}
    assert trim_padding(full, multiple=1) is full


def test_bf16_training_forward_keeps_no_weight_copies_and_generation_is_unchanged(tmp_path, monkeypatch):
    """The autocast weight cache is off in the training forward (seen from inside it, through a hook: Accelerate's
    wrapper clears the cache on exit either way); generation runs the unwrapped forward under one autocast context
    with the cache on, gives the tokens Accelerate's wrapper gives (cache on), and the wrapper is back
    after it."""
    import contextlib

    import torch

    import trainers.grpo.generation as rf
    from toolgym.rollout import GenerationRequest
    from trainers.grpo import no_autocast_weight_cache

    trainer, rollout, model, tok = _tiny_grpo(tmp_path, task_seed=3, max_turn_tokens=8, bf16=True)
    try:
        acc = trainer.accelerator
        assert acc.native_amp and acc.autocast_handler.cache_enabled is False
        assert no_autocast_weight_cache(trainer) is False  # a handler already set is left alone
        acc.prepare_model(model)  # what train() does: wraps forward in autocast (cache off)
        seen: list[bool] = []
        hook = model.model.layers[0].mlp.register_forward_hook(
            lambda *a: seen.append(torch.is_autocast_cache_enabled()))
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
        assert seen == [False]

        text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                       tokenize=False)
        prompt = [GenerationRequest(prompt_ids=list(tok(text, add_special_tokens=False)["input_ids"]),
                                    max_new_tokens=8)]
        trainer.generation_config.do_sample = False
        policy = rf.TRLPolicy(trainer)
        wrapped = vars(model)["forward"]
        seen.clear()
        [ours] = policy.generate(prompt)
        assert len(seen) > 2 and all(seen)  # every decoding step ran with the call's cache on
        assert vars(model)["forward"] is wrapped  # the wrapper is back

        # without the bypass, the wrapper's cache-off context would turn the call's cache off at every step
        monkeypatch.setattr(rf, "_without_amp_wrapper", lambda model: contextlib.nullcontext())
        seen.clear()
        [same] = policy.generate(prompt)
        assert seen and not any(seen) and same.token_ids == ours.token_ids
        # the reference: Accelerate's wrapper with its default handler (cache on)
        model.forward = vars(model).pop("_original_forward")
        acc.autocast_handler = None
        acc.prepare_model(model)
        seen.clear()
        [old] = policy.generate(prompt)
        assert seen and all(seen)
        assert old.token_ids == ours.token_ids and len(ours.token_ids) > 1
        hook.remove()
    finally:
        rollout.close()


@pytest.mark.parametrize("trim", [True, False])
def test_trim_heap_hands_generation_memory_back_before_the_training_forward(tmp_path, monkeypatch, trim):
    """``Config.trim_heap``: after a step's episodes are generated, the heap is trimmed before the first training
    forward (generation's freed KV caches would otherwise stay resident under it), and again after every
    micro-batch; off, nothing is trimmed. A real one-step GRPO run on the tiny model; the spy calls the real
    ``malloc_trim``."""
    import torch

    import toolgym.resources
    import trainers.grpo.efficiency
    import trainers.grpo.rollout_adapter as rf

    events: list[str] = []

    def spy() -> bool:
        events.append("trim")
        return toolgym.resources.trim_heap()

    monkeypatch.setattr(rf, "trim_heap", spy)
    monkeypatch.setattr(trainers.grpo.efficiency, "trim_heap", spy)
    # the random model earns no reward: every micro-batch would be skipped (trainers.grpo.zero_advantage) without
    # skip_zero_advantage=False, and this test needs their forwards
    trainer, rollout, model, _ = _tiny_grpo(tmp_path, task_seed=5, max_turn_tokens=8, trim_heap=trim,
                                            skip_zero_advantage=False, gradient_accumulation_steps=2)
    model.register_forward_pre_hook(lambda *a: events.append("train" if torch.is_grad_enabled() else "generate"))
    try:
        assert rollout.trim_heap is trim
        assert any(isinstance(c, trainers.grpo.efficiency.TrimHeapCallback) for c in trainer.callback_handler.callbacks) is trim
        trainer.train()
    finally:
        rollout.close()
    first_train = events.index("train")
    assert "generate" in events[:first_train]
    if not trim:
        assert "trim" not in events
        return
    last_gen = max(i for i, e in enumerate(events[:first_train]) if e == "generate")
    assert "trim" in events[last_gen:first_train]  # between the generation and the first training forward
    trains = [i for i, e in enumerate(events) if e == "train"]
    assert len(trains) == 2  # two micro-batches (gradient accumulation), trimmed after each
    assert "trim" in events[trains[0]:trains[1]] and "trim" in events[trains[1]:]


def test_a_cpu_policy_trims_the_heap_after_each_batch_with_the_same_tokens(monkeypatch):
    """``TransformersPolicy(trim_heap=None)`` trims after each ``max_batch_size`` batch when the model is on the
    CPU; the tokens are those of a policy that does not trim."""
    import torch

    import toolgym.resources
    import toolgym.rollout.policies as policies
    from toolgym.models import load_tokenizer, tiny_random_model
    from toolgym.rollout import GenerationRequest, TransformersPolicy

    calls: list[int] = []
    monkeypatch.setattr(policies, "trim_heap", lambda: calls.append(1) or toolgym.resources.trim_heap())
    tok = load_tokenizer()
    model = tiny_random_model(tok)
    reqs = [GenerationRequest(prompt_ids=list(tok(f"{i} + {i} =")["input_ids"]), max_new_tokens=6) for i in range(5)]
    on = TransformersPolicy(model, tok, do_sample=False, max_batch_size=2)
    off = TransformersPolicy(model, tok, do_sample=False, max_batch_size=2, trim_heap=False)
    assert on.trim_heap is True and off.trim_heap is False
    with torch.no_grad():
        a = on.generate(reqs)
        assert len(calls) == 3  # batches of 2, 2 and 1
        b = off.generate(reqs)
    assert len(calls) == 3
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and all(len(g.token_ids) for g in a)


@pytest.mark.parametrize("bf16", [False, True])
def test_grpo_generation_runs_on_a_reserved_cache_with_the_same_tokens(tmp_path, monkeypatch, bf16):
    """TRL's transformers ``generate()`` inside :class:`trainers.grpo.rollout_adapter.TRLPolicy` gets a key/value cache
    allocated before the prefill (:func:`toolgym.rollout.kvcache.reserved_cache`); sampled with the same seed, the
    tokens are those of transformers' own cache; the model's ``generate`` is its class's again afterwards."""
    import contextlib

    import torch

    import trainers.grpo.generation as rf
    from toolgym.rollout import GenerationRequest

    trainer, rollout, model, tok = _tiny_grpo(tmp_path, task_seed=7, max_turn_tokens=12, bf16=bf16,
                                              max_completion_length=24, gradient_checkpointing=True)
    caches: list[str] = []
    real_generate = type(model).generate

    def spy(self, *args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        caches.append(type(cache.layers[0]).__name__ if cache is not None else "none")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", spy)
    try:
        trainer.model.train()
        texts = [f"{a} * {a + 1} = ?" for a in range(3)]
        reqs = [GenerationRequest(prompt_ids=list(tok(t)["input_ids"]), max_new_tokens=12) for t in texts]
        policy = rf.TRLPolicy(trainer)
        torch.manual_seed(11)
        ours = policy.generate(reqs)
        assert caches == ["ReservedLayer"] and "generate" not in vars(model)
        monkeypatch.setattr(rf, "_reserved_generation_cache", lambda trainer, *a: contextlib.nullcontext())
        torch.manual_seed(11)
        theirs = policy.generate(reqs)
        assert caches == ["ReservedLayer", "none"]
        assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
        assert sum(len(g.token_ids) for g in ours) > 3 * 2
    finally:
        rollout.close()


def test_the_lm_head_scores_only_the_completion_positions_on_a_cpu(tmp_path, monkeypatch):
    """Inside the trainer's loss, TRL's fused LM head gets the labelled positions only (the completion tokens of the
    micro-batch), not every position of prompt and padding; outside it, TRL's own choice for a CPU is back."""
    import torch
    import trl.trainer.utils as trl_utils

    from trainers.grpo.trainer import scored_positions_only

    decide = trl_utils._use_triton
    assert decide(torch.device("cpu")) is False  # TRL's own choice on a CPU: score every position
    rows: list[int] = []
    real = trl_utils._ChunkedLogProbFunction

    class Spy:
        @staticmethod
        def apply(hidden, *args):
            rows.append(int(hidden.shape[0]))
            return real.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Spy)
    trainer, rollout, tasks = make_trainer(tmp_path, advantage="outcome")
    try:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        out = trainer._generate_and_score_completions(batch_inputs(tasks))
        mb = {k: (v[:2] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v) for k, v in out.items()}
        loss = trainer._compute_loss(trainer.model, mb)
        loss.backward()
        assert rows == [int(mb["completion_mask"][:, : mb["completion_ids"].size(1)].ne(0).sum())]
        assert trl_utils._use_triton is decide
        with scored_positions_only():
            assert trl_utils._use_triton(torch.device("cpu")) is True
        from trl import GRPOTrainer

        trainer.shared_prefix = False  # TRL's own rows, not the packed ones (tests/test_shared_prefix.py)
        GRPOTrainer._compute_loss(trainer, trainer.model, mb)  # TRL's own: every position of the micro-batch
        width = mb["prompt_ids"].size(1) + mb["completion_ids"].size(1) - 1
        assert rows[-1] == 2 * width > rows[0]
    finally:
        rollout.close()
