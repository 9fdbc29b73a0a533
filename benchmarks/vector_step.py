"""Vector step benchmark: toolgym's ToolVectorEnv vs a sequential loop vs gymnasium's AsyncVectorEnv.

Every sub-env makes one call to a tool that takes 50 ms (an ``asyncio.sleep``), so an ideal step takes 50 ms
whatever N is. Also measures the env's own overhead per turn (decode + parse + execute an instant tool + build
and tokenize the observation) against the tokenizer's own ``encode`` of the same observation text.

    .venv/bin/python benchmarks/vector_step.py            # full run (N = 1, 16, 64, 256)
    .venv/bin/python benchmarks/vector_step.py --quick    # N = 1, 16
    .venv/bin/python benchmarks/vector_step.py --scale    # toolgym alone at N = 256, 1024, 4096: ms per step,
                                                          # us per episode-step, memory; with and without
                                                          # gc.freeze() after setup

Prints a table and the ratios; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time

import gymnasium as gym
import numpy as np

from toolgym import runtime
from toolgym.envs.base import ToolEnv
from toolgym.format.parsers import get_parser
from toolgym.tools.function import tool
from toolgym.vector import ToolVectorEnv

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


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def bench_scale(n: int, reps: int, freeze: bool) -> dict[str, float]:
    """toolgym at ``n`` episodes: every step of ``reps`` (after one warm-up) with every sub-env calling the 50 ms
    tool; ``freeze``: ``gc.freeze()`` after setup, so a full (gen-2) collection never walks the setup's objects
    inside a step. Returns median/max ms per step, the overhead per episode-step above the tool's 50 ms, the
    number of gen-2 collections that ran inside timed steps, and the memory the vector env added (MiB)."""
    gc.collect()
    rss0 = _rss_mb()
    envs = ToolVectorEnv(make_env, num_envs=n)
    acts_by_rep = []
    for r in range(reps + 1):
        envs.reset(seed=r)
        acts_by_rep.append([envs.envs[i].encode_action(call("wait50", i)) for i in range(n)])
    envs.reset(seed=0)
    if freeze:
        gc.collect()
        gc.freeze()
    gen2 = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 2:
            gen2[0] += 1

    times = []
    for r in range(reps + 1):
        envs.reset(seed=r)
        acts = acts_by_rep[r]
        if r == 1:
            gc.callbacks.append(count)
        t0 = time.perf_counter()
        envs.step(acts)
        times.append(time.perf_counter() - t0)
    gc.callbacks.remove(count)
    rss = _rss_mb() - rss0
    envs.close()
    if freeze:
        gc.unfreeze()
    timed = times[1:]
    med = statistics.median(timed)
    return {"n": n, "gc_freeze": freeze, "median_ms": med * 1e3, "max_ms": max(timed) * 1e3,
            "us_per_episode_step": max(0.0, med - TOOL_S) / n * 1e6, "gen2_collections_in_steps": gen2[0],
            "memory_mb": rss, "reps": reps}


def main_scale(sizes: list[int], reps: int, json_path: str | None) -> None:
    print(f"toolgym at scale: one step, every sub-env calls a {TOOL_S * 1e3:.0f} ms tool ({reps} timed steps each)")
    print(f"{'N':>5} {'gc.freeze':>9} {'median ms':>10} {'max ms':>8} {'us/ep-step':>11} {'gen-2 GCs':>10} "
          f"{'MiB':>7}")
    rows = []
    for n in sizes:
        for freeze in (False, True):
            row = bench_scale(n, reps, freeze)
            rows.append(row)
            print(f"{n:>5} {'yes' if freeze else 'no':>9} {row['median_ms']:>10.1f} {row['max_ms']:>8.1f} "
                  f"{row['us_per_episode_step']:>11.1f} {row['gen2_collections_in_steps']:>10} "
                  f"{row['memory_mb']:>7.0f}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"scale": rows}, f, indent=2)
    print(json.dumps({"toolgym_bench": "vector_scale", "units": {"median_ms": "median wall ms per vector step",
                      "us_per_episode_step": "overhead above the 50 ms tool per episode-step"}, "results": rows}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 1, 16 only")
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    ap.add_argument("--async-max", type=int, default=64,
                    help="largest N for gymnasium AsyncVectorEnv (one process per env: ~250 MB each)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--scale", action="store_true", help="toolgym alone at N = 256, 1024, 4096 (or --sizes), "
                    "with and without gc.freeze() after setup: ms per step, us per episode-step, memory")
    ap.add_argument("--reps", type=int, default=9, help="timed steps per N with --scale")
    args = ap.parse_args()
    if args.scale:
        main_scale(args.sizes or [256, 1024, 4096], args.reps, args.json)
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
