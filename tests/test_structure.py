"""The layout rules of ``docs/design.md``, checked on the source (``python tests/test_structure.py`` prints every
violation; the tests fail on any). The numbers are design.md's:

1. no Python file in ``toolgym/`` or ``trainers/`` over :data:`MAX_LINES` lines;
2. no import cycle between the modules of ``toolgym/`` and ``trainers/`` (function-level imports count: a lazy
   import is still a dependency; imports under ``if TYPE_CHECKING:`` do not, they never run);
3. no private name imported across packages: ``from a.b import _x``, ``import a._b`` or ``from a._b import x`` is
   allowed only from a module in the same package (directory) as the private module or name;
4. dependencies point one way: inside the tree down the layers of :data:`LAYERS` (the package map in
   ``docs/concepts.md``; e.g. tools never import data, ``toolgym`` never imports ``trainers``; a module imports
   only its own layer or the layers above it, ``toolgym/__init__.py``, the public API, is exempt), and outside it
   ``toolgym`` never imports TRL, vLLM, MLflow or DeepSpeed (:data:`FORBIDDEN`);
5. ``toolgym`` does not reach ``trainers`` by a module-name string either: no ``import_module``/``__import__``/
   ``find_spec``/``run_module`` of a ``"trainers..."`` string and no string that is a dotted path into ``trainers``
   (the core finds the training package's commands through entry points, ``toolgym/cli/plugins.py``);
6. no module outside the entry point package ``toolgym.cli`` imports it or any of its submodules: what the
   commands share with other code lives below it (error types and exit codes in ``toolgym.errors``);
7. ``trainers/`` is in wings: its top level holds only :data:`TRAINERS_TOP` (the algorithm contract and the shared
   plumbing) and the single-module algorithms registered in ``trainers.ALGORITHMS``; every package under it is a
   wing, and a wing's modules are imported only from inside that wing (everything else goes through the package);
8. the algorithm contract (``trainers/__init__.py``): every entry of ``trainers.ALGORITHMS`` is a module with a
   ``Config`` dataclass whose fields all carry ``metadata["help"]`` and a ``run`` function taking the config, and
   reading a ``Config`` imports neither torch nor TRL (this one imports the modules, in a fresh interpreter);
9. shipped text describes the software, not its development diary: no file name or content under
   :data:`SHIPPED` names a numbered work session or issue, or the current work session, or dates the software
   against an earlier state of itself (:data:`HISTORY`), and every file name says its subject, not its age
   (:data:`NOT_BY_SUBJECT`);
10. the written map is the tree: the module map (``docs/concepts.md#where-things-live`` and the layout of
    ``docs/design.md``) names every module of ``toolgym/`` and ``trainers/`` and names no file that is not there,
    and every repository path and dotted ``toolgym``/``trainers`` name in ``docs/*.md`` exists;
11. an env's parts live where ``docs/extending.md#where-an-envs-parts-live`` says: ``toolgym/data/`` holds only
    what two parts read, and an env package under ``toolgym/envs/`` has ``env.py`` and ``data.py``.

Rules 1-7, 10 and 11 are checked with :mod:`ast` only (nothing is imported), so the check is fast and cannot be fooled
by import-time side effects.
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

#: rule 7: the plumbing allowed at the top level of ``trainers/`` beside the single-module algorithms of
#: ``trainers.ALGORITHMS`` (an algorithm's internal module goes in its package, a new shared part in a wing)
TRAINERS_TOP = frozenset({"__init__", "cli", "runconfig", "contract", "credit", "vision"})
#: rule 5: calls that import a module named by a string
IMPORT_CALLS = frozenset({"import_module", "__import__", "find_spec", "run_module", "import_train"})

#: rule 4: (importer prefix, forbidden outside packages).
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (("toolgym", ("trl", "vllm", "mlflow", "deepspeed")),)

#: rule 4: the layers, top (imported by everything below) to bottom; a module may import only its own layer or one
#: above it. Same order as the package map in docs/concepts.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("toolgym.errors", "toolgym.runtime", "toolgym.jsonl", "toolgym.batching", "toolgym.resources",
     "toolgym.checkpoint", "toolgym.weights", "toolgym.precision", "toolgym.console", "toolgym.placement",
     "toolgym.images"),
    ("toolgym.models", "toolgym.processors"),
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


#: rule 6: the entry point package, the one package whose modules may import it
ENTRY_POINT = "toolgym.cli"


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def entry_point_imports(files: dict[str, Path] | None = None) -> list[str]:
    """Imports of :data:`ENTRY_POINT` or any of its submodules from a module outside it."""
    files = files if files is not None else modules()
    return [f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports the entry point {imp.target}"
            for imp in imports(files) if _inside(imp.target, ENTRY_POINT) and not _inside(imp.source, ENTRY_POINT)]


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
    """Rule 5: module-name strings through which ``package`` could import ``trainers``."""
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


def registered_algorithms(root: Path | None = None) -> dict[str, str]:
    """``trainers.ALGORITHMS`` as written in ``trainers/__init__.py`` (name -> dotted module), read with :mod:`ast`."""
    tree = ast.parse(((root or ROOT) / "trainers" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) == "ALGORITHMS" for t in targets):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Dict):
                        return {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(sub.keys, sub.values, strict=True)}
    return {}


def wing_violations(files: dict[str, Path] | None = None) -> list[str]:
    """Rule 7: modules at the top of ``trainers/`` that are neither plumbing nor a registered algorithm, and imports
    of a wing's modules from outside that wing."""
    files = files if files is not None else modules()
    out = []
    root = ROOT / "trainers"
    algorithms = set(registered_algorithms())
    top = TRAINERS_TOP | {m.rpartition(".")[2] for m in registered_algorithms().values()}
    for p in sorted(root.iterdir()):
        if p.suffix == ".py" and p.stem not in top:
            out.append(f"{p.relative_to(ROOT)}: a module at the top of trainers/ that is neither plumbing "
                       f"(TRAINERS_TOP) nor an algorithm of trainers.ALGORITHMS ({', '.join(sorted(algorithms))}): "
                       "put it in its wing, e.g. trainers/grpo/")
    wings = sorted(m for m in files if m.count(".") == 1 and m.startswith("trainers.") and _is_package(m, files))
    for imp in imports(files):
        for wing in wings:
            if _inside(imp.target, wing) and imp.target != wing and not _inside(imp.source, wing):
                out.append(f"{files[imp.source].relative_to(ROOT)}:{imp.line}: {imp.source} imports {imp.target}, "
                           f"a module inside the wing {wing} (import {wing} instead)")
    return sorted(set(out))


def contract_violations() -> list[str]:
    """Rule 8, checked in a fresh interpreter (the modules are imported: this is the one rule that does)."""
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _CONTRACT_PROBE], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    if proc.returncode != 0:
        return [f"importing trainers.ALGORITHMS failed: {proc.stderr.strip().splitlines()[-1:]}"]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


#: rule 9: what a user reads (file names and contents); the repository's own text files only.
SHIPPED = ("README.md", "Makefile", "pyproject.toml", ".gitignore", "docs", "toolgym", "trainers", "benchmarks",
           "deploy", "examples", "tests", ".ci")
#: rule 9: work-diary wording. "session" alone is a protocol word (an MCP or HTTP session) and "round N" an RFT/DPO
#: round, so only a numbered session or issue, or a work session named by its place ("this", "first" ...), counts.
#: Besides: text that dates the software against an earlier state of itself (the loss "as it is today", fixes named
#: for when they were met, a protocol another one replaced, the previous or old code, a name that changed). Left alone: a
#: chat template stamping the day's date, a quoted or backticked name (a state key such as ``"superseded"``), a file
#: renamed into place (an atomic write). The words count inside identifiers too (a test function's name).
HISTORY = re.compile(
    r"(?<![a-z])(?:sessions?|issues?)[ _-]?#?\d+"
    r"|\b(?:this|first|second|third|previous|last|next|earlier)\s+session\b"
    r"|(?<![a-z])today'?s(?![a-z])(?!\s+date)"
    r"|(?<![a-z])first[ _-]contact(?![a-z])"
    r"|(?<![a-z`'\"])supersed(?:e|es|ed|ing)(?![a-z`'\"])"
    r"|(?<![a-z])previous(?:ly)(?![a-z])"
    r"|\bprevious\s+(?:private|code|implementation|version|release|behaviou?r)\b"
    r"|\bthe\s+old\s+(?:code|implementation|version|behaviou?r)\b"
    r"|\b(?:was|were|has\s+been|have\s+been)\s+renamed\b(?!\s+into)",
    re.IGNORECASE)
#: rule 9: file and module names by subject, not by when they were written: a name part (between ``_``, ``-``,
#: ``.`` or ``/``) that says only "newer", "old", "others" ... (``tests/test_families_newer.py``) names no subject.
NOT_BY_SUBJECT = re.compile(r"(?:^|[/_.-])(?:new|newer|newest|old|older|legacy|latest|misc|extra|more|others?|"
                            r"tmp|temp|fixed|final|copy|backup)(?=[/_.-])", re.IGNORECASE)
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
    """Rule 9: ``path[:line]: text`` for each work-diary mention in a shipped file's name or content."""
    root = root or ROOT
    out = []
    for path in shipped_files(root):
        rel = path.relative_to(root).as_posix()
        if HISTORY.search(rel) or NOT_BY_SUBJECT.search(rel):
            out.append(f"{rel}: file name")
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                out.append(f"{rel}:{n}: {line.strip()[:120]}")
    return out


def env_layout(files: dict[str, Path] | None = None) -> list[str]:
    """Rule 11, where an env's parts live (``docs/extending.md#where-an-envs-parts-live``): each module of
    ``toolgym/data/`` (a ``build_*`` script aside: it builds its data module's file) is imported by at least two
    modules outside ``toolgym/data/``, else it belongs in the one env that reads it; each package under
    ``toolgym/envs/`` is an env with internals, with ``env.py`` and ``data.py``."""
    files = files if files is not None else modules()
    readers: dict[str, set[str]] = {}
    for imp in imports(files):
        target = _own(imp.target, files)
        if target and target.startswith("toolgym.data.") and not imp.source.startswith("toolgym.data"):
            readers.setdefault(target, set()).add(imp.source)
    out = []
    for mod in sorted(files):
        short = mod.rpartition(".")[2]
        if mod.startswith("toolgym.data.") and not short.startswith("build_") and len(readers.get(mod, ())) < 2:
            out.append(f"{files[mod].relative_to(ROOT)}: read only by {sorted(readers.get(mod, ())) or 'nothing'} "
                       "outside toolgym/data/: it belongs in that env's module")
        if mod.count(".") == 2 and mod.startswith("toolgym.envs.") and _is_package(mod, files):
            missing = [f"{n}.py" for n in ("env", "data") if f"{mod}.{n}" not in files]
            if missing:
                out.append(f"{files[mod].parent.relative_to(ROOT)}/: an env package without {', '.join(missing)}")
    return out


#: rule 10: the module map, (page, first heading, the heading after it) of each of its sections
MAP_SECTIONS = (("docs/concepts.md", "## Where things live", "## Tokens"),
                ("docs/design.md", "## The layout", "## The rules of the layout"))
#: rule 10: the repository's folders a path in the docs may start with
REPO_DIRS = ("toolgym", "trainers", "tests", "benchmarks", "deploy", "examples", "docs")
_MAP_FILE = re.compile(r"(?<![\w/.*-])((?:[\w-]+/)*[\w-]+\.py)\b")
_MAP_DIR = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*)/(?![\w-])")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_DOC_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(REPO_DIRS) + r")/[\w./-]*[\w/])")
_DOC_DOTTED = re.compile(r"(?<![\w.-])((?:toolgym|trainers)(?:\.[A-Za-z_]\w*)+)")


def map_text(root: Path | None = None) -> str:
    """The text of the module map's sections (:data:`MAP_SECTIONS`)."""
    root = root or ROOT
    out = []
    for page, start, end in MAP_SECTIONS:
        text = (root / page).read_text(encoding="utf-8")
        out.append(text[text.index(start):text.index(end, text.index(start))])
    return "\n".join(out)


def map_gaps(files: dict[str, Path] | None = None, root: Path | None = None) -> list[str]:
    """Rule 10, the map: each module of :data:`PACKAGES` whose file name (a package: its folder ``name/``) the map
    does not name, and each ``name.py`` the map names that is no file of the repository."""
    root = root or ROOT
    files = files if files is not None else modules()
    text = map_text(root)
    named_files = {m.rpartition("/")[2] for m in _MAP_FILE.findall(text)}
    named_dirs = set(_MAP_DIR.findall(text))
    out = []
    for mod, path in sorted(files.items()):
        if path.name == "__main__.py":
            continue  # ``python -m PACKAGE``: part of its package
        if path.name == "__init__.py":
            if path.parent.name not in named_dirs and path.parent.name not in PACKAGES:
                out.append(f"{path.relative_to(root)}: the package {mod} is not in the module map (docs/concepts.md)")
        elif path.name not in named_files:
            out.append(f"{path.relative_to(root)}: the module {mod} is not in the module map (docs/concepts.md)")
    present = {p.name for d in REPO_DIRS if (root / d).is_dir() for p in (root / d).rglob("*.py")}
    out += [f"the module map names {name}, which is no file here" for name in sorted(named_files - present)]
    return out


def _defines(path: Path, name: str) -> bool:
    """Whether module ``path`` binds ``name`` at its top level (def, class, assignment, import)."""
    tree, _ = _parse(path, path.stat().st_mtime_ns)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any((a.asname or a.name.split(".")[0]) == name
                                                                  or a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
    return False


def docs_dangling_names(files: dict[str, Path] | None = None, root: Path | None = None) -> list[str]:
    """Rule 10, the prose: each repository path (``trainers/grpo/build.py``) and dotted module or name
    (``toolgym.evaluation.runner.evaluate``) in an inline code span of ``docs/*.md`` that does not exist. A dotted
    name counts when its longest module prefix exists and the next part is a module or a top-level name of it; a
    path, when it has a file extension or ends in ``/``."""
    root = root or ROOT
    files = files if files is not None else modules()
    out = []
    for page in sorted((root / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            for span in _CODE_SPAN.findall(line):
                if any(c in span for c in "<*{"):
                    continue  # a pattern or a placeholder, not a name
                for path in _DOC_PATH.findall(span):
                    if not (path.endswith("/") or re.search(r"\.\w+$", path)):
                        continue  # an env id (toolgym/SQL-v0) or a metric (toolgym/success), not a file
                    if not (root / path.rstrip("/.")).exists():
                        out.append(f"{page.relative_to(root)}:{n}: {path} does not exist")
                for dotted in _DOC_DOTTED.findall(span):
                    parts = dotted.split(".")
                    if parts[0] == "toolgym" and len(parts) == 2 and dotted not in files:
                        continue  # a config key (toolgym.env_id), a tracking tag or an entry-point group
                    k = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in files or i == 1)
                    mod = ".".join(parts[:k])
                    if mod not in files:
                        continue
                    if k < len(parts) and not _defines(files[mod], parts[k]):
                        out.append(f"{page.relative_to(root)}:{n}: {dotted}: {mod} has no {parts[k]}")
    return out


def test_each_env_part_lives_where_the_rule_says() -> None:
    assert env_layout() == []


def test_env_layout_sees_a_data_module_only_one_env_reads(tmp_path: Path) -> None:
    """Rule 11 on a synthetic tree: a data module with one reader and an env package without ``data.py`` are
    refused; a data module two parts read and a build script are not."""
    tg = tmp_path / "toolgym"
    for d in ("data", "envs", "envs/big", "serve"):
        (tg / d).mkdir(parents=True)
        (tg / d / "__init__.py").write_text("")
    (tg / "__init__.py").write_text("")
    (tg / "data" / "shared.py").write_text("X = 1\n")
    (tg / "data" / "lonely.py").write_text("Y = 1\n")
    (tg / "data" / "build_shared.py").write_text("")
    (tg / "envs" / "a.py").write_text("from toolgym.data.shared import X\nfrom toolgym.data import lonely\n")
    (tg / "serve" / "b.py").write_text("def f():\n    from toolgym.data.shared import X\n")
    (tg / "envs" / "big" / "env.py").write_text("")
    files = {"toolgym": tg / "__init__.py"}
    for f in sorted(tg.rglob("*.py")):
        parts = list(f.relative_to(tmp_path).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert env_layout(files) == [
            "toolgym/data/lonely.py: read only by ['toolgym.envs.a'] outside toolgym/data/: it belongs in that env's "
            "module", "toolgym/envs/big/: an env package without data.py"]
    finally:
        ROOT = old


def test_the_module_map_names_every_module() -> None:
    assert map_gaps() == []


def test_the_docs_name_only_what_exists() -> None:
    assert docs_dangling_names() == []


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


def test_history_check_sees_dated_wording_and_names_not_by_subject(tmp_path: Path) -> None:
    """The wording check finds text that dates the software against an earlier state of itself, and file names
    that say when rather than what; it leaves the same words alone where they describe the software."""
    tod, sup, prev, fc = "to" + "day's", "super" + "seded", "previ" + "ously", "first" + "-contact"
    bad = [f"the loss is exactly {tod}", f"{fc.title()} fixes", f"Version 2 {sup[:-1]}s it", f"{prev} it raised",
           "what its previ" + "ous private `_tasks` drew", "keeps the o" + "ld code as the reference",
           "the module was re" + "named", f"def test_outcome_is_{tod.replace(chr(39), '')}_loss():"]
    ok = [f"llama3_2.jinja stamps {tod} date", f"records move to `{sup}`", f'state["{sup}"] lists them',
          "the previous turn's results", "a reader sees the old file or the new one",
          "written to a temporary file renamed into place", "a format newer than this reader",
          "close no longer closes it"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("\n".join(ok + bad) + "\n")
    (tmp_path / "tests" / "cases").mkdir(parents=True)
    for name in ("test_families_" + "newer.py", "cases/oth" + "ers.py", "test_newline.py", "test_oldest_first.py",
                 "cases/qwen_llama_openai.py"):
        (tmp_path / "tests" / name).write_text("")
    found = history_mentions(tmp_path)
    lines = [f"docs/a.md:{n}" for n in range(len(ok) + 1, len(ok) + len(bad) + 1)]
    assert [f.split(": ")[0] for f in found] == [*lines, "tests/cases/oth" + "ers.py",
                                                 "tests/test_families_" + "newer.py"]


def test_checker_sees_violations(tmp_path: Path) -> None:
    """The checker itself finds each kind of violation in a small synthetic tree."""
    a = tmp_path / "pkg" / "a.py"
    b = tmp_path / "pkg" / "sub" / "b.py"
    b.parent.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (b.parent / "__init__.py").write_text("")
    a.write_text("from pkg.sub.b import _hidden\n")
    b.write_text("def f():\n    from pkg import a\n    import toolgym.cli\n    from toolgym.cli.common import x\n"
                 + "x = 1\n" * MAX_LINES)
    files = {"pkg": tmp_path / "pkg" / "__init__.py", "pkg.a": a, "pkg.sub": b.parent / "__init__.py", "pkg.sub.b": b}
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        assert cycles(files) == [["pkg.a", "pkg.sub.b"]]
        assert len(private_imports(files)) == 1 and "_hidden" in private_imports(files)[0]
        assert len(long_files(files)) == 1
        assert entry_point_imports(files) == [
            f"{b.relative_to(tmp_path)}:3: pkg.sub.b imports the entry point toolgym.cli",
            f"{b.relative_to(tmp_path)}:4: pkg.sub.b imports the entry point toolgym.cli.common"]
        assert layer("toolgym.tools.sandbox.pool") == LAYERS.index(("toolgym.tools",))
        assert layer("toolgym.cli.eval") == layer("toolgym.cli") and layer("trainers.dpo") == len(LAYERS) - 1
    finally:
        ROOT = old


def test_checker_sees_dynamic_imports_and_broken_wings(tmp_path: Path) -> None:
    """Rules 5 and 7 on a synthetic tree: module-name strings into trainers, a flat module, a reach into a wing."""
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


_TOY_ALGORITHM = '''"""Oracle episodes and their mean reward (``toolgym train toy_stats --episodes 2``)."""

from dataclasses import dataclass

from trainers.contract import EnvConfig, RunResult
from trainers.runconfig import opt


@dataclass
class Config(EnvConfig):
    """Oracle episodes: config file keys = these fields and EnvConfig's."""

    # Parameters that control the episodes
    episodes: int = opt(4, "episodes played by the env's oracle")

    # Parameters that control the output
    output_dir: str = opt("runs/toy_stats", "where the run writes")


def run(config: Config, **extras) -> RunResult:
    import gymnasium as gym

    import toolgym  # noqa: F401  (registers the envs)
    from toolgym.rollout import RolloutDriver, ScriptedPolicy

    venv = gym.make_vec(config.env_id, num_envs=config.episodes, **config.env_kwargs)
    try:
        trajs = RolloutDriver(venv, ScriptedPolicy(lambda s: s.env.oracle(s))).run([None] * config.episodes)
    finally:
        venv.close()
    return RunResult("toy_stats", config.output_dir,
                     metrics={"episodes": len(trajs), "mean_reward": sum(t.reward for t in trajs) / len(trajs)})
'''


def test_the_new_algorithm_recipe_passes_the_checks(tmp_path: Path) -> None:
    """docs/extending.md's "A new algorithm", followed in a copy of the tree with a toy algorithm: the module at
    the top of trainers/, its line in ALGORITHMS and its name in the module map. Every structure check passes on
    the result (the map check refuses the module until step 3), and the registry, ``toolgym train --help`` and
    ``toolgym train toy_stats --dry-run`` see it."""
    global ROOT
    import os
    import shutil
    import subprocess

    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    for name in ("toolgym", "trainers", "docs", "tests", "benchmarks", "deploy", "examples"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=skip)

    def problems() -> list[str]:
        files = modules()
        return (long_files(files) + [" -> ".join(c) for c in cycles(files)] + private_imports(files)
                + forbidden_imports(files) + layering(files) + entry_point_imports(files)
                + dynamic_trainers_imports(files) + wing_violations(files) + map_gaps(files)
                + docs_dangling_names(files) + contract_violations())

    old, ROOT = ROOT, tmp_path
    try:
        before = problems()  # the tree's own (none on a clean tree): the recipe must add nothing to them
    finally:
        ROOT = old
    # 1. the module; 2. the registry
    (tmp_path / "trainers" / "toy_stats.py").write_text(_TOY_ALGORITHM)
    init = tmp_path / "trainers" / "__init__.py"
    text = init.read_text()
    assert text.count("ALGORITHMS = _Algorithms({\n") == 1
    init.write_text(text.replace("ALGORITHMS = _Algorithms({\n", 'ALGORITHMS = _Algorithms({\n    "toy_stats": "trainers.toy_stats",\n'))
    old, ROOT = ROOT, tmp_path
    try:
        assert registered_algorithms()["toy_stats"] == "trainers.toy_stats"
        assert map_gaps() == ["trainers/toy_stats.py: the module trainers.toy_stats is not in the module map "
                              "(docs/concepts.md)"]
        # 3. the map
        concepts = tmp_path / "docs" / "concepts.md"
        row = "the single-module algorithms `sft.py`, `rft.py`, `reward_model.py`"
        assert row in concepts.read_text()
        concepts.write_text(concepts.read_text().replace(row, row + ", `toy_stats.py`"))
        assert problems() == before
    finally:
        ROOT = old
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    probe = ("import trainers, dataclasses; from trainers.cli import usage; "
             "print(list(trainers.ALGORITHMS)); print([f.name for f in dataclasses.fields(trainers.config_class("
             "'toy_stats'))]); print(usage())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    names, fields, usage = out.stdout.split("\n", 2)
    assert "'toy_stats'" in names and fields == ("['model', 'dtype', 'threads', 'env_id', 'env_kwargs', 'episodes', "
                                                "'output_dir']")
    assert "  toy_stats " in usage and "Oracle episodes and their mean reward" in usage
    dry = subprocess.run([sys.executable, "-m", "trainers.cli", "toy_stats", "--dry-run", "--episodes", "2"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    import json

    assert json.loads(dry.stdout) == {"algorithm": "toy_stats", "config": {
        "model": None, "dtype": "float32", "threads": 0, "env_id": "toolgym/Calculator-v0", "env_kwargs": {},
        "episodes": 2, "output_dir": "runs/toy_stats"}}


if __name__ == "__main__":
    problems = (long_files() + [" -> ".join(c) for c in cycles()] + private_imports() + forbidden_imports()
                + layering() + entry_point_imports() + dynamic_trainers_imports() + wing_violations()
                + map_gaps() + docs_dangling_names() + contract_violations() + history_mentions() + env_layout())
    print("\n".join(problems) or "structure ok")
    sys.exit(1 if problems else 0)
