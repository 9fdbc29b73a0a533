"""GRPO with LoRA adapters (``trainers.grpo.Config.lora``), on a real TRL ``GRPOTrainer`` with a tiny model on CPU:
only the adapters train, transformers generation runs on merged weights and leaves them unmerged, and the run
hands back (and saves) a plain model with the adapters merged in, which loads and evaluates like any checkpoint."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("trl", reason="the adapter needs the [train] extra (trl)")
pytest.importorskip("peft", reason="LoRA needs peft (the [train] extra)")

from toolgym.envs.calculator import generate_task  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "lora_dropout": 0.0}


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(3)
    return [generate_task(rng) for _ in range(2)]


def _trl(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=16,
                max_steps=2, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
                disable_tqdm=True, learning_rate=5e-2, temperature=1.5)
    base.update(kw)
    return base


def _tiny():
    import torch

    from toolgym.models import load_tokenizer, tiny_random_model

    torch.manual_seed(0)
    tok = load_tokenizer()
    return tiny_random_model(tok), tok


def test_lora_grpo_hands_back_and_saves_the_merged_model(tmp_path, tasks):
    """Adapters initialised non-zero (``init_lora_weights: false``; a tiny random model earns no reward, so no
    gradient would move them): the merge must show in the weights the caller gets back and in the saved ones."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainers.grpo import Config, run

    model, tok = _tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.get_input_embeddings().weight.requires_grad_(False)  # the caller's own choice survives the run
    config = Config(max_turn_tokens=16, save_model=True, lora={**LORA, "init_lora_weights": False},
                    trl=_trl(tmp_path / "out"))
    result = run(config, model=model, tokenizer=tok, tasks=tasks)

    # the caller's model is a plain model again: no adapter modules, no patched forward, its trainable set kept
    names = [n for n, _ in model.named_parameters()]
    assert names == list(before) and not any("lora" in n for n in names)
    assert "forward" not in vars(model)
    assert not model.get_input_embeddings().weight.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if "embed" not in n)
    # the adapters were merged: the adapted linear layers moved, the embedding (not adapted) did not
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[q], before[q])
    emb = "model.embed_tokens.weight"
    assert torch.equal(model.state_dict()[emb], before[emb])
    assert result.metrics["global_step"] == 2

    # the saved model is a plain checkpoint (no adapter files) with the merged weights
    out = tmp_path / "out"
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_generation_runs_on_merged_adapters_and_unmerges_after(tmp_path, tasks):
    """``TRLPolicy.generate`` merges the LoRA adapters for the transformers ``generate()`` call (one matrix product
    per layer instead of three) and unmerges them after it: same greedy tokens as the unmerged model, the base
    weights back as they were (to float rounding)."""
    import torch
    from peft.tuners.lora import LoraLayer

    from toolgym.rollout import GenerationRequest
    from trainers.grpo import Config, build_trainer
    from trainers.grpo.generation import TRLPolicy, _merged_adapters

    model, tok = _tiny()
    config = Config(max_turn_tokens=8, save_model=False, lora=LORA, trl=_trl(tmp_path, temperature=1.0))
    trainer, rollout = build_trainer(config, model=model, tokenizer=tok, tasks=tasks)
    try:
        peft_model = trainer.accelerator.unwrap_model(trainer.model)
        layers = [m for m in peft_model.modules() if isinstance(m, LoraLayer)]
        assert layers
        for layer in layers:  # non-zero adapters (B starts at zero), so a merge changes the weights
            for b in layer.lora_B.values():
                torch.nn.init.normal_(b.weight, std=0.5)
        w = layers[0].base_layer.weight
        w0 = w.detach().clone()
        seen = []
        original = trainer._generate_single_turn

        def spy(*a, **k):
            seen.append([layer.merged for layer in layers])
            return original(*a, **k)

        trainer._generate_single_turn = spy
        trainer.model.eval()
        text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                       tokenize=False)
        prompt = list(tok(text, add_special_tokens=False)["input_ids"])
        trainer.temperature = 1e-4  # effectively greedy, to compare with the unmerged model's argmax
        trainer.generation_config.temperature = 1e-4
        trainer.generation_config.do_sample = False
        [gen] = TRLPolicy(trainer).generate([GenerationRequest(prompt_ids=prompt, max_new_tokens=6)])
        assert gen.token_ids
        assert seen == [[True] * len(layers)]  # merged during the call ...
        assert not any(layer.merged for layer in layers)  # ... and not after it
        assert torch.allclose(w, w0, atol=1e-6)
        # the same tokens as the unmerged adapters give, greedily, one token at a time
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for t in gen.token_ids:
                nxt = int(peft_model(input_ids=ids).logits[0, -1].argmax())
                assert nxt == t
                ids = torch.cat([ids, torch.tensor([[t]])], dim=1)

        with _merged_adapters(object()):  # no trainer attributes: nothing to merge, nothing raised
            pass
    finally:
        rollout.close()


def test_lora_config_names_an_unknown_field():
    from trainers.grpo import Config, lora_config

    cfg = lora_config({"r": 8, "target_modules": "all-linear"})
    assert cfg.r == 8 and str(cfg.task_type).endswith("CAUSAL_LM")
    with pytest.raises(ValueError, match="rank"):
        lora_config({"rank": 8})
    with pytest.raises(ValueError, match="lora"):
        Config(lora=[8])
