"""The one error the page shows: :class:`UIError`, bad input or a failure as one clear line (an HTTP 400 with
``{"error": message}``, never a traceback)."""

from __future__ import annotations

__all__ = ["UIError"]


class UIError(ValueError):
    """Bad input or a failure to show on the page as one clear line (HTTP 400)."""
