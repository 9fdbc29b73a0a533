"""Every code block in ``docs/*.md`` and ``README.md`` is executed or checked.

* ```` ```python ```` blocks run, in order, one fresh interpreter per page (blocks of a page share a namespace,
  like a notebook), in a temporary working directory. Tracebacks point at the Markdown file and line.
  ```` ```python no-run ```` (or any other flag) is not allowed: commands that need a GPU or a long run belong in
  ```` ```bash ```` blocks.
* ```` ```bash ```` blocks: every ``toolgym ...`` line must parse with the real argument parser (so the docs
  cannot drift from the CLI); the cheap ones also run, in the same page's working directory after its Python
  blocks: ``list``, ``--help`` forms, ``rollout --policy tiny``, and ``view`` / ``plot`` of files produced there.
  ``python path/to/script.py`` / ``python -m module`` / ``accelerate launch script.py`` lines must name a script
  or module that exists; ``make TARGET`` must be a Makefile target.
* Relative links between pages must resolve; README.md must start with the two commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*(.*)$")
PAGE_TIMEOUT_S = 900
OWN_DIRS = {"benchmarks", "trainers", "toolgym", "tests", "examples"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the first code line
    lang: str
    flags: str
    code: str


def blocks(page: Path) -> list[Block]:
    """Fenced code blocks of a Markdown page (nested/indented fences handled by matching the opening fence)."""
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang, flags = m.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        out.append(Block(page, i + 2, lang.lower(), flags.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return out


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------------------------
# Python blocks
# ---------------------------------------------------------------------------------------------------------------

RUNNER = r'''
import json, os, shlex, sys, time, traceback, types
spec = json.loads(open(sys.argv[1]).read())
main_mod = types.ModuleType("__main__")
main_mod.__file__ = spec["page"]
sys.modules["__main__"] = main_mod
for b in spec["python"]:
    t0 = time.perf_counter()
    code = compile("\n" * (b["line"] - 1) + b["code"], spec["page"], "exec")
    try:
        exec(code, main_mod.__dict__)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED python block at {spec['page']}:{b['line']}", flush=True)
        sys.exit(1)
    print(f"ok python block {spec['page']}:{b['line']} in {time.perf_counter() - t0:.1f} s", flush=True)
from toolgym.cli import main
for c in spec["bash"]:
    t0 = time.perf_counter()
    rc = main(shlex.split(c["cmd"])[1:])
    if rc != 0:
        print(f"FAILED (exit {rc}) bash command at {spec['page']}:{c['line']}: {c['cmd']}", flush=True)
        sys.exit(1)
    print(f"ok bash {spec['page']}:{c['line']} `{c['cmd']}` in {time.perf_counter() - t0:.1f} s", flush=True)
'''


def _commands(block: Block) -> list[tuple[int, str]]:
    """``(line, command)`` for each command line of a bash block (comments and ``$`` prompts removed, ``\\``
    continuations joined, a trailing ``&`` dropped)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for k, raw in enumerate(block.code.splitlines()):
        s = raw.strip()
        if not pending:
            start = block.line + k
        if s.startswith("$ "):
            s = s[2:]
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            pending += s[:-1] + " "
            continue
        cmd = (pending + s).strip()
        pending = ""
        try:
            parts = shlex.split(cmd, comments=True)
        except ValueError:
            parts = cmd.split()
        cmd = shlex.join(p for p in parts if p != "&")
        out.append((start, cmd))
    return out


SHELL_OPERATORS = {">", ">>", "2>", "2>&1", "|", "&&", "||", ";"}


def _before_shell_operator(argv: list[str]) -> list[str]:
    """The command's own arguments: ``toolgym eval ... --json > runs/eval.json`` -> up to ``--json``."""
    cut = next((i for i, a in enumerate(argv) if a in SHELL_OPERATORS), len(argv))
    return argv[:cut]


def _runnable(cmd: str, produced: set[str]) -> bool:
    """Cheap ``toolgym`` invocations that run in the docs test (see the module docstring)."""
    argv = shlex.split(cmd)
    if not argv or argv[0] != "toolgym" or len(argv) < 2 or _before_shell_operator(argv) != argv:
        return False
    sub = argv[1]
    if "--help" in argv or "-h" in argv or sub in ("list", "--version"):
        return True
    if sub == "rollout":
        return "--policy" in argv and argv[argv.index("--policy") + 1] == "tiny"
    if sub == "view":
        return argv[2] in produced
    if sub == "plot":
        inputs = [a for a in argv[3:] if not a.startswith("-")]
        inputs = inputs[: len(inputs) - (1 if "--out" in argv else 0)]
        return bool(inputs) and all(a in produced for a in inputs)
    return False


def _outputs(cmd: str) -> set[str]:
    argv = shlex.split(cmd)
    return {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"}


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang in ("python", "py", "bash") for b in blocks(p))],
                         ids=rel)
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    bs = blocks(page)
    py = [{"line": b.line, "code": b.code} for b in bs if b.lang in ("python", "py")]
    bash: list[dict[str, object]] = []
    produced: set[str] = set()
    for b in bs:
        if b.lang not in ("bash", "sh", "shell", "console"):
            continue
        for line, cmd in _commands(b):
            if _runnable(cmd, produced):
                bash.append({"line": line, "cmd": cmd})
                produced |= _outputs(cmd)
    if not py and not bash:
        pytest.skip(f"{rel(page)}: no Python block and no cheap toolgym command to run")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"page": str(page), "python": py, "bash": bash}))
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    work = tmp_path / "work"
    work.mkdir()
    for d in sorted(OWN_DIRS - {"toolgym"}):  # docs may use repo-relative paths such as examples/mcp/...
        if (ROOT / d).is_dir():
            (work / d).symlink_to(ROOT / d, target_is_directory=True)
    r = subprocess.run([sys.executable, str(runner), str(spec)], cwd=work, capture_output=True, text=True,
                       timeout=PAGE_TIMEOUT_S, env=env, check=False)
    log = (r.stdout + "\n" + r.stderr)[-6000:]
    assert r.returncode == 0, f"{rel(page)}: a code block failed\n{log}"
    assert r.stdout.count("ok python block") == len(py), log
    assert r.stdout.count("ok bash ") == len(bash), log


def test_no_unrunnable_python_blocks() -> None:
    bad = [f"{rel(b.page)}:{b.line} ```{b.lang} {b.flags}" for p in PAGES for b in blocks(p)
           if b.lang in ("python", "py") and b.flags]
    assert not bad, ("flagged python blocks are not allowed (GPU-only or long commands go in ```bash blocks): "
                     + ", ".join(bad))


# ---------------------------------------------------------------------------------------------------------------
# Bash blocks: commands must exist and parse
# ---------------------------------------------------------------------------------------------------------------


def _all_commands() -> list[tuple[str, str]]:
    return [(f"{rel(b.page)}:{line}", cmd) for p in PAGES for b in blocks(p)
            if b.lang in ("bash", "sh", "shell", "console") for line, cmd in _commands(b)]


def test_toolgym_commands_in_docs_parse() -> None:
    from toolgym.cli import BENCHMARKS, SERVERS, build_parser

    parser = build_parser()
    checked = 0
    for where, cmd in _all_commands():
        argv = _before_shell_operator(shlex.split(cmd))
        if not argv or argv[0] != "toolgym":
            continue
        checked += 1
        if len(argv) >= 3 and argv[1] in ("bench", "serve"):
            assert argv[2] in (BENCHMARKS if argv[1] == "bench" else SERVERS), f"{where}: {cmd}"
            continue
        if "--help" in argv or "-h" in argv or "--version" in argv:
            continue
        try:
            parser.parse_args(argv[1:])
            if argv[1] == "registry":  # it owns its arguments (trainers/tracking/registry.py)
                from trainers.tracking.registry import build_parser as registry_parser

                registry_parser().parse_args(argv[2:])
        except SystemExit as e:
            pytest.fail(f"{where}: `{cmd}` does not parse (exit {e.code})")
    assert checked >= 10


def test_scripts_modules_and_make_targets_in_docs_exist() -> None:
    import importlib.util

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    missing = []
    for where, cmd in _all_commands():
        argv = shlex.split(cmd)
        while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value prefixes
            argv = argv[1:]
        if not argv:
            continue
        exe = Path(argv[0]).name
        if exe == "make" and len(argv) > 1 and not argv[1].startswith("-"):
            if argv[1] not in targets:
                missing.append(f"{where}: make target {argv[1]!r}")
        elif exe.startswith("python") or exe in ("accelerate", "torchrun"):
            rest = argv[1:]
            if exe in ("accelerate", "torchrun"):
                rest = [a for a in rest if a.endswith(".py") or a == "-m"] + rest[-1:]
            if "-m" in rest:
                mod = rest[rest.index("-m") + 1]
                if mod.split(".")[0] in ("toolgym", "trainers", "benchmarks") and importlib.util.find_spec(mod) is None:
                    missing.append(f"{where}: module {mod}")
            else:
                scripts = [a for a in rest if a.endswith(".py")]
                for s in scripts[:1]:  # only this repository's scripts (docs also quote other projects')
                    if Path(s).parts[0] in OWN_DIRS and not (ROOT / s).is_file():
                        missing.append(f"{where}: script {s}")
    assert not missing, "docs name things that do not exist:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------------------------------------
# Links and the README
# ---------------------------------------------------------------------------------------------------------------


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{rel(page)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_index_links_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in PAGES if p.parent.name == "docs" and p.name != "index.md" and f"({p.name}" not in index]
    assert not unlinked, f"docs/index.md does not link: {unlinked}"


def test_readme_starts_with_the_two_commands() -> None:
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert lines[0].startswith("```")
    assert lines[1].startswith("make demo") and lines[2].startswith("make test")
    assert lines[3] == "```"


def _private_grpo_trainer_names() -> set[str]:
    """The private ``GRPOTrainer`` methods the GRPO wing overrides (in its ``GRPOTrainer`` subclasses) or calls (on a
    trainer, or on ``self`` inside such a subclass), read from ``trainers/grpo/*.py`` with :mod:`ast`."""
    import ast

    trl = pytest.importorskip("trl", reason="the GRPO wing needs the [train] extra (trl)")
    private = {n for n in dir(trl.GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "trainers" / "grpo").glob("*.py"))]
    classes = [c for t in trees for c in ast.walk(t) if isinstance(c, ast.ClassDef)]
    subclasses, grown = {"GRPOTrainer"}, True
    while grown:
        new = {c.name for c in classes if any(ast.unparse(b).split(".")[-1] in subclasses for b in c.bases)}
        grown, subclasses = not new <= subclasses, subclasses | new
    found = set()
    for tree in trees:
        owners = {id(n): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in ast.walk(c)}
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef) and n.name in private and owners.get(id(n)) in subclasses:
                found.add(n.name)
            elif isinstance(n, ast.Attribute) and n.attr in private:
                on_self = ast.unparse(n.value) in ("self", "super()")
                if not on_self or owners.get(id(n)) in subclasses:
                    found.add(n.attr)
    return found


def test_design_names_every_private_grpo_trainer_method_the_wing_relies_on() -> None:
    """docs/design.md says which private ``GRPOTrainer`` methods the GRPO wing overrides or calls: the list is the
    code's (a TRL upgrade is checked against exactly these)."""
    names = _private_grpo_trainer_names()
    assert {"_compute_loss", "_generate_single_turn"} <= names  # the reader sees what it must
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    para = text[text.index("TRL's code is not patched"):]
    para = para[:para.index("\n\n")]
    named = set(re.findall(r"`(_[a-z_]+)`", para))
    assert names <= named, f"docs/design.md does not name {sorted(names - named)}"
    methods = {n for n in named if callable(getattr(pytest.importorskip("trl").GRPOTrainer, n, None))}
    assert methods <= names, f"docs/design.md names {sorted(methods - names)}, which the wing does not use"
