"""The optional verl adapter (``pip install "toolgym[verl]"``, or ``make verl-env``): PPO with a critic on toolgym envs.

* :mod:`trainers.verl.rewards` (no verl): per-token rewards, each turn's reward on its last policy token; turns
  read back from a loss mask; turn-level advantages of a padded batch through :mod:`trainers.credit`;
* :mod:`trainers.verl.agent_loop` (verl): the ``toolgym`` agent loop (``agent_name: toolgym``), its output type
  (per-token ``rm_scores``) and a worker/manager pair for verl's legacy trainer;
* :mod:`trainers.verl.advantage` (verl): ``algorithm.adv_estimator=toolgym_turn_return`` in verl's registry;
* :mod:`trainers.verl.plugin` (verl): imports the two above; verl imports it in every process through the
  ``verl.plugins`` entry point that toolgym's package metadata declares;
* :mod:`trainers.verl.launch` (no verl): dataset rows and the ``verl.trainer.main_ppo`` overrides for a run.

Importing this package (or ``trainers``) imports no verl; see docs/verl.md for the environment and a launch.
"""

from __future__ import annotations

#: The verl version the adapter was written and tested against (its agent-loop API changed between 0.8 and 0.9).
VERL_VERSION = "0.9.1"

__all__ = ["VERL_VERSION"]
