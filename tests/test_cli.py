"""The ``toolgym`` command: every subcommand, its output, and the documented exit codes.

Most tests call :func:`toolgym.cli.main` in-process (same code path as the console script, minus the interpreter
start-up); a few run the installed ``toolgym`` entry point as a real subprocess, including a rollout against a
real ``toolgym serve model`` server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.procs import free_port
from tests.rollout_files import make_rollout_file
from toolgym.cli import BENCHMARKS, SERVERS, ExitCode, build_parser, main
from toolgym.envs.registration import ENVS

TOOLGYM = shutil.which("toolgym", path=str(Path(sys.executable).parent)) or shutil.which("toolgym")
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def toolgym(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [TOOLGYM, *args] if TOOLGYM else [sys.executable, "-m", "toolgym.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)


def test_exit_codes_are_stable() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 130]


# ---------------------------------------------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------------------------------------------


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    builtin = out[: len(ENVS)]  # toolgym's envs first; user envs registered by other tests may follow, marked
    assert all(line.endswith("[user]") for line in out[len(ENVS):])
    for line, (env_id, (_, desc)) in zip(builtin, ENVS.items(), strict=True):
        assert line.startswith(env_id) and line.endswith(desc)
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows if r["builtin"]] == list(ENVS)


def test_entry_point_subprocess() -> None:
    r = toolgym("list")
    assert r.returncode == 0, r.stderr
    assert "toolgym/Calculator-v0" in r.stdout
    r = toolgym("rollout", "NoSuchEnv-v9", "--episodes", "1")
    assert r.returncode == ExitCode.USAGE
    assert "unknown env 'NoSuchEnv-v9'" in r.stderr and "toolgym/Calculator-v0" in r.stderr
    r = toolgym("frobnicate")
    assert r.returncode == ExitCode.USAGE and "invalid choice" in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# rollout
# ---------------------------------------------------------------------------------------------------------------


def test_rollout_tiny_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs" / "traj.jsonl"
    out.parent.mkdir()
    out.write_text("stale line that must be overwritten\n")
    rc = main(["rollout", "calculator", "--policy", "tiny", "--episodes", "2", "--num-envs", "2",
               "--max-new-tokens", "6", "--seed", "7", "--out", str(out), "--json", "--no-progress"])
    assert rc == 0
    cap = capsys.readouterr()
    for label in ("mean reward", "success", "mean turns", "tool calls/episode", "errors"):
        assert label in cap.err  # with --json the table goes to stderr ...
    assert len(cap.out.strip().splitlines()) == 1  # ... and stdout is the JSON object alone
    summary = json.loads(cap.out)
    assert summary["env"] == "toolgym/Calculator-v0" and summary["summary"]["episodes"] == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        assert len(r["completion_ids"]) == len(r["loss_mask"]) > 0
        spans = [(*t["action_span"], *t["obs_span"]) for t in r["turns"]]
        ends = [0] + [s[3] for s in spans]  # the turns tile the completion: action, then observation
        assert [s[0] for s in spans] == ends[:-1] and ends[-1] == len(r["completion_ids"])
        assert all(a < b <= c <= d for a, b, c, d in spans)
        assert all(r["loss_mask"][s[0]] == 1 for s in spans)  # an action starts with a sampled token
        assert r["logprobs"] is not None and len(r["logprobs"]) == len(r["completion_ids"])
        assert sum(r["loss_mask"]) <= 6 * len(r["turns"])  # the per-turn budget holds
    # seeded: the same command gives the same trajectories
    out2 = tmp_path / "again.jsonl"
    assert main(["rollout", "toolgym/Calculator-v0", "--policy", "tiny", "--episodes", "2", "--num-envs", "2",
                 "--max-new-tokens", "6", "--seed", "7", "--out", str(out2), "--no-progress"]) == 0
    rows2 = [json.loads(line) for line in out2.read_text().splitlines()]
    assert [r["completion_ids"] for r in rows2] == [r["completion_ids"] for r in rows]
    assert [r["task"]["id"] for r in rows2] == [r["task"]["id"] for r in rows]


def test_rollout_env_kwargs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["rollout", "Calculator-v0", "--policy", "tiny", "--episodes", "2", "--max-new-tokens", "4",
                 "--env-kwarg", "split=test", "--env-kwarg", "max_turns=1", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["task"]["split"] for r in rows} == {"test"}
    capsys.readouterr()
    # an unknown constructor argument is a usage error, reported with the env's own message
    assert main(["rollout", "Calculator-v0", "--policy", "tiny", "--episodes", "1",
                 "--env-kwarg", "no_such_option=1", "--out", str(out), "--no-progress"]) == ExitCode.USAGE
    assert "no_such_option" in capsys.readouterr().err
    assert main(["rollout", "Calculator-v0", "--env-kwarg", "=1", "--out", str(out)]) == ExitCode.USAGE
    capsys.readouterr()
    assert main(["rollout", "Calculator-v0", "--policy", "tiny", "--episodes", "1", "--env-kwarg", "split=bogus",
                 "--out", str(out), "--no-progress"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err == "toolgym: error: bad env arguments for toolgym/Calculator-v0: split must be 'train' or 'test'"
    assert main(["rollout", "Calculator-v0", "--episodes", "0", "--out", str(out)]) == ExitCode.USAGE


def test_rollout_bad_policy_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    port = free_port()  # nothing listens there
    assert main(["rollout", "calculator", "--policy", f"http://127.0.0.1:{port}", "--episodes", "1",
                 "--out", str(out)]) == ExitCode.UNREACHABLE
    assert f"cannot reach the policy server at http://127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["rollout", "calculator", "--policy", str(tmp_path / "no-model"), "--out", str(out)]) == ExitCode.INPUT
    assert "no such model path" in capsys.readouterr().err
    assert main(["rollout", "calculator", "--policy", "ftp://x", "--out", str(out)]) == ExitCode.USAGE
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["rollout", "calculator", "--policy", "tiny", "--out", str(blocked / "t.jsonl")]) == ExitCode.INPUT
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_model_and_rollout_against_it(tmp_path: Path) -> None:
    """``toolgym serve model`` (a real server subprocess) + ``toolgym rollout --policy URL`` (another one)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [TOOLGYM, "serve", "model", "--model", "tiny", "--port", str(port), "--threads", "1"] if TOOLGYM else \
        [sys.executable, "-m", "toolgym.cli", "serve", "model", "--model", "tiny", "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        out = tmp_path / "url.jsonl"
        r = toolgym("rollout", "calculator", "--policy", url, "--episodes", "2", "--max-new-tokens", "5",
                    "--temperature", "0", "--out", str(out), "--json", "--no-progress")
        assert r.returncode == 0, r.stderr[-3000:]
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["summary"]["episodes"] == 2 and summary["stats"]["generated_tokens"] > 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert all(len(x["completion_ids"]) == len(x["loss_mask"]) and sum(x["loss_mask"]) > 0 for x in rows)
        assert all(x["logprobs"] is not None for x in rows)
    finally:
        server.terminate()
        server.wait(timeout=30)
    # the server is gone: the same command now fails with the "unreachable" code
    r = toolgym("rollout", "calculator", "--policy", url, "--episodes", "1", "--out", str(tmp_path / "x.jsonl"))
    assert r.returncode == ExitCode.UNREACHABLE, r.stderr


# ---------------------------------------------------------------------------------------------------------------
# view / plot
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    return make_rollout_file(tmp_path_factory.mktemp("rollout") / "traj.jsonl")


def test_view(rollout: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, trajs = rollout
    out = tmp_path / "sub" / "report.html"
    assert main(["view", str(path), "--out", str(out)]) == 0
    assert f"wrote {out} ({len(trajs)} episodes)" in capsys.readouterr().out
    page = out.read_text()
    assert page.count('"nt":') == len(trajs)  # one embedded episode record each (rendered in the browser)
    assert main(["view", str(path), "--out", str(out), "--limit", "2", "--tokenizer", "none", "--title", "T"]) == 0
    page = out.read_text()
    assert page.count('"nt":') == 2 and "<title>T</title>" in page


def test_view_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "r.html")
    assert main(["view", str(tmp_path / "missing.jsonl"), "--out", out]) == ExitCode.INPUT
    assert "cannot read" in capsys.readouterr().err
    assert main(["view", str(tmp_path), "--out", out]) == ExitCode.INPUT  # a directory
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["view", str(bad), "--out", out]) == ExitCode.INPUT
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err
    bad.write_bytes(b"\xff\xfe\x00garbage\n")
    assert main(["view", str(bad), "--out", out]) == ExitCode.INPUT
    assert main(["view"]) == ExitCode.USAGE
    assert not Path(out).exists()


def test_plot(rollout: tuple[Path, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": i, "reward": i / 4, "success": i / 8}) + "\n" for i in range(1, 5)))
    png = tmp_path / "curves.png"
    assert main(["plot", "curves", str(log), "--out", str(png), "--smooth", "2"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    png2 = tmp_path / "lat.png"
    assert main(["plot", "latency", str(rollout[0]), "--out", str(png2)]) == 0
    assert png2.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["plot", "curves", str(tmp_path / "nope.jsonl"), "--out", str(png)]) == ExitCode.INPUT
    assert main(["plot", "curves", str(log), "--metrics", "loss", "--out", str(png)]) == ExitCode.INPUT
    assert "none of the metrics" in capsys.readouterr().err
    assert main(["plot", "curves", str(log), str(log), "--out", str(png)]) == 0  # several runs: overlaid
    assert main(["plot", "curves", str(log), str(tmp_path / "nope.jsonl"), "--out", str(png)]) == ExitCode.INPUT
    assert main(["plot", "bars", str(log), "--out", str(png)]) == ExitCode.USAGE


# ---------------------------------------------------------------------------------------------------------------
# bench / serve
# ---------------------------------------------------------------------------------------------------------------


def test_bench_names_map_to_scripts() -> None:
    repo_bench = Path(__file__).resolve().parent.parent / "benchmarks"
    present = {name for name, (cands, _) in BENCHMARKS.items() if any((repo_bench / c).is_file() for c in cands)}
    assert {"vector", "rollout", "mcp", "sandbox"} <= present, present


def _benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: dict[str, str]) -> None:
    """A benchmarks folder holding ``scripts`` (file name -> source), the one ``toolgym bench`` runs from."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name, source in scripts.items():
        (bench / name).write_text(source)
    monkeypatch.setenv("TOOLGYM_BENCHMARKS", str(bench))


def test_bench_forwards_args_and_prints_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _benchmarks(tmp_path, monkeypatch, {
        "vector_step.py": "import sys\nprint('args:', sys.argv[1:])\nprint('| N | seq/toolgym |')\n"
                          "print('seq/toolgym ratio: 12.5x')\nprint()\nprint('done, nothing to repeat')\n",
        "sandbox.py": "import sys\nprint('half done')\nsys.exit(3)\n"})
    assert main(["bench", "vector", "--quick", "--sizes", "1", "16"]) == 0
    out = capsys.readouterr().out
    assert "args: ['--quick', '--sizes', '1', '16']" in out
    assert out.split("== vector: ratios ==")[1].strip().splitlines()[:2] == ["| N | seq/toolgym |",
                                                                            "seq/toolgym ratio: 12.5x"]
    assert "done, nothing to repeat" not in out.split("== vector: ratios ==")[1]
    assert main(["bench", "sandbox"]) == ExitCode.FAILURE
    assert "exited with status 3" in capsys.readouterr().err
    assert main(["bench", "judge"]) == ExitCode.INPUT  # no script for it in this directory
    assert main(["bench", "nonsense"]) == ExitCode.USAGE


def test_bench_real_vector_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "vector", "--sizes", "1", "4", "--async-max", "0"]) == 0
    out = capsys.readouterr().out
    assert "== vector: ratios ==" in out and "seq/toolgym" in out
    ratios = out.split("== vector: ratios ==")[1]
    assert "sequential/toolgym N=4" in ratios and "x\n" in ratios  # read from the script's JSON summary line
    assert "toolgym ms" in out  # the table has units


def test_bench_reads_the_json_summary_line_and_help_has_no_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _benchmarks(tmp_path, monkeypatch, {"retrieval.py": (
        "import json, sys\n"
        "if '--help' in sys.argv: print('usage: compare ratio vs direct  calls  x vs y'); sys.exit(0)\n"
        "print('a ratio of 9.9x scraped from text must not be used')\n"
        "print(json.dumps({'toolgym_bench': 'retrieval', 'ratios': {'calc@1': 1.25}, 'units': {'ratio': 'p50/p50'}}))\n"
    )})
    assert main(["bench", "retrieval", "--help"]) == 0
    assert "ratios ==" not in capsys.readouterr().out
    assert main(["bench", "retrieval"]) == 0
    section = capsys.readouterr().out.split("== retrieval: ratios ==")[1]
    assert "calc@1  1.25x" in section and "(ratio: p50/p50)" in section and "9.9x" not in section


def test_serve_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    for name in SERVERS:
        assert main(["serve", name, "--help"]) == 0
        assert f"toolgym serve {name}" in capsys.readouterr().out
    assert main(["serve", "ftp"]) == ExitCode.USAGE
    assert main(["serve", "mcp", "--tools", "no_such_toolset"]) == ExitCode.USAGE


def test_parser_help_mentions_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "exit codes: 0 ok, 1 runtime failure, 2 usage error" in text
    for cmd in ("list", "rollout", "view", "plot", "bench", "serve"):
        assert cmd in text
    assert build_parser().parse_args(["rollout", "calculator"]).policy == "embedded"


# ---------------------------------------------------------------------------------------------------------------
# exit codes of env construction (docs/cli.md "Exit codes") and MCP start-up messages
# ---------------------------------------------------------------------------------------------------------------

_DIE = ("import sys; sys.stderr.write('starting\\n'); sys.stderr.write('boom: MY_API_KEY is not set\\n'); "
        "sys.exit(3)")


def _mcp_files(tmp_path: Path) -> dict[str, Path]:
    f = {name: tmp_path / name for name in ("die.json", "die_null.json", "url.json", "bad.json", "shape.json",
                                            "tasks.jsonl", "bad_tasks.jsonl")}
    die = {"command": sys.executable, "args": ["-c", _DIE]}
    f["die.json"].write_text(json.dumps({"mcpServers": {"dead": die}}))
    f["die_null.json"].write_text(json.dumps({"mcpServers": {"dead": {**die, "stderr": "devnull"}}}))
    f["url.json"].write_text(json.dumps({"mcpServers": {"far": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}}))
    f["bad.json"].write_text('{"mcpServers": ')
    f["shape.json"].write_text(json.dumps({"mcpServers": {"x": {"command": "a", "url": "http://b"}}}))
    f["tasks.jsonl"].write_text(json.dumps({"prompt": "hi", "answer": "x"}) + "\n")
    f["bad_tasks.jsonl"].write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"oops": 1}) + "\n")
    return f


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("config", "tasks", "code", "needles"),
    [
        ("die.json", "tasks.jsonl", ExitCode.UNREACHABLE,
         ["cannot connect to MCP server 'dead': connection closed", "boom: MY_API_KEY is not set"]),
        ("die_null.json", "tasks.jsonl", ExitCode.UNREACHABLE, ["connection closed", "boom: MY_API_KEY is not set"]),
        ("url.json", "tasks.jsonl", ExitCode.UNREACHABLE, ["'far': all connection attempts failed (url http://"]),
        ("missing.json", "tasks.jsonl", ExitCode.INPUT, ["MCP config not found"]),
        ("bad.json", "tasks.jsonl", ExitCode.INPUT, ["cannot parse MCP config", "bad.json"]),
        ("shape.json", "tasks.jsonl", ExitCode.INPUT, ["shape.json", "exactly one of 'command'"]),
        ("die.json", "missing.jsonl", ExitCode.INPUT, ["task file not found"]),
        ("die.json", "bad_tasks.jsonl", ExitCode.INPUT, ["bad_tasks.jsonl:2", "needs 'prompt' or 'messages'"]),
    ],
)
def test_mcp_env_errors_exit_codes_and_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str,
                                                tasks: str, code: int, needles: list[str]) -> None:
    _mcp_files(tmp_path)
    rc = main(["eval", "MCP-v0", "--policy", "oracle", "--no-progress",
               "--env-kwarg", f"mcp_config={tmp_path / config}", "--env-kwarg", f"tasks={tmp_path / tasks}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == code, err
    assert err.startswith("toolgym: error: ")
    for needle in needles:
        assert needle in err
    for raw in ("ExceptionGroup", "TaskGroup", "ValueError:", "FileNotFoundError:", "ConnectionError:", "ToolError:"):
        assert raw not in err


@pytest.mark.parametrize(("kwarg", "needle"), [("max_turns=abc", "max_turns must be a positive integer, got 'abc'"),
                                               ("max_turns=0", "max_turns must be a positive integer, got 0"),
                                               ("max_obs_tokens=-5", "max_obs_tokens must be a positive integer"),
                                               ("split=bogus", "split must be")])
def test_bad_env_kwarg_values_are_usage_errors(capsys: pytest.CaptureFixture[str], kwarg: str, needle: str) -> None:
    assert main(["eval", "calculator", "--policy", "oracle", "--tasks", "1", "--env-kwarg", kwarg]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "ValueError" not in err[0]


def test_mcp_example_check_setup_says_when_uvx_is_missing(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo), "PATH": str(tmp_path)}  # no uvx on this PATH
    r = subprocess.run([sys.executable, str(repo / "examples" / "mcp" / "check_setup.py")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line, no traceback
    assert "server command not found (calculator: 'uvx')" in r.stderr and "pip install uv" in r.stderr
