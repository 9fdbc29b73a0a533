"""trainers.grpo.sampling: GRPO's CPU generation samples by inverse CDF, from the distribution transformers samples from."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainers.grpo.sampling import InverseCDFSampler, inverse_cdf_sampling, sampling_warpers  # noqa: E402


def _chi2_ok(counts, probs, n) -> bool:
    """Pearson's chi-square against ``probs`` below its 99.9% quantile (df <= 9: 27.9)."""
    keep = probs > 0
    expected = probs[keep] * n
    stat = float((((counts[keep] - expected) ** 2) / expected).sum())
    return stat < 27.9


def test_inverse_cdf_sampler_draws_from_the_warped_softmax():
    from transformers import GenerationConfig

    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.5, float("-inf")])
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=5, top_p=0.95)
    warpers = sampling_warpers(config)
    assert [type(w).__name__ for w in warpers] == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]
    n = 40_000
    scores = logits.repeat(n, 1)
    out = InverseCDFSampler(warpers, generator=g)(None, scores)
    assert out.shape == scores.shape
    assert bool(((out == 0).sum(dim=1) == 1).all()) and bool((out[out != 0] == float("-inf")).all())
    chosen = out.argmax(dim=1)
    counts = torch.bincount(chosen, minlength=len(logits)).double()
    warped = logits[None].clone()
    for w in warpers:
        warped = w(None, warped)
    probs = torch.softmax(warped[0].double(), dim=0)
    assert int((probs == 0).sum()) >= 3  # top-k / top-p masked some tokens ...
    assert counts[probs == 0].sum() == 0  # ... which are never drawn
    assert _chi2_ok(counts, probs, n)
    # and a wrong distribution is told apart (the test can fail)
    assert not _chi2_ok(counts, torch.softmax(logits.double(), dim=0), n)


def test_a_config_with_a_warper_it_does_not_rebuild_is_left_to_transformers():
    from transformers import GenerationConfig

    assert sampling_warpers(GenerationConfig(do_sample=True, typical_p=0.9)) is None
    assert sampling_warpers(GenerationConfig(do_sample=True, epsilon_cutoff=3e-4)) is None
    assert sampling_warpers(GenerationConfig(do_sample=True, temperature=1.0, top_k=0)) == []


def test_generate_samples_the_first_token_from_the_models_distribution():
    """The tiny model's first sampled token over 6,000 rows of one prompt (6 calls of 1,000), through ``generate()``
    with the wrapper, against the model's own next-token distribution after temperature and top-k."""
    from transformers import GenerationConfig

    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=3).eval()
    ids = torch.tensor([tok("What is 2 + 2?", add_special_tokens=False)["input_ids"]])
    config = GenerationConfig(do_sample=True, temperature=0.8, top_k=6, max_new_tokens=1, pad_token_id=0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].double()
    top = torch.topk(logits, 6)
    probs = torch.zeros_like(logits)
    probs[top.indices] = torch.softmax(top.values / 0.8, dim=0)
    n = 6_000
    torch.manual_seed(0)
    chunk = 1_000  # rows per generate() call: 6,000 rows at once hold several (rows x 49,152) float32 score tensors
    with torch.no_grad(), inverse_cdf_sampling(model):
        assert "generate" in vars(model)
        out = torch.cat([model.generate(input_ids=ids.repeat(chunk, 1), generation_config=config)
                         for _ in range(n // chunk)])
    assert "generate" not in vars(model)  # restored
    first = out[:, ids.shape[1]]
    counts = torch.bincount(first, minlength=len(logits)).double()
    assert set(first.tolist()) <= set(top.indices.tolist())
    assert _chi2_ok(counts[top.indices], probs[top.indices], n)
    # greedy calls and calls that want scores keep transformers' own path (the same tokens as without the wrapper)
    greedy = GenerationConfig(do_sample=False, max_new_tokens=4, pad_token_id=0)
    with torch.no_grad():
        plain = model.generate(input_ids=ids, generation_config=greedy)
        with inverse_cdf_sampling(model):
            wrapped = model.generate(input_ids=ids, generation_config=greedy)
            scored = model.generate(input_ids=ids, generation_config=GenerationConfig(
                do_sample=True, top_k=6, max_new_tokens=2, pad_token_id=0, output_scores=True,
                return_dict_in_generate=True))
    assert torch.equal(plain, wrapped)
    assert bool(torch.isfinite(scored.scores[0]).sum(dim=1).eq(6).all())  # top-k's scores, not a one-hot
