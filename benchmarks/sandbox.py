"""Sandboxed Python executions per second: warm pool vs a fresh interpreter spawned per call.

Both modes run the same snippet through the same :class:`toolgym.tools.python.Sandbox` (same isolation and
limits); the only difference is ``pool_size`` (0 = spawn on demand, the call waits for interpreter start-up).
Calls are issued by ``--concurrency`` coroutines. Prints one line per mode and the ratio.

    .venv/bin/python benchmarks/sandbox.py --calls 200 --concurrency 4 --pool 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time

from toolgym.tools.python import Sandbox, SandboxLimits

SNIPPET = "print(sum(i * i for i in range(1000)))"


async def bench(pool: int, calls: int, concurrency: int, isolation: str) -> dict[str, float]:
    sb = Sandbox(SandboxLimits(), pool_size=pool, isolation=isolation)
    await sb.start()
    lat: list[float] = []
    queue = list(range(calls))

    async def worker() -> None:
        while queue:
            queue.pop()
            t = time.perf_counter()
            r = await sb.run(SNIPPET)
            assert r.status == "ok" and r.stdout.strip() == "332833500", r
            lat.append(time.perf_counter() - t)

    def cpu() -> float:
        c, m = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        return c.ru_utime + c.ru_stime + m.ru_utime + m.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu_s = time.perf_counter() - t0, cpu() - c0
    await sb.aclose()
    lat.sort()
    return {
        "pool": pool, "isolation": isolation, "namespaces": sb.namespaces, "calls": calls,
        "concurrency": concurrency, "exec_per_s": calls / wall, "p50_ms": 1000 * statistics.median(lat),
        "p95_ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
        # CPU (host + all sandbox processes, waited-for descendants included) per execution: load-independent;
        # 2 / cpu_s_per_exec is the throughput 2 idle cores could sustain
        "cpu_ms_per_exec": 1000 * cpu_s / calls, "capacity_2_cores_per_s": 2 * calls / cpu_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--isolation", default="auto", choices=["auto", "namespaces", "none"])
    args = ap.parse_args()
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, snippet: {SNIPPET!r}")
    fresh = asyncio.run(bench(0, args.calls, args.concurrency, args.isolation))
    warm = asyncio.run(bench(args.pool, args.calls, args.concurrency, args.isolation))
    for r in (fresh, warm):
        label = "fresh per call" if r["pool"] == 0 else f"warm pool ({r['pool']})"
        print(f"{label:16s}: {r['exec_per_s']:6.1f} exec/s  p50 {r['p50_ms']:6.1f} ms  p95 {r['p95_ms']:6.1f} ms"
              f"  CPU {r['cpu_ms_per_exec']:5.1f} ms/exec (=> {r['capacity_2_cores_per_s']:5.1f}/s on 2 idle cores)"
              f"  (namespaces={r['namespaces']}, concurrency={r['concurrency']})")
    print(f"warm/fresh throughput ratio: {warm['exec_per_s'] / fresh['exec_per_s']:.2f}x, "
          f"p50 latency ratio: {fresh['p50_ms'] / warm['p50_ms']:.2f}x")
    print(json.dumps({"fresh": fresh, "warm": warm}))


if __name__ == "__main__":
    main()
