"""Faults of issue 26 outside the MCP transport: unbounded work on the shared event loop (a schema pattern that
backtracks, a slow ``__str__``), deeply nested arguments reaching the JSONL writer, a full disk and non-regular files
behind ``--out``. Each case has a deadline; a case that could hang the process runs in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPTS = Path(__file__).parent / "fault_scripts"


def _script(name: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


# -- 2. unbounded work on the loop -------------------------------------------------------------------------------
@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["nested", "alternation", "slow_str"])
def test_work_a_call_brings_never_freezes_the_loop(case) -> None:
    try:
        out = _script("loop_work.py", case, timeout=120)
    except subprocess.TimeoutExpired:  # before: `re` backtracking with the GIL held, for good
        pytest.fail(f"{case}: the process hung")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # the loop kept running: before, a 26-character argument froze it for seconds, a slow __str__ for 8 s
    assert r["max_gap"] < 1.0, r
    if case == "slow_str":
        assert r["kind"] == "timeout" and r["took"] < 4, r  # before: "success" after 8 s past a 1 s timeout
    elif case == "nested":
        assert r["kind"] == "invalid_arguments" and "does not match" in r["content"], r
    else:
        assert r["kind"] == "invalid_arguments" and r["took"] < 10, r
