"""The GPU extra resolves to a stack TRL 1.16 supports (from package metadata only: no GPU wheel is downloaded).

TRL 1.16 supports vLLM 0.22.0-0.31.0 (its ``vllm`` extra; its import check warns outside it). Each vLLM release
pins torch and a transformers window (0.31.0: ``torch==2.13.0``, ``transformers>=5.10.4,<5.18``), so the core's
transformers range decides whether any supported vLLM can be installed at all. ``pip install --dry-run --report``
resolves ``.[train,gpu]`` from the index's metadata (it downloads no wheel it does not need to read metadata from).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
TRL_VLLM_MIN, TRL_VLLM_MAX = Version("0.22.0"), Version("0.31.0")


def _extra(name: str) -> list[Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["project"]["optional-dependencies"][name]]


def _core(name: str) -> Requirement:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return next(r for r in map(Requirement, data["project"]["dependencies"]) if r.name == name)


def test_gpu_extra_declares_trl_s_vllm_window():
    """Our vllm specifier admits no version outside TRL's own `vllm` extra (read from the installed TRL)."""
    ours = next(r for r in _extra("gpu") if r.name == "vllm").specifier
    trl_reqs = [Requirement(r) for r in importlib.metadata.requires("trl") or []]
    trl_vllm = next(r for r in trl_reqs if r.name == "vllm" and r.marker and "vllm" in str(r.marker))
    assert trl_vllm.specifier == SpecifierSet(">=0.22.0,<=0.31.0"), trl_vllm  # TRL changed its window: re-check
    probes = [Version(f"0.{m}.{p}") for m in range(15, 40) for p in (0, 1, 2)]
    outside = [v for v in probes if v in ours and v not in trl_vllm.specifier]
    assert not outside, f"pyproject's gpu extra admits vllm {outside} which TRL 1.16 does not support"
    assert any(r.name == "trl" and "vllm" in r.extras for r in _extra("gpu"))


def test_core_transformers_range_admits_the_gpu_stack():
    """vllm 0.31.0 needs transformers>=5.10.4,<5.18: the core's range must overlap it (else no supported vLLM)."""
    core = _core("transformers").specifier
    vllm_031 = SpecifierSet(">=5.10.4,<5.18")
    assert any(Version(f"5.{m}.{p}") in core and Version(f"5.{m}.{p}") in vllm_031
               for m in range(10, 18) for p in range(0, 5))


@pytest.mark.slow
def test_gpu_extra_resolves_inside_trl_s_supported_vllm_range(tmp_path):
    """`pip install --dry-run --report` of `.[train,gpu]` on a metadata-only copy of the project: the resolved
    vllm is inside 0.22.0-0.31.0, TRL is 1.16.0, and transformers/torch satisfy what that vllm declares."""
    proj = tmp_path / "proj"
    for pkg in ("toolgym", "trainers"):
        (proj / pkg).mkdir(parents=True)
        (proj / pkg / "__init__.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", proj / "pyproject.toml")
    shutil.copy(ROOT / "README.md", proj / "README.md")
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), ".[train,gpu]"]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"the GPU extra does not resolve:\n{proc.stderr[-3000:]}"
    installs = {i["metadata"]["name"].lower(): i["metadata"] for i in json.loads(report.read_text())["install"]}
    versions = {name: Version(m["version"]) for name, m in installs.items()}
    vllm = versions["vllm"]
    assert TRL_VLLM_MIN <= Version(vllm.base_version) <= TRL_VLLM_MAX, f"vllm {vllm} is outside TRL 1.16's range"
    assert versions["trl"] == Version("1.16.0")
    assert "deepspeed" in versions and "wandb" in versions
    needs = {r.name.lower(): r for r in map(Requirement, installs["vllm"].get("requires_dist") or [])
             if r.marker is None}
    for dep in ("transformers", "torch"):
        if dep in needs:  # what the resolved vllm declares, satisfied by what was resolved
            assert needs[dep].specifier.contains(versions[dep], prereleases=True), (dep, versions[dep], needs[dep])
    assert versions["transformers"] in _core("transformers").specifier
    print(f"resolved: vllm {vllm}, torch {versions['torch']}, transformers {versions['transformers']}, "
          f"trl {versions['trl']}, deepspeed {versions['deepspeed']}")
