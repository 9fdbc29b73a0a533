"""What a user sees on the terminal: toolgym's messages and nothing the libraries print for their own developers,
unless ``-v`` (``TOOLGYM_VERBOSE=1``) asks for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolgym.runtime import run_sync
from toolgym.tools.mcp import MCPToolset

ROOT = Path(__file__).resolve().parent.parent

NOISY_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

print("NOISY-SERVER-LOG: starting up", file=sys.stderr, flush=True)
server = MCPServer("noisy")


@server.tool()
def echo(text: str) -> str:
    """Echo a text."""
    return text


if __name__ == "__main__":
    server.run()
'''


def _lines(stderr: str) -> list[str]:
    """stderr without progress-bar frames (tqdm redraws with carriage returns)."""
    return [ln for raw in stderr.splitlines() for ln in raw.split("\r") if ln.strip() and "ep/s" not in ln]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_model_evaluation_prints_no_library_warnings_unless_verbose(tmp_path: Path):
    quiet = ("TOOLGYM_VERBOSE", "TOOLGYM_QUIET_SET", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    env = {k: v for k, v in os.environ.items() if k not in quiet}  # as on a user's terminal
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "toolgym.cli", "eval", "Calculator-v0", "--policy", "embedded", "--tasks", "2",
           "--max-new-tokens", "8", "--json"]
    quiet = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=500)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert json.loads(quiet.stdout)["episodes"] == 2
    noise = [ln for ln in _lines(quiet.stderr) if any(w in ln.lower() for w in ("deprecat", "warning", "loading weights"))]
    assert noise == []
    loud = subprocess.run([cmd[0], cmd[1], cmd[2], "-v", *cmd[3:]], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=500)
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert any("loading weights" in ln.lower() or "deprecat" in ln.lower() for ln in _lines(loud.stderr))


@pytest.mark.parametrize("verbose", [False, True])
def test_a_stdio_mcp_servers_log_reaches_the_terminal_only_when_verbose(verbose: bool, tmp_path: Path,
                                                                          capfd: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch):
    if verbose:
        monkeypatch.setenv("TOOLGYM_VERBOSE", "1")
    else:
        monkeypatch.delenv("TOOLGYM_VERBOSE", raising=False)
    server = tmp_path / "noisy.py"
    server.write_text(NOISY_SERVER)
    toolset = MCPToolset({"mcpServers": {"noisy": {"command": sys.executable, "args": [str(server)]}}})
    tools = run_sync(toolset.aconnect())
    try:
        assert [t.name for t in tools] == ["echo"]
        assert run_sync(tools[0].acall({"text": "hi"})) == "hi"
    finally:
        run_sync(toolset.aclose())
    err = capfd.readouterr().err
    assert ("NOISY-SERVER-LOG" in err) is verbose
