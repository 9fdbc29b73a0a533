"""The registry's store and its records under faults: an interrupted `registry register` removes only what it made;
a process killed while it creates a fresh store leaves none that later commands cannot use; a broken store that
holds runs is left as it is (real processes on a real MLflow SQLite store; the pauses and kills inside the first
process are the injected faults)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import test_weights_integrity

pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")

ROOT = Path(__file__).resolve().parents[1]

# `registry register` whose upload of the model files stops (the injected fault) until SIGINT arrives. Ctrl-C in a
# terminal reaches a process with Python's default handler; a shell that starts the test run in the background
# (`make test &`) hands down SIGINT ignored, so the child puts the default handler back first.
PAUSED_REGISTER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
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


ckpt = test_weights_integrity.ckpt  # a real tiny checkpoint (one for this module)


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
        _, err = a.communicate(timeout=240)  # reads its output meanwhile: a full pipe never holds it
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode != 0 and "interrupted" in err, err[-2000:]
    listed = _toolgym(tmp_path, "registry", "list", "shared", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = json.loads(listed.stdout)
    assert [r["version"] for r in rows] == [1]  # the other process's version survives; nothing of the first's


# a command on a fresh store, killed (SIGKILL, the injected fault) after the fifth of MLflow's schema migrations
KILLED_CREATING = """
import os, signal, sys
import alembic.runtime.migration as m
real = m.HeadMaintainer.update_to_step
done = []
def step(self, s):
    real(self, s)
    done.append(s)
    if len(done) == 5:
        os.kill(os.getpid(), signal.SIGKILL)
m.HeadMaintainer.update_to_step = step
if sys.argv[1] == "mlflow":  # MLflow itself creating the store in place (what an older toolgym did)
    import mlflow
    mlflow.MlflowClient(sys.argv[2]).search_experiments()
from toolgym.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _killed_while_creating(cwd: Path, how: str) -> None:
    runs = cwd / "runs"
    if how in ("hook", "in place"):
        argv = ["registry", "list", "m"] if how == "hook" else ["mlflow", f"sqlite:///{runs / 'mlflow.db'}"]
        runs.mkdir(exist_ok=True)
        p = subprocess.run([sys.executable, "-c", KILLED_CREATING, *argv], cwd=cwd, env=_env(),
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
        return
    p = subprocess.Popen([sys.executable, "-m", "toolgym.cli", "registry", "list", "m"], cwd=cwd, env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # a few hundred ms after the database file (or its temporary file) appears
        end = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < end and not (runs.is_dir() and any(
                f.name.startswith(("mlflow.db", ".mlflow.db")) and not f.name.endswith(".lock")
                for f in runs.iterdir())):
            time.sleep(0.005)
        time.sleep(0.3)
    finally:
        p.kill()
        p.wait()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["hook", "timed", "in place"])
def test_a_store_killed_while_being_created_works_afterwards(tmp_path, ckpt, how):
    _killed_while_creating(tmp_path, how)
    listed = _toolgym(tmp_path, "registry", "list", "m")
    assert listed.returncode == 2 and "no registered model named 'm'" in listed.stderr, listed.stderr[-2000:]
    reg = _toolgym(tmp_path, "registry", "register", str(ckpt), "--name", "m", "--json")
    assert reg.returncode == 0, reg.stderr[-2000:]
    # MLflow logging through toolgym (what training and `--report-to mlflow` use) works on the same store
    logged = subprocess.run([sys.executable, "-c", "import mlflow; from trainers.tracking import configure_mlflow; "
                             "configure_mlflow(); r = mlflow.start_run(run_name='after'); mlflow.log_metric('x', 1); "
                             "mlflow.end_run(); print(r.info.run_id)"], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert logged.returncode == 0, logged.stderr[-2000:]
    assert not [f for f in (tmp_path / "runs").iterdir() if f.name.endswith(".creating")]


def test_a_broken_store_that_holds_runs_is_left_as_it_is(tmp_path):
    import sqlite3

    made = subprocess.run([sys.executable, "-c", "import mlflow; from trainers.tracking import configure_mlflow; "
                           "configure_mlflow(); mlflow.start_run(); mlflow.end_run()"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    db = tmp_path / "runs" / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")  # an older schema: migrations pending
    con.commit()
    con.close()
    before = db.read_bytes()
    listed = _toolgym(tmp_path, "registry", "list", "m")
    assert listed.returncode == 3 and str(db) in listed.stderr and "holds 1 runs" in listed.stderr, listed.stderr
    assert listed.stderr.count("\n") == 1 and db.read_bytes() == before
