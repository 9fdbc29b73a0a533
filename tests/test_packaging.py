"""The wheel ships both packages: the core ``toolgym`` with its data, and the ``trainers`` adapter with its configs.

Builds the wheel from a copy of the source (``pip wheel --no-deps --no-build-isolation``: no download), checks
its contents against the source tree, then installs it (``--no-deps --target``) and imports the adapter from the
installed copy, outside the checkout (the dependencies come from this interpreter).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _source_files(pkg: str) -> set[str]:
    base = ROOT / pkg
    return {p.relative_to(ROOT).as_posix() for p in base.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("toolgym", "trainers"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=ignore)
    out = tmp / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = out.glob("toolgym-*.whl")
    return whl


@pytest.mark.timeout(300)
def test_wheel_contains_the_adapter_configs_and_package_data(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("trainers/__init__.py", "trainers/grpo/rollout_adapter.py", "trainers/grpo/__init__.py", "trainers/sft.py",
              "trainers/cli.py", "trainers/configs/grpo_calculator_cpu.yaml", "trainers/configs/accelerate_zero3.yaml",
              "toolgym/cli/main.py", "toolgym/data/chinook.sqlite.gz", "toolgym/format/templates/chatml_tools.jinja"):
        assert f in names, f
    # every file of both packages is in the wheel (a new data file without a package-data pattern fails here)
    missing = (_source_files("toolgym") | _source_files("trainers")) - names
    assert not missing, sorted(missing)
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entries = zipfile.ZipFile(wheel).read(entry).decode()
    assert "toolgym = toolgym.cli:main" in entries
    # verl imports this entry point at `import verl` (trainers/verl/plugin.py registers the agent loop + estimator)
    assert "[verl.plugins]\ntoolgym = trainers.verl.plugin" in entries
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert 'Requires-Dist: trl==1.16.0; extra == "train"' in meta


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_wheel_imports_the_adapter_outside_the_checkout(wheel: Path, tmp_path: Path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # the installed copy comes first on the path (an editable install's finder comes after path entries); the
    # dependencies come from this interpreter; the checkout is not on the path (cwd elsewhere, no PYTHONPATH)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()), "PYTHONPATH": str(target)}
    code = ("import trainers, trainers.cli, trainers.grpo, trainers.grpo.rollout_adapter, toolgym, pathlib; "
            "print(pathlib.Path(trainers.__file__).parent, pathlib.Path(toolgym.__file__).parent); "
            "print((pathlib.Path(trainers.__file__).parent / 'configs' / 'grpo_calculator_cpu.yaml').is_file())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trainers_dir, toolgym_dir, has_cfg = proc.stdout.split()
    assert Path(trainers_dir) == target / "trainers" and Path(toolgym_dir) == target / "toolgym"
    assert has_cfg == "True"
    # the wheel's console script dispatches `train` to the installed adapter
    proc = subprocess.run([str(target / "bin" / "toolgym"), "train", "grpo", "--config", "nope.yaml"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240, env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.strip().startswith("toolgym train grpo: error: cannot read config nope.yaml: no such file, and "
                                          "no shipped config of that name (shipped: ")
    assert "grpo_calculator_cpu" in proc.stderr


def _installed(wheel: Path, tmp_path: Path) -> tuple[Path, Path, Any]:
    """The wheel installed with ``pip --target`` outside the checkout: ``(site dir, work dir, run)``, where
    ``run(*args, timeout=400)`` runs the wheel's own ``toolgym`` script in the work dir with only that site on the
    path."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()), "PYTHONPATH": str(target),
           "OMP_NUM_THREADS": "1"}
    toolgym = str(target / "bin" / "toolgym")

    def run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        return subprocess.run([toolgym, *args], capture_output=True, text=True, cwd=work, timeout=timeout, env=env)

    return target, work, run


_USER_TOOLS = """
from toolgym import ToolError, tool


@tool
def shout(text: str) -> str:
    \"\"\"Upper-case a text.

    Args:
        text: what to upper-case.
    \"\"\"
    if text == "boom":
        raise ToolError("cannot shout that")
    return text.upper()
"""

_USER_MCP_SERVER = """
from mcp.server.mcpserver import MCPServer

server = MCPServer("user")


@server.tool()
def reverse(text: str) -> str:
    \"\"\"Reverse a text.\"\"\"
    return text[::-1]


if __name__ == "__main__":
    server.run()
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installed_wheel_trains_by_config_name_and_benchmarks_the_users_tools(wheel: Path, tmp_path: Path):
    """From a wheel installed outside the checkout: ``toolgym train grpo --config grpo_calculator_cpu`` finds the
    shipped config by name and runs a step; ``toolgym bench tools`` times a user's ``@tool`` module and ``toolgym
    bench mcp`` a user's MCP config (a real stdio server), each with the user's arguments."""
    target, work, run = _installed(wheel, tmp_path)

    proc = run("train", "grpo", "--config", "grpo_calculator_cpu", "--max_steps", "1", "--output_dir", "out/grpo")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert (work / "out" / "grpo").is_dir()

    (work / "user_tools.py").write_text(_USER_TOOLS)
    rows = work / "tools.json"
    proc = run("bench", "tools", "--module", "user_tools.py", "--call", 'shout={"text": "hi"}',
               "--call", 'shout={"text": "boom"}', "--calls", "20", "--concurrency", "1,4", "--json", str(rows))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(rows.read_text())
    assert [(r["tool"], r["concurrency"], r["calls"]) for r in result] == [("shout", 1, 20), ("shout", 4, 20)]
    for r in result:
        assert r["executor"]["errors"] == {"exception": 10}  # every other call raises ToolError
        assert 0 < r["executor"]["p50_ms"] <= r["executor"]["p95_ms"] <= r["executor"]["p99_ms"]
        assert r["direct"]["calls_s"] > 0 and r["executor"]["calls_s"] > 0
        assert r["overhead_ms"] == pytest.approx(r["executor"]["p50_ms"] - r["direct"]["p50_ms"])
    assert "p50 ms" in proc.stdout and "overhead ms" in proc.stdout

    (work / "server.py").write_text(_USER_MCP_SERVER)
    (work / "mcp.json").write_text(json.dumps({"mcpServers": {"user": {"command": sys.executable,
                                                                        "args": [str(work / "server.py")]}}}))
    rows = work / "mcp_rows.json"
    proc = run("bench", "mcp", "--config", "mcp.json", "--call", 'reverse={"text": "abc"}', "--calls", "10",
               "--concurrency", "1,4", "--json", str(rows))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(rows.read_text())
    assert {r["tool"] for r in result} == {"reverse"} and all(r["executor"]["errors"] == {} for r in result)
    # a call naming no tool of the server is a usage error that names the server's tools
    proc = run("bench", "mcp", "--config", "mcp.json", "--call", 'nope={}', "--calls", "2")
    assert proc.returncode == 2 and "reverse" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installed_wheel_runs_train_and_ui_through_its_entry_points(wheel: Path, tmp_path: Path):
    """The core finds ``train``/``registry``/``ui`` through the wheel's ``toolgym.commands`` entry points: the
    installed console script trains one GRPO step from the config file shipped inside the wheel, outside the
    checkout, and answers ``toolgym ui --help``."""
    names = set(zipfile.ZipFile(wheel).namelist())
    entries = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[toolgym.commands]\n" in entries and "train = trainers.cli:main" in entries
    assert "[toolgym.report_to]\n" in entries and "[toolgym.policies]\n" in entries
    target, work, run = _installed(wheel, tmp_path)

    proc = run("train", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "grpo" in proc.stdout and "reward_model" in proc.stdout
    proc = run("ui", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--port" in proc.stdout and "--runs" in proc.stdout
    config = target / "trainers" / "configs" / "grpo_calculator_cpu.yaml"
    out = work / "grpo-1"
    proc = run("train", "grpo", "--config", str(config), "--max_steps", "1", "--toolgym.model", "tiny",
               "--toolgym.num_train_tasks", "2", "--toolgym.max_turn_tokens", "8", "--toolgym.threads", "1",
               "--per_device_train_batch_size", "2", "--num_generations", "2", "--max_completion_length", "16",
               "--toolgym.trajectory_dir", str(out / "trajectories"), "--output_dir", str(out), timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file(), sorted(p.name for p in out.iterdir())
    assert list((out / "trajectories").glob("*.jsonl"))
