"""Commands and backends that other installed packages add to ``toolgym``, found through entry points.

The core never imports the training package (not even by a module-name string): the package declares what it
provides in its ``pyproject.toml`` and the core finds it with :func:`importlib.metadata.entry_points`. Groups:

* ``toolgym.commands`` -- a subcommand: ``NAME = "module:main"``, ``main(argv: list[str]) -> int`` parses
  everything after ``toolgym NAME`` (``train``, ``registry``, ``ui``);
* ``toolgym.report_to`` -- a ``--report-to`` backend: ``NAME = "module:object"``, the object has
  ``check_report_backends(names) -> list[str]`` and ``report_summary(backends, *, kind, run_name, metrics, params,
  artifacts, documents) -> {backend: where}`` (``mlflow``, ``tensorboard``, ``wandb``, ``trackio``);
* ``toolgym.policies`` -- a ``--policy SCHEME:/...`` URI scheme: ``SCHEME = "module:resolve"``,
  ``resolve(uri) -> path`` gives the local model directory (``models:/NAME/VERSION``, the model registry).

When loading an entry point fails on a missing module, the error names the extra to install: the entry point's
own ``[extra]`` if it declares one, else toolgym's extra for that name (:data:`EXTRAS`).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from toolgym.errors import CLIError, ExitCode

__all__ = ["COMMANDS", "EXTRAS", "POLICIES", "REPORT_TO", "load", "names"]

COMMANDS = "toolgym.commands"
REPORT_TO = "toolgym.report_to"
POLICIES = "toolgym.policies"

#: (group, name) -> the toolgym extra whose dependencies that entry point needs (for the error message)
EXTRAS = {(COMMANDS, "train"): "train", (COMMANDS, "registry"): "registry", (COMMANDS, "ui"): "ui",
          (REPORT_TO, "mlflow"): "registry", (REPORT_TO, "wandb"): "wandb", (REPORT_TO, "trackio"): "trackio",
          (REPORT_TO, "tensorboard"): "dev", (POLICIES, "models"): "registry"}


def _entry_point(group: str, name: str) -> EntryPoint | None:
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    return found[0] if found else None


def names(group: str) -> list[str]:
    """The names installed in entry-point ``group``, sorted (nothing is imported)."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load(group: str, name: str, *, what: str, code: ExitCode = ExitCode.USAGE) -> Any:
    """The object entry point ``name`` of ``group`` refers to, imported now.

    Args:
        group: one of :data:`COMMANDS`, :data:`REPORT_TO`, :data:`POLICIES`.
        name: the entry point's name (a subcommand, a backend, a URI scheme).
        what: how the user asked for it, for the message (e.g. ``"`toolgym train`"``).
        code: the exit code of the :class:`CLIError` when it cannot be loaded.

    Raises:
        CLIError: no installed package provides ``name``, or importing it failed on a missing module (the
            message names the module and the extra to install).
    """
    ep = _entry_point(group, name)
    if ep is None:
        extra = EXTRAS.get((group, name), "train")
        raise CLIError(f"{what} is not installed (no {group!r} entry point named {name!r}): "
                       f"pip install 'toolgym[{extra}]'", code)
    try:
        return ep.load()
    except ModuleNotFoundError as e:
        extra = ",".join(ep.extras) or EXTRAS.get((group, name), "train")
        raise CLIError(f"{what} needs the [{extra}] extra (missing module {e.name!r}): pip install "
                       f"'toolgym[{extra}]'", code) from None
