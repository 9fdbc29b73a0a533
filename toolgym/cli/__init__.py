"""The ``toolgym`` command (``[project.scripts] toolgym = "toolgym.cli:main"``; ``python -m toolgym.cli``).

:mod:`toolgym.cli.main` builds the parser and dispatches; each group of subcommands has its module:
:mod:`~toolgym.cli.eval` (``eval``, ``rollout``), :mod:`~toolgym.cli.view` (``view``, ``plot``),
:mod:`~toolgym.cli.bench` (``bench``, ``serve``); :mod:`~toolgym.cli.common` holds what they share (policies,
argument checks, error printing and exit codes).
"""

from __future__ import annotations

from toolgym.cli.main import (
    BENCHMARKS,
    SERVERS,
    CLIError,
    ExitCode,
    build_parser,
    check_reachable,
    env_construction_error,
    main,
    parse_env_kwargs,
    resolve_env_id,
    summary_line,
)

__all__ = [
    "BENCHMARKS",
    "SERVERS",
    "CLIError",
    "ExitCode",
    "build_parser",
    "check_reachable",
    "env_construction_error",
    "main",
    "parse_env_kwargs",
    "resolve_env_id",
    "summary_line",
]
