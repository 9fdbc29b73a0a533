"""Error types shared across toolgym's packages (no dependencies: any module may import this one)."""

from __future__ import annotations

__all__ = ["InputFileError", "OutputFileError"]


class InputFileError(ValueError):
    """A file given as input (an MCP config, a task file) is malformed: not parseable, wrong shape, no rows.

    The message names the file (and line when there is one). A missing file is ``FileNotFoundError``. The
    ``toolgym`` command exits with code 3 for both.
    """


class OutputFileError(OSError):
    """An output file (``--out``, a trajectory file) cannot be written: a full disk, no permission, or a path that
    is not a regular file (a device, a FIFO, a directory). The message names the file; rows already written are
    whole. The ``toolgym`` command exits with code 3."""
