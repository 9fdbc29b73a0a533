"""Tracking and the model registry against a real MLflow: the embedded SQLite store and a `mlflow server` started on
loopback (one per module). Models are tiny random Llamas saved with the embedded tokenizer; evaluation files follow
the `toolgym eval --json` contract (the per-task successes are the inputs of the promotion decision under test)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")

from tests.procs import free_port  # noqa: E402
from toolgym.cli import ExitCode, main  # noqa: E402

ENV = "toolgym/Calculator-v0"
TASKS = [f"calc-test-{i}" for i in range(40)]


def _eval(path: Path, rate: float, *, env: str = ENV, ids: list[str] = TASKS, policy: str = "ckpt",
          ckpt: Path | None = None) -> Path:
    """A `toolgym eval --json` summary where the first ``rate`` fraction of tasks succeed; with ``ckpt``, an
    evaluation of that checkpoint's weights (its ``evaluated`` record)."""
    from toolgym.weights import weights_hash

    per = [1.0 if k < round(rate * len(ids)) else 0.0 for k in range(len(ids))]
    s = sum(per) / len(per)
    evaluated = {"kind": "checkpoint", "path": str(ckpt), "weights_sha256": weights_hash(ckpt)} if ckpt else None
    path.write_text(json.dumps({
        "env_id": env, "split": "test", "n_tasks": len(ids), "k": 1, "seed": 0, "policy": policy, "success": s,
        "success_ci95": [max(0.0, s - 0.15), min(1.0, s + 0.15)], "pass_at_k": s, "mean_at_k": s, "reward": s,
        "tool_call_rate": 1.0, "errors": {}, "drift": 0, "task_ids": ids, "per_task_success": per, "wall_s": 1.0,
        **({"evaluated": evaluated} if evaluated else {}),
    }))
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """Two tiny saved models (different weights) and a directory that is not a model."""
    from toolgym.models import load_tokenizer, tiny_random_model

    root = tmp_path_factory.mktemp("ckpts")
    tok = load_tokenizer()
    out = {}
    for seed in (1, 2):
        d = root / f"tiny{seed}"
        tiny_random_model(tok, seed=seed, num_hidden_layers=1).save_pretrained(d)
        tok.save_pretrained(d)
        out[f"tiny{seed}"] = d
    bad = root / "notamodel"
    bad.mkdir()
    (bad / "config.json").write_text('{"hello": 1}')
    out["bad"] = bad
    return out


@pytest.fixture
def sqlite_store(tmp_path, monkeypatch) -> Path:
    """Nothing configured: the embedded store under ``<cwd>/runs``."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on a free loopback port (SQLite backend, proxied artifacts)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    cmd = [str(exe) if exe.exists() else "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts")]
    log = open(root / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _workflow(tmp_path: Path, capsys, ckpts) -> None:
    """register -> list -> promote (accepted first, refused when worse or incomparable, accepted when better)."""
    low = _eval(tmp_path / "low.json", 0.25, ckpt=ckpts["tiny1"])
    high = _eval(tmp_path / "high.json", 0.75, ckpt=ckpts["tiny2"])
    other = _eval(tmp_path / "other.json", 0.9, ids=[f"calc-x-{i}" for i in range(40)], ckpt=ckpts["tiny2"])
    for ck, ev in ((ckpts["tiny1"], low), (ckpts["tiny2"], high), (ckpts["tiny2"], other)):
        rc, out, err = _cli(capsys, "registry", "register", str(ck), "--name", "calc", "--eval", str(ev), "--json")
        assert rc == 0, err
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "1")
    assert rc == 0 and "champion -> v1" in out, err
    # worse (v1 holds; v1 vs itself is 'already'); v2 is better on the same 40 tasks
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "2", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["promoted"] and res["from"] == 1 and res["to"] == 2 and res["lo"] > 0 and res["n"] == 40
    assert res["mean"] == pytest.approx(0.5)
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "1")
    assert rc == ExitCode.FAILURE and "refused" in err and "CI" in err and err.count("\n") == 1
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "3")
    assert rc == ExitCode.FAILURE and "different task sets" in err
    rc, out, err = _cli(capsys, "registry", "list", "calc", "--json")
    rows = {r["version"]: r for r in json.loads(out)}
    assert rows[2]["aliases"] == ["champion"] and rows[1]["aliases"] == rows[3]["aliases"] == []
    assert rows[2]["success"] == pytest.approx(0.75) and rows[1]["success"] == pytest.approx(0.25)
    assert rows[2]["env_id"] == ENV and rows[2]["split"] == "test" and rows[2]["n_tasks"] == 40
    assert rows[2]["success_ci95"] == pytest.approx([0.6, 0.9]) and rows[2]["task_set"] == rows[1]["task_set"]
    assert rows[3]["task_set"] != rows[2]["task_set"]
    assert rows[2]["promotions"]["champion"]["from"] == 1 and not rows[2]["promotions"]["champion"]["forced"]
    rc, out, _ = _cli(capsys, "registry", "list", "calc")
    assert out.splitlines()[0].split()[:3] == ["version", "aliases", "env"] and "champion" in out
    # an override is recorded with its reason
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "3", "--force")
    assert rc == ExitCode.USAGE and "--reason" in err
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "3", "--force", "--reason", "new task set")
    assert rc == 0 and "FORCED" in out
    rc, out, _ = _cli(capsys, "registry", "list", "calc", "--json")
    rec = {r["version"]: r for r in json.loads(out)}[3]["promotions"]["champion"]
    assert rec["forced"] and rec["reason"] == "new task set" and rec["from"] == 2
    rc, out, err = _cli(capsys, "registry", "promote", "calc", "2", "--force", "--reason", "back")
    assert rc == 0


def _rollout_ids(capsys, policy: str, out: Path) -> list[tuple[list[int], list[float]]]:
    rc, _, err = _cli(capsys, "rollout", "calculator", "--policy", policy, "--episodes", "2", "--temperature", "0",
                      "--max-new-tokens", "6", "--out", str(out), "--no-progress")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [(r["completion_ids"], [round(x, 4) for x in r["logprobs"] if x is not None]) for r in rows]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sqlite_default_register_list_promote_and_load_by_uri(sqlite_store, tmp_path, capsys, ckpts):
    _workflow(tmp_path, capsys, ckpts)
    assert (sqlite_store / "mlflow.db").is_file() and (sqlite_store / "mlartifacts").is_dir()
    from trainers.tracking.registry import resolve_model_uri

    champ = resolve_model_uri("models:/calc@champion")
    assert _sha(champ / "model.safetensors") == _sha(ckpts["tiny2"] / "model.safetensors")
    assert _sha(resolve_model_uri("models:/calc/1") / "model.safetensors") == _sha(ckpts["tiny1"] / "model.safetensors")
    # a policy loaded by URI samples exactly what the same checkpoint loaded by path does (greedy: same tokens,
    # same logprobs), and the other version's weights give other logprobs
    by_uri = _rollout_ids(capsys, "models:/calc@champion", tmp_path / "a.jsonl")
    by_path = _rollout_ids(capsys, str(ckpts["tiny2"]), tmp_path / "b.jsonl")
    other = _rollout_ids(capsys, "models:/calc/1", tmp_path / "c.jsonl")
    assert by_uri == by_path and [lp for _, lp in by_uri] != [lp for _, lp in other] and by_uri[0][1]
    # `toolgym eval` by URI, reported to MLflow; its --json report attaches to the version it evaluated
    rc, out, err = _cli(capsys, "eval", "calculator", "--policy", "models:/calc/3", "--split", "test", "--tasks",
                        "3", "--max-new-tokens", "4", "--json", "--no-progress", "--out", str(tmp_path / "e.jsonl"),
                        "--report-to", "mlflow")
    assert rc == 0, err
    report = json.loads(out.splitlines()[-1])
    (tmp_path / "real.json").write_text(json.dumps(report))
    run_id = next(line.split(": ")[1] for line in err.splitlines() if line.startswith("reported to mlflow"))
    client = mlflow.MlflowClient(f"sqlite:///{sqlite_store / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.data.tags["toolgym.kind"] == "eval" and run.data.params["policy"] == "models:/calc/3"
    assert run.data.metrics["n_tasks"] == 3 and run.data.metrics["success"] == report["success"]
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["e.jsonl", "eval.json"]
    assert _cli(capsys, "registry", "attach-eval", "calc", "3", "--eval", str(tmp_path / "real.json"))[0] == 0
    rows = {r["version"]: r for r in json.loads(_cli(capsys, "registry", "list", "calc", "--json")[1])}
    assert rows[3]["n_tasks"] == 3 and rows[3]["task_set"] != rows[2]["task_set"]
    assert rows[3]["success_ci95"] == pytest.approx(report["success_ci95"], abs=1e-4)


@pytest.mark.timeout(300)
def test_bad_input_is_one_line_with_its_exit_code_and_registers_nothing(sqlite_store, tmp_path, capsys, ckpts):
    good = _eval(tmp_path / "good.json", 0.5, ckpt=ckpts["tiny1"])
    search = _eval(tmp_path / "search.json", 0.5, env="toolgym/Search-v0")
    (tmp_path / "broken.json").write_text('{"env_id": "toolgym/Calculator-v0"')
    (tmp_path / "partial.json").write_text('{"env_id": "toolgym/Calculator-v0", "success": 1}')
    cases = [
        (["register", str(ckpts["bad"]), "--name", "m"], ExitCode.INPUT, "model_type"),
        (["register", str(tmp_path / "nope"), "--name", "m"], ExitCode.INPUT, "not a directory"),
        (["register", str(ckpts["tiny1"]), "--name", "m", "--eval", str(search), "--env", ENV],
         ExitCode.INPUT, "Search-v0"),
        (["register", str(ckpts["tiny1"]), "--name", "m", "--eval", str(tmp_path / "broken.json")],
         ExitCode.INPUT, "not JSON"),
        (["register", str(ckpts["tiny1"]), "--name", "m", "--eval", str(tmp_path / "partial.json")],
         ExitCode.INPUT, "missing"),
        (["register", str(ckpts["tiny1"]), "--name", "a/b"], ExitCode.USAGE, "bad model name"),
        (["list", "m"], ExitCode.USAGE, "no registered model named 'm'"),
    ]
    for argv, code, text in cases:
        rc, out, err = _cli(capsys, "registry", *argv)
        assert (rc, err.count("\n")) == (code, 1) and text in err and "Error:" not in err, (argv, rc, err)
    # a registration that fails part-way (fault injected after the files were uploaded) leaves nothing behind
    import mlflow.tracking.client as mc

    real = mc.MlflowClient.create_model_version

    def boom(self, *a, **k):
        raise RuntimeError("store failure")

    mc.MlflowClient.create_model_version = boom
    try:
        rc, _, err = _cli(capsys, "registry", "register", str(ckpts["tiny1"]), "--name", "m", "--eval", str(good))
    finally:
        mc.MlflowClient.create_model_version = real
    assert rc == ExitCode.FAILURE and "store failure" in err
    rc, _, err = _cli(capsys, "registry", "list", "m")
    assert rc == ExitCode.USAGE  # the model created for it was removed
    client = mlflow.MlflowClient(f"sqlite:///{sqlite_store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("toolgym")
    assert client.search_runs([exp.experiment_id]) == []  # its registration run was deleted
    # now a real one, then unknown version / alias / a different env's eval for it
    assert _cli(capsys, "registry", "register", str(ckpts["tiny1"]), "--name", "m", "--env", ENV)[0] == 0
    for argv, code, text in [
        (["promote", "m", "7"], ExitCode.USAGE, "no version 7 (versions: 1)"),
        (["promote", "m", "1"], ExitCode.FAILURE, "has no evaluation"),
        (["attach-eval", "m", "1", "--eval", str(search)], ExitCode.INPUT, "trained on toolgym/Calculator-v0"),
    ]:
        rc, out, err = _cli(capsys, "registry", *argv)
        assert rc == code and text in err, (argv, rc, err)
    from trainers.tracking.registry import RegistryError, resolve_model_uri

    for uri, text in [("models:/m@champion", "no alias"), ("models:/m/4", "no version 4"), ("models:/m", "bad")]:
        with pytest.raises(RegistryError, match=text):
            resolve_model_uri(uri)
    rc, _, err = _cli(capsys, "rollout", "calculator", "--policy", "models:/zz@champion", "--out", str(tmp_path / "r"))
    assert rc == ExitCode.USAGE and "no registered model named 'zz'" in err
    # attach an evaluation afterwards, then promotion works
    assert _cli(capsys, "registry", "attach-eval", "m", "1", "--eval", str(good))[0] == 0
    assert _cli(capsys, "registry", "promote", "m", "1")[0] == 0
    # an unreachable tracking server: exit 4 at once (no minutes of retries)
    os.environ["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{free_port()}"
    try:
        t0 = time.monotonic()
        rc, _, err = _cli(capsys, "registry", "list", "m")
        assert rc == ExitCode.UNREACHABLE and "cannot reach the MLflow tracking server" in err
        assert time.monotonic() - t0 < 30
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_real_server_register_promote_and_download(mlflow_server, tmp_path, capsys, ckpts, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(tmp_path)
    _workflow(tmp_path, capsys, ckpts)
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # everything went to the server
    from trainers.tracking.registry import resolve_model_uri

    got = resolve_model_uri("models:/calc@champion", cache_dir=tmp_path / "cache")
    assert got == tmp_path / "cache" / "calc" / "2"
    assert _sha(got / "model.safetensors") == _sha(ckpts["tiny2"] / "model.safetensors")
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in ckpts["tiny2"].iterdir())
    (got / "model.safetensors").write_bytes(b"\0" * 64)  # a damaged cached copy is downloaded again, not loaded
    again = resolve_model_uri("models:/calc@champion", cache_dir=tmp_path / "cache")
    assert again == got and _sha(again / "model.safetensors") == _sha(ckpts["tiny2"] / "model.safetensors")
    shutil.rmtree(got)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_two_step_toolgym_train_run_is_tracked_and_registered_with_its_lineage(sqlite_store, tmp_path, capsys):
    config = Path(__file__).resolve().parent.parent / "trainers" / "configs" / "grpo_calculator_cpu.yaml"
    rc, out, err = _cli(capsys, "train", "grpo", "--config", str(config), "--toolgym.model", "tiny",
                        "--toolgym.num_train_tasks", "2", "--toolgym.max_turn_tokens", "8", "--toolgym.threads", "1",
                        "--toolgym.trajectory_dir", str(tmp_path / "traj"), "--max_steps", "2",
                        "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "32",
                        "--output_dir", str(tmp_path / "out"), "--run_name", "grpo-test", "--report_to", "mlflow",
                        "--disable_tqdm", "true")
    assert rc == 0, err[-3000:]
    lineage = json.loads((tmp_path / "out" / "toolgym_run.json").read_text())
    client = mlflow.MlflowClient(f"sqlite:///{sqlite_store / 'mlflow.db'}")
    run = client.get_run(lineage["training_run_id"])
    assert run.info.run_name == "grpo-test" and run.info.status == "FINISHED"
    hist = client.get_metric_history(run.info.run_id, "toolgym/tool_call_rate")
    assert sorted(m.step for m in hist) == [1, 2]
    assert {"toolgym/success", "toolgym/turns", "reward"} <= set(run.data.metrics)
    assert run.data.params["toolgym.env_id"] == ENV and run.data.params["num_generations"] == "4"
    assert run.data.tags["toolgym.env_id"] == ENV and run.data.tags["toolgym.split"] == "train"
    assert run.data.tags["toolgym.config_hash"] == lineage["config_hash"] and lineage["split"] == "train"
    from toolgym import __version__

    assert run.data.tags["toolgym.version"] == __version__
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "trajectories")]
    assert arts == ["trajectories/rank0.jsonl"]
    # registering the output carries the lineage; an evaluation of another env is refused
    bad = _eval(tmp_path / "search.json", 0.5, env="toolgym/Search-v0")
    rc, _, err = _cli(capsys, "registry", "register", str(tmp_path / "out"), "--name", "grpo", "--eval", str(bad))
    assert rc == ExitCode.INPUT and "trained on toolgym/Calculator-v0" in err
    rc, out, err = _cli(capsys, "registry", "register", str(tmp_path / "out"), "--name", "grpo", "--json")
    assert rc == 0, err
    row = json.loads(out)
    assert row["training_run_id"] == run.info.run_id and row["config_hash"] == lineage["config_hash"]
    assert row["env_id"] == ENV


@pytest.mark.timeout(300)
def test_rollout_report_to_mlflow_and_tensorboard(sqlite_store, tmp_path, capsys):
    rc, _, err = _cli(capsys, "rollout", "calculator", "--policy", "tiny", "--report-to", "bogus",
                      "--out", str(tmp_path / "x.jsonl"))
    assert rc == ExitCode.USAGE and "choose from mlflow" in err
    out = tmp_path / "r.jsonl"
    rc, _, err = _cli(capsys, "rollout", "calculator", "--policy", "tiny", "--episodes", "2", "--max-new-tokens", "4",
                      "--out", str(out), "--no-progress", "--report-to", "mlflow,tensorboard")
    assert rc == 0, err
    run_id = next(line.split(": ")[1] for line in err.splitlines() if line.startswith("reported to mlflow"))
    client = mlflow.MlflowClient(f"sqlite:///{sqlite_store / 'mlflow.db'}")
    run = client.get_run(run_id)
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    assert run.data.metrics["episodes"] == 2
    assert run.data.metrics["tool_call_rate"] == pytest.approx(sum(any(turn["calls"] for turn in t["turns"]) for t in trajs) / 2)
    assert run.data.params["env_id"] == ENV and run.data.tags["toolgym.kind"] == "rollout"
    assert [a.path for a in client.list_artifacts(run_id)] == ["r.jsonl"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = next(line.split(": ")[1] for line in err.splitlines() if line.startswith("reported to tensorboard"))
    acc = EventAccumulator(logdir)
    acc.Reload()
    assert "rollout/episodes" in acc.Tags()["scalars"]
    assert acc.Scalars("rollout/episodes")[0].value == 2
    assert acc.Scalars("rollout/reward")[0].value == pytest.approx(run.data.metrics["reward"])
