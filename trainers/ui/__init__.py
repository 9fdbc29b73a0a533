"""``toolgym ui``: a web page to set up tools and rewards, launch and watch training, compare runs, evaluate and
promote (``docs/ui.md``). Every button runs the code the CLI runs: in process for the tool playground and the
reward composer, as ``toolgym train`` / ``toolgym eval`` / ``toolgym registry`` commands (argument lists) for the
rest. Needs the ``[ui]`` extra (FastAPI + uvicorn) and, for training and the registry, ``[train,registry]``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``toolgym ui [--host H] [--port P] [--runs DIR] [--token-file F]``; returns the exit code."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        from toolgym.errors import CLIError, ExitCode

        raise CLIError(f"`toolgym ui` needs the [ui] extra (missing {e.name!r}): pip install 'toolgym[ui]'",
                       ExitCode.INPUT) from None
    from trainers.ui.server import main as _main

    return _main(argv)
