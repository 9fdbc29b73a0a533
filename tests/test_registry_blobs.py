"""The registry keeps a version's files by content (trainers/tracking/blobs.py) on a real MLflow SQLite store with
real tiny saved models: registering the same weights again adds no model bytes on disk, versions that share their
tokenizer store it once, a version loads bit-identical weights after its source checkpoint is deleted or
overwritten, and damaged stored bytes are a classified error (exit 3) naming the file, never other weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow", reason="the registry needs the [registry] extra (mlflow)")

from tests import test_registry  # noqa: E402
from toolgym.cli import ExitCode, main  # noqa: E402

ckpts = test_registry.ckpts  # two tiny saved models (different weights, the same tokenizer)
sqlite_store = test_registry.sqlite_store  # the embedded store under <tmp>/runs

ENV = "toolgym/Calculator-v0"
SLACK = 64 * 1024  # a registration's own records (manifest, directory entries): far below any model file here


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def _same_tensors(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _blob(version_dir: Path, name: str) -> Path:
    """The blob a version's file links to (the file in the blob folder with the same inode)."""
    from trainers.tracking.blobs import file_sha256

    sha = file_sha256(version_dir / name)
    root = version_dir.parents[2] / "blobs" / "sha256"
    blob = root / sha[:2] / sha
    assert blob.samefile(version_dir / name)  # a hard link, not a copy
    return blob


@pytest.mark.timeout(300)
def test_the_same_weights_registered_again_cost_no_model_bytes(sqlite_store, ckpts, tmp_path):
    from trainers.tracking.blobs import disk_usage
    from trainers.tracking.registry import register, resolve_model_uri

    arts = sqlite_store / "mlartifacts"
    size = {p.name: p.stat().st_size for p in ckpts["tiny1"].iterdir()}
    register(ckpts["tiny1"], "m", env_id=ENV)
    first = disk_usage(arts)
    assert first >= sum(size.values())  # the bytes are really in the store
    register(ckpts["tiny1"], "m", env_id=ENV)
    second = disk_usage(arts)
    assert second - first < SLACK, (first, second)
    # other weights, the same tokenizer: the new weights cost their bytes, the shared tokenizer files nothing
    register(ckpts["tiny2"], "m", env_id=ENV)
    third = disk_usage(arts)
    new_weights = (ckpts["tiny2"] / "model.safetensors").stat().st_size
    assert new_weights <= third - second < new_weights + SLACK, (second, third, new_weights)
    assert size["tokenizer.json"] > SLACK  # so the saving above is measurable
    v1, v2, v3 = (resolve_model_uri(f"models:/m/{v}") for v in (1, 2, 3))
    assert (v1 / "model.safetensors").samefile(v2 / "model.safetensors")
    assert (v1 / "tokenizer.json").samefile(v3 / "tokenizer.json")
    assert not (v1 / "model.safetensors").samefile(v3 / "model.safetensors")
    assert sorted(p.name for p in v1.iterdir()) == sorted(size)  # the version directory is the model directory
    manifest = json.loads((v1.parent / "model_manifest.json").read_text())
    assert {e["path"]: e["size"] for e in manifest["files"]} == size


@pytest.mark.timeout(300)
def test_a_version_loads_the_registered_weights_after_its_source_is_deleted_or_overwritten(sqlite_store, ckpts,
                                                                                           tmp_path, capsys):
    from trainers.tracking.registry import register, resolve_model_uri

    src = Path(shutil.copytree(ckpts["tiny1"], tmp_path / "src"))
    register(src, "m", env_id=ENV)
    original = _tensors(ckpts["tiny1"])
    # overwritten in place (same inode, as save_pretrained into the same directory does): the version is untouched
    other = (ckpts["tiny2"] / "model.safetensors").read_bytes()
    with open(src / "model.safetensors", "r+b") as f:
        f.write(other)
        f.truncate()
    got = resolve_model_uri("models:/m/1")
    assert _same_tensors(_tensors(got), original)
    shutil.rmtree(src)
    got = resolve_model_uri("models:/m/1")
    assert _same_tensors(_tensors(got), original)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(got)
    ref = AutoModelForCausalLM.from_pretrained(ckpts["tiny1"])
    assert _same_tensors(model.state_dict(), ref.state_dict())


@pytest.mark.timeout(300)
def test_damaged_stored_bytes_are_a_classified_error_and_registering_again_repairs_them(sqlite_store, ckpts, tmp_path,
                                                                                        capsys):
    from trainers.tracking.blobs import RegistryIntegrityError
    from trainers.tracking.registry import register, resolve_model_uri

    register(ckpts["tiny1"], "m", env_id=ENV)
    register(ckpts["tiny1"], "copy", env_id=ENV)
    v1 = resolve_model_uri("models:/m/1")
    blob = _blob(v1, "model.safetensors")
    data = bytearray(blob.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte inside a tensor: the file still parses, the weights differ
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    for uri in ("models:/m/1", "models:/copy/1"):  # every version that shares the blob
        with pytest.raises(RegistryIntegrityError, match=r"model\.safetensors .* SHA-256 .* damaged") as e:
            resolve_model_uri(uri)
        assert e.value.code == ExitCode.INPUT and uri in e.value.message
    capsys.readouterr()
    rc = main(["rollout", "calculator", "--policy", "models:/m/1", "--episodes", "1", "--out",
               str(tmp_path / "r.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == ExitCode.INPUT and "model.safetensors" in err and "damaged" in err and err.count("\n") == 1, err
    # registering the same checkpoint again rewrites the blob, which repairs both versions
    register(ckpts["tiny1"], "m", env_id=ENV)
    for uri in ("models:/m/1", "models:/copy/1", "models:/m/2"):
        assert _same_tensors(_tensors(resolve_model_uri(uri)), _tensors(ckpts["tiny1"]))
    # a truncated file, a removed one and a weights file written into a version's directory
    tok = _blob(v1, "tokenizer.json")
    tok.chmod(0o644)
    with open(tok, "r+b") as f:
        f.truncate(100)
    with pytest.raises(RegistryIntegrityError, match=r"tokenizer\.json .* has 100 bytes"):
        resolve_model_uri("models:/m/2")
    register(ckpts["tiny1"], "m", env_id=ENV)  # repaired
    (v1 / "generation_config.json").unlink()
    with pytest.raises(RegistryIntegrityError, match=r"generation_config\.json is missing"):
        resolve_model_uri("models:/m/1")
    resolve_model_uri("models:/m/2")  # only that version's link was removed
    v3 = resolve_model_uri("models:/m/3")
    shutil.copyfile(v3 / "model.safetensors", v3 / "adapter_model.safetensors")
    with pytest.raises(RegistryIntegrityError, match=r"adapter_model\.safetensors\).*must not be written into"):
        resolve_model_uri("models:/m/3")


@pytest.mark.timeout(300)
def test_a_version_without_a_manifest_is_checked_by_its_weights_hash(sqlite_store, ckpts):
    from trainers.tracking.blobs import RegistryIntegrityError
    from trainers.tracking.registry import register, resolve_model_uri

    register(ckpts["tiny2"], "old", env_id=ENV)
    d = resolve_model_uri("models:/old/1")
    (d.parent / "model_manifest.json").unlink()  # a version registered without a manifest
    assert resolve_model_uri("models:/old/1") == d
    blob = _blob(d, "model.safetensors")
    data = bytearray(blob.read_bytes())
    data[-3] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(RegistryIntegrityError, match="not the ones registered"):
        resolve_model_uri("models:/old/1")
