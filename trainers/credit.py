"""Turn-level credit assignment: per-turn advantages from per-turn (process) rewards, in pure numpy.

Engine-independent on purpose: nothing here imports torch, TRL or verl, so the TRL subclass
(:mod:`trainers.grpo.trainer`) and the verl adapter register the *same* estimator math. Inputs are plain Python
sequences; outputs are lists of floats (one advantage per turn per episode) and a numpy array per token.

Notation: episode ``i`` has ``K_i`` turns with per-turn (process) rewards ``r[i][0..K_i-1]`` and an outcome
reward ``o[i]``; its reward sequence is ``u[i][k] = r[i][k]`` for ``k < K_i - 1`` and ``u[i][K_i-1] = r[i][K_i-1]
+ o[i]`` (the outcome arrives with the last turn, as the env's step rewards do); the episode return is
``R_i = o[i] + sum_k r[i][k]`` (``Trajectory.reward``). ``group_ids[i]`` says which episodes were sampled from the
same prompt. ``scale`` mirrors TRL's ``scale_rewards``: ``"group"`` (divide by the group's std + ``EPS``),
``"batch"`` (by the whole batch's std + ``EPS``), ``"none"``. Standard deviations use Bessel's correction (as
torch and TRL do); a group of one episode has std 0.

Estimators (``ESTIMATORS``):

``outcome``
    TRL's GRPO: ``A[i][k] = (R_i - mean_g R) / (std_g R + EPS)`` for every turn ``k`` -- exactly the per-sequence
    advantage TRL 1.16 computes for one reward function with ``multi_objective_aggregation="sum_then_normalize"``
    (``gamma`` is ignored).

``turn_return``
    Discounted reward-to-go per turn, ``G[i][k] = sum_{j>=k} gamma^(j-k) u[i][j]``, minus a **per-turn-index group
    baseline over all episodes of the group, where an episode that ended before turn ``k`` counts as return 0**
    (a finished episode earns nothing more: the absorbing state):
    ``b[g][k] = (1/N_g) sum_{j in g} G~[j][k]`` with ``G~[j][k] = G[j][k]`` if ``k < K_j`` else ``0``;
    ``A[i][k] = (G[i][k] - b[g][k]) / (s_g + EPS)`` where ``s_g`` is the std of the group's episode returns
    ``G[j][0]`` (the same scale GRPO uses; when it is 0 but the centred turn returns are not, the std of the
    centred, zero-padded returns of the group is used instead, so a group whose episodes tie on the total but
    differ turn by turn still gets a finite signal).

    Why this estimator (verl RFC #7244): the MT-GRPO-style construction normalises each turn's *reward* per turn
    index over the episodes that reached that index and sums the normalised rewards from ``k`` on; the baseline
    it subtracts from turn ``k`` then has one term per later turn of the episode itself, so its size depends on
    the episode's own stopping turn -- an action-dependent baseline, biased whenever the policy decides when to
    stop (a hidden ``-E[R_intermediate]`` bonus per extra turn). Here the baseline subtracted from turn ``k`` is
    **one number per (group, turn index)**, computed with every episode of the group (short ones padded with 0),
    so it never depends on how many turns the episode itself took. Property tested in ``tests/test_credit.py``:
    two episodes of one group with the same return from turn ``k`` get the same advantage at ``k`` whatever their
    turn counts; and at ``gamma = 1`` turn 0's advantage equals the ``outcome`` advantage. Including the episode
    itself in its baseline (as GRPO does) is exactly ``(N_g-1)/N_g`` times the leave-one-out estimator, whose
    baseline is independent of the episode: the direction is unbiased, only its scale shrinks.

``gigpo``
    GiGPO (Feng et al., 2025): ``A[i][k] = A_E[i] + omega * A_S[i][k]``; ``A_E`` is the ``outcome`` advantage and
    ``A_S`` a step-level advantage among the turns of the same group that **start from the same env state**
    (same ``anchors[i][k]``, e.g. :func:`anchor_key` of the tokens before the turn): within an anchor set,
    ``A_S = (G - mean G) / (std G + EPS)`` of the discounted returns from that turn (``scale="none"``: mean only).
    A turn whose anchor state no other turn of its group shares gets ``A_S = 0``. Without ``anchors`` every turn
    index of a group is taken as one state only when it is turn 0 (all episodes of a group start from the prompt);
    other turns get ``A_S = 0``.

Tokens: :func:`token_advantages` spreads one episode's per-turn advantages over its completion tokens: each
turn's policy tokens (``loss_mask == 1`` inside the turn's action span) get that turn's advantage, every env token
0.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "EPS",
    "ESTIMATORS",
    "SCALES",
    "anchor_key",
    "check_estimator",
    "episode_returns",
    "token_advantages",
    "turn_advantages",
    "turn_returns",
]

#: The estimators :func:`turn_advantages` knows (see the module docstring).
ESTIMATORS = ("outcome", "turn_return", "gigpo")
#: Reward scaling modes, as TRL's ``scale_rewards``.
SCALES = ("group", "batch", "none")
#: Added to a standard deviation before dividing (TRL's constant).
EPS = 1e-4


def check_estimator(name: str) -> str:
    """``name`` if it is one of :data:`ESTIMATORS`, else a ``ValueError`` listing them."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    return name


def _std(x: np.ndarray) -> float:
    """Sample std with Bessel's correction; 0 for fewer than 2 values (torch/TRL give NaN there, and TRL then
    produces an advantage of 0 for a one-sample group: dividing ``0`` by ``0 + EPS`` gives the same)."""
    return float(np.std(x, ddof=1)) if x.size > 1 else 0.0


def episode_returns(turn_rewards: Sequence[Sequence[float]], outcome: Sequence[float]) -> np.ndarray:
    """``R_i = outcome[i] + sum(turn_rewards[i])``, shape ``(N,)``."""
    return np.array([float(o) + float(np.sum(np.asarray(r, dtype=np.float64))) for r, o in
                     zip(turn_rewards, outcome, strict=True)], dtype=np.float64)


def turn_returns(turn_rewards: Sequence[float], outcome: float, gamma: float = 1.0) -> np.ndarray:
    """Discounted reward-to-go of one episode, shape ``(K,)``: ``G[k] = sum_{j>=k} gamma^(j-k) u[j]`` with the
    outcome added to the last turn's reward. An episode without turns gives an empty array."""
    u = np.asarray(turn_rewards, dtype=np.float64).copy()
    if u.size == 0:
        return u
    u[-1] += float(outcome)
    g = np.empty_like(u)
    acc = 0.0
    for k in range(u.size - 1, -1, -1):
        acc = u[k] + gamma * acc
        g[k] = acc
    return g


def anchor_key(token_ids: Sequence[int]) -> int:
    """A 63-bit key of an env state given as the token ids seen so far (prompt + completion before a turn):
    equal token sequences give equal keys in every process (blake2b, not Python's salted ``hash``); fits an int64
    tensor for a cross-process gather."""
    data = np.asarray(token_ids, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        out[g].append(i)
    return out


def _outcome(returns: np.ndarray, groups: dict[Hashable, list[int]], scale: str) -> np.ndarray:
    adv = np.zeros_like(returns)
    batch_std = _std(returns)
    for idx in groups.values():
        r = returns[idx]
        centred = r - r.mean()
        if scale == "group":
            centred = centred / (_std(r) + EPS)
        elif scale == "batch":
            centred = centred / (batch_std + EPS)
        adv[idx] = centred
    return adv


def _turn_return(
    rets: list[np.ndarray], groups: dict[Hashable, list[int]], scale: str, batch_std: float,
) -> list[np.ndarray]:
    out: list[np.ndarray] = [np.zeros_like(g) for g in rets]
    for idx in groups.values():
        kmax = max((rets[i].size for i in idx), default=0)
        if kmax == 0:
            continue
        padded = np.zeros((len(idx), kmax))
        for row, i in enumerate(idx):
            padded[row, : rets[i].size] = rets[i]
        baseline = padded.mean(axis=0)  # one number per turn index; finished episodes count 0
        if scale == "group":
            s = _std(padded[:, 0])
            if s < 1e-8:
                centred = np.concatenate([rets[i] - baseline[: rets[i].size] for i in idx])
                s = _std(centred) if np.any(np.abs(centred) > 1e-12) else 0.0
        elif scale == "batch":
            s = batch_std
        else:
            s = None
        for i in idx:
            a = rets[i] - baseline[: rets[i].size]
            out[i] = a if s is None else a / (s + EPS)
    return out


def _gigpo(
    rets: list[np.ndarray], episode_adv: np.ndarray, group_ids: Sequence[Hashable],
    anchors: Sequence[Sequence[Hashable]] | None, scale: str, omega: float,
) -> list[np.ndarray]:
    sets: dict[tuple[Hashable, Hashable], list[tuple[int, int]]] = defaultdict(list)
    for i, g in enumerate(rets):
        for k in range(g.size):
            if anchors is not None:
                key: Hashable = anchors[i][k]
            elif k == 0:
                key = ("__start__",)
            else:
                continue
            sets[(group_ids[i], key)].append((i, k))
    step = [np.zeros_like(g) for g in rets]
    for members in sets.values():
        if len(members) < 2:
            continue
        vals = np.array([rets[i][k] for i, k in members])
        centred = vals - vals.mean()
        if scale != "none":
            centred = centred / (_std(vals) + EPS)
        for (i, k), a in zip(members, centred, strict=True):
            step[i][k] = a
    return [episode_adv[i] + omega * step[i] for i in range(len(rets))]


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    outcome: Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    estimator: str,
    gamma: float = 1.0,
    anchors: Sequence[Sequence[Hashable]] | None = None,
    scale: str = "group",
    omega: float = 1.0,
) -> list[list[float]]:
    """One advantage per turn per episode.

    Args:
        turn_rewards: per episode, its per-turn (process) rewards, ``K_i`` floats (``K_i`` may differ, may be 0).
        outcome: per episode, the outcome reward (added to the last turn's reward).
        group_ids: per episode, a hashable group key (episodes sampled from the same prompt share it).
        estimator: one of :data:`ESTIMATORS`.
        gamma: discount per turn for ``turn_return`` and ``gigpo``'s step returns (``0 < gamma <= 1``).
        anchors: ``gigpo`` only: per episode, one hashable env-state key per turn (:func:`anchor_key`).
        scale: ``group`` / ``batch`` / ``none`` (TRL's ``scale_rewards``).
        omega: ``gigpo`` only: weight of the step-level advantage.

    Returns:
        ``len(turn_rewards)`` lists; list ``i`` has ``K_i`` floats. Raises ``ValueError`` on unknown estimator or
        scale, mismatched lengths, ``gamma`` outside ``(0, 1]`` or anchors not matching the turn counts.
    """
    check_estimator(estimator)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; known: {', '.join(SCALES)}")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    n = len(turn_rewards)
    if len(outcome) != n or len(group_ids) != n:
        raise ValueError(f"turn_rewards ({n}), outcome ({len(outcome)}) and group_ids ({len(group_ids)}) "
                         "must have one entry per episode")
    if anchors is not None:
        if len(anchors) != n:
            raise ValueError(f"anchors has {len(anchors)} episodes, expected {n}")
        for i, (a, r) in enumerate(zip(anchors, turn_rewards, strict=True)):
            if len(a) != len(r):
                raise ValueError(f"episode {i}: {len(a)} anchors for {len(r)} turns")
    groups = _groups(group_ids)
    totals = episode_returns(turn_rewards, outcome)
    if estimator == "outcome":
        adv = _outcome(totals, groups, scale)
        return [[float(adv[i])] * len(turn_rewards[i]) for i in range(n)]
    rets = [turn_returns(r, o, gamma) for r, o in zip(turn_rewards, outcome, strict=True)]
    if estimator == "turn_return":
        starts = np.array([g[0] if g.size else 0.0 for g in rets])
        res = _turn_return(rets, groups, scale, _std(starts))
    else:
        res = _gigpo(rets, _outcome(totals, groups, scale), group_ids, anchors, scale, omega)
    return [[float(x) for x in a] for a in res]


def token_advantages(
    turn_advantages: Sequence[float], turn_spans: Sequence[Sequence[int]], loss_mask: Sequence[int] | Any,
    length: int | None = None,
) -> np.ndarray:
    """One episode's per-token advantages, shape ``(length or len(loss_mask),)`` float32.

    Args:
        turn_advantages: ``K`` floats, one per turn.
        turn_spans: ``K`` ``(start, end)`` action spans ``[start, end)`` in the completion (``Turn.action_start``,
            ``Turn.action_end``); spans past ``len(loss_mask)`` (a clipped episode) are cut.
        loss_mask: 1 on policy tokens, 0 on env tokens (the trajectory's ``loss_mask``).
        length: pad (with 0) or cut to this many tokens (a padded batch's width).

    Each turn's policy tokens get its advantage, every env token (mask 0, in or out of a span) 0. A policy token
    outside every span is a ``ValueError`` (the spans do not describe this completion).
    """
    mask = np.asarray(loss_mask, dtype=np.int64)
    if len(turn_advantages) != len(turn_spans):
        raise ValueError(f"{len(turn_advantages)} turn advantages for {len(turn_spans)} turn spans")
    out = np.zeros(mask.size, dtype=np.float32)
    covered = np.zeros(mask.size, dtype=bool)
    for a, span in zip(turn_advantages, turn_spans, strict=True):
        s, e = int(span[0]), int(span[1])
        if s < 0 or s > e:
            raise ValueError(f"bad turn span {tuple(span)}")
        s, e = min(s, mask.size), min(e, mask.size)  # a turn that starts past a clipped completion's end: empty
        out[s:e] = a
        covered[s:e] = True
    if np.any((mask == 1) & ~covered):
        first = int(np.flatnonzero((mask == 1) & ~covered)[0])
        raise ValueError(f"policy token {first} lies outside every turn span")
    out[mask == 0] = 0.0
    if length is not None:
        out = out[:length] if length <= out.size else np.pad(out, (0, length - out.size))
    return out
