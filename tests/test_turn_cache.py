"""toolgym.rollout.turn_cache: an episode's next turn prefills only what the env appended, with the same tokens.

The embedded SmolLM2-135M-Instruct (a random tiny model greedily repeats one token), CPU: a batch of episodes is
generated for one turn, the "env" appends tokens, and the second turn is generated once over the kept keys and values
and once from scratch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from toolgym.models import load_model  # noqa: E402
from toolgym.rollout import GenerationRequest, TransformersPolicy, TurnCache  # noqa: E402


@pytest.fixture(scope="module")
def smol():
    model, tok = load_model()
    return model.eval(), tok


def _prompts(tok):
    texts = ["What is 2+2?", "Compute 12 * 7 - 3, then answer with the number.", "Hi"]
    out = []
    for t in texts:
        text = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out  # different lengths: left padding


def _policy(model, tok, *, kept: bool, **kw):
    return TransformersPolicy(model, tok, do_sample=False, return_logprobs=True, logprobs_mode="raw_logprobs",
                              turn_cache_mb=64 if kept else 0, **kw)


def _two_turns(model, tok, policy, stop_ids, *, new_tokens=(7, 3, 11)):
    """Turn 1 on the three prompts, then turn 2 = each episode so far + a few 'env' tokens."""
    prompts = _prompts(tok)
    first = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=6, stop_ids=stop_ids) for p in prompts])
    env = [[int(x) for x in tok(" result: 84\n", add_special_tokens=False)["input_ids"]][:n] for n in new_tokens]
    second_prompts = [p + g.token_ids + e for p, g, e in zip(prompts, first, env, strict=True)]
    second = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=5, stop_ids=stop_ids)
                              for p in second_prompts])
    return first, second


@pytest.mark.parametrize("autocast", [None, "bfloat16"])
def test_the_second_turn_runs_on_kept_keys_and_values_with_the_same_tokens(smol, autocast):
    model, tok = smol
    # a stop id that row 0 samples at its 3rd step: that row stops early, the others run to the budget
    probe = _policy(model, tok, kept=False, autocast=autocast).generate(
        [GenerationRequest(prompt_ids=_prompts(tok)[0], max_new_tokens=6, stop_ids=[])])[0]
    stop = [probe.token_ids[2]]
    ref_policy = _policy(model, tok, kept=False, autocast=autocast)
    ref_first, ref_second = _two_turns(model, tok, ref_policy, stop)
    policy = _policy(model, tok, kept=True, autocast=autocast)
    first, second = _two_turns(model, tok, policy, stop)
    assert [g.token_ids for g in first] == [g.token_ids for g in ref_first]
    assert len(first[0].token_ids) <= 3 < max(len(g.token_ids) for g in first)  # one row stopped early
    assert policy.turn_cache.hits == 1 and policy.turn_cache.saved_tokens > 0
    if autocast is None:  # float32: the kept keys and values are the recomputed ones to rounding
        assert [g.token_ids for g in second] == [g.token_ids for g in ref_second]
        for a, b in zip(second, ref_second, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    else:
        for a, b in zip(second, ref_second, strict=True):
            _same_until_a_near_tie(a, b, tol=0.2)  # bfloat16: a logit of ~10 is rounded to ~0.06
    assert len(policy.turn_cache) == 3  # the second turn's rows, kept for a third; the first turn's were used


def _same_until_a_near_tie(a, b, *, tol: float) -> None:
    """bfloat16 keys computed in a decoding step and in a prefill round differently (the kernels and their
    accumulation order differ between CPUs): greedy decoding then agrees token for token, except where two tokens
    were within rounding of each other. Each step's log-probability agrees to ``tol``; where the tokens part, both
    choices had log-probabilities within ``tol`` (a near-tie), and nothing after that point is compared."""
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)):
        assert a.logprobs[i] == pytest.approx(b.logprobs[i], abs=tol), (i, a.token_ids, b.token_ids)
        if x != y:
            return
    assert len(a.token_ids) == len(b.token_ids)


def test_a_batch_with_a_row_that_has_no_kept_prefix_prefills_as_before(smol):
    model, tok = smol
    policy = _policy(model, tok, kept=True)
    prompts = _prompts(tok)
    first = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in prompts[:2]])
    second = [p + g.token_ids + [42] for p, g in zip(prompts, first, strict=False)] + [prompts[2]]
    out = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
    ref = _policy(model, tok, kept=False).generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
    assert policy.turn_cache.hits == 0 and policy.turn_cache.misses == 2
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]


def test_rows_that_continue_kept_ones_are_batched_first(smol):
    """With batches of 2, the rows with kept keys and values form their own whole batch, run first (before newer
    rows push theirs out of the cache); the outputs come back in the callers' order."""
    model, tok = smol
    prompts = _prompts(tok)
    policy = _policy(model, tok, kept=True, max_batch_size=2)
    first = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in prompts])
    assert len(policy.turn_cache) == 3
    policy.turn_cache.clear()  # keep rows 1 and 2 only: run them again, together
    again = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in prompts[1:]])
    assert [g.token_ids for g in again] == [g.token_ids for g in first[1:]]
    second = [p + g.token_ids + [42] for p, g in zip(prompts, first, strict=True)]
    out = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
    assert policy.turn_cache.hits == 1  # the batch [row 1, row 2] ran on its kept rows; [row 0] prefilled
    ref = _policy(model, tok, kept=False, max_batch_size=1).generate(
        [GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]  # in the callers' order
    # a part batch of kept rows is prefilled with the others instead: one call fewer than a batch of its own
    policy.turn_cache.clear()
    policy.generate([GenerationRequest(prompt_ids=prompts[0], max_new_tokens=4)])
    hits, calls = policy.turn_cache.hits, policy.calls
    policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
    assert policy.turn_cache.hits == hits and policy.calls == calls + 2


def test_kept_rows_are_dropped_when_the_weights_change_in_place(smol):
    model, tok = smol
    policy = _policy(model, tok, kept=True)
    prompts = _prompts(tok)
    first = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in prompts])
    weight = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        weight.mul_(1.5)  # what an optimizer step does: an in-place update
    try:
        second = [p + g.token_ids + [42] for p, g in zip(prompts, first, strict=True)]
        out = policy.generate([GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
        assert policy.turn_cache.hits == 0
        ref = _policy(model, tok, kept=False).generate(
            [GenerationRequest(prompt_ids=p, max_new_tokens=4) for p in second])
        assert [g.token_ids for g in out] == [g.token_ids for g in ref]
    finally:
        with torch.no_grad():
            weight.div_(1.5)


def test_the_cache_keeps_at_most_max_bytes():
    from transformers import DynamicCache

    def layer_cache():  # one full-attention layer: (rows, kv heads, width 2 + 3 sampled - 1 fed, head dim)
        c = DynamicCache()
        c.update(torch.zeros(2, 2, 4, 8), torch.zeros(2, 2, 4, 8), 0)
        return c

    cache = TurnCache(max_bytes=1100)  # a row below: 2 x (2 heads x 4 positions x 8 dims) float32 = 512 bytes
    model = torch.nn.Linear(2, 2)
    ids = torch.tensor([[1, 2], [3, 4]])
    seqs = torch.tensor([[1, 2, 5, 6, 9], [3, 4, 7, 8, 9]])
    cache.keep(model, layer_cache(), ids, torch.ones_like(ids), seqs, stop_ids=[9])
    assert len(cache) == 2 and cache.nbytes == 1024
    assert cache.extends_a_kept_row([1, 2, 5, 6, 9, 0]) and cache.extends_a_kept_row([3, 4, 7, 8, 1])
    assert not cache.extends_a_kept_row([1, 2, 5, 6])  # no new token
    seqs2 = torch.tensor([[5, 5, 1, 1, 1], [6, 6, 2, 2, 2]])
    cache.keep(model, layer_cache(), torch.tensor([[5, 5], [6, 6]]), torch.ones_like(ids), seqs2, stop_ids=[9])
    assert len(cache) == 2 and cache.nbytes == 1024  # the oldest went first
    assert not cache.extends_a_kept_row([1, 2, 5, 6, 9, 0]) and cache.extends_a_kept_row([5, 5, 1, 1, 3])


def test_without_a_reserved_cache_the_second_turn_still_runs_on_kept_rows(smol):
    """``reserve_cache=False``: the call runs on a ``DynamicCache`` the policy passes in, so its rows can be kept."""
    model, tok = smol
    stop = []
    ref_first, ref_second = _two_turns(model, tok, _policy(model, tok, kept=False, reserve_cache=False), stop)
    policy = _policy(model, tok, kept=True, reserve_cache=False)
    first, second = _two_turns(model, tok, policy, stop)
    assert policy.turn_cache.hits == 1
    assert [g.token_ids for g in second] == [g.token_ids for g in ref_second]


def test_a_sliding_window_model_keeps_nothing():
    """A sliding-window layer holds only its last positions: no row of it is kept, and generation is unchanged."""
    from transformers import MistralConfig, MistralForCausalLM

    from toolgym.models import load_tokenizer

    tok = load_tokenizer()
    model = MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             sliding_window=28)).eval()  # past the prompts, not the turns
    for reserve in (True, False):
        ref = _two_turns(model, tok, _policy(model, tok, kept=False, reserve_cache=reserve), [])
        policy = _policy(model, tok, kept=True, reserve_cache=reserve)
        out = _two_turns(model, tok, policy, [])
        assert len(policy.turn_cache) == 0 and policy.turn_cache.hits == 0
        assert [[g.token_ids for g in turn] for turn in out] == [[g.token_ids for g in turn] for turn in ref]
