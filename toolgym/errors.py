"""Error types shared across toolgym's packages (no dependencies: any module may import this one)."""

from __future__ import annotations

__all__ = ["InputFileError"]


class InputFileError(ValueError):
    """A file given as input (an MCP config, a task file) is malformed: not parseable, wrong shape, no rows.

    The message names the file (and line when there is one). A missing file is ``FileNotFoundError``. The
    ``toolgym`` command exits with code 3 for both.
    """
