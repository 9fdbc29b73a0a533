"""Registers toolgym with verl: the ``toolgym`` agent loop and the ``toolgym_turn_return`` advantage estimator.

verl imports the ``verl.plugins`` entry points at ``import verl`` in every process (driver, trainer, Ray workers;
``VERL_USE_EXTERNAL_PLUGINS`` = ``auto`` by default, ``none`` turns it off), and toolgym's package metadata
declares this module as one (``pyproject.toml``). Without the entry point (a source checkout on ``PYTHONPATH``
only), ``VERL_USE_EXTERNAL_MODULES=trainers.verl.plugin`` does the same. verl swallows a plugin's import error
(logged at debug level): ``python -m trainers.verl.launch --check`` says whether both names are registered.
"""

from __future__ import annotations

from trainers.verl import advantage, agent_loop

__all__ = ["advantage", "agent_loop"]
