"""Per-token rewards for verl: each turn's reward on that turn's **last policy token** (pure Python, no verl).

verl computes PPO's GAE (and every other advantage) from ``token_level_rewards``, a ``(batch, response_length)``
tensor built from the rollout's ``rm_scores``. By default an agent loop returns one scalar ``reward_score`` and
verl writes it on the **last response token**, whatever that token is. In a toolgym episode the last token can be
env output (a turn cut by its budget ends with a mask-0 end-of-turn token the env wrote), and verl's GAE ignores a
reward placed on a mask-0 token (measured: the advantages come out all 0). A process reward needs more anyway:
each turn's reward must reach the tokens of that turn. So the adapter writes the rewards itself:

* turn ``k``'s reward (``turn.reward``; the episode's outcome reward is added to the last turn's, exactly as the
  env's ``step`` rewards add up) goes on the last mask-1 token of turn ``k``'s action span;
* every other token (env tokens included) gets 0, so ``sum(rewards) == trajectory.reward``;
* a turn with no policy token left (an empty action, or an action clipped away by the completion budget) has
  its reward moved to the nearest policy token before it (else after it; else, with no policy token at all,
  the last token), so no reward is silently lost.

:func:`turn_ends` and :func:`turn_rewards_from_tokens` read the turns back from the loss mask: a turn's policy
tokens are one run of mask-1 tokens (toolgym episodes always have env tokens between two actions: the tool
result and the next assistant header), and its reward is what lies on the tokens it owns (its run and the env
tokens after it). The verl advantage
estimator (:mod:`trainers.verl.advantage`) uses them, because verl hands estimators only ``token_level_rewards``
and ``response_mask``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from toolgym.trajectory import Trajectory
from trainers.credit import check_estimator, token_advantages, turn_advantages

__all__ = ["token_level_advantages", "token_rewards", "turn_ends", "turn_rewards_from_tokens", "turn_runs"]


def _place(mask: Sequence[int], lo: int, hi: int) -> int | None:
    """The position a reward of the action span ``[lo, hi)`` goes to (see the module docstring)."""
    n = len(mask)
    hi = min(hi, n)
    for j in range(hi - 1, max(lo, 0) - 1, -1):
        if mask[j]:
            return j
    for j in range(min(lo, n) - 1, -1, -1):  # nearest policy token before the span
        if mask[j]:
            return j
    for j in range(max(hi, 0), n):  # ... else after it
        if mask[j]:
            return j
    return n - 1 if n else None


def token_rewards(trajectory: Trajectory, length: int | None = None) -> list[float]:
    """One reward per completion token: each turn's reward (plus the outcome on the last turn) on the turn's last
    policy token, 0 elsewhere.

    Args:
        trajectory: a finished episode (``completion_ids``, ``loss_mask``, ``turns`` with their spans and rewards).
        length: the number of completion tokens kept (default ``len(trajectory.completion_ids)``); tokens past it
            were clipped and their rewards move to the last policy token kept.

    Returns:
        ``length`` floats whose sum is ``trajectory.reward`` (unless ``length`` is 0).
    """
    mask = [int(m) for m in trajectory.loss_mask]
    n = len(mask) if length is None else min(int(length), len(mask))
    mask = mask[:n]
    out = [0.0] * n
    turns = trajectory.turns
    for k, turn in enumerate(turns):
        r = float(turn.reward) + (float(trajectory.outcome_reward) if k == len(turns) - 1 else 0.0)
        if r == 0.0:
            continue
        pos = _place(mask, turn.action_start, turn.action_end)
        if pos is not None:
            out[pos] += r
    if not turns and trajectory.outcome_reward and n:  # no turn at all: the outcome still lands somewhere
        pos = _place(mask, 0, n)
        assert pos is not None
        out[pos] += float(trajectory.outcome_reward)
    return out


def turn_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of the runs of mask-1 tokens, in order: one per turn of a toolgym episode."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for j, m in enumerate(mask):
        if m and start is None:
            start = j
        elif not m and start is not None:
            runs.append((start, j))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def turn_ends(mask: Sequence[int]) -> list[int]:
    """The index of the last policy token of each turn (each run of mask-1 tokens)."""
    return [end - 1 for _, end in turn_runs(mask)]


def turn_rewards_from_tokens(rewards: Sequence[float], mask: Sequence[int]) -> list[float]:
    """Each turn's reward read back from per-token rewards: the sum over the tokens the turn owns, i.e. its
    policy tokens and the env tokens after them up to the next turn (tokens before the first turn belong to the
    first). With :func:`token_rewards` that is the value on the turn's last policy token (its inverse for
    episodes whose every turn has a policy token); a reward written elsewhere (verl's default, on the last
    token, or a per-token KL penalty) still counts for the turn it falls in. ``[]`` when no token has mask 1."""
    starts = [start for start, _ in turn_runs(mask)]
    bounds = [0, *starts[1:], len(rewards)] if starts else []
    return [float(sum(rewards[bounds[k] : bounds[k + 1]])) for k in range(len(starts))]


def token_level_advantages(
    token_level_rewards: Any,
    response_mask: Any,
    group_ids: Sequence[Hashable],
    *,
    estimator: str = "turn_return",
    gamma: float = 1.0,
    scale: str = "group",
) -> np.ndarray:
    """Turn-level advantages of a padded batch, per token: what verl's estimator API has (rewards and mask per
    token, a group id per row) turned into :func:`trainers.credit.turn_advantages`' inputs and back.

    Each row's turns are its runs of mask-1 tokens; turn ``k``'s reward is :func:`turn_rewards_from_tokens`'s
    (the outcome is already inside the last turn's reward, so the credit API gets ``outcome = 0``); the per-turn
    advantages are spread over each turn's policy tokens with :func:`trainers.credit.token_advantages`; env and
    padding tokens get 0.

    Args:
        token_level_rewards: ``(B, T)`` floats (numpy or anything ``np.asarray`` reads).
        response_mask: ``(B, T)`` 0/1, 1 on policy tokens.
        group_ids: ``B`` group keys (verl's ``uid``: rows sampled from the same prompt share one).
        estimator: one of :data:`trainers.credit.ESTIMATORS`.
        gamma: the discount **per turn**.
        scale: ``"group"`` / ``"batch"`` / ``"none"``.

    Returns:
        ``(B, T)`` float32 advantages.
    """
    check_estimator(estimator)
    rewards = np.asarray(token_level_rewards, dtype=np.float64)
    mask = np.asarray(response_mask).astype(np.int64)
    if rewards.shape != mask.shape or rewards.ndim != 2:
        raise ValueError(f"token_level_rewards {rewards.shape} and response_mask {mask.shape} must be equal (B, T)")
    if len(group_ids) != rewards.shape[0]:
        raise ValueError(f"{len(group_ids)} group ids for {rewards.shape[0]} rows")
    runs = [turn_runs(m) for m in mask]
    turn_r = [turn_rewards_from_tokens(r, m) for r, m in zip(rewards, mask, strict=True)]
    adv = turn_advantages(turn_r, [0.0] * len(turn_r), list(group_ids), estimator=estimator, gamma=gamma,
                          scale=scale)
    out = np.zeros(rewards.shape, dtype=np.float32)
    for i, (a, spans) in enumerate(zip(adv, runs, strict=True)):
        if spans:
            out[i] = token_advantages(a, spans, mask[i], length=rewards.shape[1])
    return out
