"""The GPU check and its offline bundle, exercised on a CPU: the stages run at toy size and report, and a bundle cut
into parts installs on a machine with no index (hashes checked, a damaged part refused)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deploy.gpu_bundle import make_bundle
from deploy.gpu_check import main as gpu_check


def _tiny_wheel(tmp: Path) -> Path:
    whl = tmp / "tinypkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("tinypkg/__init__.py", "VALUE = 42\n")
        z.writestr("tinypkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n")
        z.writestr("tinypkg-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n")
        z.writestr("tinypkg-0.1.dist-info/RECORD", "")
    return whl


@pytest.mark.timeout(300)
def test_a_bundle_in_parts_installs_offline_and_refuses_a_damaged_part(tmp_path: Path):
    out = tmp_path / "bundle"
    manifest = make_bundle(out, [str(_tiny_wheel(tmp_path))], part_mb=0.5)
    assert len(manifest["parts"]) >= 2 and manifest["wheels"] == ["tinypkg-0.1-py3-none-any.whl"]
    assert all((out / p).stat().st_size <= 0.5 * 2**20 for p in manifest["parts"])
    site, proj = tmp_path / "site", tmp_path / "proj"
    cmd = [sys.executable, str(out / "install.py"), "--target", str(site), "--project", str(proj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (site / "tinypkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert (proj / "toolgym" / "__init__.py").is_file() and (proj / "pyproject.toml").is_file()
    damaged = out / manifest["parts"][0]
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF  # one byte of a part changed in transit
    damaged.write_bytes(bytes(data))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0 and "does not match its sha256" in proc.stderr


def test_without_a_gpu_the_check_says_so(capsys: pytest.CaptureFixture[str]):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check(["--out", "unused"]) == 3
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_stage_runs_at_toy_size_on_a_cpu_and_reports(tmp_path: Path):
    rc = gpu_check(["--device", "cpu", "--smoke", "--out", str(tmp_path), "--timeout", "1200"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    by = {s["stage"]: s for s in report["stages"]}
    assert set(by) == {"demo", "chain", "generation_2", "vision"}
    assert by["vision"]["figures"]["local"]["ok"]
    assert rc == 0, [(s["stage"], s["exit"], Path(s["log"]).read_text()[-1500:]) for s in report["stages"]]
    assert set(by["demo"]["figures"]) >= {"eval_before", "eval_after_grpo", "grpo_gain"}
    assert by["generation_2"]["figures"]
    assert "| demo | yes |" in (tmp_path / "gpu_check.md").read_text()
