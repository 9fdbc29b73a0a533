"""The registry's store and its records under faults: an interrupted `registry register` removes only what it made
(real processes on a real MLflow SQLite store; the pause inside the first process is the injected fault)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")

ROOT = Path(__file__).resolve().parents[1]

# `registry register` whose upload of the model files stops (the injected fault) until SIGINT arrives
PAUSED_REGISTER = """
import sys, time
from pathlib import Path
import mlflow
ready = Path(sys.argv[1])
real = mlflow.MlflowClient.log_artifact
def paused(self, *a, **k):
    ready.write_text("uploading")
    while True:
        time.sleep(0.05)
mlflow.MlflowClient.log_artifact = paused
from toolgym.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _toolgym(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolgym.cli", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from toolgym.models import load_tokenizer, tiny_random_model

    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = load_tokenizer()
    tiny_random_model(tok, seed=1, num_hidden_layers=1).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.timeout(600)
def test_interrupted_register_keeps_a_version_another_process_registered(tmp_path, ckpt):
    assert _toolgym(tmp_path, "registry", "list", "--json").returncode in (0, 2)  # the store exists first
    ready = tmp_path / "ready"
    a = subprocess.Popen([sys.executable, "-c", PAUSED_REGISTER, str(ready), "registry", "register", str(ckpt),
                          "--name", "shared"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 240
        while not ready.exists() and a.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert ready.exists(), a.stderr.read() if a.poll() is not None else "the first register never uploaded"
        b = _toolgym(tmp_path, "registry", "register", str(ckpt), "--name", "shared")
        assert b.returncode == 0, b.stderr[-2000:]
        a.send_signal(signal.SIGINT)  # Ctrl-C on the first one
        a.wait(120)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode != 0
    listed = _toolgym(tmp_path, "registry", "list", "shared", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = json.loads(listed.stdout)
    assert [r["version"] for r in rows] == [1]  # the other process's version survives; nothing of the first's
