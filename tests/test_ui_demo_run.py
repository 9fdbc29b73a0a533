"""The demo's run in the tracking store the UI reads (``trainers/demo/record.py``): held-out evaluations of real
episodes (the oracle on four Calculator-v0 test tasks, a tiny model on the same tasks) and two saved checkpoints go
through the demo's own recording; the UI's Runs code then finds the run with its parameters, its per-step curve and
its held-out results, the UI's Register list offers the demo's evaluation, and the registry accepts it for the
checkpoint it evaluated (and refuses it for the other)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="the tracking store needs the [registry] extra")
pytest.importorskip("trl", reason="the demo needs the [train] extra")
pytest.importorskip("fastapi", reason="toolgym ui needs the [ui] extra")


def _demo_outputs(out: Path) -> dict:
    """What ``run_demo`` holds when it records: real held-out episodes, two saved checkpoints, GRPO step rows."""
    import toolgym  # noqa: F401
    from toolgym.checkpoint import save_checkpoint
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import oracle_policy, paired_difference_ci
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_tokenizer, tiny_random_model
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from toolgym.trajectory import write_trajectories
    from trainers.demo import ENV_ID, EVAL_FILES, DemoConfig
    from trainers.demo.record import heldout_summary

    tok = load_tokenizer()
    tasks = draw_tasks(ENV_ID, 4, seed=10_000, split="test", env_kwargs={"tokenizer": tok})
    seeds = list(range(10_000, 10_004))
    venv = make_vector_env(ENV_ID, 4, {"split": "test", "tokenizer": tok})
    (out / "trajectories").mkdir(parents=True)
    model = tiny_random_model(tok, seed=1)
    summaries = {}
    for key, policy in (("eval_before", TransformersPolicy(model, tok, do_sample=False, return_logprobs=False)),
                        ("eval_after_warmstart", TransformersPolicy(model, tok, do_sample=False,
                                                                    return_logprobs=False)),
                        ("eval_after_grpo", oracle_policy())):
        trajs = RolloutDriver(venv, policy, max_turn_tokens=64).run(tasks, seeds=seeds, progress=False)
        path = out / "trajectories" / EVAL_FILES[{"eval_before": "before", "eval_after_warmstart": "after warm start",
                                                  "eval_after_grpo": "after GRPO"}[key]]
        write_trajectories(path, trajs)
        summaries[key] = heldout_summary(trajs, path, 1.5)
    venv.close()
    ws = save_checkpoint(model, tok, out / "warmstart")
    final = save_checkpoint(tiny_random_model(tok, seed=2), tok, out / "final")
    steps = [{"step": i, "reward": r, "reward_std": 0.4, "frac_reward_zero_std": 0.5, "success": r,
              "tool_call_rate": 0.9, "calls_per_episode": 1.0, "errors": {"bad_arguments": 0.25} if i == 1 else {},
              "turns": 2.0, "loss": 0.01 * i, "step_s": 20.0} for i, r in ((1, 0.25), (2, 0.5), (3, 0.75))]
    metrics = {"env_id": ENV_ID, "eval_split": "test", "eval_task_ids": [t["id"] for t in tasks],
               "eval_seeds": seeds, "config": {**DemoConfig().__dict__, "grpo_steps": 3}, **summaries,
               "warmstart": {"loss": [2.5, 1.5, 1.0]}, "grpo": {"steps": steps},
               "checkpoints": {"warmstart": str(ws), "final": str(final)},
               "grpo_gain": paired_difference_ci(summaries["eval_after_warmstart"]["per_task_success"],
                                                 summaries["eval_after_grpo"]["per_task_success"])}
    (out / "metrics.json").write_text(json.dumps(metrics))
    return metrics


def test_the_demo_run_is_in_the_store_the_ui_reads_and_its_evaluation_registers(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from toolgym.errors import CLIError
    from toolgym.weights import weights_hash
    from trainers.demo.record import eval_reports, log_run
    from trainers.tracking import LINEAGE_FILE, tracking_uri
    from trainers.tracking.registry import register
    from trainers.ui import commands as C
    from trainers.ui.state import UI

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "runs" / "demo"
    metrics = _demo_outputs(out)
    after = metrics["eval_after_grpo"]
    assert after["success"] == 1.0 and metrics["eval_before"]["success"] == 0.0  # the oracle / an untrained model

    reports = eval_reports(metrics, out)
    run_id = log_run(metrics, out)

    # the store `toolgym ui --runs runs` reads holds the run: its parameters, curve and held-out results
    ui = UI(tmp_path / "runs", None, 1_000_000)
    assert ui.tracking_uri == tracking_uri()
    row = next(r for r in C.runs_table(ui.tracking_uri) if r["id"] == run_id)
    assert row["status"] == "finished" and row["name"] == "demo demo"
    import mlflow

    params = mlflow.MlflowClient(ui.tracking_uri).get_run(run_id).data.params
    assert params["demo.grpo_steps"] == "3" and params["env_id"] == metrics["env_id"]
    assert row["n_params"] == len(params) == 1 + len(metrics["config"])
    assert row["metrics"]["toolgym/heldout/after_grpo"] == after["success"]
    assert row["metrics"]["toolgym/heldout/before"] == 0.0
    curves = C.run_metrics(ui.tracking_uri, run_id)
    assert curves["reward"] == [[1.0, 0.25], [2.0, 0.5], [3.0, 0.75]]
    assert curves["toolgym/warmstart_loss"] == [[1.0, 2.5], [2.0, 1.5], [3.0, 1.0]]
    assert curves["toolgym/errors/bad_arguments"] == [[1.0, 0.25]]

    # the Register form offers the demo's evaluations; the registry takes the one of the checkpoint it evaluated
    assert {"demo/eval_after_grpo.json", "demo/eval_after_warmstart.json"} <= set(ui.files("eval"))
    assert [p.name for p in reports] == ["eval_after_warmstart.json", "eval_after_grpo.json"]
    ev = json.loads((out / "eval_after_grpo.json").read_text())
    assert ev["per_task_success"] == after["per_task_success"] and ev["task_ids"] == metrics["eval_task_ids"]
    assert ev["evaluated"]["weights_sha256"] == weights_hash(out / "final")
    version = register(out / "final", "demo-model", out / "eval_after_grpo.json")
    assert json.loads((out / "final" / LINEAGE_FILE).read_text())["training_run_id"] == run_id
    assert version["success"] == after["success"] and version["training_run_id"] == run_id
    # the store's own copies (the run's artifacts, the registered model) are never offered as files or models
    copies = tmp_path / "runs" / "mlartifacts"
    assert any(copies.rglob("eval_after_grpo.json")) and any(copies.rglob("eval_before.jsonl"))
    assert any(copies.rglob("config.json"))
    offered = ui.files("jsonl") + ui.files("eval") + ui.files("model")
    assert "demo/final" in offered and not [f for f in offered if f.startswith("mlartifacts")], offered
    with pytest.raises(CLIError, match="evaluates other weights"):
        register(out / "warmstart", "demo-model", out / "eval_after_grpo.json")
