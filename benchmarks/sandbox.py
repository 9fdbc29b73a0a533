"""Sandboxed Python executions per second: a fresh interpreter per call vs the fork server's warm pool.

All modes run the same snippet through :class:`toolgym.tools.python.Sandbox` with the same isolation and
limits (PID/mount/network namespaces, per-worker uid, rlimits when available); only the way workers are made
differs:

* ``fresh interpreter``: ``Sandbox(fork_server=False, pool_size=0)`` -- every call starts a new ``python -I -S``
  that isolates itself and runs the snippet (the design before the fork server; the baseline);
* ``fork server``: ``pool_size=0`` -- every call forks a worker from the long-lived server and waits for it;
* ``fork server + pool``: ``pool_size=--pool`` (the default configuration) -- workers are forked and isolated
  ahead of time, so a call only sends the code and reads the output.

Calls are issued by ``--concurrency`` coroutines. Besides exec/s and latency, it reports CPU per execution:
this process, every interpreter it started, the fork server and all workers (``getrusage`` of reaped children
plus ``/proc/<server>/stat`` of the live server), which does not depend on what else the machine is doing;
``2 / CPU-seconds-per-exec`` is the rate two idle cores could sustain. Kernel worker threads (namespace
teardown) are not attributed to any process and not included. Prints one line per mode and the ratios.

    .venv/bin/python -m benchmarks.sandbox --calls 200 --concurrency 4 --pool 4
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


def _own_cpu() -> float:
    """CPU seconds of this process and of its reaped children (and theirs)."""
    c, m = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return c.ru_utime + c.ru_stime + m.ru_utime + m.ru_stime


def _server_cpu(pid: int | None) -> float:
    """CPU seconds of the live fork server and of the workers it reaped (utime + stime + cutime + cstime)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


async def bench(label: str, calls: int, concurrency: int, isolation: str, *, pool: int,
                fork_server: bool) -> dict[str, object]:
    sb = Sandbox(SandboxLimits(), pool_size=pool, isolation=isolation, fork_server=fork_server)
    await sb.start()
    r = await sb.run(SNIPPET)  # the fork server is up and the pool refilled before timing starts
    assert r.status == "ok", r
    await asyncio.sleep(0.3)
    lat: list[float] = []
    queue = list(range(calls))

    async def worker() -> None:
        while queue:
            queue.pop()
            t = time.perf_counter()
            r = await sb.run(SNIPPET)
            assert r.status == "ok" and r.stdout.strip() == "332833500", r
            lat.append(time.perf_counter() - t)

    server = sb.server_pid
    t0, c0 = time.perf_counter(), _own_cpu() + _server_cpu(server)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await asyncio.sleep(0.3)  # let the per-call interpreters be reaped; the pool refills (counted: it is per call)
    assert sb.server_pid == server, "the fork server restarted during the benchmark"
    cpu_s = _own_cpu() + _server_cpu(server) - c0
    await sb.aclose()
    lat.sort()
    return {
        "mode": label, "pool": pool, "fork_server": fork_server, "isolation": isolation,
        "namespaces": sb.namespaces, "calls": calls, "concurrency": concurrency, "exec_per_s": calls / wall,
        "p50_ms": 1000 * statistics.median(lat), "p95_ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
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
    runs = [
        asyncio.run(bench("fresh interpreter", args.calls, args.concurrency, args.isolation, pool=0,
                          fork_server=False)),
        asyncio.run(bench("fork server", args.calls, args.concurrency, args.isolation, pool=0, fork_server=True)),
        asyncio.run(bench(f"fork server + pool ({args.pool})", args.calls, args.concurrency, args.isolation,
                          pool=args.pool, fork_server=True)),
    ]
    for r in runs:
        print(f"{r['mode']:24s}: {r['exec_per_s']:6.1f} exec/s  p50 {r['p50_ms']:6.1f} ms  p95 {r['p95_ms']:6.1f} ms"
              f"  CPU {r['cpu_ms_per_exec']:5.1f} ms/exec (=> {r['capacity_2_cores_per_s']:6.1f}/s on 2 idle cores)"
              f"  (namespaces={r['namespaces']}, concurrency={r['concurrency']})")
    fresh, warm = runs[0], runs[-1]
    print(f"fork server + pool vs fresh interpreter: {warm['exec_per_s'] / fresh['exec_per_s']:.2f}x exec/s, "
          f"{fresh['cpu_ms_per_exec'] / warm['cpu_ms_per_exec']:.2f}x less CPU per exec, "
          f"{fresh['p50_ms'] / warm['p50_ms']:.2f}x lower p50 latency")
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "sandbox",
                      "units": {"exec_per_s": "executions per second", "*_ms": "milliseconds"},
                      "ratios": {"pool/fresh exec/s": round(warm["exec_per_s"] / fresh["exec_per_s"], 3),
                                 "fresh/pool CPU per exec": round(fresh["cpu_ms_per_exec"] / warm["cpu_ms_per_exec"], 3),
                                 "fresh/pool p50 latency": round(fresh["p50_ms"] / warm["p50_ms"], 3)},
                      "results": runs}))


if __name__ == "__main__":
    main()
