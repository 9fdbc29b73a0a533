"""Vector step benchmark: toolgym's ToolVectorEnv vs a sequential loop vs gymnasium's AsyncVectorEnv.

Every sub-env makes one call to a tool that takes 50 ms (an ``asyncio.sleep``), so an ideal step takes 50 ms
whatever N is. Also measures the env's own overhead per turn (decode + parse + execute an instant tool + build
and tokenize the observation) against the tokenizer's own ``encode`` of the same observation text.

    .venv/bin/python -m benchmarks.vector_step            # full run (N = 1, 16, 64, 256)
    .venv/bin/python -m benchmarks.vector_step --quick    # N = 1, 16
    .venv/bin/python -m benchmarks.vector_step --scale    # N = 256, 1024, 4096: toolgym with and without its
                                                          # gc handling (and verifiers 0.3.1 with
                                                          # --verifiers-python): ms per step, us per
                                                          # episode-step, memory

Prints a table and the ratios; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import gymnasium as gym
import numpy as np

from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.format.parsers import get_parser
from toolgym.resources import current_rss_mb, peak_rss_mb
from toolgym.tools.function import tool

TOOL_S = 0.05
TASKS = [{"id": f"t{i}", "prompt": f"task number {i}"} for i in range(512)]
OBS_TEXT = " ".join(
    f"Doc {i} (Title: City {i}) City {i} is a city in Country {i % 7} with a population of {1000 * i} people."
    for i in range(1, 6)
)


@tool
async def wait50(x: int) -> str:
    """Wait 50 ms and answer.

    Args:
        x: a number
    """
    await asyncio.sleep(TOOL_S)
    return f"done {x}"


@tool
async def instant(x: int) -> str:
    """Answer at once with a passage-sized text.

    Args:
        x: a number
    """
    return OBS_TEXT


def make_env(**kw):
    return ToolEnv(TASKS, [wait50, instant], max_turns=8, max_episode_tokens=8192, **kw)


def call(name: str, x: int) -> str:
    return get_parser("hermes").format_calls([(name, {"x": x})])


def bench_toolgym(n: int, reps: int) -> float:
    envs = ToolVectorEnv(make_env, num_envs=n)
    times = []
    for r in range(reps + 1):  # the first step renders and caches the template skeletons: a warm-up, not timed
        envs.reset(seed=r)
        acts = [envs.envs[i].encode_action(call("wait50", i)) for i in range(n)]
        t0 = time.perf_counter()
        envs.step(acts)
        times.append(time.perf_counter() - t0)
    envs.close()
    return statistics.median(times[1:])


def bench_sequential(n: int, reps: int) -> float:
    envs = [make_env() for _ in range(n)]
    times = []
    for r in range(reps):
        acts = []
        for i, e in enumerate(envs):
            e.reset(seed=r + i)
            acts.append(e.encode_action(call("wait50", i)))
        t0 = time.perf_counter()
        for e, a in zip(envs, acts, strict=True):
            e.step(a)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_gym_async(n: int, reps: int) -> float:
    envs = gym.vector.AsyncVectorEnv([make_env for _ in range(n)], shared_memory=False)
    probe = make_env()
    times = []
    for r in range(reps):
        envs.reset(seed=r)
        acts = tuple(probe.encode_action(call("wait50", i)) for i in range(n))
        t0 = time.perf_counter()
        envs.step(acts)
        times.append(time.perf_counter() - t0)
    envs.close()
    return statistics.median(times)


def bench_overhead(reps: int = 500) -> tuple[float, float, float]:
    """Median seconds of one env turn with an instant tool (run on the runtime loop, no thread hop), of the
    tokenizer's ``encode`` of the same observation text, and of the Rust tokenizer's own ``encode`` of it
    (``backend_tokenizer.encode``: no Python wrapper; what the env itself calls)."""
    env = make_env()
    env.reset(seed=0)
    action = env.encode_action(call("instant", 1))

    async def one_turn() -> float:
        env.reset(seed=0)
        t0 = time.perf_counter()
        await env.astep(action)
        return time.perf_counter() - t0

    env.reset(seed=0)
    obs, *_ = env.step(action)
    obs_text = env.format.decode(obs.tolist())
    tok = env.tokenizer
    rust = tok.backend_tokenizer.encode
    assert rust(obs_text, add_special_tokens=False).ids == tok.encode(obs_text, add_special_tokens=False)
    # interleaved, one of each per round: this machine's speed drifts by up to 2x within seconds, so timing the
    # three in separate blocks would compare different speeds
    env_times, enc_times, rust_times = [], [], []
    for _ in range(reps):
        env_times.append(runtime.run_sync(one_turn()))
        t0 = time.perf_counter()
        tok.encode(obs_text, add_special_tokens=False)
        t1 = time.perf_counter()
        rust(obs_text, add_special_tokens=False)
        rust_times.append(time.perf_counter() - t1)
        enc_times.append(t1 - t0)
    return statistics.median(env_times), statistics.median(enc_times), statistics.median(rust_times)


def scale_worker(n: int, steps: int, manage_gc: bool, default_cap: bool = False) -> dict[str, Any]:
    """One cell of ``--scale``, in its own process: ``ToolVectorEnv(manage_gc=...)`` of ``n`` sub-envs, one untimed
    warm-up step, then ``steps`` timed steps (a reset before each, untimed), every sub-env calling the 50 ms tool.
    The executor's cap is raised to ``n`` (its default, 512 calls at once, would queue the calls in waves of 512 and
    so measure the cap, not the env; ``default_cap`` keeps it, to show that). Returns per-step seconds, full (gen-2) collections that started inside timed
    steps, and the RSS the vector env added (MiB)."""
    rss0 = current_rss_mb() or float("nan")
    cap = {} if default_cap else {"executor_kwargs": {"max_concurrency": n}}
    envs = ToolVectorEnv(make_env, num_envs=n, manage_gc=manage_gc, **cap)
    gen2 = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 2:
            gen2[0] += 1

    times = []
    for r in range(steps + 1):
        envs.reset(seed=r)
        acts = [envs.envs[i].encode_action(call("wait50", i)) for i in range(n)]
        if r == 1:
            gc.callbacks.append(count)
        t0 = time.perf_counter()
        envs.step(acts)
        times.append(time.perf_counter() - t0)
    gc.callbacks.remove(count)
    rss = (current_rss_mb() or float("nan")) - rss0
    envs.close()
    impl = "toolgym" + ("" if manage_gc else " manage_gc=False") + (" cap 512" if default_cap else "")
    return {"impl": impl, "n": n, "step_s": times[1:],
            "gen2": gen2[0], "rss_mb": rss, "peak_rss_mb": peak_rss_mb()}


def main_scale(sizes: list[int], reps: int, steps: int, json_path: str | None, verifiers_python: str | None,
               only: list[str] | None = None) -> None:
    """Every (N, implementation) cell ``reps`` times, each in a fresh process, rep-major so that the cells of one
    rep run close together in time (this machine's speed drifts); medians over all timed steps of all reps."""
    from toolgym.models import chatml_tools_template, embedded_cache_dir

    impls = ["toolgym", "toolgym manage_gc=False", "toolgym cap 512"]
    impls += ["verifiers 0.3.1", "verifiers 0.3.1 + bridge"] if verifiers_python else []
    impls = [i for i in impls if not only or i in only]
    here = os.path.dirname(os.path.abspath(__file__))
    tok_json = str(embedded_cache_dir() / "tokenizer" / "tokenizer.json")
    template = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)  # the template toolgym renders
    template.write(chatml_tools_template())
    template.close()
    cells: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rep in range(reps):
        for n in sizes:
            for impl in impls:
                if impl.endswith("cap 512") and n <= 512:
                    continue  # the same as "toolgym" there
                if impl.startswith("verifiers"):
                    cmd = [verifiers_python, os.path.join(here, "peer_verifiers_step.py"), "--n", str(n),
                           "--steps", str(steps), "--tokenizer-json", tok_json]
                    cmd += ["--bridge-template", template.name] if impl.endswith("bridge") else []
                else:
                    cmd = [sys.executable, os.path.abspath(__file__), "--scale-worker", str(n), "--steps", str(steps)]
                    cmd += ["--no-manage-gc"] if "manage_gc=False" in impl else []
                    cmd += ["--default-cap"] if impl.endswith("cap 512") else []
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                cells.setdefault((n, impl), []).append(row)
                print(f"rep {rep} N={n} {impl}: median {statistics.median(row['step_s']) * 1e3:.1f} ms, "
                      f"gen-2 GCs {row['gen2']}", flush=True)
    print(f"\nvector step at scale: every sub-env calls a {TOOL_S * 1e3:.0f} ms tool; {reps} processes x {steps} "
          "timed steps per cell")
    print(f"{'N':>5} {'implementation':<26} {'median ms':>10} {'max ms':>8} {'rep medians ms':>18} "
          f"{'us/ep-step':>11} {'gen-2/step':>10} {'MiB':>6}")
    rows = []
    os.unlink(template.name)
    for n in sizes:
        for impl in impls:
            if (n, impl) not in cells:
                continue
            rs = cells[(n, impl)]
            all_s = [t for r in rs for t in r["step_s"]]
            med = statistics.median(all_s)
            rep_meds = [statistics.median(r["step_s"]) * 1e3 for r in rs]
            row = {"n": n, "impl": impl, "median_ms": med * 1e3, "max_ms": max(all_s) * 1e3,
                   "rep_median_ms": [min(rep_meds), max(rep_meds)],
                   "us_per_episode_step": max(0.0, med - TOOL_S) / n * 1e6,
                   "gen2_per_step": sum(r["gen2"] for r in rs) / len(all_s),
                   "memory_mb": statistics.median(r["rss_mb"] for r in rs), "steps": len(all_s)}
            rows.append(row)
            print(f"{n:>5} {impl:<26} {row['median_ms']:>10.1f} {row['max_ms']:>8.1f} "
                  f"{rep_meds and f'{min(rep_meds):.0f}-{max(rep_meds):.0f}':>18} "
                  f"{row['us_per_episode_step']:>11.1f} {row['gen2_per_step']:>10.2f} {row['memory_mb']:>6.0f}")
    ratios = {}
    for n in sizes:
        tg = next((r for r in rows if r["n"] == n and r["impl"] == "toolgym"), None)
        for r in rows if tg is not None else []:
            if r["n"] == n and r is not tg:
                ratios[f"{r['impl']}/toolgym N={n} median"] = r["median_ms"] / tg["median_ms"]
                ratios[f"{r['impl']}/toolgym N={n} max"] = r["max_ms"] / tg["max_ms"]
    print("\nratios (> 1: toolgym faster):")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"scale": rows, "cells": {f"{n} {i}": v for (n, i), v in cells.items()}}, f, indent=2)
    print(json.dumps({"toolgym_bench": "vector_scale", "units": {"median_ms": "median wall ms per vector step",
                      "us_per_episode_step": "overhead above the 50 ms tool per episode-step"},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}, "results": rows}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 1, 16 only")
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    ap.add_argument("--async-max", type=int, default=64,
                    help="largest N for gymnasium AsyncVectorEnv (one process per env: ~250 MB each)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--scale", action="store_true", help="N = 256, 1024, 4096 (or --sizes): toolgym with and "
                    "without its gc handling (manage_gc), and verifiers with --verifiers-python: ms per step, us per "
                    "episode-step, memory")
    ap.add_argument("--reps", type=int, default=3, help="--scale: fresh processes per (N, implementation)")
    ap.add_argument("--steps", type=int, default=5, help="--scale: timed steps per process")
    ap.add_argument("--verifiers-python", default=None,
                    help="--scale: python of a venv with verifiers==0.3.1 and tokenizers (see peer_verifiers_step.py)")
    ap.add_argument("--impls", nargs="*", default=None, help='--scale: only these rows (e.g. "toolgym" '
                    '"toolgym manage_gc=False" "toolgym cap 512" "verifiers 0.3.1" "verifiers 0.3.1 + bridge")')
    ap.add_argument("--scale-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-manage-gc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--default-cap", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale_worker is not None:
        print(json.dumps(scale_worker(args.scale_worker, args.steps, not args.no_manage_gc, args.default_cap)))
        return
    if args.scale:
        main_scale(args.sizes or [256, 1024, 4096], args.reps, args.steps, args.json, args.verifiers_python,
                   args.impls)
        return
    sizes = args.sizes or ([1, 16] if args.quick else [1, 16, 64, 256])
    rows = []
    print(f"one step, every sub-env calls a {TOOL_S * 1e3:.0f} ms tool (median wall ms)")
    print(f"{'N':>5} {'toolgym ms':>11} {'sequential ms':>14} {'gym async ms':>13} {'seq/toolgym':>12} "
          f"{'async/toolgym':>14} {'toolgym/50ms':>13}")
    for n in sizes:
        reps = 9
        tg = bench_toolgym(n, reps)
        sq = bench_sequential(n, 1 if n > 16 else 3)
        ga = bench_gym_async(n, 3) if n <= args.async_max else float("nan")
        rows.append({"n": n, "toolgym_ms": tg * 1e3, "sequential_ms": sq * 1e3, "gym_async_ms": ga * 1e3})
        print(f"{n:>5} {tg * 1e3:>11.1f} {sq * 1e3:>14.1f} {ga * 1e3:>13.1f} {sq / tg:>12.1f} {ga / tg:>14.2f} "
              f"{tg / TOOL_S:>13.2f}")
    env_s, enc_s, rust_s = bench_overhead()
    print(f"\nenv overhead per turn: {env_s * 1e6:.0f} us; tokenizer.encode of the same observation: "
          f"{enc_s * 1e6:.0f} us (ratio {env_s / enc_s:.2f}x); the Rust tokenizer's own encode of it: "
          f"{rust_s * 1e6:.0f} us (ratio {env_s / rust_s:.2f}x)")
    results = {"rows": rows, "env_turn_us": env_s * 1e6, "encode_us": enc_s * 1e6, "rust_encode_us": rust_s * 1e6}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    ratios = {f"sequential/toolgym N={r['n']}": r["sequential_ms"] / r["toolgym_ms"] for r in rows}
    ratios |= {f"gym_async/toolgym N={r['n']}": r["gym_async_ms"] / r["toolgym_ms"] for r in rows
               if r["gym_async_ms"] == r["gym_async_ms"]}
    ratios["env_turn/encode"] = env_s / enc_s
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "vector", "units": {"*_ms": "median wall ms per vector step",
                                                           "*_us": "microseconds per turn"},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}, "results": results}))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
