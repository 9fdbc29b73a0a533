"""Runs the verl adapter's tests (tests/verl_adapter) in ``.venv-verl``, the venv ``make verl-env`` builds.

verl 0.9.1 cannot share the main venv (it pins ``transformers<5.11``; the core needs ``>=5.17``), so this test
starts that venv's Python on ``tests/verl_adapter`` and fails if any of them fails or is skipped there. It is
skipped with the reason when the venv was not built (``make verl-env``; CI builds it best-effort in ``.ci/run``).
``TOOLGYM_VERL_PYTHON`` points it at another interpreter with verl installed. Slow: ~1-2 minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-verl"


def _verl_python() -> Path | None:
    given = os.environ.get("TOOLGYM_VERL_PYTHON")
    if given:
        return Path(given)
    return VENV / "bin" / "python" if (VENV / ".installed").exists() else None


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_verl_adapter_tests_pass_in_the_verl_venv():
    python = _verl_python()
    if python is None:
        pytest.skip("no .venv-verl (verl 0.9.1 needs its own venv): `make verl-env` builds it, then this test runs "
                    "tests/verl_adapter there")
    if importlib.util.find_spec("verl") is not None:
        pytest.skip("verl is importable in this interpreter: tests/verl_adapter runs here directly")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([str(python), "-m", "pytest", "tests/verl_adapter", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1400)
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0, tail
    summary = res.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary and "failed" not in summary, tail
