"""Process helpers shared by the tests that check no server or worker process is left behind."""

from __future__ import annotations

import os
from pathlib import Path


def children() -> set[int]:
    """Pids of this process's direct children (from /proc)."""
    me, out = os.getpid(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                out.add(int(d))
    return out
