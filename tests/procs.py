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


def torchrun_two_ranks(script: Path, out: Path, *, timeout: float) -> list[dict]:
    """Run ``script`` under ``torchrun`` as 2 CPU processes (gloo, 1 thread each, the repository on
    ``PYTHONPATH``) in ``out`` and return each rank's ``rank{k}.json`` there; a failed run fails the test with
    the end of its stderr."""
    import json
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(script)]  # static rendezvous: a real port, not 0
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{k}.json").read_text()) for k in (0, 1)]
