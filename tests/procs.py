"""Process and port helpers shared by the tests that start servers and check no server or worker process is left
behind."""

from __future__ import annotations

import os
import socket
import subprocess
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


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (from /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """End a server process: SIGTERM, then SIGKILL after 10 s; waits for it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
