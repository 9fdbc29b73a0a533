"""Moved module paths stay importable (``toolgym.moved``): the old name gives the same module object, warns once
with a ``DeprecationWarning`` naming the new path, and leaves the module's own ``__spec__`` alone; the repository
itself imports only the new paths."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import toolgym
import trainers

ROOT = Path(__file__).resolve().parent.parent
MOVED = {**toolgym.MOVED_MODULES, **trainers.MOVED_MODULES}


def test_every_new_path_exists_and_no_old_file_is_left():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), f"{old} is both moved and present"


def test_an_old_path_is_the_new_module_with_a_warning():
    code = (
        "import warnings, sys\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    import toolgym.eval as old\n"
        "    from trainers.rollout_func import ToolgymRollout\n"
        "import toolgym.evaluation.runner as new, trainers.grpo.rollout_adapter as adapter\n"
        "assert old is new and ToolgymRollout is adapter.ToolgymRollout\n"
        "assert new.__spec__.name == 'toolgym.evaluation.runner', new.__spec__\n"
        "assert sys.modules['toolgym.eval'] is new\n"
        "msgs = [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]\n"
        "assert any('toolgym.eval moved to toolgym.evaluation.runner' in m for m in msgs), msgs\n"
        "assert any('trainers.rollout_func moved to trainers.grpo.rollout_adapter' in m for m in msgs), msgs\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_an_unknown_name_is_still_an_import_error():
    import pytest

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("toolgym.no_such_module")


def test_the_repository_imports_only_new_paths():
    used = []
    for folder in ("toolgym", "trainers", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                used += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                         if any(n == old or n.startswith(old + ".") for old in MOVED)]
    # this file imports old names on purpose, inside a subprocess string only
    assert used == []
