"""The turn-level advantage estimator, registered with verl's registry: ``algorithm.adv_estimator=toolgym_turn_return``.

verl (0.9.x) calls a registered estimator (``verl.trainer.ppo.core_algos.register_adv_est``) from
``ray_trainer.compute_advantage`` with ``token_level_rewards`` ``(B, T)``, ``response_mask`` ``(B, T)``, ``index``
(the rows' ``uid``: samples of the same prompt share one) and ``config`` (the ``algorithm`` section), and expects
``(advantages, returns)``, both ``(B, T)``. The math is :func:`trainers.credit.turn_advantages` (the same code the
TRL subclass uses), reached through :func:`trainers.verl.rewards.token_level_advantages`: turns are the runs of
policy tokens, a turn's reward is the reward on the tokens it owns (the toolgym agent loop writes it on the turn's
last policy token), and each turn's advantage goes to that turn's policy tokens (env tokens 0).

Config: ``algorithm.gamma`` is the discount **per turn** here (GAE reads it per token);
``algorithm.norm_adv_by_std_in_grpo`` (default true) divides by the group's std (``scale="group"``), false only
centres (``scale="none"``). ``returns`` = ``advantages``, as verl's GRPO does (no critic is trained with it).

Not registered: ``gigpo`` (its anchor states need the token ids before each turn, which verl's estimator API does
not pass) and ``outcome`` (that is verl's own ``grpo``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from trainers.verl.rewards import token_level_advantages

__all__ = ["ESTIMATOR_NAME", "compute_toolgym_turn_return_advantage"]

#: the name to put in ``algorithm.adv_estimator``
ESTIMATOR_NAME = "toolgym_turn_return"


def _get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, dict) or hasattr(config, "get"):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


@register_adv_est(ESTIMATOR_NAME)
def compute_toolgym_turn_return_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn discounted reward-to-go with a per-(group, turn index) baseline (``trainers.credit``'s
    ``turn_return``), spread over each turn's policy tokens.

    Args:
        token_level_rewards: ``(B, T)`` rewards (each turn's on its last policy token).
        response_mask: ``(B, T)``, 1 on policy tokens.
        index: ``B`` group ids (verl's ``uid``); ``None``: every row is its own group (all advantages 0).
        config: verl's ``algorithm`` config (``gamma``, ``norm_adv_by_std_in_grpo``).

    Returns:
        ``(advantages, returns)``, each ``(B, T)`` on the rewards' device and dtype, 0 on env and padding tokens.
    """
    gamma = float(_get(config, "gamma", 1.0))
    scale = "group" if bool(_get(config, "norm_adv_by_std_in_grpo", True)) else "none"
    b = token_level_rewards.shape[0]
    groups = list(range(b)) if index is None else [str(g) for g in index]
    with torch.no_grad():
        adv = token_level_advantages(
            token_level_rewards.detach().float().cpu().numpy(), response_mask.detach().cpu().numpy(), groups,
            estimator="turn_return", gamma=gamma, scale=scale,
        )
    out = torch.from_numpy(adv).to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
    return out, out.clone()
