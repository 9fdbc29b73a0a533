"""MCP tool-call latency and throughput: stdio and streamable HTTP vs a direct in-process call.

The same tool (toolgym's ``calculator``) is called three ways through a :class:`ToolExecutor`, so only the
transport differs:

* ``direct``: the in-process tool;
* ``stdio``: ``toolgym serve mcp --tools calculator`` as a stdio subprocess, one shared MCP session;
* ``http``: the same server over streamable HTTP on 127.0.0.1, one shared MCP session.

At each concurrency (calls in flight at once: 1, 64, 512) it runs ``--calls`` calls and reports per-call
p50/p99 latency (ms) and calls/s, plus the slowdown vs ``direct`` at the same concurrency.

    python -m benchmarks.mcp_latency                 # 2,000 calls per cell (500 at concurrency 1)
    python -m benchmarks.mcp_latency --calls 500     # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from toolgym.runtime import run_sync
from toolgym.tools.base import ToolCall
from toolgym.tools.calculator import calculator_tool
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.mcp import MCPToolset


async def _measure(ex: ToolExecutor, name: str, concurrency: int, n_calls: int) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0
    first_error = ""
    counter = iter(range(n_calls))

    async def worker() -> None:
        nonlocal errors, first_error
        for i in counter:
            t0 = time.perf_counter()
            r = await ex.run(ToolCall(name, {"expression": f"{i} * 7 + 3"}))
            lat.append(time.perf_counter() - t0)
            if not r.ok:
                errors += 1
                first_error = first_error or r.content

    # warm-up (connection, first-call costs)
    await asyncio.gather(*(ex.run(ToolCall(name, {"expression": "1+1"})) for _ in range(min(concurrency, 32))))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    a = np.asarray(lat) * 1e3
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "calls_per_s": len(lat) / wall,
        "errors": errors,
        "first_error": first_error,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_http(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolgym.serve.mcp",
            "--tools",
            "calculator",
            "--transport",
            "http",
            "--port",
            str(port),
        ],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("toolgym serve mcp (http) did not start")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per cell (a quarter of it at concurrency 1)")
    p.add_argument("--concurrency", default="1,64,512")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    p.add_argument("--mode", default="auto", help="MCP protocol negotiation: auto (SDK default) or legacy")
    p.add_argument("--only", default="", help="comma-separated subset of direct,stdio,http")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]

    port = _free_port()
    http = _start_http(port)
    try:
        cfg = {
            "mcpServers": {
                "stdio": {"command": sys.executable, "args": ["-m", "toolgym.serve.mcp", "--tools", "calculator"],
                          "stderr": "devnull"},
                "http": {"url": f"http://127.0.0.1:{port}/mcp"},
            }
        }  # fmt: skip
        ts = MCPToolset(cfg, prefix="always", connect_timeout_s=180, mode=args.mode)
        tools = ts.connect()
        direct = calculator_tool(timeout_s=60)
        ex = ToolExecutor([direct, *tools], max_concurrency=1024, default_timeout_s=60, max_retries=0)
        names = {"direct": "calculator", "stdio": "stdio__calculator", "http": "http__calculator"}
        if args.only:
            names = {k: v for k, v in names.items() if k in args.only.split(",")}
        results: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in names}
        for c in levels:
            n = max(args.calls // 4, 100) if c == 1 else args.calls
            for mode, tool_name in names.items():
                results[mode][c] = run_sync(_measure(ex, tool_name, c, n))
        run_sync(ex.aclose())
    finally:
        http.terminate()
        http.wait(10)

    print(f"# MCP call latency ({platform.processor() or platform.machine()}, python {platform.python_version()})")
    print("| transport | concurrency | p50 ms | p99 ms | calls/s | calls/s vs direct | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in levels:
        base = results["direct"][c]["calls_per_s"] if "direct" in results else float("nan")
        for mode in names:
            r = results[mode][c]
            print(
                f"| {mode} | {c} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['calls_per_s']:.0f} | "
                f"{r['calls_per_s'] / base:.3f}x | {r['errors']} |"
            )
    for mode in names:
        for c in levels:
            if results[mode][c]["errors"]:
                print(f"{mode} @ {c}: first error: {results[mode][c]['first_error'][:300]}")
    if args.json:
        print(json.dumps(results, indent=1))
    ratios = {f"{mode}/direct calls/s @ {c}": results[mode][c]["calls_per_s"] / results["direct"][c]["calls_per_s"]
              for c in levels for mode in names if mode != "direct" and "direct" in results}
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "mcp", "units": {"ratio": "calls/s through MCP / calls/s direct"},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()},
                      "results": {m: {str(c): {k: v for k, v in r.items() if k != "first_error"}
                                      for c, r in per.items()} for m, per in results.items()}}))


if __name__ == "__main__":
    main()
