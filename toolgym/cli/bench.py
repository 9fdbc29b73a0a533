"""``toolgym bench`` and ``toolgym serve``: run a script from ``benchmarks/`` (then repeat its ratios) or start a
service from :mod:`toolgym.serve`; both forward their remaining arguments."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolgym.cli.common import CLIError, ExitCode, print_error

__all__ = [
    "BENCHMARKS",
    "SERVERS",
    "add_parsers",
    "benchmark_script",
    "benchmarks_dir",
    "ratio_lines",
    "run_benchmark",
    "run_server",
    "summary_line",
]

#: benchmark name -> (candidate script names under benchmarks/, what it measures)
BENCHMARKS: dict[str, tuple[tuple[str, ...], str]] = {
    "vector": (("vector_step.py",), "ToolVectorEnv step vs a sequential loop vs gymnasium AsyncVectorEnv"),
    "tools": (("tool_latency.py",), "per-call latency of each built-in tool, direct vs through the executor"),
    "retrieval": (("retrieval.py",), "BM25 retrieval: queries/s, local vs HTTP"),
    "rollout": (("rollout.py",), "rollout throughput: TRL native tool loop vs the toolgym adapter"),
    "mcp": (("mcp_latency.py",), "MCP call latency: stdio and streamable HTTP vs direct"),
    "sandbox": (("sandbox.py",), "sandboxed Python executions/s: warm pool vs fresh interpreter"),
    "judge": (("judge.py",), "LLM-judge throughput against a local model server"),
}

#: server name -> module with ``main(argv) -> int``
SERVERS: dict[str, tuple[str, str]] = {
    "retriever": ("toolgym.serve.retriever", "Search-R1 compatible /retrieve HTTP service (BM25)"),
    "mcp": ("toolgym.serve.mcp", "toolgym's tools as an MCP server (stdio or streamable HTTP)"),
    "model": ("toolgym.serve.model", "OpenAI-compatible /v1 completions server over a local transformers model"),
}


def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` directory: ``$TOOLGYM_BENCHMARKS``, else next to the package (a source checkout),
    else under the current directory."""
    env = os.environ.get("TOOLGYM_BENCHMARKS")
    cands = [Path(env)] if env else []
    cands += [Path(__file__).resolve().parent.parent / "benchmarks", Path.cwd() / "benchmarks"]
    return next((c for c in cands if c.is_dir()), None)


def benchmark_script(name: str) -> Path:
    """The script behind ``toolgym bench NAME``.

    Raises:
        CLIError: unknown name (usage) or script not found (input).
    """
    if name not in BENCHMARKS:
        raise CLIError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}", ExitCode.USAGE)
    d = benchmarks_dir()
    if d is None:
        raise CLIError("no benchmarks/ directory found (run from a toolgym checkout or set TOOLGYM_BENCHMARKS)",
                       ExitCode.INPUT)
    for cand in BENCHMARKS[name][0]:
        if (d / cand).is_file():
            return d / cand
    raise CLIError(f"benchmark {name!r}: none of {', '.join(BENCHMARKS[name][0])} in {d}", ExitCode.INPUT)


_RATIO = re.compile(r"\bratio\b|\bspeed-?up\b|\b\d+(?:\.\d+)?x\b|\bx vs\b", re.IGNORECASE)
_TABLE_HEAD = re.compile(r"\bratio\b|\bvs\b|\w/\w|\bspeed-?up\b|\bx vs\b", re.IGNORECASE)


def _is_table_header(s: str) -> bool:
    return bool(_TABLE_HEAD.search(s)) and (s.startswith("|") or len(re.findall(r"\S\s{2,}\S", s)) >= 2)


def ratio_lines(lines: Sequence[str]) -> list[str]:
    """The lines of a benchmark's output that state ratios: lines naming a ratio / speed-up / ``N.Nx``, and whole
    tables (up to the next blank line) whose header has a ratio column (``ratio``, ``vs``, ``a/b``)."""
    out: list[str] = []
    in_table = False
    for line in lines:
        s = line.rstrip()
        if not s.strip():
            in_table = False
            continue
        if in_table:
            out.append(s)
        elif s.lstrip().startswith(("{", "[")):
            continue
        elif _is_table_header(s.strip()):
            in_table = True
            out.append(s)
        elif _RATIO.search(s):
            out.append(s)
    return out


def run_benchmark(name: str, extra: Sequence[str]) -> int:
    """Run ``benchmarks/<script>`` with ``extra`` args in this interpreter, stream its output, then repeat the
    lines that state ratios. Returns 0, or 1 when the script fails."""
    script = benchmark_script(name)
    repo = script.parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(script), *extra]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=str(repo), bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        print_error(f"benchmark {name} ({script.name}) exited with status {rc} after {wall:.0f} s")
        return ExitCode.FAILURE
    if any(a in ("-h", "--help") for a in extra):
        return ExitCode.OK  # the script printed its help; there are no results to summarise
    summary = summary_line(lines)
    if summary is not None:
        ratios = summary.get("ratios") or {}
        if ratios:
            print(f"\n== {name}: ratios ==")
            width = max(len(str(k)) for k in ratios)
            for k, v in ratios.items():
                print(f"{k:<{width}}  {v:.2f}x" if isinstance(v, int | float) else f"{k:<{width}}  {v}")
            for k, v in (summary.get("units") or {}).items():
                print(f"  ({k}: {v})")
    else:  # a script without a summary line: repeat the lines that state ratios
        ratios_text = ratio_lines(lines)
        if ratios_text:
            print(f"\n== {name}: ratios ==")
            for r in ratios_text:
                print(r)
    print(f"\n{name}: done in {wall:.0f} s ({script.name})")
    return ExitCode.OK


def summary_line(lines: Sequence[str]) -> dict[str, Any] | None:
    """The benchmark's JSON summary: the last stdout line that is a JSON object with a ``toolgym_bench`` key
    (``{"toolgym_bench": NAME, "ratios": {label: x}, "units": {...}, "results": {...}}``), or ``None``."""
    for line in reversed(lines):
        s = line.strip()
        if s.startswith("{") and '"toolgym_bench"' in s:
            try:
                obj = json.loads(s)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def run_server(name: str, extra: Sequence[str]) -> int:
    """Dispatch ``toolgym serve NAME ARGS`` to ``toolgym.serve.<name>.main(ARGS)``."""
    import importlib

    if name not in SERVERS:
        raise CLIError(f"unknown server {name!r}; choose from {', '.join(SERVERS)}", ExitCode.USAGE)
    try:
        mod = importlib.import_module(SERVERS[name][0])
    except ImportError as e:
        raise CLIError(f"server {name!r} is not available: {e}", ExitCode.FAILURE) from None
    rc = mod.main(list(extra))
    return int(rc or 0)


def add_parsers(sub: Any) -> None:
    """Add the ``bench`` and ``serve`` subcommands to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (extra args are forwarded)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in BENCHMARKS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(BENCHMARKS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark script")

    s = sub.add_parser("serve", help="start a service (extra args are forwarded; NAME --help lists them)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in SERVERS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(SERVERS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the server")
