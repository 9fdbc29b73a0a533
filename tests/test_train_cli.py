"""``toolgym train NAME`` (trainers/cli.py, trainers/runconfig.py): every algorithm of ``trainers.ALGORITHMS``
through one parser; overrides reach the config, bad keys are one-line errors, and short real runs of the tiny
model train, save, and log the toolgym metrics to TensorBoard."""

from __future__ import annotations

import dataclasses
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolgym.checkpoint import read_run_settings

pytest.importorskip("trl", reason="toolgym train needs the [train] extra (trl)")

from toolgym.cli import main as toolgym_main
from trainers import ALGORITHMS, cli
from trainers.runconfig import as_mapping, parse_overrides, resolve

ROOT = Path(__file__).resolve().parent.parent
GRPO_CFG = str(ROOT / "trainers" / "configs" / "grpo_calculator_cpu.yaml")


def _dry(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert cli.main([*argv, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _error(capsys: pytest.CaptureFixture[str], *argv: str, code: int) -> str:
    assert cli.main(list(argv)) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_overrides_reach_the_grpo_config(capsys):
    out = _dry(capsys, "grpo", "--config", GRPO_CFG, "--max_steps", "2", "--learning_rate", "1e-5",
               "--toolgym.env_id", "toolgym/SQL-v0", "--report_to", "mlflow", "--max-completion-length=96",
               "--toolgym.env_kwargs.split", "test", "--bf16", "--toolgym.model", "null")
    cfg = out["config"]
    tg = cfg.pop("toolgym")
    assert cfg["max_steps"] == 2 and cfg["learning_rate"] == 1e-5 and isinstance(cfg["learning_rate"], float)
    assert cfg["report_to"] == "mlflow" and cfg["max_completion_length"] == 96 and cfg["bf16"] is True
    assert cfg["num_generations"] == 8  # untouched fields keep the file's values
    assert tg["env_id"] == "toolgym/SQL-v0" and tg["env_kwargs"] == {"split": "test"} and tg["model"] is None
    assert tg["max_turn_tokens"] == 64 and tg["schedule"] == "lockstep"  # file value / dataclass default
    # the resolved fields build TRL's own config
    from trl import GRPOConfig

    grpo = ALGORITHMS["grpo"]
    c = resolve(grpo.Config, GRPO_CFG, parse_overrides(["--max_steps", "3", "--report_to", "[tensorboard]"]))
    assert isinstance(c, grpo.Config) and c.env_id == "toolgym/Calculator-v0" and c.max_turn_tokens == 64
    g = GRPOConfig(**{**c.trl, "bf16": False})
    assert g.max_steps == 3 and g.report_to == ["tensorboard"] and g.num_generations == 8
    assert resolve(grpo.Config, as_mapping(c)) == c  # the dry-run layout reads back as the same config
    assert parse_overrides(["--a.b-c", "-1", "--flag", "--x=1.5", "--y", "{k: [1, 2]}"]) == {
        "a.b_c": -1, "flag": True, "x": 1.5, "y": {"k": [1, 2]}}


def test_misspelt_keys_are_one_line_errors_naming_the_close_match(capsys, tmp_path):
    err = _error(capsys, "grpo", "--config", GRPO_CFG, "--max_step", "2", code=2)
    assert err.startswith("toolgym train grpo: error: unknown option --max_step; did you mean --max_steps")
    err = _error(capsys, "grpo", "--config", GRPO_CFG, "--toolgym.env_idd", "toolgym/SQL-v0", code=2)
    assert "unknown option --toolgym.env_idd; did you mean --toolgym.env_id?" in err
    err = _error(capsys, "grpo", "--config", GRPO_CFG, "--zzzz_qqq", "1", code=2)
    assert "unknown option --zzzz_qqq (not a field of trl" in err
    err = _error(capsys, "grpo", "--config", GRPO_CFG, "--learning_rate", "fast", code=2)
    assert err.endswith("--learning_rate: expected float, got 'fast'")
    bad = tmp_path / "bad.yaml"
    bad.write_text("toolgym:\n  env_id: toolgym/SQL-v0\n  num_train_task: 8\nmax_steps: 1\n")
    err = _error(capsys, "grpo", "--config", str(bad), code=2)
    assert err.endswith(f"{bad}: unknown key toolgym.num_train_task; did you mean toolgym.num_train_tasks?")
    err = _error(capsys, "sft", "--config", GRPO_CFG, code=2)  # a GRPO file is not an SFT config
    assert f"{GRPO_CFG}: unknown key num_generations" in err
    assert "cannot read config" in _error(capsys, "grpo", "--config", str(tmp_path / "none.yaml"), code=3)
    assert "--config needs a FILE.yaml" in _error(capsys, "grpo", "--config", code=2)
    assert "did you mean grpo?" in _error(capsys, "gpro", "--config", GRPO_CFG, code=2)
    err = _error(capsys, "grpo", "--config", GRPO_CFG, "--num_generations", "3", code=2)  # TRL's own check
    assert err.startswith("toolgym train grpo: error: invalid GRPOConfig:")


@pytest.mark.timeout(300)
def test_toolgym_command_exits_2_on_a_misspelt_key():
    proc = subprocess.run([sys.executable, "-m", "toolgym.cli", "train", "grpo", "--config", GRPO_CFG,
                           "--learning_rat", "1e-5"], capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if "Warning" not in ln and not ln.startswith("  warnings.warn")]
    assert lines == ["toolgym train grpo: error: unknown option --learning_rat; did you mean --learning_rate?"]


def test_missing_train_extra_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now fails as if it were not installed
    err = _error(capsys, "grpo", "--config", GRPO_CFG, code=3)
    assert "needs the [train] extra (missing module 'trl')" in err
    monkeypatch.setitem(sys.modules, "trainers.cli", None)
    assert toolgym_main(["train", "grpo", "--config", GRPO_CFG]) == 3
    assert "`toolgym train` needs the [train] extra" in capsys.readouterr().err


def test_every_algorithm_resolves_without_a_file_and_lists_its_fields(capsys):
    """No file: the Config's defaults (+ overrides); ``NAME --help`` lists the fields with their help texts."""
    for name in ALGORITHMS:
        cls = ALGORITHMS[name].Config
        trl = ("--use_cpu", "true", "--bf16", "false") if name in ("grpo", "sft") else ()  # TRL: bf16 needs a GPU
        out = _dry(capsys, name, *trl)
        assert out["algorithm"] == name
        assert cli.main([name, "--help"]) == 0
        text = capsys.readouterr().out
        for f in dataclasses.fields(cls):
            if f.name != "trl":
                assert f"--{'toolgym.' if name in ('grpo', 'sft') else ''}{f.name} (" in text
                assert f.metadata["help"] in text
    out = _dry(capsys, "rft", "--rounds", "3", "--env-kwargs", "{max_turns: 2}")
    assert out["config"]["rounds"] == 3 and out["config"]["env_kwargs"] == {"max_turns": 2}
    assert _dry(capsys, "reward-model", "--max_steps", "5")["config"]["max_steps"] == 5  # dashes in the name
    err = _error(capsys, "rft", "--toolgym.rounds", "2", code=2)  # rft has no toolgym section
    assert "unknown option --toolgym" in err
    assert cli.main(["--help"]) == 0 and "reward_model" in capsys.readouterr().out


def test_every_algorithm_config_extends_the_base_and_restates_none_of_it(capsys):
    """Every ``Config`` subclasses ``trainers.contract.BaseConfig`` (those that roll out: ``EnvConfig``) and
    declares none of its fields again, so ``model``, ``dtype``, ``threads``, ``env_id``, ``env_kwargs`` and their
    help have one definition; a shared field set on the command line reaches each algorithm's config."""
    from trainers.contract import BaseConfig, EnvConfig

    shared = {f.name for f in dataclasses.fields(EnvConfig)}
    for name in ALGORITHMS:
        cls = ALGORITHMS[name].Config
        assert issubclass(cls, BaseConfig), name
        base = EnvConfig if issubclass(cls, EnvConfig) else BaseConfig
        restated = sorted(shared & {n for k in cls.__mro__ if k not in (BaseConfig, EnvConfig, object)
                                    for n in getattr(k, "__annotations__", {})})
        assert restated == [], f"{name} restates {restated}"
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(base):
            assert fields[f.name].metadata["help"] == f.metadata["help"]
        section = "toolgym." if name in ("grpo", "sft") else ""
        trl = ("--use_cpu", "true", "--bf16", "false") if name in ("grpo", "sft") else ()
        out = _dry(capsys, name, *trl, f"--{section}dtype", "bfloat16", f"--{section}threads", "3")
        cfg = out["config"][section.rstrip(".")] if section else out["config"]
        assert (cfg["dtype"], cfg["threads"]) == ("bfloat16", 3)
    assert not issubclass(ALGORITHMS["reward_model"].Config, EnvConfig)  # it reads trajectory files, runs no env


def test_run_is_called_with_the_resolved_config(monkeypatch, capsys, tmp_path):
    """``toolgym train NAME`` resolves the Config and calls the module's ``run`` with it, nothing else."""
    from trainers.contract import RunResult

    rft = ALGORITHMS["rft"]
    got: list = []

    def fake_run(cfg):
        got.append(cfg)
        return RunResult("rft", cfg.output_dir, None, {"rounds": []})

    monkeypatch.setattr(rft, "run", fake_run)
    f = tmp_path / "rft.yaml"
    f.write_text("output_dir: runs/x\nrounds: 3\n")
    assert toolgym_main(["train", "rft", "--config", str(f), "--lr", "3e-5", "--env_id", "toolgym/SQL-v0"]) == 0
    assert got == [rft.Config(output_dir="runs/x", rounds=3, lr=3e-5, env_id="toolgym/SQL-v0")]
    assert "toolgym train rft: done, outputs in runs/x" in capsys.readouterr().out
    assert "did you mean --rounds?" in _error(capsys, "rft", "--config", str(f), "--round", "1", code=2)

    def failing(cfg):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(rft, "run", failing)
    assert _error(capsys, "rft", code=1) == "toolgym train rft: error: RuntimeError: boom second line"
    monkeypatch.setitem(sys.modules, "trainers.rft", None)  # not installed
    assert _error(capsys, "rft", code=3).endswith("needs trainers.rft (not in this install)")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_two_steps_of_the_tiny_model_log_toolgym_metrics_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "grpo"
    rc = toolgym_main(["train", "grpo", "--config", GRPO_CFG, "--toolgym.model", "tiny", "--max_steps", "2",
                       "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "32",
                       "--toolgym.max_turn_tokens", "8", "--toolgym.num_train_tasks", "4", "--toolgym.threads", "1",
                       "--toolgym.trajectory_dir", str(tmp_path / "traj"), "--learning_rate", "1e-4",
                       "--output_dir", str(out), "--report_to", "tensorboard"])
    assert rc == 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    # what toolgym eval needs to evaluate the checkpoint as the run ran it: the turn budget and the env
    settings = read_run_settings(out)
    assert settings["max_turn_tokens"] == 8 and settings["env_id"] == "toolgym/Calculator-v0"
    (run,) = glob.glob(str(out / "runs" / "*"))
    ea = EventAccumulator(run)
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    for t in ("train/toolgym/success", "train/toolgym/groups_with_success", "train/toolgym/tool_call_rate",
              "train/toolgym/turns",
              "train/toolgym/errors/parse_error", "train/rewards/env_reward/mean", "train/frac_reward_zero_std"):
        assert t in tags, sorted(tags)
    assert [e.step for e in ea.Scalars("train/toolgym/success")] == [1, 2]
    assert ea.Scalars("train/learning_rate")[0].value == pytest.approx(1e-4)  # the override reached the trainer
    assert len(list((tmp_path / "traj").glob("*.jsonl"))) >= 1  # the env episodes went through the adapter


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_on_oracle_episodes_trains_and_saves(tmp_path, capsys):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("toolgym:\n  model: tiny\n  env_id: toolgym/Calculator-v0\n  episodes: 4\n  num_envs: 4\n"
                   "output_dir: runs/never\nmax_steps: 50\nper_device_train_batch_size: 2\nuse_cpu: true\n"
                   "report_to: []\nsave_strategy: 'no'\nlogging_steps: 1\n")
    out = tmp_path / "sft"
    assert cli.main(["sft", "--config", str(cfg), "--max_steps", "2", "--output_dir", str(out),
                     "--toolgym.env_kwargs", "{split: train}"]) == 0
    printed = capsys.readouterr().out
    assert "4 episodes, kept 4 (reward >= 1.0)" in printed and "2 steps, model saved" in printed
    assert f"toolgym train sft: done, model saved to {out}" in printed
    kept = [json.loads(ln) for ln in (out / "sft_trajectories.jsonl").read_text().splitlines()]
    assert len(kept) == 4 and all(t["task"]["split"] == "train" and t["outcome_reward"] == 1.0 for t in kept)
    assert (out / "model.safetensors").is_file()
    settings = read_run_settings(out)  # the turn budget is recorded; the task split is the evaluation's own choice
    assert settings["max_turn_tokens"] == 128 and settings["env_kwargs"] == {}


@pytest.mark.parametrize("algo,path,extra", [
    ("grpo", "trainers/configs/grpo_calculator_cpu.yaml", ()),
    ("grpo", "trainers/configs/qwen3_4b_search_8xa100.yaml", ("--bf16", "false")),  # a GPU config, checked on CPU
    ("grpo", "examples/mcp/grpo_mcp_cpu.yaml", ()),
    ("sft", "trainers/configs/sft_calculator_cpu.yaml", ()),
])
def test_shipped_configs_resolve(algo, path, extra, capsys):
    import yaml

    out = _dry(capsys, algo, "--config", str(ROOT / path), *extra)["config"]
    raw = yaml.safe_load((ROOT / path).read_text())
    assert out["toolgym"]["env_id"] == raw["toolgym"]["env_id"]
    assert out["output_dir"] == raw["output_dir"]


def test_dpo_resolves_its_config_and_names_close_matches(capsys):
    """``toolgym train dpo`` reads trainers.dpo.Config's fields: overrides are typed, a misspelt key is exit 2."""
    cfg = str(Path(__file__).resolve().parent.parent / "trainers" / "configs" / "dpo_calculator_cpu.yaml")
    assert cli.main(["dpo", "--config", cfg, "--max_steps", "3", "--beta", "0.2", "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["algorithm"] == "dpo" and out["config"]["max_steps"] == 3 and out["config"]["beta"] == 0.2
    assert out["config"]["env_id"] == "toolgym/Calculator-v0"
    assert "did you mean --margin?" in _error(capsys, "dpo", "--config", cfg, "--margn", "1", code=2)


def test_output_dir_on_the_command_line_moves_the_trajectories_too(tmp_path):
    out = tmp_path / "second"
    c = cli.load("grpo", GRPO_CFG, ["--output_dir", str(out)])
    assert c.trl["output_dir"] == str(out) and c.trajectory_dir == str(out / "trajectories")
    kept = cli.load("grpo", GRPO_CFG, ["--output_dir", str(out), "--toolgym.trajectory_dir", "elsewhere"])
    assert kept.trajectory_dir == "elsewhere"  # named on the command line: kept
    assert cli.load("grpo", GRPO_CFG).trajectory_dir == "runs/grpo_calculator_cpu/trajectories"  # the file's own
    other = cli.load("grpo", {"output_dir": "runs/x", "toolgym": {"trajectory_dir": "logs/traj"}},
                     ["--output_dir", str(out), "--use_cpu", "true"])
    assert other.trajectory_dir == str(out / "trajectories")
    fixed = cli.load("grpo", {"toolgym": {"trajectory_dir": str(tmp_path / "abs")}}, ["--output_dir", str(out)])
    assert fixed.trajectory_dir == str(tmp_path / "abs")  # an absolute path is a deliberate choice


def test_runs_with_the_same_seed_get_run_names_of_their_own():
    a, b = (cli.load("grpo", GRPO_CFG, ["--seed", "0"], name_run=True) for _ in range(2))
    assert a.trl["run_name"] != b.trl["run_name"]
    assert a.trl["run_name"].startswith("grpo_calculator_cpu-seed0-")
    assert cli.load("grpo", GRPO_CFG, ["--run_name", "mine"], name_run=True).trl["run_name"] == "mine"
    assert cli.load("grpo", {"run_name": "filed", "use_cpu": True}, name_run=True).trl["run_name"] == "filed"
    assert cli.load("grpo", GRPO_CFG).trl.get("run_name") is None  # --dry-run: as configured
