"""Install third-party MCP servers into isolated environments (the way users run them with uvx/pipx/npx).

Nothing here touches the project venv: each PyPI server gets its own ``python -m venv`` under the cache
dir (``$TOOLGYM_MCP_CACHE`` or ``~/.cache/toolgym/mcp-venvs``), each npm server its own ``npm install
--prefix`` dir. Installs are idempotent and guarded by a file lock, so parallel test workers and
``make test`` can call them freely. Run as a script to pre-install everything::

    python tests/mcp_servers/install.py
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: PyPI servers: name -> (pip requirements, console script). mcp-server-sqlite declares ``mcp>=1.0`` but is
#: written against the 1.x server API, so its environment pins ``mcp<2`` (mcp-server-calculator pins it itself).
PYPI_SERVERS: dict[str, tuple[str, str]] = {
    "sqlite": ("mcp-server-sqlite==2025.4.25 mcp<2", "mcp-server-sqlite"),
    "calculator": ("mcp-server-calculator==0.2.1", "mcp-server-calculator"),
}
#: npm servers: name -> (package spec, entry script relative to the prefix)
NPM_SERVERS: dict[str, tuple[str, str]] = {
    "everything": (
        "@modelcontextprotocol/server-everything@2026.8.31",
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("TOOLGYM_MCP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "toolgym" / "mcp-venvs"


class _Lock:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("w")

    def __enter__(self) -> None:
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def ensure_pypi_server(name: str) -> Path:
    """Create ``<cache>/<name>`` (a venv with the server installed); return the server's executable."""
    requirement, script = PYPI_SERVERS[name]
    venv = cache_dir() / name
    exe = venv / "bin" / script
    marker = venv / ".installed"
    with _Lock(cache_dir() / f".{name}.lock"):
        if marker.exists() and marker.read_text() == requirement and exe.exists():
            return exe
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *requirement.split(),
            ],
            check=True,
        )
        marker.write_text(requirement)
    return exe


def ensure_npm_server(name: str) -> Path:
    """``npm install --prefix <cache>/npm-<name>``; return the server's JS entry point (run it with ``node``)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise FileNotFoundError("node/npm not found on PATH")
    spec, entry = NPM_SERVERS[name]
    prefix = cache_dir() / f"npm-{name}"
    marker = prefix / ".installed"
    with _Lock(cache_dir() / f".npm-{name}.lock"):
        if not (marker.exists() and marker.read_text() == spec and (prefix / entry).exists()):
            prefix.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), spec], check=True
            )
            marker.write_text(spec)
    return prefix / entry


if __name__ == "__main__":
    for n in PYPI_SERVERS:
        print(n, ensure_pypi_server(n))
    if shutil.which("npm"):
        for n in NPM_SERVERS:
            print(n, ensure_npm_server(n))
