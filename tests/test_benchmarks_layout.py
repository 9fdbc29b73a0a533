"""benchmarks/ in the shape of its kinds: scripts import only ``benchmarks.common`` and the library (never one
another), nothing edits ``sys.path``, no import circle; every benchmark command the docs name runs as a module from
the repository root; the BFCL report prints the committed records; ``toolgym bench`` finds its checkout from any
directory and says which benchmarks need one where there is none."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the folders of runnable modules that are not the library: the measurements and experiments, and the deploy tools
TOOL_DIRS = ("benchmarks", "deploy")


def _modules() -> dict[str, Path]:
    """Dotted name -> file for every module under :data:`TOOL_DIRS` (a package is its ``__init__``)."""
    out = {}
    for top in TOOL_DIRS:
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in ``path``, at any depth (a function's lazy import counts)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _unit(module: str) -> str:
    """What a module belongs to: ``benchmarks.common``, one experiment folder or script (``benchmarks.bfcl``,
    ``benchmarks.vector_step``), or a deploy tool."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def script_imports(modules: dict[str, Path]) -> list[str]:
    """Each import of one script's (or experiment's) module by another, and each import of a script by
    ``benchmarks.common``: ``file:line: module``."""
    out = []
    for mod, path in modules.items():
        for line, target in _imports(path):
            if target.split(".")[0] not in TOOL_DIRS or target not in modules:
                continue
            own, other = _unit(mod), _unit(target)
            if other != own and other != "benchmarks.common":
                out.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    return out


def path_edits(modules: dict[str, Path]) -> list[str]:
    """Each use of ``sys.path`` (an insert, an append, an assignment): ``file:line``."""
    out = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """The import circles among ``modules`` (lazy imports included), each as a list of modules."""
    graph = {m: sorted({t for _, t in _imports(p) if t in modules and t != m}) for m, p in modules.items()}
    for m in modules:  # importing a.b.c runs a/__init__ and a/b/__init__ first: only the module itself is an edge
        graph[m] = [t for t in graph[m] if not m.startswith(t + ".")]
    cycles, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_scripts_import_only_the_shared_package_and_the_library() -> None:
    assert script_imports(_modules()) == []


def test_nothing_edits_sys_path() -> None:
    assert path_edits(_modules()) == []


def test_no_import_circle_among_benchmark_modules() -> None:
    assert import_cycles(_modules()) == []


def test_the_checks_see_violations(tmp_path: Path) -> None:
    """The three checks on modules that break them: one script importing another, a path edit, a circle."""
    (tmp_path / "a.py").write_text("import sys\nsys.path.insert(0, '.')\nfrom benchmarks.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    import benchmarks.a\n")
    (tmp_path / "c.py").write_text("from benchmarks.common.stages import Stage\n")
    mods = {"benchmarks.a": tmp_path / "a.py", "benchmarks.b": tmp_path / "b.py", "benchmarks.c": tmp_path / "c.py",
            "benchmarks.common.stages": tmp_path / "c.py"}
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert [s.split(": ")[1] for s in script_imports(mods)] == ["imports benchmarks.b", "imports benchmarks.a"]
        assert path_edits(mods) == ["a.py:2"]
        assert import_cycles(mods) == [["benchmarks.a", "benchmarks.b", "benchmarks.a"]]
    finally:
        ROOT = old


#: ``python -m benchmarks.X`` / ``python -m deploy.X`` in a command of the docs
_COMMAND = re.compile(r"python3? -m\s+((?:benchmarks|deploy)(?:\.\w+)+)")
#: a script started by its path (``python benchmarks/x.py``): the old way, which skips the package
_BY_PATH = re.compile(r"python3?\s+(?:benchmarks|deploy)/[\w/]+\.py")


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def documented_commands() -> list[str]:
    """Every module the docs and READMEs run with ``python -m`` under benchmarks/ or deploy/."""
    return sorted({m for page in _doc_pages() for m in _COMMAND.findall(page.read_text(encoding="utf-8"))})


def test_the_docs_run_benchmarks_as_modules() -> None:
    found = [f"{p.relative_to(ROOT)}: {m}" for p in _doc_pages() for m in _BY_PATH.findall(p.read_text("utf-8"))]
    assert found == []
    cmds = documented_commands()
    assert {"benchmarks.bfcl", "benchmarks.credit", "benchmarks.vector_step", "deploy.gpu_check"} <= set(cmds), cmds


@pytest.mark.parametrize("module", documented_commands())
def test_every_documented_benchmark_command_answers_help(module: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_the_bfcl_report_prints_the_committed_records() -> None:
    """``python -m benchmarks.bfcl --seeds 0 1 2 --report``: each cell of the per-category table is the share of
    valid entries in that checkpoint's committed record of that category, counted here from the records."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bfcl", "--seeds", "0", "1", "2", "--report"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| category | untrained |"))
    columns = [c.strip() for c in lines[head].strip("|").split("|")][1:]
    tags = ["untrained"] + [f"{stage}-seed{s}" for s in (0, 1, 2) for stage in ("warmstart", "grpo")]
    assert columns == ["untrained"] + [f"seed {s} {w}" for s in (0, 1, 2) for w in ("warm start", "GRPO")]
    table = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = cells[1:]
    assert len(table) == 10
    for category, cells in table.items():
        for tag, cell in zip(tags, cells, strict=True):
            records = list((ROOT / "benchmarks" / "bfcl" / "results").glob(f"eval-{tag}-{category}-*.json"))
            assert len(records) == 1, (tag, category)
            entries = json.loads(records[0].read_text())["entries"]
            assert cell == f"{100 * sum(e['valid'] for e in entries) / len(entries):.1f}", (tag, category)


# -- toolgym bench: the checkout from any directory ------------------------------------------------------------------

def _toolgym(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TOOLGYM_BENCHMARKS", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "toolgym.cli", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=300)


def test_toolgym_bench_runs_a_checkout_script_from_another_directory(tmp_path: Path) -> None:
    """From a directory outside the checkout and without ``TOOLGYM_BENCHMARKS``: the checkout is found from the
    package's own file and the script runs as a module there."""
    proc = _toolgym("bench", "vector", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "-m benchmarks.vector_step --help" in proc.stdout and "--async-max" in proc.stdout


def test_toolgym_bench_without_a_checkout_says_which_benchmarks_need_one(tmp_path: Path) -> None:
    """Where no checkout is found (an installed wheel used elsewhere; here a benchmarks folder that is not there),
    a checkout benchmark fails with a message naming what needs a checkout, and ``bench tools`` still runs."""
    from toolgym.cli.bench import ANYWHERE, BENCHMARKS

    nowhere = {"TOOLGYM_BENCHMARKS": str(tmp_path / "no-such-dir")}
    proc = _toolgym("bench", "sandbox", cwd=tmp_path, env=nowhere)
    assert proc.returncode != 0
    need = proc.stderr.split("): ", 1)[1].split(" run scripts of a source checkout")[0]
    assert need.split(", ") == [n for n in BENCHMARKS if n not in ANYWHERE]
    assert "`toolgym bench tools`" in proc.stderr
    tools = _toolgym("bench", "tools", "--help", cwd=tmp_path, env=nowhere)
    assert tools.returncode == 0 and "usage: toolgym bench tools" in tools.stdout


def test_the_checkout_is_found_from_any_directory_inside_it(tmp_path: Path) -> None:
    from toolgym.cli.bench import find_checkout

    (tmp_path / "co" / "benchmarks").mkdir(parents=True)
    (tmp_path / "co" / "pyproject.toml").write_text("[project]\nname = 'toolgym'\n")
    deep = tmp_path / "co" / "runs" / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "plain" / "benchmarks").mkdir(parents=True)  # a benchmarks folder without a project: not one
    assert find_checkout([deep]) == tmp_path / "co"
    assert find_checkout([tmp_path / "plain"]) is None
    assert find_checkout([tmp_path / "plain", deep]) == tmp_path / "co"
    assert find_checkout([Path(__file__).resolve().parent]) == ROOT
