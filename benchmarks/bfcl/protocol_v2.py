"""Protocol v2 of the BFCL learning experiment (docs/bfcl.md, "Protocol v2"): GRPO with the stabilizers of the
published tool-calling runs, its learning rate, reward and KL weight chosen on a validation part of ``train``.

What v2 reuses from v1 unchanged (same stage keys, records read from v1's results directory): the untrained model's
evaluations, each seed's warm start and the warm start's evaluations. What it adds, each a resumable stage whose
record goes to ``results/v2/``:

* ``sweep-<arm>``: GRPO from seed :data:`SWEEP_SEED`'s warm start for :data:`SWEEP_STEPS` steps, one arm per
  (learning rate, reward, KL weight) of :func:`sweep_arms`, validated every :data:`GRPO_V2` ``validation_every``
  steps on the validation part; only its records are kept (no checkpoint);
* ``grpo-seed<S>``: GRPO with the chosen arm (:func:`choose`) for :data:`GRPO_V2` ``steps`` steps, validated the
  same way, its best validation step kept (``model``) beside its last step (``last``);
* ``eval-grpo-seed<S>-<category>`` (the selected checkpoint) and ``eval-grpolast-seed<S>-<category>`` (the last
  one, when it is another step), on v1's evaluation plan.

Nothing here loads a model.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bfcl.protocol import RESULTS

__all__ = ["GRPO_V2", "RESULTS_V2", "SWEEP_BETA", "SWEEP_BETAS_SECOND", "SWEEP_LRS", "SWEEP_REWARDS", "SWEEP_SEED",
           "SWEEP_STEPS", "arm_name", "arm_score", "choose", "grpo_v2_config", "sweep_arms"]

RESULTS_V2 = RESULTS / "v2"
#: the GRPO stage of every v2 run (sweep arms and seeds alike; the sweep arms stop at :data:`SWEEP_STEPS`)
GRPO_V2: dict[str, Any] = {
    "steps": 48, "prompts_per_step": 8, "num_generations": 4, "temperature": 1.0, "lr_scheduler": "constant",
    "dynamic_sampling_max_draws": 3, "validation_tasks": 100, "validation_every": 8, "validation_seed": 0,
    "save_steps": 8,
}
#: the sweep: seed 0's warm start, 24 steps an arm; first the learning rates x rewards at KL weight 1e-3, then the
#: KL weights 0 and 1e-2 at the first phase's choice
SWEEP_SEED = 0
SWEEP_STEPS = 24
SWEEP_LRS = (1e-6, 3e-6, 1e-5)
SWEEP_REWARDS = ("binary", "partial")
SWEEP_BETA = 1e-3
SWEEP_BETAS_SECOND = (0.0, 1e-2)
#: BFCL's partial credit in the "partial" arms: 0.1 for each of parse / names / keys (docs/bfcl.md)
PARTIAL_CREDIT = True


def arm_name(arm: Mapping[str, Any]) -> str:
    """``lr3e-06-partial-beta0.001``: a sweep arm's stage name suffix."""
    return f"lr{arm['lr']:.0e}-{arm['reward']}-beta{arm['beta']:g}"


def sweep_arms(first_choice: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The sweep's arms in their order: the first phase (every learning rate x reward at :data:`SWEEP_BETA`); with
    ``first_choice`` (the first phase's chosen arm) the second phase too (its learning rate and reward at each of
    :data:`SWEEP_BETAS_SECOND`)."""
    arms = [{"lr": lr, "reward": rw, "beta": SWEEP_BETA} for lr in SWEEP_LRS for rw in SWEEP_REWARDS]
    if first_choice is not None:
        arms += [{"lr": first_choice["lr"], "reward": first_choice["reward"], "beta": b} for b in SWEEP_BETAS_SECOND]
    return arms


def arm_score(history: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """An arm's validation score: the best validation success over its GRPO steps (step 0, the warm start, left
    out: every arm shares it) and, to break ties, the mean over those steps; ``None`` without such a step."""
    xs = [float(r["success"]) for r in history if int(r["step"]) > 0 and r.get("success") is not None]
    return (max(xs), sum(xs) / len(xs)) if xs else None


def choose(scored: Sequence[tuple[Mapping[str, Any], tuple[float, float] | None]]) -> dict[str, Any] | None:
    """The arm with the highest :func:`arm_score` among ``(arm, score)`` pairs given in the protocol's order (ties
    go to the earlier arm: the lower learning rate, binary before partial, the first phase's KL weight before the
    second's); ``None`` while an arm has no score."""
    if not scored or any(s is None for _, s in scored):
        return None
    best_i = max(range(len(scored)), key=lambda i: (scored[i][1], -i))
    return dict(scored[best_i][0])


def grpo_v2_config(proto: Mapping[str, Any], seed: int, ws_key: str, arm: Mapping[str, Any], steps: int,
                   tasks: int) -> dict[str, Any]:
    """The key material of a v2 GRPO stage: from the warm start ``ws_key`` of ``seed``, with ``arm``'s learning
    rate, reward and KL weight, for ``steps`` steps on ``tasks`` training tasks (the validation part excluded)."""
    return {"protocol": "v2", "warmstart": ws_key, "seed": seed, "categories": list(proto["categories"]),
            "steps": steps, "tasks": tasks, "lr": arm["lr"], "reward": arm["reward"], "beta": arm["beta"],
            "partial_credit": PARTIAL_CREDIT if arm["reward"] == "partial" else False,
            **{k: v for k, v in GRPO_V2.items() if k != "steps"},
            "max_turn_tokens": proto["max_turn_tokens"], "max_episode_tokens": proto["max_episode_tokens"],
            "autocast": proto["autocast"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """v2's options on the experiment's command line."""
    p.add_argument("--protocol", choices=["v1", "v2"], default="v1",
                   help="v1 (docs/bfcl.md, 'Protocol') or v2 (docs/bfcl.md, 'Protocol v2'); --report prints it")
    p.add_argument("--v2-part", choices=["sweep", "seeds", "all"], default="all",
                   help="v2: the sweep only, the seeds only (needs the sweep's choice), or both in order")
    p.add_argument("--results-v2", default=str(RESULTS_V2), help="v2's records (v1's --results are read for the "
                   "stages v2 reuses)")
    p.add_argument("--grpo-v2-tasks", type=int, default=520, help="v2: training tasks (the train split of the five "
                   "categories is 620 entries; 100 are the validation part)")


def results_v2(args: argparse.Namespace) -> Path:
    return Path(args.results_v2)
