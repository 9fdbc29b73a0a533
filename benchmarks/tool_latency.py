"""Per-call latency of the built-in tools, called directly vs through the ToolExecutor.

For each tool (calculator, BM25 search, read-only SQL, sandboxed Python) it times N calls made directly
(``await tool.acall(args)``) and N calls through a :class:`~toolgym.tools.executor.ToolExecutor` (argument
validation, caps, timeout, metrics), at concurrency 1 and 32, side by side in one run, and prints the executor's
overhead as a ratio. It also writes the per-call latencies (JSON) and a histogram PNG.

    .venv/bin/python -m benchmarks.tool_latency                 # all tools, 200 calls each
    .venv/bin/python -m benchmarks.tool_latency --tools calculator,search --calls 500 --out runs/bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from toolgym import runtime
from toolgym.tools.base import Tool, ToolCall
from toolgym.tools.executor import ToolExecutor


def make_tool(name: str) -> tuple[Tool, list[dict[str, Any]]]:
    """The tool and a list of argument dicts to cycle through."""
    if name == "calculator":
        from toolgym.tools.calculator import calculator_tool

        return calculator_tool(), [{"expression": f"({i} + 12345) * 6789 - {i * 7}"} for i in range(50)]
    if name == "search":
        from toolgym.data.geo import default_retriever
        from toolgym.tools.search import SearchTool

        qs = ["capital of France", "population of Lima", "currency of Japan", "Berlin", "country of Osaka"]
        return SearchTool(default_retriever()), [{"query": f"{q} {i}"} for i in range(10) for q in qs]
    if name == "sql":
        from toolgym.data.chinook import chinook_path
        from toolgym.tools.sql import SQLTool

        qs = ["SELECT COUNT(*) FROM Track", "SELECT Name FROM Artist ORDER BY Name LIMIT 5",
              "SELECT g.Name, COUNT(*) FROM Track t JOIN Genre g ON g.GenreId = t.GenreId GROUP BY g.Name"]
        return SQLTool(chinook_path()), [{"query": q} for q in qs]
    if name == "python":
        from toolgym.tools.python import PythonTool

        return PythonTool(), [{"code": f"print(sum(range({i} * 1000)))"} for i in range(1, 20)]
    raise SystemExit(f"unknown tool {name!r}")


async def timed_direct(tool: Tool, args: list[dict[str, Any]], n: int, conc: int) -> list[float]:
    sem = asyncio.Semaphore(conc)
    out: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            await tool.acall(args[i % len(args)])
            out.append(time.perf_counter() - t0)

    await asyncio.gather(*(one(i) for i in range(n)))
    return out


async def timed_executor(ex: ToolExecutor, name: str, args: list[dict[str, Any]], n: int, conc: int) -> list[float]:
    sem = asyncio.Semaphore(conc)
    out: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            r = await ex.run(ToolCall(name, args[i % len(args)]))
            if not r.ok:
                raise RuntimeError(r.content)
            out.append(time.perf_counter() - t0)

    await asyncio.gather(*(one(i) for i in range(n)))
    return out


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3


async def run(names: list[str], n: int, concs: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        tool, args = make_tool(name)
        ex = ToolExecutor([tool], max_concurrency=1024)
        await timed_direct(tool, args, min(n, 20), 4)  # warm-up (pools, JIT, caches)
        for conc in concs:
            t0 = time.perf_counter()
            direct = await timed_direct(tool, args, n, conc)
            t_direct = time.perf_counter() - t0
            t0 = time.perf_counter()
            via = await timed_executor(ex, tool.name, args, n, conc)
            t_via = time.perf_counter() - t0
            results[f"{name}@{conc}"] = {
                "direct_p50_ms": pct(direct, 0.5), "direct_p99_ms": pct(direct, 0.99),
                "executor_p50_ms": pct(via, 0.5), "executor_p99_ms": pct(via, 0.99),
                "direct_calls_s": n / t_direct, "executor_calls_s": n / t_via,
                "latencies_s": via,
            }
        await ex.aclose()
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", default="calculator,search,sql,python")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--out", default="runs/bench-tools", help="directory for latencies.json and latency.png")
    args = ap.parse_args(argv)
    names = [t.strip() for t in args.tools.split(",") if t.strip()]
    concs = [int(c) for c in args.concurrency.split(",")]
    res = runtime.run_sync(run(names, args.calls, concs))
    print("latency per call in ms (p50 / p99), throughput in calls/s, ratio = executor p50 / direct p50")
    print(f"{'tool@conc':<16} {'direct p50 ms':>13} {'exec p50 ms':>11} {'direct p99 ms':>13} {'exec p99 ms':>11} "
          f"{'direct calls/s':>14} {'exec calls/s':>12} {'exec/direct p50':>16}")
    for key, r in res.items():
        print(f"{key:<16} {r['direct_p50_ms']:>13.3f} {r['executor_p50_ms']:>11.3f} {r['direct_p99_ms']:>13.3f} "
              f"{r['executor_p99_ms']:>11.3f} {r['direct_calls_s']:>14.0f} {r['executor_calls_s']:>12.0f} "
              f"{r['executor_p50_ms'] / max(r['direct_p50_ms'], 1e-9):>15.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lat = {k: v.pop("latencies_s") for k, v in res.items()}
    (out / "latencies.json").write_text(json.dumps(lat))
    (out / "summary.json").write_text(json.dumps(res, indent=2))
    try:
        from toolgym.report.plots import plot_latency_histogram

        png = plot_latency_histogram(lat, out / "latency.png", title="tool-call latency through the executor")
        print(f"\nwrote {out / 'latencies.json'} and {png}")
    except ImportError as e:  # matplotlib is in the train extra
        print(f"\nwrote {out / 'latencies.json'} (no histogram: {e})")
    ratios = {k: r["executor_p50_ms"] / max(r["direct_p50_ms"], 1e-9) for k, r in res.items()}
    median = statistics.median(ratios.values())
    print(f"median executor overhead ratio: {median:.2f}x")
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "tools", "units": {"ratio": "executor p50 / direct p50 latency"},
                      "ratios": {"median": round(median, 3), **{k: round(v, 3) for k, v in ratios.items()}},
                      "results": res}))


if __name__ == "__main__":
    main()
