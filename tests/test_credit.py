"""trainers.credit: estimator values on hand-made trajectories (incl. groups with different turn counts)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from trainers.credit import (
    EPS,
    ESTIMATORS,
    anchor_key,
    token_advantages,
    turn_advantages,
    turn_returns,
)


def _grpo(values: list[float]) -> list[float]:
    """TRL's per-group advantage by hand: (r - mean) / (std_bessel + 1e-4)."""
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return [(v - m) / (s + EPS) for v in values]


def test_credit_imports_no_torch_or_trl():
    code = ("import sys, trainers.credit; bad = [m for m in ('torch', 'trl', 'transformers') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_outcome_is_grpo_per_episode_on_every_turn():
    tr = [[0.0, 1.0], [1.0], [0.0, 0.0, 0.0], [1.0, 1.0]]
    out = [1.0, 0.0, 0.0, 1.0]
    adv = turn_advantages(tr, out, [0, 0, 0, 0], estimator="outcome")
    want = _grpo([2.0, 1.0, 0.0, 3.0])
    assert [len(a) for a in adv] == [2, 1, 3, 2]
    for a, w in zip(adv, want, strict=True):
        assert a == pytest.approx([w] * len(a), abs=1e-12)
    # scale none: centred only; two groups normalised apart
    adv = turn_advantages([[1.0], [0.0], [5.0], [3.0]], [0, 0, 0, 0], ["a", "a", "b", "b"], estimator="outcome",
                          scale="none")
    assert [a[0] for a in adv] == [0.5, -0.5, 1.0, -1.0]


def test_turn_returns_discount_and_outcome_on_last_turn():
    assert turn_returns([1.0, 0.0, 1.0], 2.0, gamma=0.5).tolist() == [1.0 + 0.25 * 3.0, 1.5, 3.0]
    assert turn_returns([], 1.0).size == 0


def test_turn_return_values_by_hand_with_different_turn_counts():
    # group of 3: K = 3, 2, 1; process rewards in [0, 1], outcome 1 for the first only
    tr = [[1.0, 1.0, 1.0], [1.0, 0.0], [0.0]]
    out = [1.0, 0.0, 0.0]
    g = [[4.0, 3.0, 2.0], [1.0, 0.0], [0.0]]  # reward-to-go, gamma 1
    # baseline per turn index over ALL episodes, finished ones count 0
    b = [(4 + 1 + 0) / 3, (3 + 0 + 0) / 3, (2 + 0 + 0) / 3]
    s = np.std([4.0, 1.0, 0.0], ddof=1)
    adv = turn_advantages(tr, out, [7, 7, 7], estimator="turn_return")
    for a, gi in zip(adv, g, strict=True):
        assert a == pytest.approx([(x - b[k]) / (s + EPS) for k, x in enumerate(gi)], abs=1e-12)


def test_turn_return_baseline_does_not_depend_on_the_episodes_own_length():
    # episodes 0 and 1 have the same return from turn 1 (1.0) but stop at different turns: same advantage there
    tr = [[0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.0]]
    out = [0.0, 0.0, 0.0, 0.0]
    adv = turn_advantages(tr, out, [0] * 4, estimator="turn_return")
    assert adv[0][1] == pytest.approx(adv[1][1])
    assert adv[0][0] == pytest.approx(adv[1][0])
    # the biased MT-GRPO-style construction (normalise turn rewards per index over survivors, sum from k on)
    # does NOT have this property: episode 1's extra (zero-reward) turns subtract other episodes' turn-2 reward
    def survivors(tr: list[list[float]]) -> list[list[float]]:
        norm = []
        for ep in tr:
            row = []
            for k, r in enumerate(ep):
                vals = [e[k] for e in tr if len(e) > k]
                m = sum(vals) / len(vals)
                row.append(r - m)
            norm.append(row)
        return [[sum(row[k:]) for k in range(len(row))] for row in norm]
    biased = survivors(tr)
    assert biased[0][1] != pytest.approx(biased[1][1])


def test_turn_return_turn0_equals_outcome_at_gamma_1():
    rng = np.random.default_rng(0)
    tr = [list(rng.integers(0, 2, size=int(rng.integers(1, 5))).astype(float)) for _ in range(12)]
    out = list(rng.integers(0, 2, size=12).astype(float))
    gid = [i // 4 for i in range(12)]
    tret = turn_advantages(tr, out, gid, estimator="turn_return")
    outc = turn_advantages(tr, out, gid, estimator="outcome")
    assert [a[0] for a in tret] == pytest.approx([a[0] for a in outc], abs=1e-9)
    # and later turns differ from the outcome estimate (credit actually moves)
    assert any(abs(a[-1] - b[-1]) > 1e-3 for a, b in zip(tret, outc, strict=True) if len(a) > 1)


def test_turn_return_tied_totals_still_get_a_finite_turn_signal():
    # both episodes total 1, but one earned it at turn 0 and one at turn 1
    adv = turn_advantages([[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0], [0, 0], estimator="turn_return")
    assert adv[0][0] == pytest.approx(0.0) and adv[1][0] == pytest.approx(0.0)
    assert adv[0][1] < 0 < adv[1][1] and abs(adv[1][1]) < 10


def test_gigpo_episode_plus_step_advantage_among_shared_states():
    # group of 4, all start from the prompt (anchor "p"); episodes 0 and 1 reach the same state "s" at turn 1
    tr = [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0]]
    out = [1.0, 0.0, 0.0, 0.0]
    anchors = [["p", "s"], ["p", "s"], ["p", "t"], ["p"]]
    adv = turn_advantages(tr, out, [0] * 4, estimator="gigpo", anchors=anchors)
    ep = _grpo([3.0, 1.0, 0.0, 0.0])
    s0 = _grpo([3.0, 1.0, 0.0, 0.0])  # turn 0: every episode shares the prompt state, returns = totals
    s1 = _grpo([2.0, 0.0])  # turn 1 in state "s": returns 2 and 0
    assert adv[0] == pytest.approx([ep[0] + s0[0], ep[0] + s1[0]])
    assert adv[1] == pytest.approx([ep[1] + s0[1], ep[1] + s1[1]])
    assert adv[2] == pytest.approx([ep[2] + s0[2], ep[2]])  # state "t" is alone: step advantage 0
    assert adv[3] == pytest.approx([ep[3] + s0[3]])
    # the same anchor in another group is a different state set
    adv2 = turn_advantages(tr + tr, out + out, [0] * 4 + [1] * 4, estimator="gigpo", anchors=anchors + anchors)
    flat = [x for a in adv for x in a]
    assert [x for a in adv2[:4] for x in a] == pytest.approx(flat)
    assert [x for a in adv2[4:] for x in a] == pytest.approx(flat)


def test_anchor_key_is_stable_and_distinguishes_states():
    assert anchor_key([1, 2, 3]) == anchor_key(np.array([1, 2, 3]))
    assert anchor_key([1, 2, 3]) != anchor_key([1, 2, 4])
    assert 0 <= anchor_key(list(range(1000))) < 2**63
    code = "from trainers.credit import anchor_key; print(anchor_key([5, 6, 7]))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert int(other) == anchor_key([5, 6, 7])  # not Python's per-process salted hash


def test_token_advantages_policy_tokens_get_their_turn_env_tokens_zero():
    # completion: turn0 action [0,3) obs [3,5); turn1 action [5,8) with a cut eot at 7 (mask 0)
    mask = [1, 1, 1, 0, 0, 1, 1, 0]
    out = token_advantages([0.5, -2.0], [(0, 3), (5, 8)], mask, length=10)
    assert out.tolist() == [0.5, 0.5, 0.5, 0, 0, -2.0, -2.0, 0, 0, 0]
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match="outside every turn span"):
        token_advantages([1.0], [(0, 2)], [1, 1, 1])
    # a clipped completion: spans past its end are cut
    assert token_advantages([1.0, 2.0], [(0, 2), (3, 9)], [1, 1, 0, 1]).tolist() == [1, 1, 0, 2]
    # ... and a turn that starts past the clipped end has no token left
    assert token_advantages([1.0, 2.0, 3.0], [(0, 2), (3, 5), (6, 7)], [1, 1, 0, 1]).tolist() == [1, 1, 0, 2]
    with pytest.raises(ValueError, match="bad turn span"):
        token_advantages([1.0], [(3, 2)], [1, 1, 1, 1])


@pytest.mark.parametrize("bad", [
    {"estimator": "nope"}, {"estimator": "turn_return", "gamma": 0.0}, {"estimator": "outcome", "scale": "x"},
])
def test_bad_arguments_are_clear_errors(bad):
    with pytest.raises(ValueError):
        turn_advantages([[1.0]], [0.0], [0], **bad)
    assert set(ESTIMATORS) == {"outcome", "turn_return", "gigpo"}


def test_mismatched_anchors_raise():
    with pytest.raises(ValueError, match="anchors"):
        turn_advantages([[1.0, 0.0]], [0.0], [0], estimator="gigpo", anchors=[["a"]])
