"""Training algorithms on toolgym envs, one contract for all (TRL 1.16 underneath).

Each algorithm is one module ``trainers/<name>.py`` or package ``trainers/<name>/`` exporting

* ``Config``: a dataclass extending :class:`trainers.contract.BaseConfig` (or ``EnvConfig``, for an algorithm
  that runs episodes) with only its own fields, each carrying its help text (``metadata={"help": ...}``, TRL's
  convention); an algorithm built on a TRL trainer has one field named ``trl`` holding that trainer's config
  fields (its ``metadata["trl_config"]`` names the class, e.g. ``"GRPOConfig"``);
* ``run(config: Config, **extras) -> RunResult``: train, save, report (:class:`trainers.contract.RunResult`).

:data:`ALGORITHMS` maps the names to those modules, imported on first use (``import trainers`` loads neither torch
nor TRL, and neither does reading a ``Config``: see :func:`config_class`). ``toolgym train <name>``
(:mod:`trainers.cli`), the demo, ``benchmarks/`` and the web UI all go through it. The core library ``toolgym``
never imports this package.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator, Mapping
from types import ModuleType

# the run preamble's environment, set once for every algorithm before TRL or tokenizers load
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL's warning on its experimental rollout_func
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no fork warnings from the rollout's tokenizers

TRL_VERSION = "1.16.0"
"""The TRL version the adapter was written and tested against (``rollout_func`` is experimental there)."""

# bitsandbytes (the [train] extra's 8-bit AdamW; peft imports it whenever it is installed) logs a warning at import
# about an optional 4-bit CPU kernel package toolgym never uses: it would be an extra stderr line in every
# command that imports TRL or peft (a CLI error is one line)
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__all__ = ["ALGORITHMS", "TRL_VERSION", "config_class"]


class _Algorithms(Mapping[str, ModuleType]):
    """Algorithm name -> its module, imported on first access (``list(ALGORITHMS)`` imports nothing)."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)

    def __getitem__(self, name: str) -> ModuleType:
        return importlib.import_module(self._modules[name])

    def __contains__(self, name: object) -> bool:  # without importing (Mapping's default would)
        return name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    def module_name(self, name: str) -> str:
        """The dotted module of ``name`` (nothing imported)."""
        return self._modules[name]

    def __repr__(self) -> str:
        return f"ALGORITHMS({self._modules})"


#: name -> module (``trainers.<name>``), imported lazily. Add an algorithm: write ``trainers/<name>.py`` (or a package) with
#: ``Config`` and ``run`` and add it here (``tests/test_structure.py`` checks both).
ALGORITHMS = _Algorithms({
    "grpo": "trainers.grpo",
    "sft": "trainers.sft",
    "rft": "trainers.rft",
    "dpo": "trainers.dpo",
    "reward_model": "trainers.reward_model",
})


def config_class(name: str) -> type:
    """The ``Config`` dataclass of algorithm ``name``. Cheap: the algorithm modules import torch/TRL only inside
    functions (``trainers.dpo`` keeps its TRL subclasses in :mod:`trainers.dpo.trainer`), so listing the fields and
    their help texts (``dataclasses.fields(config_class("grpo"))``) loads neither."""
    return ALGORITHMS[name].Config
