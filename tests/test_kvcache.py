"""The preallocated key/value cache of ``TransformersPolicy`` (``toolgym.rollout.kvcache``): the same tokens and the
same log-probabilities as transformers' own cache, in float32 and under bfloat16 autocast, with left padding, past
its capacity, and on the real embedded model; models with other cache layers fall back to transformers' cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from toolgym.models import load_model, load_tokenizer, tiny_random_model  # noqa: E402
from toolgym.rollout import GenerationRequest, TransformersPolicy  # noqa: E402
from toolgym.rollout.kvcache import cache_kwarg, reserved_cache  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _requests(tok, n=3, max_new=12):
    texts = ["What is 2+2?", "Compute 12 * 7 - 3, then answer.", "Hi"][:n]
    out = []
    for t in texts:
        text = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        out.append(GenerationRequest(prompt_ids=ids, max_new_tokens=max_new, stop_ids=[tok.eos_token_id]))
    return out  # prompts of different lengths: left padding in one batch


def _generate(model, tok, requests, *, reserve, autocast=None):
    policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=True, logprobs_mode="raw_logprobs",
                                autocast=autocast, reserve_cache=reserve)
    return policy.generate(requests)


@pytest.mark.parametrize("autocast", [None, "bfloat16"])
def test_reserved_cache_gives_the_same_tokens_and_logprobs(tok, autocast):
    model = tiny_random_model(tok, seed=1).eval()
    reqs = _requests(tok)
    ours = _generate(model, tok, reqs, reserve=True, autocast=autocast)
    theirs = _generate(model, tok, reqs, reserve=False, autocast=autocast)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.logprobs for g in ours] == [g.logprobs for g in theirs]  # bit-identical, not close
    assert all(len(g.token_ids) == 12 for g in ours)  # random weights rarely stop: every step was exercised


def test_reserved_cache_holds_autocast_dtype_and_grows_past_its_capacity(tok):
    model = tiny_random_model(tok, seed=2).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = reserved_cache(model, 2, 6)  # room for 2 new tokens only: generating 10 must grow it
        assert cache is not None
        assert {layer.keys.dtype for layer in cache.layers} == {torch.bfloat16}
        ours = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                              min_new_tokens=10, do_sample=False, **{cache_kwarg(): cache})
        theirs = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                                min_new_tokens=10, do_sample=False)
    assert torch.equal(ours, theirs)
    assert cache.get_seq_length() == 4 + 10 - 1  # the last sampled token is never fed back
    with torch.no_grad():
        assert reserved_cache(model, 2, 6).layers[0].keys.dtype == torch.float32  # no autocast: the model's dtype


def test_models_with_other_cache_layers_get_transformers_cache(tok):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=4)
    model = MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        assert reserved_cache(model, 2, 8) is None
    reqs = _requests(tok, n=2, max_new=6)
    assert [g.token_ids for g in _generate(model, tok, reqs, reserve=True)] == \
        [g.token_ids for g in _generate(model, tok, reqs, reserve=False)]


@pytest.mark.slow
def test_reserved_cache_on_the_embedded_model_under_bfloat16(tok):
    """SmolLM2-135M-Instruct (the demo's model): its rotary keys are float32 under autocast, its cache here
    bfloat16, and the greedy tokens and raw log-probabilities are still exactly transformers' own."""
    model, tok = load_model()
    reqs = _requests(tok, max_new=16)
    ours = _generate(model.eval(), tok, reqs, reserve=True, autocast="bfloat16")
    theirs = _generate(model, tok, reqs, reserve=False, autocast="bfloat16")
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.logprobs for g in ours] == [g.logprobs for g in theirs]


def _head_casts(model, tok, *, frozen: bool, autocast: str = "bfloat16") -> tuple[int, list[list[int]]]:
    """How many times the LM head's weight is cast during a greedy generation of 8 tokens, and the tokens."""
    from torch.profiler import ProfilerActivity, profile

    head = model.get_output_embeddings().weight
    head.requires_grad_(not frozen)
    reqs = _requests(tok, max_new=8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = _generate(model, tok, reqs, reserve=True, autocast=autocast)
    shape = [list(head.shape)]
    casts = sum(e.count for e in prof.key_averages(group_by_input_shape=True)
                if e.key == "aten::_to_copy" and e.input_shapes[:1] == shape)
    head.requires_grad_(True)
    return casts, [g.token_ids for g in out]


def test_frozen_weights_are_cast_once_per_generation_under_autocast(tok):
    """A frozen LM head (the demo freezes the tied embedding) was cast to bfloat16 again at every decoding step:
    autocast caches only weights that require grad. TransformersPolicy now caches it once per call, with the same
    tokens; the flag is restored afterwards."""
    model = tiny_random_model(tok, seed=1).eval()
    trained_casts, trained_tokens = _head_casts(model, tok, frozen=False)
    frozen_casts, frozen_tokens = _head_casts(model, tok, frozen=True)
    assert trained_casts == 1  # the cache: one cast for the probe, prefill and every step
    assert frozen_casts == 1, f"the frozen head was cast {frozen_casts} times in one generate() call"
    assert frozen_tokens == trained_tokens
    # under grad, the model's flags are left alone (training must not get gradients for frozen weights)
    from toolgym.precision import autocast_context

    head = model.get_output_embeddings().weight
    head.requires_grad_(False)
    with torch.no_grad(), autocast_context("cpu", "bfloat16", model):
        assert head.requires_grad
    assert not head.requires_grad
    with autocast_context("cpu", "bfloat16", model):
        assert not head.requires_grad


def test_greedy_processed_logprobs_equal_the_full_scores_path_and_a_teacher_forced_forward(tok):
    """Greedy ``processed_logprobs`` come from a (B,) record per step (max - logsumexp), not from (B, V) scores kept
    per step: the same tokens and log-probabilities as the raw-logits path (greedy has no processors) and as one
    forward over prompt + completion."""
    model = tiny_random_model(tok, seed=3).eval()
    reqs = _requests(tok)
    fast = TransformersPolicy(model, tok, do_sample=False, return_logprobs=True, turn_cache_mb=0).generate(reqs)
    full = TransformersPolicy(model, tok, do_sample=False, return_logprobs=True, logprobs_mode="raw_logprobs",
                              turn_cache_mb=0).generate(reqs)
    assert [g.token_ids for g in fast] == [g.token_ids for g in full]
    for f, r, req in zip(fast, full, reqs, strict=True):
        assert f.logprobs == pytest.approx(r.logprobs, abs=1e-5)
        ids = torch.tensor([req.prompt_ids + f.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        n = len(req.prompt_ids)
        forced = [float(logp[n - 1 + j, t]) for j, t in enumerate(f.token_ids)]
        assert f.logprobs == pytest.approx(forced, abs=1e-4)
