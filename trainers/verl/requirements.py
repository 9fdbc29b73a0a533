"""What ``make verl-env`` installs into ``.venv-verl``, read from ``pyproject.toml`` (standard library only).

``python trainers/verl/requirements.py`` (a script: it runs on a bare interpreter, without importing the package) prints one requirement per line: the core's dependencies **except
transformers** (verl 0.9.1 pins ``transformers<5.11``; the core declares ``>=5.17`` but runs on verl's 5.10: its
env, rollout and tokenizer tests pass there, see docs/verl.md), the ``[verl]`` extra, and the test runner. toolgym
itself goes in with ``pip install --no-deps -e .`` so its own transformers pin is not enforced in that venv only;
the main ``.venv`` and ``pip install toolgym`` keep it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

__all__ = ["TEST_REQUIREMENTS", "verl_env_requirements"]

#: what the verl tests need besides the adapter (pytest plugins the suite's configuration uses)
TEST_REQUIREMENTS = ("pytest>=8", "pytest-asyncio>=1.0", "pytest-timeout>=2.3")
#: core dependencies that verl pins to other versions: left to verl's resolution in ``.venv-verl``
LEFT_TO_VERL = ("transformers",)


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0].lower()


def verl_env_requirements(pyproject: str | Path | None = None) -> list[str]:
    """The requirements of ``.venv-verl`` (see the module docstring), in ``pyproject.toml`` order."""
    path = Path(pyproject) if pyproject is not None else Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    core = [r for r in project["dependencies"] if _name(r) not in LEFT_TO_VERL]
    return [*core, *project["optional-dependencies"]["verl"], *TEST_REQUIREMENTS]


if __name__ == "__main__":
    print("\n".join(verl_env_requirements()))
