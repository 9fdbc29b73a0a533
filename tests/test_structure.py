"""The layout rules of ``docs/design.md``, checked on the source (``python tests/test_structure.py`` prints every
violation; the tests fail on any):

1. no Python file in ``toolgym/`` or ``trainers/`` over :data:`MAX_LINES` lines;
2. no import cycle between the modules of ``toolgym/`` and ``trainers/`` (function-level imports count: a lazy
   import is still a dependency; imports under ``if TYPE_CHECKING:`` do not, they never run);
3. no private name imported across packages: ``from a.b import _x``, ``import a._b`` or ``from a._b import x`` is
   allowed only from a module in the same package (directory) as the private module or name;
4. dependencies point one way inside the tree: the layers of :data:`LAYERS` (the package map in
   ``docs/concepts.md``; e.g. tools never import data, ``toolgym`` never imports ``trainers``): a module imports only
   its own layer or the layers above it (``toolgym/__init__.py``, the public API, is exempt);
5. ... and outside it: ``toolgym`` never imports TRL, vLLM, MLflow or DeepSpeed (:data:`FORBIDDEN`);
6. no module imports ``toolgym.cli`` (the entry point) but the entry point itself: the error types and exit codes
   live in ``toolgym.errors``;
7. the algorithm contract (``trainers/__init__.py``): every entry of ``trainers.ALGORITHMS`` is a module with a
   ``Config`` dataclass whose fields all carry ``metadata["help"]`` and a ``run`` function taking the config, and
   reading a ``Config`` imports neither torch nor TRL (this one imports the modules, in a fresh interpreter);
8. shipped text describes the software, not its development diary: no file name or content under
   :data:`SHIPPED` names a numbered work session or issue, or the current work session (:data:`HISTORY`).
9. ``toolgym`` does not reach ``trainers`` by a module-name string either: no ``import_module``/``__import__``/
   ``find_spec``/``run_module`` of a ``"trainers..."`` string and no string that is a dotted path into ``trainers``
   (the core finds the training package's commands through entry points, ``toolgym/cli/plugins.py``);
10. ``trainers/`` is in wings: its top level holds only :data:`TRAINERS_TOP` (the algorithm contract, the shared
   plumbing, the single-module algorithms and the shared credit estimators) and the packages
   :data:`TRAINERS_WINGS`; the modules inside an algorithm's package (``trainers/grpo/*``, ``trainers/dpo/*``) are
   imported only from inside that package (everything else goes through the package: ``Config``, ``run``).

The import graph (rules 1-6) is built with :mod:`ast` only (nothing is imported), so the check is fast and cannot
be fooled by import-time side effects.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolgym", "trainers")
MAX_LINES = 600

#: rule 9: the modules allowed at the top level of ``trainers/`` (a new algorithm-internal module goes in its wing)
TRAINERS_TOP = frozenset({"__init__", "cli", "runconfig", "contract", "credit", "sft", "rft", "reward_model"})
#: rule 9: the packages of ``trainers/``
TRAINERS_WINGS = frozenset({"grpo", "dpo", "tracking", "demo", "ui", "verl"})
#: rule 9: the wings whose modules are private to the package (algorithms: the outside sees ``Config`` and ``run``)
ALGORITHM_WINGS = ("trainers.grpo", "trainers.dpo")
#: rule 8: calls that import a module named by a string
IMPORT_CALLS = frozenset({"import_module", "__import__", "find_spec", "run_module", "import_train"})

#: rule 5: (importer prefix, forbidden outside packages).
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (("toolgym", ("trl", "vllm", "mlflow", "deepspeed")),)

#: rule 4: the layers, top (imported by everything below) to bottom; a module may import only its own layer or one
#: above it. Same order as the package map in docs/concepts.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("toolgym.errors", "toolgym.runtime", "toolgym.jsonl", "toolgym.batching", "toolgym.resources",
     "toolgym.checkpoint", "toolgym.weights", "toolgym.moved", "toolgym.console", "toolgym.placement"),
    ("toolgym.models",),
    ("toolgym.tools",),
    ("toolgym.trajectory",),
    ("toolgym.format",),
    ("toolgym.rewards",),
    ("toolgym.data",),
    ("toolgym.envs",),
    ("toolgym.rollout",),
    ("toolgym.evaluation",),
    ("toolgym.serve", "toolgym.bench"),
    ("toolgym.report",),
    ("toolgym.cli",),
    ("trainers",),
)


@dataclass(frozen=True)
class Import:
    """One import statement: ``source`` module imports ``target`` (a module) and possibly ``names`` from it."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of :data:`PACKAGES` (a package is its ``__init__``)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _is_package(mod: str, files: dict[str, Path]) -> bool:
    return files[mod].name == "__init__.py"


@functools.cache
def _parse(path: Path, mtime_ns: int) -> tuple[ast.Module, frozenset[int]]:
    """A file's syntax tree and its ``TYPE_CHECKING`` lines, parsed once per version of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return tree, frozenset(_type_checking_lines(tree))


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if hasattr(n, "lineno"):
                        lines.add(n.lineno)
    return lines


def imports(files: dict[str, Path] | None = None) -> Iterator[Import]:
    """Every import in :data:`PACKAGES` (any nesting level), resolved to absolute module names."""
    files = files if files is not None else modules()
    for mod, path in files.items():
        tree, skip = _parse(path, path.stat().st_mtime_ns)
        pkg = mod if _is_package(mod, files) else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield Import(mod, a.name, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = tuple(a.name for a in node.names)
                # `from pkg import submodule` imports the submodule
                subs = [n for n in names if f"{target}.{n}" in files]
                for n in subs:
                    yield Import(mod, f"{target}.{n}", (), node.lineno)
                rest = tuple(n for n in names if n not in subs)
                if rest or not subs:
                    yield Import(mod, target, rest, node.lineno)


def _own(target: str, files: dict[str, Path]) -> str | None:
    """The module of ours that ``target`` names (itself, or its nearest parent that is one of ours), else None."""
    t = target
    while t:
        if t in files:
            return t
        t = t.rpartition(".")[0]
    return None


def long_files(files: dict[str, Path] | None = None) -> list[str]:
    files = files if files is not None else modules()
    out = []
    for p in files.values():
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            out.append(f"{p.relative_to(ROOT)}: {n} lines (max {MAX_LINES})")
    return out


def cycles(files: dict[str, Path] | None = None) -> list[list[str]]:
    """Strongly connected components (size > 1, or a self-import) of the module import graph."""
    files = files if files is not None else modules()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for imp in imports(files):
        t = _own(imp.target, files)
        if t is not None and t != imp.source:
            graph[imp.source].add(t)
    # Tarjan's algorithm, iterative
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(files: dict[str, Path] | None = None) -> list[str]:
    """Imports of a private module or name from outside the package (directory) that holds it."""
    files = files if files is not None else modules()
    out = []
    for imp in imports(files):
        src_pkg = imp.source if _is_package(imp.source, files) else imp.source.rpartition(".")[0]
        parts = imp.target.split(".")
        for i, part in enumerate(parts):
            if _private(part):
                holder = ".".join(parts[:i])  # the package that holds the private module
                if holder != src_pkg:
                    out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: imports private module "
                               f"{imp.target}")
                break
        else:
            t = _own(imp.target, files)
            if t is None:
                continue
            holder = t if _is_package(t, files) else t.rpartition(".")[0]
            for n in imp.names:
                if _private(n) and holder != src_pkg:
                    out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: imports private name {n} "
                               f"from {imp.target}")
    return out


def forbidden_imports(files: dict[str, Path] | None = None) -> list[str]:
    files = files if files is not None else modules()
    out = []
    for imp in imports(files):
        for src, targets in FORBIDDEN:
            if imp.source == src or imp.source.startswith(src + "."):
                for t in targets:
                    if imp.target == t or imp.target.startswith(t + "."):
                        out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports "
                                   f"{imp.target} (not allowed: {src} -> {t})")
    return out


def layer(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module`` (its longest matching prefix), or None."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(LAYERS):
        for p in names:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def layering(files: dict[str, Path] | None = None) -> list[str]:
    """Imports that point down :data:`LAYERS` (and modules of ours in no layer)."""
    files = files if files is not None else modules()
    out = []
    for imp in imports(files):
        t = _own(imp.target, files)
        if t is None or imp.source in PACKAGES or t in PACKAGES:
            continue
        a, b = layer(imp.source), layer(t)
        if a is None or b is None:
            out.append(f"{files[imp.source].relative_to(ROOT)}: {imp.source if a is None else t} is in no layer")
        elif b > a:
            out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports {t}, a lower layer")
    return sorted(set(out))


#: rule 6: the entry point, the one module that may import itself
ENTRY_POINT = "toolgym.cli"


def entry_point_imports(files: dict[str, Path] | None = None) -> list[str]:
    """Imports of :data:`ENTRY_POINT` from any other module."""
    files = files if files is not None else modules()
    return [f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports the entry point {ENTRY_POINT}"
            for imp in imports(files) if imp.target == ENTRY_POINT and imp.source != ENTRY_POINT]


_CONTRACT_PROBE = """
import dataclasses, inspect, json, sys
import trainers
out = []
for name in trainers.ALGORITHMS:
    mod = trainers.ALGORITHMS[name]
    cfg, run = getattr(mod, "Config", None), getattr(mod, "run", None)
    if not (isinstance(cfg, type) and dataclasses.is_dataclass(cfg)):
        out.append(f"{mod.__name__}: no Config dataclass")
    else:
        out += [f"{mod.__name__}.Config.{f.name}: no help text" for f in dataclasses.fields(cfg)
                if not str(f.metadata.get("help", "")).strip()]
    if not callable(run) or not list(inspect.signature(run).parameters)[:1]:
        out.append(f"{mod.__name__}: no run(config)")
heavy = sorted(m for m in ("torch", "trl", "transformers") if m in sys.modules)
if heavy:
    out.append(f"reading the Configs imported {heavy}")
print(json.dumps(out))
"""


def _docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring constant of ``tree`` (module, class, function)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _names_trainers(text: str) -> bool:
    import re

    return re.fullmatch(r"trainers(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?", text.strip()) is not None


def dynamic_trainers_imports(files: dict[str, Path] | None = None, package: str = "toolgym") -> list[str]:
    """Rule 8: module-name strings through which ``package`` could import ``trainers``."""
    files = files if files is not None else modules()
    out = []
    for mod, path in files.items():
        if mod != package and not mod.startswith(package + "."):
            continue
        tree, _ = _parse(path, path.stat().st_mtime_ns)
        docs = _docstrings(tree)
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                arg = node.args[0] if node.args else None
                text = ast.unparse(arg) if arg is not None else ""
                if fn in IMPORT_CALLS and "trainers" in text:
                    out.append(f"{where}:{node.lineno}: {fn}({text}) imports trainers by name")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and _names_trainers(node.value)):
                out.append(f"{where}:{node.lineno}: the string {node.value!r} names a module of trainers")
    return sorted(set(out))


def wing_violations(files: dict[str, Path] | None = None) -> list[str]:
    """Rule 9: flat modules at the top of ``trainers/`` and imports of an algorithm's internals from outside."""
    files = files if files is not None else modules()
    out = []
    root = ROOT / "trainers"
    for p in sorted(root.iterdir()):
        if p.suffix == ".py" and p.stem not in TRAINERS_TOP:
            out.append(f"{p.relative_to(ROOT)}: a module at the top of trainers/ (put it in its wing, e.g. "
                       "trainers/grpo/, or add it to TRAINERS_TOP with a reason)")
        elif p.is_dir() and (p / "__init__.py").exists() and p.name not in TRAINERS_WINGS:
            out.append(f"{p.relative_to(ROOT)}/: a package of trainers/ not in TRAINERS_WINGS")
    for imp in imports(files):
        for wing in ALGORITHM_WINGS:
            inside = imp.source == wing or imp.source.startswith(wing + ".")
            if imp.target.startswith(wing + ".") and not inside:
                out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports {imp.target}, "
                           f"an internal module of {wing} (import {wing} instead)")
    return sorted(set(out))


def contract_violations() -> list[str]:
    """Rule 7, checked in a fresh interpreter (the modules are imported: this is the one rule that does)."""
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CONTRACT_PROBE], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    if proc.returncode != 0:
        return [f"importing trainers.ALGORITHMS failed: {proc.stderr.strip().splitlines()[-1:]}"]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


#: rule 8: what a user reads (file names and contents); the repository's own text files only.
SHIPPED = ("README.md", "Makefile", "pyproject.toml", ".gitignore", "docs", "toolgym", "trainers", "benchmarks",
           "examples", "tests", ".ci")
#: rule 8: work-diary wording. "session" alone is a protocol word (an MCP or HTTP session) and "round N" an RFT/DPO
#: round, so only a numbered session or issue, or a work session named by its place ("this", "first" ...), counts.
HISTORY = re.compile(r"(?<![a-z])(?:sessions?|issues?)[ _-]?#?\d+|\b(?:this|first|second|third|previous|last|next|earlier)\s+session\b", re.IGNORECASE)
_TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".json", ".jsonl", ".txt", ".html", ".js", ".css", ".cfg",
                  ".ini", ".sh", ".jinja", ".j2", ""}


def shipped_files(root: Path | None = None) -> Iterator[Path]:
    """The text files under :data:`SHIPPED` (caches and build outputs skipped)."""
    root = root or ROOT
    for name in SHIPPED:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            rel = path.relative_to(root).parts
            if any(part in {"__pycache__", ".pytest_cache", ".ruff_cache"} or part.endswith(".egg-info")
                   for part in rel):
                continue
            if path.is_file() and path.suffix in _TEXT_SUFFIXES:
                yield path


def history_mentions(root: Path | None = None) -> list[str]:
    """Rule 8: ``path[:line]: text`` for each work-diary mention in a shipped file's name or content."""
    root = root or ROOT
    out = []
    for path in shipped_files(root):
        rel = path.relative_to(root).as_posix()
        if HISTORY.search(rel):
            out.append(f"{rel}: file name")
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                out.append(f"{rel}:{n}: {line.strip()[:120]}")
    return out


def test_the_core_names_no_trainers_module() -> None:
    assert dynamic_trainers_imports() == []


def test_trainers_is_in_wings() -> None:
    assert wing_violations() == []


def test_no_file_over_max_lines() -> None:
    assert long_files() == []


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_no_private_imports_across_packages() -> None:
    assert private_imports() == []


def test_dependencies_point_one_way() -> None:
    assert forbidden_imports() == []


def test_imports_follow_the_layers() -> None:
    assert layering() == []


def test_only_the_entry_point_imports_it() -> None:
    assert entry_point_imports() == []


def test_every_algorithm_keeps_the_contract() -> None:
    assert contract_violations() == []


def test_shipped_text_has_no_work_diary() -> None:
    assert history_mentions() == []


def test_history_check_sees_numbered_sessions_and_issues(tmp_path: Path) -> None:
    """The wording check finds a numbered session or issue (and the current one) in names and contents, and leaves a
    protocol session and an RFT round alone."""
    word = "sess" + "ion"  # spelled apart so that this file passes its own check
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"ok: the MCP {word} restarts\nok: round 2 keeps 87 samples\n"
                                            f"bad: {word.title()} 10's code\nbad: see iss" + "ue #26\n"
                                            f"bad: this {word} changed it\nbad: in the first {word}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / f"test_{word}_3.py").write_text("")
    found = history_mentions(tmp_path)
    assert [f.split(": ")[0] for f in found] == ["docs/a.md:3", "docs/a.md:4", "docs/a.md:5", "docs/a.md:6",
                                                    f"tests/test_{word}_3.py"]


def test_checker_sees_violations(tmp_path: Path) -> None:
    """The checker itself finds each kind of violation in a small synthetic tree."""
    a = tmp_path / "pkg" / "a.py"
    b = tmp_path / "pkg" / "sub" / "b.py"
    b.parent.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (b.parent / "__init__.py").write_text("")
    a.write_text("from pkg.sub.b import _hidden\n")
    b.write_text("def f():\n    from pkg import a\n    import toolgym.cli\n" + "x = 1\n" * MAX_LINES)
    files = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": a, "pkg.sub": b.parent / "__init__.py", "pkg.sub.b": b}
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert cycles(files) == [["pkg.a", "pkg.sub.b"]]
        assert len(private_imports(files)) == 1 and "_hidden" in private_imports(files)[0]
        assert len(long_files(files)) == 1
        assert entry_point_imports(files) == [f"{b.relative_to(tmp_path)}:3: pkg.sub.b imports the entry point "
                                              "toolgym.cli"]
        assert layer("toolgym.tools.sandbox.pool") == LAYERS.index(("toolgym.tools",))
        assert layer("toolgym.cli.eval") == layer("toolgym.cli") and layer("trainers.dpo") == len(LAYERS) - 1
    finally:
        ROOT = old


def test_checker_sees_dynamic_imports_and_broken_wings(tmp_path: Path) -> None:
    """Rules 8 and 9 on a synthetic tree: module-name strings into trainers, a flat module, a reach into a wing."""
    core = tmp_path / "toolgym" / "c.py"
    core.parent.mkdir()
    (core.parent / "__init__.py").write_text('"""trainers.cli in a docstring is prose."""\n')
    core.write_text('import importlib\nNAME = "trainers.tracking.registry"\n'
                    'def f(x):\n    importlib.import_module("trainers." + x)\n    __import__(f"trainers.{x}")\n'
                    '    return "see trainers.ALGORITHMS in the docs"\n')
    wing = tmp_path / "trainers" / "grpo"
    wing.mkdir(parents=True)
    for p in (tmp_path / "trainers" / "__init__.py", wing / "__init__.py", wing / "inner.py"):
        p.write_text("")
    flat = tmp_path / "trainers" / "rollout_helpers.py"
    flat.write_text("from trainers.grpo.inner import x\nfrom trainers.grpo import Config\n")
    files = {"toolgym": core.parent / "__init__.py", "toolgym.c": core, "trainers": tmp_path / "trainers" / "__init__.py",
             "trainers.grpo": wing / "__init__.py", "trainers.grpo.inner": wing / "inner.py",
             "trainers.rollout_helpers": flat}
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        found = dynamic_trainers_imports(files)
        assert [ln.split(":")[1] for ln in found] == ["2", "4", "5"], found
        broken = wing_violations(files)
        assert len(broken) == 2, broken
        assert any("rollout_helpers.py: a module at the top" in b for b in broken)
        assert any(":1: trainers.rollout_helpers imports trainers.grpo.inner" in b for b in broken)
    finally:
        ROOT = old


if __name__ == "__main__":
    problems = (long_files() + [" -> ".join(c) for c in cycles()] + private_imports() + forbidden_imports()
                + layering() + entry_point_imports() + dynamic_trainers_imports() + wing_violations()
                + contract_violations() + history_mentions())
    print("\n".join(problems) or "structure ok")
    sys.exit(1 if problems else 0)
