"""A training run stopped or broken outside the UI reads so in the tracking store: `toolgym train` (trainers/cli.py)
ends its MLflow run as ``KILLED`` on Ctrl-C or SIGTERM and ``FAILED`` when training raises (MLflow alone would close
it as ``FINISHED`` at exit). Real tiny GRPO runs on a real MLflow SQLite store; the fault (an exception, a
KeyboardInterrupt, a SIGTERM to the process itself) is injected by a trainer callback."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow", reason="tracking needs the [registry] extra (mlflow)")
pytest.importorskip("trl", reason="toolgym train needs the [train] extra (trl)")

from transformers import TrainerCallback  # noqa: E402

from trainers import cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRPO_CFG = str(ROOT / "trainers" / "configs" / "grpo_calculator_cpu.yaml")


class _Fault(TrainerCallback):
    """Raises ``what`` when the trainer logs step ``at`` (after MLflow's callback has logged it)."""

    def __init__(self, what: str, at: int) -> None:
        self.what, self.at = what, at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step < self.at:
            return
        if self.what == "error":
            raise RuntimeError("injected failure")
        if self.what == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # `kill PID` from outside; the handler raises at the next bytecode
        raise AssertionError("SIGTERM did not stop training")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("what,code,status,line", [
    ("error", 1, "FAILED", "toolgym train grpo: error: RuntimeError: injected failure"),
    ("ctrl-c", 130, "KILLED", "toolgym train grpo: interrupted"),
    ("sigterm", 143, "KILLED", "toolgym train grpo: terminated (SIGTERM)"),
])
def test_a_run_stopped_or_failed_reads_so_in_the_store(what, code, status, line, tmp_path, monkeypatch, capsys):
    import trainers.grpo.build as build

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    real = build.mlflow_callbacks
    monkeypatch.setattr(build, "mlflow_callbacks", lambda *a, **k: [*real(*a, **k), _Fault(what, at=1)])
    before = signal.getsignal(signal.SIGTERM)
    rc = cli.main(["grpo", "--config", GRPO_CFG, "--toolgym.model", "tiny", "--toolgym.num_train_tasks", "2",
                   "--toolgym.max_turn_tokens", "8", "--toolgym.threads", "1", "--max_steps", "3",
                   "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "16",
                   "--logging_steps", "1", "--output_dir", str(tmp_path / "out"), "--run_name", f"fault-{what}",
                   "--report_to", "mlflow", "--disable_tqdm", "true"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("toolgym train")]
    assert (rc, err) == (code, [line])
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is training's only
    assert mlflow.active_run() is None
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("toolgym")
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = 'fault-{what}'")
    assert run.info.status == status and run.info.end_time is not None
    assert [m.step for m in client.get_metric_history(run.info.run_id, "toolgym/success")] == [1]  # one step logged
