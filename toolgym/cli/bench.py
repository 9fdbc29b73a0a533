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
    "ANYWHERE",
    "BENCHMARKS",
    "SERVERS",
    "add_parsers",
    "benchmark_script",
    "benchmarks_dir",
    "find_checkout",
    "needs_checkout_message",
    "ratio_lines",
    "run_benchmark",
    "run_server",
    "summary_line",
]

#: benchmark name -> (candidate script names under benchmarks/, what it measures)
BENCHMARKS: dict[str, tuple[tuple[str, ...], str]] = {
    "vector": (("vector_step.py",), "ToolVectorEnv step vs a sequential loop vs gymnasium AsyncVectorEnv"),
    "tools": ((), "tool-call latency of your @tool module, MCP config or env (or the built-in tools): p50/p95/p99, "
                  "calls/s, errors, toolgym's overhead over the raw call"),
    "retrieval": (("retrieval.py",), "BM25 retrieval: queries/s, local vs HTTP"),
    "rollout": (("rollout.py",), "rollout throughput: TRL native tool loop vs the toolgym adapter"),
    "mcp": (("mcp_latency.py",), "MCP call latency: your MCP config's tools (--config), else toolgym's calculator "
                                 "over stdio and streamable HTTP vs direct (a checkout's mcp_latency.py)"),
    "sandbox": (("sandbox.py",), "sandboxed Python executions/s: warm pool vs fresh interpreter"),
    "judge": (("judge.py",), "LLM-judge throughput against a local model server"),
}

#: server name -> module with ``main(argv) -> int``
SERVERS: dict[str, tuple[str, str]] = {
    "retriever": ("toolgym.serve.retriever", "Search-R1 compatible /retrieve HTTP service (BM25)"),
    "mcp": ("toolgym.serve.mcp", "toolgym's tools as an MCP server (stdio or streamable HTTP)"),
    "model": ("toolgym.serve.model", "OpenAI-compatible /v1 completions server over a local transformers model"),
}


def _is_checkout(d: Path) -> bool:
    """Whether ``d`` is the root of a toolgym source checkout: its ``benchmarks/`` beside a ``pyproject.toml``."""
    return (d / "benchmarks").is_dir() and (d / "pyproject.toml").is_file()


def find_checkout(starts: Sequence[Path]) -> Path | None:
    """The first toolgym checkout root at or above any of ``starts``, in order (:func:`_is_checkout`), or ``None``."""
    for start in starts:
        for d in (start, *start.parents):
            if _is_checkout(d):
                return d
    return None


def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` directory: ``$TOOLGYM_BENCHMARKS``, else that of the checkout this package runs from
    (walking up from the package's own file: an editable install or a source tree), else that of a checkout at or
    above the current directory; ``None`` from an installed wheel used outside a checkout."""
    env = os.environ.get("TOOLGYM_BENCHMARKS")
    if env:
        return Path(env) if Path(env).is_dir() else None
    root = find_checkout([Path(__file__).resolve().parent, Path.cwd().resolve()])
    return root / "benchmarks" if root is not None else None


#: the benchmarks that run anywhere (the package's own code, on the user's tools); every other name runs a script
#: of a source checkout's ``benchmarks/``
ANYWHERE = ("tools",)


def needs_checkout_message() -> str:
    """What ``toolgym bench`` says where no checkout is found: which benchmarks need one and which run anywhere."""
    need = ", ".join(n for n in BENCHMARKS if n not in ANYWHERE)
    return (f"no toolgym checkout found (no benchmarks/ beside a pyproject.toml at or above this directory or the "
            f"installed package, and TOOLGYM_BENCHMARKS is not set): {need} run scripts of a source checkout "
            f"(git clone it and run from inside it); without one, `toolgym bench tools` times your @tool module, "
            f"MCP config or env and `toolgym bench mcp --config FILE` your MCP servers")


def benchmark_script(name: str) -> Path:
    """The script behind ``toolgym bench NAME``.

    Raises:
        CLIError: unknown name (usage) or script not found (input: no checkout, or no such script in it).
    """
    if name not in BENCHMARKS:
        raise CLIError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}", ExitCode.USAGE)
    d = benchmarks_dir()
    if d is None:
        raise CLIError(needs_checkout_message(), ExitCode.INPUT)
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
    """Run ``python -m benchmarks.<script>`` of the checkout (:func:`benchmarks_dir`) with ``extra`` args in this
    interpreter, from the checkout's root, stream its output, then repeat the lines that state ratios. Returns 0, or
    1 when the script fails. ``tools`` (and ``mcp`` with a config, or without a checkout) run the package's own
    :mod:`toolgym.bench`: anywhere, on the user's tools."""
    if name == "tools" or (name == "mcp" and (any(a.split("=")[0] in ("--config", "--mcp") for a in extra)
                                               or benchmarks_dir() is None)):
        from toolgym import bench  # in the package: works from an installed wheel, on the user's tools

        if name == "mcp" and not any(a.split("=")[0] in ("--config", "--mcp", "-h", "--help") for a in extra):
            extra = ["--config", json.dumps({"mcpServers": {"toolgym": {
                "command": sys.executable, "args": ["-m", "toolgym.serve.mcp", "--tools", "calculator"]}}}),
                     "--call", 'calculator={"expression": "(12345 + 6789) * 3"}', *extra]
        return bench.main(extra, prog=f"toolgym bench {name}")
    script = benchmark_script(name)
    repo = script.parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", f"{script.parent.name}.{script.stem}", *extra]  # as a module, from the checkout
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
    s = sub.add_parser("bench", help="run a benchmark (extra args are forwarded)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in BENCHMARKS.items())
                       + "\n\n  tools runs anywhere; the others run a script of a toolgym source checkout's benchmarks/ "
                         "(found at or above the current directory or the installed package; mcp with --config runs "
                         "anywhere too)",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(BENCHMARKS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark script")

    s = sub.add_parser("serve", help="start a service (extra args are forwarded; NAME --help lists them)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in SERVERS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(SERVERS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the server")
