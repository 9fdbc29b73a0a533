"""toolgym.rollout.shared_prefix: rows of a generation call with the same prompt prefill it once, with the tokens and
log-probabilities of the unshared call.

The embedded SmolLM2-135M-Instruct in float32 on the CPU (a random tiny model greedily repeats one token): groups of
different sizes and prompts of different lengths (left padding) in one call, sampled with the per-episode seeded
sampler and greedily; the forwards the model runs are recorded by a hook (rows x columns of each call), so "once per
distinct prompt" is counted, not timed. GRPO's transformers generation (``TRLPolicy``) is checked the same way.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="shared-prefix generation runs the model with torch")

from toolgym.models import load_model  # noqa: E402
from toolgym.rollout import GenerationRequest, TransformersPolicy  # noqa: E402
from toolgym.rollout.shared_prefix import prompt_groups, shared_prefill  # noqa: E402
from toolgym.rollout.types import EpisodeState  # noqa: E402

TEXTS = (
    "A shop sells pencils at 3 dollars each and notebooks at 7 dollars each. Ana buys 4 pencils and 2 notebooks, "
    "then returns one notebook. How much did she spend in the end? Show the computation step by step.",
    "What is 2+2?",
    "Name a prime number larger than 10.",
)
GROUPS = (3, 2, 1)  # copies of TEXTS[0], TEXTS[1], TEXTS[2], adjacent as in a GRPO batch


@pytest.fixture(scope="module")
def smol():
    model, tok = load_model()
    return model.eval(), tok


def _encode(tok, text: str) -> list[int]:
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return list(tok(chat, add_special_tokens=False)["input_ids"])


def _requests(tok, *, turn: int = 0, max_new: int = 8, groups=GROUPS) -> list[GenerationRequest]:
    out = []
    for text, n in zip(TEXTS, groups, strict=True):
        ids = _encode(tok, text)
        for _ in range(n):
            out.append(GenerationRequest(prompt_ids=ids, max_new_tokens=max_new,
                                         episode=EpisodeState(index=len(out), task={}, turn=turn)))
    return out


class Forwards:
    """The ``(rows, columns)`` of every forward of ``model`` while entered (the probe forwards of the reserved
    cache, one row and one column, are left out)."""

    def __init__(self, model) -> None:
        self.model, self.shapes = model, []

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        if tuple(ids.shape) != (1, 1):
            self.shapes.append(tuple(ids.shape))

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    @property
    def prefill_tokens(self) -> int:
        """Tokens of the forwards over more than one column (the prefills; decoding steps take one column)."""
        return sum(r * c for r, c in self.shapes if c > 1)


def _generate(model, tok, requests, *, shared: bool, **kw):
    policy = TransformersPolicy(model, tok, shared_prefix=shared, turn_cache_mb=0, **kw)
    with Forwards(model) as fw:
        gens = policy.generate(requests)
    return gens, fw, policy


def _assert_same(gens, ref, *, first_steps: int = 4, tol: float = 1e-5) -> None:
    for a, b in zip(gens, ref, strict=True):
        assert a.token_ids == b.token_ids
        # the first steps to 1e-5, absolute or relative (keys of a batch of distinct prompts vs of every row: float32
        # rounding only; a log-probability of -7 differs by ~1e-5 absolute, 2e-6 relative)
        assert a.logprobs[:first_steps] == pytest.approx(b.logprobs[:first_steps], rel=tol, abs=tol)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_prompt_groups_ignore_padding_and_keep_row_order():
    ids = torch.tensor([[0, 0, 5, 6], [0, 0, 5, 6], [7, 5, 6, 8], [0, 0, 0, 9], [0, 0, 5, 6]])
    attn = (ids != 0).long()
    assert prompt_groups(ids, attn) == ([0, 2, 3], [0, 0, 1, 2, 0])
    # the same tokens under other padding are the same prompt
    ids2 = torch.tensor([[0, 5, 6], [5, 6, 3]])
    assert prompt_groups(torch.cat([ids2, ids2]), torch.cat([ids2 != 0, ids2 != 0]).long()) == ([0, 1], [0, 1, 0, 1])


def test_nothing_is_shared_without_a_repeated_prompt(smol):
    model, tok = smol
    a, b = _encode(tok, TEXTS[1]), _encode(tok, TEXTS[2])
    width = max(len(a), len(b))
    rows = [[0] * (width - len(p)) + p for p in (a, b)]
    ids = torch.tensor(rows)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in (a, b)])
    with torch.no_grad():
        assert shared_prefill(model, ids, attn) is None
        one = torch.tensor([[0, 9], [0, 9]])  # a repeated one-token prompt: nothing to prefill before its last token
        assert shared_prefill(model, one, (one != 0).long()) is None


@pytest.mark.parametrize("do_sample", [True, False], ids=["seeded-sampling", "greedy"])
def test_a_shared_prompt_is_prefilled_once_with_the_unshared_tokens(smol, do_sample):
    """Groups of 3, 2 and 1 copies of prompts of different lengths: the same tokens and log-probabilities as the
    unshared call; the prefill runs once per distinct prompt (3 rows, not 6) and every row's last prompt column
    once more, with the decoding."""
    model, tok = smol
    requests = _requests(tok)
    kw = {"temperature": 1.0, "seed": 11} if do_sample else {"do_sample": False}
    ref, ref_fw, _ = _generate(model, tok, requests, shared=False, **kw)
    gens, fw, policy = _generate(model, tok, requests, shared=True, **kw)
    _assert_same(gens, ref)
    width = max(len(r.prompt_ids) for r in requests)
    assert ref_fw.shapes[0] == (6, width)  # unshared: every row's whole (padded) prompt
    assert fw.shapes[0] == (3, width - 1)  # shared: each distinct prompt once, all but its last column
    assert fw.shapes[1] == (6, 1)  # then every row from the prompt's last column on, over the shared keys
    assert fw.prefill_tokens == 3 * (width - 1)
    lengths = [len(r.prompt_ids) for r in requests]
    assert policy.shared_tokens == (lengths[1] - 1) * 2 + (lengths[4] - 1)  # the copies' prompts not prefilled
    if do_sample:  # the seeded per-episode sampler gives the copies of one prompt different samples
        assert len({tuple(g.token_ids) for g in gens[:3]}) > 1


def test_groups_split_by_the_batch_size_share_within_each_batch(smol):
    """``max_batch_size=4`` over 6 rows: the first batch holds 3 + 1 copies, the second 1 + 1; each prefills its
    distinct prompts once, and the tokens are the unshared ones."""
    model, tok = smol
    requests = _requests(tok)
    ref, _, _ = _generate(model, tok, requests, shared=False, temperature=1.0, seed=5, max_batch_size=4)
    gens, fw, _ = _generate(model, tok, requests, shared=True, temperature=1.0, seed=5, max_batch_size=4)
    _assert_same(gens, ref)
    prefills = [s for s in fw.shapes if s[1] > 1]
    assert [r for r, _ in prefills] == [2, 2]  # batch 1: prompts 0 and 1; batch 2: prompts 1 and 2


def test_the_second_turn_is_not_shared(smol):
    """Turn 1 shares each group's prompt; turn 2's prompts carry each row's own sample (and the env's reply), so
    they run as before: on the kept keys and values (turn cache on) or prefilled row by row (off), with the
    unshared tokens either way."""
    model, tok = smol
    reply = [int(x) for x in tok(" result: 84\n", add_special_tokens=False)["input_ids"]]

    def two_turns(shared: bool, turn_cache_mb: float):
        policy = TransformersPolicy(model, tok, temperature=1.0, seed=3, shared_prefix=shared,
                                    turn_cache_mb=turn_cache_mb)
        first_requests = _requests(tok, max_new=5)
        first = policy.generate(first_requests)
        after_first = policy.shared_tokens
        second_requests = [
            GenerationRequest(prompt_ids=r.prompt_ids + g.token_ids + reply, max_new_tokens=5,
                              episode=EpisodeState(index=r.episode.index, task={}, turn=1))
            for r, g in zip(first_requests, first, strict=True)]
        with Forwards(model) as fw:
            second = policy.generate(second_requests)
        return first, second, policy, after_first, fw

    ref_first, ref_second, *_ = two_turns(False, 0)
    for turn_cache_mb in (64, 0):
        first, second, policy, after_first, fw = two_turns(True, turn_cache_mb)
        _assert_same(first, ref_first)
        # kept keys (turn cache) were computed while decoding: to rounding, as in tests/test_turn_cache.py
        _assert_same(second, ref_second, tol=1e-4 if turn_cache_mb else 1e-5)
        assert after_first > 0
        assert policy.shared_tokens == after_first  # nothing shared in turn 2
        assert fw.shapes[0][0] == 6  # turn 2's first forward covers every row
        if turn_cache_mb:
            assert policy.turn_cache.hits == 1  # turn 2 ran on the kept rows


# --- GRPO's transformers generation --------------------------------------------------------------------------------


def _trainer(tmp_path, model, tok):
    pytest.importorskip("trl", reason="GRPO needs the [train] extra (trl)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig

    from trainers.grpo import Config, build_trainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=16, max_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0, bf16=False,
                      disable_tqdm=True)
    tasks = [{"id": "t0", "prompt": "What is 2+3?", "answer": 5}]
    trainer, _ = build_trainer(Config(max_turn_tokens=8, trl=args), model=model, tokenizer=tok, tasks=tasks)
    return trainer


def test_grpo_generation_prefills_a_group_once_with_the_same_tokens(smol, tmp_path):
    """``TRLPolicy`` on TRL's transformers path: the same sampled tokens (torch's seeded generator, inverse-CDF
    sampling) with the shared prefix on and off; on, the prompt is prefilled for the distinct prompts only. The
    trainer's ``shared_prefix`` attribute is the default."""
    from trainers.grpo.generation import TRLPolicy

    model, tok = smol
    trainer = _trainer(tmp_path, model, tok)
    requests = _requests(tok, max_new=6)
    width = max(len(r.prompt_ids) for r in requests)
    out = {}
    for shared in (False, True):
        policy = TRLPolicy(trainer, shared_prefix=shared)
        torch.manual_seed(0)
        with Forwards(trainer.model) as fw:
            out[shared] = [g.token_ids for g in policy.generate(requests)]
        rows = 3 if shared else 6
        assert fw.shapes[0] == (rows, width - 1 if shared else width)
        assert fw.prefill_tokens == rows * (width - 1 if shared else width)
    assert out[True] == out[False]
    assert policy.shared is not None and policy.shared.calls == 1 and policy.shared.tokens > 0
    trainer.shared_prefix = False
    assert TRLPolicy(trainer).shared is None
    del trainer.shared_prefix
    assert TRLPolicy(trainer).shared is not None


def test_under_bfloat16_autocast_the_shared_prefix_rounds_within_batch_size_noise(smol):
    """bfloat16 keys of a batch of distinct prompts round differently from those of every row, as between batch
    sizes: greedy decoding's first log-probabilities agree to bfloat16 rounding (a logit of ~10 rounds to ~0.06),
    no bit-equality asserted."""
    model, tok = smol
    requests = _requests(tok, max_new=2)
    kw = {"do_sample": False, "autocast": "bfloat16", "logprobs_mode": "raw_logprobs"}
    ref, _, _ = _generate(model, tok, requests, shared=False, **kw)
    gens, fw, _ = _generate(model, tok, requests, shared=True, **kw)
    assert fw.shapes[0][0] == 3
    for a, b in zip(gens, ref, strict=True):
        assert a.logprobs[0] == pytest.approx(b.logprobs[0], abs=0.2)
