"""Statistics across training seeds, shared by the experiments: the paired difference of two checkpoints' per-task
wins, per seed, their mean, the t-interval over seeds and a hierarchical bootstrap CI."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

__all__ = ["across_seeds"]


def across_seeds(base: dict[int, list[float]], arm: dict[int, list[float]], *, n_boot: int = 4000,
                 seed: int = 0) -> dict[str, Any]:
    """``arm - base`` held-out success across training seeds, each a list of per-task wins on the same tasks.

    Returns ``per_seed`` differences (mean over tasks), their ``mean``, the paired t-interval over seeds
    (``t_lo``, ``t_hi``: n_seeds - 1 degrees of freedom), a hierarchical bootstrap 95% CI (``boot_lo``,
    ``boot_hi``: resample seeds, then tasks within each drawn seed) and ``positive`` (seeds with a difference > 0).
    """
    import numpy as np

    from toolgym.evaluation import paired_difference_ci

    common = sorted(set(base) & set(arm))
    if not common:
        return {"seeds": []}
    b = {k: np.asarray(base[k], dtype=float) for k in common}
    a = {k: np.asarray(arm[k], dtype=float) for k in common}
    # the differences and their mean in exact arithmetic (Fraction holds every float exactly): float rounding
    # must not move a mean that is exactly 0 (e.g. +7, -1, -2, 0, -4 points) below the verdict's ">= 0"
    exact = [sum(map(Fraction, arm[k])) / len(arm[k]) - sum(map(Fraction, base[k])) / len(base[k]) for k in common]
    per_seed = [float(d) for d in exact]
    t = paired_difference_ci([float(b[k].mean()) for k in common], [float(a[k].mean()) for k in common])
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    for i in range(n_boot):
        drawn = rng.choice(len(common), size=len(common), replace=True)
        diffs = []
        for j in drawn:
            k = common[int(j)]
            idx = rng.integers(0, len(b[k]), size=len(b[k]))
            diffs.append(float(a[k][idx].mean() - b[k][idx].mean()))
        stats[i] = float(np.mean(diffs))
    return {"seeds": common, "per_seed": per_seed, "mean": float(sum(exact) / len(exact)), "t_lo": t["lo"],
            "t_hi": t["hi"], "boot_lo": float(np.quantile(stats, 0.025)), "boot_hi": float(np.quantile(stats, 0.975)),
            "positive": sum(d > 0 for d in exact)}
