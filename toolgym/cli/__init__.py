"""The ``toolgym`` command (``[project.scripts] toolgym = "toolgym.cli:main"``; ``python -m toolgym.cli``).

:mod:`toolgym.cli.main` builds the parser and dispatches; each group of subcommands has its module:
:mod:`~toolgym.cli.eval` (``eval``, ``rollout``), :mod:`~toolgym.cli.view` (``view``, ``plot``),
:mod:`~toolgym.cli.bench` (``bench``, ``serve``); :mod:`~toolgym.cli.common` holds what they share (policies,
argument checks, error printing and exit codes).
"""

from __future__ import annotations

from toolgym.cli import main as _main
from toolgym.cli.main import *  # noqa: F403  (the command's public names are main's)

__all__ = list(_main.__all__)
