"""Error types and exit codes shared across toolgym's packages (no dependencies: any module may import this one).

* :class:`ExitCode`: the exit codes of the ``toolgym`` command (and ``toolgym train``), stable for scripts.
* :class:`CLIError`: a failure with a one-line message for the user and the exit code to return.
* :class:`ConfigError`: a bad run config (unknown or misspelt key, a value of the wrong type, an unreadable
  file): a :class:`CLIError`, exit code 2 by default (3 for a file that cannot be read or a missing extra).
* :class:`InputFileError`: a malformed input file.
* :class:`OutputFileError`: an output file that cannot be written (a full disk, a device): exit code 3.

Only the entry point (:mod:`toolgym.cli`) turns these into messages and exit codes; every other module raises them.
"""

from __future__ import annotations

import enum

__all__ = ["CLIError", "ConfigError", "ExitCode", "InputFileError", "OutputFileError"]


class ExitCode(enum.IntEnum):
    """Exit codes of the ``toolgym`` command."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    INPUT = 3
    UNREACHABLE = 4
    INTERRUPTED = 130


class CLIError(Exception):
    """A failure with a message for the user (one line) and the exit code to return."""

    def __init__(self, message: str, code: ExitCode | int = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = ExitCode(code)


class ConfigError(CLIError):
    """A configuration problem reported as one line: an unknown key (naming the close matches), a value of the
    wrong type, a config TRL rejects (``code`` 2, the default), or a config file that cannot be read / a missing
    ``[train]`` extra (``code`` 3)."""

    def __init__(self, message: str, code: ExitCode | int = ExitCode.USAGE) -> None:
        super().__init__(message, code)


class InputFileError(ValueError):
    """A file given as input (an MCP config, a task file) is malformed: not parseable, wrong shape, no rows.

    The message names the file (and line when there is one). A missing file is ``FileNotFoundError``. The
    ``toolgym`` command exits with code 3 for both.
    """


class OutputFileError(OSError):
    """An output file (``--out``, a trajectory file) cannot be written: a full disk, no permission, or a path that
    is not a regular file (a device, a FIFO, a directory). The message names the file; rows already written are
    whole. The ``toolgym`` command exits with code 3."""
