"""Retrieval benchmark: the embedded BM25 index, locally and over HTTP, on the ~34k-passage GeoNames corpus and on
the 100k one (GeoNames + synthetic passages).

Measures, per corpus:

* local single-query latency (``BM25Retriever.search``, one query at a time): p50 / p99 in ms;
* local batched throughput (``batch_search`` with batches of ``--batch`` queries): queries/s;
* HTTP single-query latency (one ``POST /retrieve`` per query, sequential) against ``toolgym serve retriever``
  running in a separate process: p50 / p99 in ms;
* HTTP batched throughput two ways: explicit batches (one POST per ``--batch`` queries) and ``--concurrency``
  concurrent single-query ``asearch`` calls micro-batched by the client (what a vector env does): queries/s;
* for reference, the numpy backend's local single-query latency (a smaller sample).

Usage::

    python -m benchmarks.retrieval                # both corpora
    python -m benchmarks.retrieval --quick        # fewer queries, embedded corpus only

Queries are the embedded questions and their entities (deterministic). Numbers are machine-dependent: compare
rows taken side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from toolgym.data.geo import geo_corpus, geo_questions
from toolgym.tools.search import BM25Retriever, RemoteRetriever, ToolError


def _queries(n: int) -> list[str]:
    qs = geo_questions()
    pool = [q["entity"] for q in qs] + [q["question"] for q in qs]
    rng = np.random.default_rng(0)
    return [pool[int(i)] for i in rng.integers(len(pool), size=n)]


def _pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _single(fn: Any, queries: list[str], k: int) -> dict[str, float]:
    """One query at a time: wall p50/p99 (ms), wall mean (ms) and this thread's CPU p50/p99 (ms)."""
    lat, cpu = [], []
    for q in queries:
        t, c = time.perf_counter(), time.thread_time()
        fn(q, k)
        cpu.append(time.thread_time() - c)
        lat.append(time.perf_counter() - t)
    (p50, p99), (c50, c99) = _pct(lat), _pct(cpu)
    return {"p50": p50, "p99": p99, "mean": float(np.mean(lat) * 1e3), "cpu_p50": c50, "cpu_p99": c99}


def _batched(fn: Any, queries: list[str], k: int, batch: int) -> tuple[float, float]:
    """(queries/s of wall time, queries per CPU-second of this process)."""
    t, c = time.perf_counter(), time.process_time()
    for i in range(0, len(queries), batch):
        fn(queries[i : i + batch], k)
    return len(queries) / (time.perf_counter() - t), len(queries) / max(time.process_time() - c, 1e-9)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(corpus: str) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolgym.serve.retriever", "--corpus", corpus, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "NUMBA_NUM_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}/retrieve"
    from toolgym import runtime

    client = RemoteRetriever(url, timeout_s=5)
    deadline = time.monotonic() + 300
    try:
        while True:
            try:
                client.search("warm up", 1)
                return proc, url
            except ToolError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"retriever service for {corpus} did not start") from None
                time.sleep(0.5)
    finally:
        runtime.run_sync(client.aclose())


async def _concurrent(client: RemoteRetriever, queries: list[str], k: int, concurrency: int) -> float:
    t = time.perf_counter()
    for i in range(0, len(queries), concurrency):
        await asyncio.gather(*(client.asearch(q, k) for q in queries[i : i + concurrency]))
    return len(queries) / (time.perf_counter() - t)


def bench_corpus(name: str, size: str, args: argparse.Namespace) -> dict[str, Any]:
    rows = geo_corpus(size)
    t = time.perf_counter()
    r = BM25Retriever(rows)
    build_s = time.perf_counter() - t
    qs = _queries(args.n)
    k = args.topk
    out: dict[str, Any] = {"corpus": name, "passages": len(rows), "backend": r.backend, "build_s": build_s}
    out["local"] = _single(r.search, qs[: args.n_single], k)
    out["local_qps"], out["local_qps_cpu"] = _batched(r.batch_search, qs, k, args.batch)
    npy = BM25Retriever(rows, backend="numpy", warm=False)
    out["numpy"] = _single(npy.search, qs[: args.n_numpy], k)
    if not args.no_http:
        proc, url = _start_server("geo" if size == "default" else "geo-100k")
        try:
            client = RemoteRetriever(url, timeout_s=30)
            out["http"] = _single(client.search, qs[: args.n_single], k)
            out["http_batch_qps"], _ = _batched(client.batch_search, qs, k, args.batch)
            from toolgym import runtime

            before = client.requests
            out["http_concurrent_qps"] = runtime.run_sync(_concurrent(client, qs, k, args.concurrency))
            out["http_requests"] = client.requests - before
            runtime.run_sync(client.aclose())
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer queries, embedded corpus only")
    p.add_argument("--n", type=int, default=20_000, help="queries for the throughput runs")
    p.add_argument("--n-single", type=int, default=2_000, help="queries for the latency runs")
    p.add_argument("--n-numpy", type=int, default=200, help="queries for the numpy-backend latency run")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256, help="concurrent single-query calls (episodes)")
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--no-http", action="store_true")
    a = p.parse_args(argv)
    corpora = [("geonames", "default"), ("geonames+synthetic", "100k")]
    if a.quick:
        a.n, a.n_single, a.n_numpy = 4_000, 500, 50
        corpora = corpora[:1]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# retrieval benchmark (cpus={os.cpu_count()}, load average {load:.1f}, topk={a.topk}, "
          f"batch={a.batch}, concurrency={a.concurrency}, queries={a.n:,}, single-query sample={a.n_single:,})")
    rows = [bench_corpus(n, s, a) for n, s in corpora]
    head = ["corpus", "passages", "build s", "local p50 / p99 ms (CPU p50 / p99)", "local batched q/s (per CPU-s)",
            "numpy p50 / p99 ms"]
    if not a.no_http:
        head += ["HTTP p50 / p99 ms", "HTTP batched q/s", "HTTP concurrent q/s (POSTs)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        loc, npy = r["local"], r["numpy"]
        cells = [r["corpus"], f"{r['passages']:,}", f"{r['build_s']:.1f}",
                 f"{loc['p50']:.2f} / {loc['p99']:.2f} ({loc['cpu_p50']:.2f} / {loc['cpu_p99']:.2f})",
                 f"{r['local_qps']:,.0f} ({r['local_qps_cpu']:,.0f})", f"{npy['p50']:.1f} / {npy['p99']:.1f}"]
        if not a.no_http:
            h = r["http"]
            cells += [f"{h['p50']:.2f} / {h['p99']:.2f}", f"{r['http_batch_qps']:,.0f}",
                      f"{r['http_concurrent_qps']:,.0f} ({r['http_requests']:,})"]
        print("| " + " | ".join(cells) + " |")
    for r in rows:
        loc, npy = r["local"], r["numpy"]
        print(f"{r['corpus']}: numba vs numpy single-query mean latency: {npy['mean'] / loc['mean']:.0f}x; "
              f"batched vs one-at-a-time throughput: {r['local_qps'] * loc['mean'] / 1e3:.2f}x")
        if "http" in r:
            print(f"{r['corpus']}: HTTP micro-batched concurrent calls vs sequential single-query HTTP calls: "
                  f"{r['http_concurrent_qps'] * r['http']['mean'] / 1e3:.0f}x")
    ratios: dict[str, float] = {}
    for r in rows:
        loc, npy = r["local"], r["numpy"]
        ratios[f"{r['corpus']}: numpy/numba single-query latency"] = round(npy["mean"] / loc["mean"], 3)
        ratios[f"{r['corpus']}: batched/one-at-a-time throughput"] = round(r["local_qps"] * loc["mean"] / 1e3, 3)
        if "http" in r:
            ratios[f"{r['corpus']}: HTTP concurrent/sequential throughput"] = round(
                r["http_concurrent_qps"] * r["http"]["mean"] / 1e3, 3)
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "retrieval", "units": {"latency": "ms", "throughput": "queries/s"},
                      "ratios": ratios, "results": rows}, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
