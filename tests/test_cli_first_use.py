"""What a new user meets first at the command line: each case runs the real ``toolgym`` command.

* ``rollout --policy oracle`` works as it does for ``eval`` (and refuses an env without an oracle, exit 2);
* ``--import MODULE`` / ``module:Env-v0`` find a module in the current directory without ``PYTHONPATH=.``;
* ``--temperature -1`` is a usage error for ``rollout`` and ``eval`` (exit 2);
* an unknown ``--tokenizer`` fails at once, in one line, when the hub cannot be reached (exit 3);
* ``plot curves`` refuses a trajectory file (its rows are episodes, not training steps; exit 3);
* ``view`` of a file whose last row was cut mid-write shows the whole rows and reports the cut one;
* ``view --compare`` counts the episodes of both files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tests.eval_env  # noqa: F401 - registers EvalEcho-v0 / EvalNoOracle-v0
from tests.rollout_files import make_rollout_file
from toolgym.cli import main
from toolgym.trajectory import read_trajectories

TOOLGYM = Path(sys.executable).with_name("toolgym")


def run_toolgym(*args: str, cwd: Path, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed console script (not ``python -m``, which would put the current directory on the path)."""
    exe = [str(TOOLGYM)] if TOOLGYM.exists() else [sys.executable, "-c", "import sys; from toolgym.cli import main; "
                                                                           "sys.exit(main())"]
    return subprocess.run([*exe, *args], cwd=cwd, env=env or os.environ.copy(), capture_output=True, text=True,
                          timeout=timeout)


def test_rollout_with_the_oracle_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "oracle.jsonl"
    assert main(["rollout", "Calculator-v0", "--policy", "oracle", "--episodes", "4", "--out", str(out),
                 "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]
    assert summary["episodes"] == 4 and summary["success"] == 1.0 and summary["tool_call_rate"] == 1.0
    rows = read_trajectories(out)
    assert len(rows) == 4 and all(r["outcome_reward"] == 1.0 for r in rows)


def test_rollout_oracle_on_an_env_without_one_is_a_usage_error(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.jsonl"
    assert main(["rollout", "EvalNoOracle-v0", "--policy", "oracle", "--episodes", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no oracle" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


MODULE = '''
import gymnasium as gym
from tests.eval_env import EvalEchoEnv

class HereEnv(EvalEchoEnv):
    """An env defined in the current directory."""

gym.register(id="Here-v0", entry_point=HereEnv, disable_env_checker=True)
'''


def test_import_finds_a_module_in_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "mytools_here.py").write_text(MODULE)
    env = os.environ.copy()
    repo = str(Path(__file__).resolve().parent.parent)  # for `tests.eval_env`; not the current directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), repo) if p)
    assert str(tmp_path) not in env["PYTHONPATH"].split(os.pathsep)
    r = run_toolgym("list", "--import", "mytools_here", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "Here-v0" in r.stdout and "[user]" in r.stdout
    r = run_toolgym("eval", "mytools_here:Here-v0", "--policy", "oracle", "--no-progress", "--json", cwd=tmp_path,
                    env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["success"] == 1.0
    r = run_toolgym("list", "--import", "no_such_module_here", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "no_such_module_here" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["rollout", "eval"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "hot"])
def test_a_negative_or_non_finite_temperature_is_refused(command: str, value: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    assert main([command, "Calculator-v0", "--policy", "tiny", "--temperature", value, "--out", str(out)]) == 2
    assert "--temperature" in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_tokenizer_fails_at_once_in_one_line(tmp_path: Path) -> None:
    path, _ = make_rollout_file(tmp_path / "t.jsonl", episodes=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: the id cannot be there
    t0 = time.monotonic()
    r = run_toolgym("view", str(path), "--tokenizer", "bogus-org/no-such-tokenizer", "--out",
                    str(tmp_path / "v.html"), cwd=tmp_path, env=env)
    wall = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "bogus-org/no-such-tokenizer" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert wall < 30, f"took {wall:.1f} s (the hub client's retries take ~45 s)"
    assert not (tmp_path / "v.html").exists()


def test_plot_curves_refuses_a_trajectory_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = make_rollout_file(tmp_path / "t.jsonl", episodes=2)
    assert main(["plot", "curves", str(path), "--out", str(tmp_path / "c.png")]) == 3
    err = capsys.readouterr().err
    assert "trajectory file" in err and "toolgym view" in err
    assert not (tmp_path / "c.png").exists()


def test_view_keeps_the_whole_rows_of_a_file_cut_mid_write(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = make_rollout_file(tmp_path / "t.jsonl", episodes=3)
    data = path.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) - 150])  # the third row loses its end and its newline
    out = tmp_path / "v.html"
    assert main(["view", str(cut), "--tokenizer", "none", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "(2 episodes)" in captured.out
    assert "cut.jsonl:3" in captured.err and "cut mid-write" in captured.err
    # a bad line that is not the last one is still an error (exit 3), never silently skipped
    lines = data.decode().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + lines[1][:40] + "\n" + lines[2])
    assert main(["view", str(bad), "--tokenizer", "none", "--out", str(tmp_path / "b.html")]) == 3
    assert "bad.jsonl:2" in capsys.readouterr().err


def test_view_compare_counts_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = make_rollout_file(tmp_path / "a.jsonl", episodes=2)
    b, _ = make_rollout_file(tmp_path / "b.jsonl", episodes=3)
    assert main(["view", str(a), "--compare", str(b), "--tokenizer", "none", "--out", str(tmp_path / "c.html")]) == 0
    assert "(5 episodes: 2 in a.jsonl, 3 in b.jsonl)" in capsys.readouterr().out
