"""Generation.from_sampled: the one post-processing path of sampled ids (cut at stop, budget, logprobs, reason)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from toolgym.rollout import Generation

STOP = (2, 9)


def test_cut_after_the_first_stop_id_in_the_middle():
    g = Generation.from_sampled([5, 6, 9, 7, 2, 8], [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6], STOP, 10)
    assert g.token_ids == [5, 6, 9]  # the stop id is kept, nothing after it
    assert g.logprobs == [-0.1, -0.2, -0.3]
    assert g.finish_reason == "stop" and g.stopped


def test_no_stop_id_reads_length_or_the_backend_reason():
    g = Generation.from_sampled([5, 6, 7], [-1.0, -2.0, -3.0], STOP, 10)
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([5, 6, 7], [-1.0, -2.0, -3.0], "length")
    assert not g.stopped
    # a server that stopped on its own end-of-sequence id (not one of ours) says so
    g = Generation.from_sampled([5, 6], [-1.0, -2.0], STOP, 10, finish_reason="stop")
    assert g.finish_reason == "stop"


def test_over_budget_is_trimmed_and_reads_length_even_with_a_later_stop():
    g = Generation.from_sampled([5, 6, 7, 8, 2], [-1.0, -2.0, -3.0, -4.0, -5.0], STOP, 3, finish_reason="stop")
    assert g.token_ids == [5, 6, 7]
    assert g.logprobs == [-1.0, -2.0, -3.0]
    assert g.finish_reason == "length"
    g = Generation.from_sampled([5, 6], None, STOP, 0)
    assert g.token_ids == [] and g.finish_reason == "length"


def test_stop_within_the_budget_wins_over_the_budget():
    g = Generation.from_sampled([5, 2, 7, 8], [-1.0] * 4, STOP, 2)
    assert g.token_ids == [5, 2] and g.finish_reason == "stop"


def test_non_finite_logprobs_are_sanitised_once():
    nan, inf = float("nan"), float("inf")
    g = Generation.from_sampled([5, 6, 7, 8], [nan, -inf, inf, None], STOP, 10)
    assert g.logprobs == [0.0, 0.0, 0.0, 0.0]
    g = Generation.from_sampled([5, 6], [nan, -0.5], STOP, 10, non_finite=float("nan"))
    assert g.logprobs is not None and math.isnan(g.logprobs[0]) and g.logprobs[1] == -0.5


def test_logprobs_none_and_misaligned_logprobs():
    assert Generation.from_sampled([5, 6, 2], None, STOP, 10).logprobs is None
    # fewer logprobs than kept ids cannot be aligned: dropped, never guessed
    assert Generation.from_sampled([5, 6, 7], [-1.0], STOP, 10).logprobs is None
    # more logprobs than kept ids (padding after a stop): trimmed
    assert Generation.from_sampled([5, 2, 0, 0], [-1.0, -2.0, -3.0, -4.0], STOP, 10).logprobs == [-1.0, -2.0]


def test_nested_top_k_logprobs_and_any_int_type():
    ids = np.array([5, 6, 9], dtype=np.int64)
    g = Generation.from_sampled(ids, [[-0.1, -2.0], [-0.2], []], STOP, 10)
    assert g.token_ids == [5, 6, 9] and all(type(t) is int for t in g.token_ids)
    assert g.logprobs == [-0.1, -0.2, 0.0]  # an empty entry is missing -> NaN -> sanitised


@pytest.mark.parametrize("budget", [1, 2, 5])
def test_invariants_hold_for_random_rows(budget):
    rng = np.random.default_rng(budget)
    for _ in range(200):
        ids = rng.integers(0, 12, size=int(rng.integers(0, 8))).tolist()
        lps = rng.normal(size=len(ids)).tolist()
        g = Generation.from_sampled(ids, lps, STOP, budget)
        assert len(g.token_ids) <= budget
        assert g.token_ids == ids[: len(g.token_ids)]
        assert g.logprobs == lps[: len(g.token_ids)]
        assert sum(t in STOP for t in g.token_ids) <= 1
        assert (g.finish_reason == "stop") == (bool(g.token_ids) and g.token_ids[-1] in STOP)
