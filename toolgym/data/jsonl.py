"""JSON Lines reading shared by task files, trajectory files, corpora and replay logs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["iter_jsonl", "read_jsonl"]


def iter_jsonl(
    path: str | os.PathLike[str], *, error: type[Exception] = ValueError, objects: bool = True
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of ``path`` (numbers start at 1).

    Raises ``error`` with ``path:line`` in its message for a line that is not JSON, or (when ``objects``) not a
    JSON object; ``FileNotFoundError`` when the file is missing.
    """
    p = Path(path)
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{p}:{n}: not valid JSON ({e.msg})") from None
            if objects and not isinstance(value, dict):
                raise error(f"{p}:{n}: expected a JSON object, got {type(value).__name__}")
            yield n, value


def read_jsonl(path: str | os.PathLike[str], *, error: type[Exception] = ValueError) -> list[dict[str, Any]]:
    """Every JSON object of ``path`` (see :func:`iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path, error=error)]
