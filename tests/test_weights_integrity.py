"""A checkpoint's weights before anything uses them: a truncated, empty or missing weights file, or a config file
that is not a JSON object, is refused by `toolgym registry register` and `toolgym eval --policy DIR` with exit 3 and
the file's name (real tiny checkpoints, damaged on disk)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolgym.cli import ExitCode, main
from toolgym.weights import WeightsError, check_weights, weights_hash


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from toolgym.models import load_tokenizer, tiny_random_model

    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    tok = load_tokenizer()
    tiny_random_model(tok, seed=1, num_hidden_layers=1).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _copy(ckpt: Path, where: Path, name: str) -> Path:
    """A copy of the checkpoint ``ckpt`` at ``where / name``."""
    return Path(shutil.copytree(ckpt, where / name))


def _damaged(ckpt: Path, where: Path, cut: int | None) -> Path:
    """A copy of ``ckpt`` whose model.safetensors keeps its first ``cut`` bytes (``None``: half of them)."""
    d = _copy(ckpt, where, f"cut{cut}")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2 if cut is None else cut])
    return d


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("cut", [None, 0, 5, 40])
def test_a_truncated_safetensors_file_is_named(ckpt, tmp_path, cut):
    check_weights(ckpt)
    bad = _damaged(ckpt, tmp_path, cut)
    with pytest.raises(WeightsError, match=r"model\.safetensors: truncated") as e:
        check_weights(bad)
    assert e.value.code == ExitCode.INPUT and str(bad / "model.safetensors") in e.value.message


def test_sharded_checkpoints_check_every_shard(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path, "sharded")
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    data = (d / "model-00001-of-00002.safetensors").read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    names = [k for k in header if k != "__metadata__"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        n: "model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors"
        for i, n in enumerate(names)}}))
    with pytest.raises(WeightsError, match=r"model-00002-of-00002\.safetensors: missing"):
        check_weights(d)
    shutil.copy(d / "model-00001-of-00002.safetensors", d / "model-00002-of-00002.safetensors")
    assert len(check_weights(d)) == 3
    (d / "model-00002-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"model-00002-of-00002\.safetensors: truncated"):
        check_weights(d)


def test_an_empty_torch_weights_file_is_named(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path, "bin")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"pytorch_model\.bin: empty"):
        check_weights(d)


def test_the_weights_hash_follows_the_bytes(ckpt, tmp_path):
    same = _copy(ckpt, tmp_path, "same")
    assert weights_hash(same) == weights_hash(ckpt)
    (same / "tokenizer_config.json").write_text("{}")  # not a weights file
    assert weights_hash(same) == weights_hash(ckpt)
    data = bytearray((same / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (same / "model.safetensors").write_bytes(bytes(data))
    assert weights_hash(same) != weights_hash(ckpt)


@pytest.mark.timeout(300)
def test_register_and_eval_refuse_a_truncated_checkpoint_naming_the_file(ckpt, tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    bad = _damaged(ckpt, tmp_path, None)
    name = str(bad / "model.safetensors")
    rc, _, err = _cli(capsys, "registry", "register", str(bad), "--name", "m")
    assert rc == ExitCode.INPUT and name in err and err.count("\n") == 1, (rc, err)
    rc, _, err = _cli(capsys, "eval", "calculator", "--policy", str(bad), "--tasks", "1", "--max-new-tokens", "4",
                      "--no-progress", "--json")
    assert rc == ExitCode.INPUT and name in err and err.count("\n") == 1, (rc, err)
    assert not (tmp_path / "runs" / "mlflow.db").exists() or _cli(capsys, "registry", "list", "m")[0] == ExitCode.USAGE


@pytest.mark.parametrize(("name", "text", "why"), [("config.json", '{"model_type": "llama",', "not valid JSON"),
                                                    ("tokenizer_config.json", "[1, 2]", "not a JSON object")])
def test_eval_refuses_a_malformed_config_file_naming_it(ckpt, tmp_path, capsys, name, text, why):
    """A checkpoint whose config.json (or tokenizer config) is not a JSON object: exit 3, one line naming the file,
    before transformers reads it (its own error is an OSError, exit 1)."""
    bad = _copy(ckpt, tmp_path, "bad")
    (bad / name).write_text(text)
    with pytest.raises(WeightsError, match=why):
        check_weights(bad)
    rc, _, err = _cli(capsys, "eval", "calculator", "--policy", str(bad), "--tasks", "1", "--max-new-tokens", "4",
                      "--no-progress", "--json")
    assert rc == ExitCode.INPUT and str(bad / name) in err and why in err and err.count("\n") == 1, (rc, err)


def _eval_json(capsys, tmp_path: Path, policy: str, name: str) -> Path:
    rc, out, err = _cli(capsys, "eval", "calculator", "--policy", policy, "--split", "test", "--tasks", "2",
                        "--max-new-tokens", "4", "--no-progress", "--json")
    assert rc == 0, err
    path = tmp_path / f"{name}.json"
    path.write_text(out.splitlines()[-1])
    return path


@pytest.mark.timeout(400)
def test_an_evaluation_is_registered_only_with_the_weights_it_evaluated(ckpt, tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    from toolgym.models import load_tokenizer, tiny_random_model

    other = tmp_path / "other"
    tiny_random_model(load_tokenizer(), seed=2, num_hidden_layers=1).save_pretrained(other)
    load_tokenizer().save_pretrained(other)
    oracle = _eval_json(capsys, tmp_path, "oracle", "oracle")
    mine = _eval_json(capsys, tmp_path, str(ckpt), "mine")
    rec = json.loads(mine.read_text())["evaluated"]
    assert rec == {"kind": "checkpoint", "path": str(ckpt.resolve()), "weights_sha256": weights_hash(ckpt)}
    assert json.loads(oracle.read_text())["evaluated"] == {"kind": "oracle"}
    old = tmp_path / "old.json"  # a report from before the record
    old.write_text(json.dumps({k: v for k, v in json.loads(mine.read_text()).items() if k != "evaluated"}))
    for ck, ev, text in [(ckpt, oracle, "not of a checkpoint"), (other, mine, "evaluates other weights"),
                         (ckpt, old, "--unverified-eval")]:
        rc, _, err = _cli(capsys, "registry", "register", str(ck), "--name", "m", "--eval", str(ev))
        assert rc == ExitCode.INPUT and text in err and str(ev) in err and err.count("\n") == 1, (ck, ev, err)
    rc, _, err = _cli(capsys, "registry", "register", str(ckpt), "--name", "m", "--eval", str(oracle),
                      "--unverified-eval")
    assert rc == ExitCode.INPUT and "not of a checkpoint" in err
    rc, out, err = _cli(capsys, "registry", "register", str(ckpt), "--name", "m", "--eval", str(mine), "--json")
    assert rc == 0, err
    rc, out, err = _cli(capsys, "registry", "register", str(other), "--name", "m", "--eval", str(old), "--json",
                        "--unverified-eval")
    assert rc == 0, err
    # attach-eval: the version's own weights only
    for version, ev, text in [("1", oracle, "not of a checkpoint"), ("2", mine, "evaluates other weights"),
                              ("1", old, "--unverified-eval")]:
        rc, _, err = _cli(capsys, "registry", "attach-eval", "m", version, "--eval", str(ev))
        assert rc == ExitCode.INPUT and text in err, (version, ev, err)
    assert _cli(capsys, "registry", "attach-eval", "m", "1", "--eval", str(mine))[0] == 0
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    tags = {v: client.get_model_version("m", v).tags for v in ("1", "2")}
    assert tags["1"]["eval.verified"] == "true" and tags["2"]["eval.verified"] == "false"
    assert tags["1"]["toolgym.weights_sha256"] == weights_hash(ckpt)
