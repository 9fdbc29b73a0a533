"""Judge throughput: ``LLMJudge`` against a real ``toolgym serve model`` subprocess at several concurrencies.

Every judgement has a distinct prompt (cache off), so each one is a real generation. Two verdict styles:

* ``digit``: a constrained one-token verdict (``allowed_token_ids`` = the digits, ``max_tokens=1``):
  prefill-bound, and the score always parses;
* ``free``: a free-form reply of up to ``--max-tokens`` tokens (decode-bound; an untrained 135M model rarely
  writes a parsable score, so parse failures are expected and counted, and do not change the timing).

Prints judgements/s per concurrency and the speed-up over concurrency 1 (ratios measured side by side).

    python -m benchmarks.judge                      # embedded SmolLM2-135M, concurrency 1 / 8 / 32
    python -m benchmarks.judge --model tiny --n 64  # tiny random model: client + server overhead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from toolgym.rewards import DEFAULT_JUDGE_PROMPT, LLMJudge
from toolgym.trajectory import Trajectory, Turn

DIGIT_PROMPT = (
    "Grade the answer from 0 (wrong) to 9 (right).\nQuestion: {question}\nReference: {reference}\n"
    "Answer: {prediction}\nGrade:"
)
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "8"),
    ("Who wrote Hamlet?", "William Shakespeare"),
    ("What is 12 times 12?", "144"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str | None, port: int, max_batch_size: int, threads: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "toolgym.serve.model", "--port", str(port), "--max-batch-size", str(max_batch_size)]
    if model:
        cmd += ["--model", model]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def episode(i: int) -> tuple[Trajectory, dict]:
    q, a = QUESTIONS[i % len(QUESTIONS)]
    task = {"question": f"{q} (case {i})", "golden_answers": [a]}
    t = Trajectory(prompt_ids=[0], task=task)
    text = f"<answer>{a if i % 2 else 'not sure'}</answer>"
    t.turns.append(Turn(index=0, action_start=0, action_end=1, text=text, content=text))
    return t, task


async def measure(judge: LLMJudge, n: int, start: int) -> dict:
    eps = [episode(start + i) for i in range(n)]
    latencies: list[float] = []

    async def one(t: Trajectory, task: dict) -> float:
        t0 = time.perf_counter()
        v = (await judge.outcome(t, task)).value
        latencies.append(time.perf_counter() - t0)
        return v

    before = dict(judge.failures)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(t, k) for t, k in eps))
    wall = time.perf_counter() - t0
    failures = {k: v - before.get(k, 0) for k, v in judge.failures.items() if v - before.get(k, 0)}
    lat = sorted(latencies)
    return {
        "n": n,
        "wall_s": wall,
        "judgements_per_s": n / wall,
        "p50_s": statistics.median(lat),
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "failures": failures,
    }


async def bench(args: argparse.Namespace, url: str, served_name: str) -> list[dict]:
    from toolgym.models import load_tokenizer

    tok = load_tokenizer(None)
    digits = [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    rows = []
    start = 0
    for style in args.styles:
        extra = {"allowed_token_ids": digits} if style == "digit" else {"ignore_eos": True}
        max_tokens = 1 if style == "digit" else args.max_tokens
        for c in args.concurrency:
            judge = LLMJudge(
                url,
                model=served_name,
                max_concurrency=c,
                cache=False,
                timeout_s=600,
                max_tokens=max_tokens,
                max_score=9 if style == "digit" else 10,
                extra_body=extra,
                prompt_template=DIGIT_PROMPT if style == "digit" else DEFAULT_JUDGE_PROMPT,
            )
            await measure(judge, min(c, 4), 10_000 + start)  # warm-up (not timed)
            n = args.n if c > 1 else max(4, args.n // 4)
            row = {"style": style, "concurrency": c, "max_tokens": max_tokens, **await measure(judge, n, start)}
            start += n
            rows.append(row)
            print(json.dumps(row), flush=True)
            await judge.aclose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="server model: default embedded SmolLM2; 'tiny' = tiny random")
    ap.add_argument("--url", default=None, help="judge an already running server instead of starting one")
    ap.add_argument("--served-name", default=None)
    ap.add_argument("--n", type=int, default=32, help="judgements per concurrency level (a quarter at 1)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--styles", nargs="+", default=["digit", "free"], choices=["digit", "free"])
    ap.add_argument("--max-tokens", type=int, default=16, help="reply length of the free style")
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    proc = None
    if args.url:
        url, name = args.url, args.served_name
    else:
        port = free_port()
        t0 = time.perf_counter()
        proc = start_server(args.model, port, args.max_batch_size, args.threads)
        print(f"server up in {time.perf_counter() - t0:.1f}s (cpus={os.cpu_count()})", flush=True)
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(url + "/v1/models") as r:
            name = json.loads(r.read())["data"][0]["id"]
    try:
        rows = asyncio.run(bench(args, url, name))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print("\n| verdict | max_tokens | concurrency | judgements | judgements/s | x vs c=1 | p50 s | p95 s | failures |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {r["style"]: r["judgements_per_s"] for r in rows if r["concurrency"] == min(args.concurrency)}
    for r in rows:
        print(
            f"| {r['style']} | {r['max_tokens']} | {r['concurrency']} | {r['n']} | {r['judgements_per_s']:.2f} | "
            f"{r['judgements_per_s'] / base[r['style']]:.1f} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
            f"{r['failures'] or '-'} |"
        )
    ratios = {f"{r['style']} c={r['concurrency']} vs c={min(args.concurrency)}":
              round(r["judgements_per_s"] / base[r["style"]], 3) for r in rows if r["concurrency"] != min(args.concurrency)}
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "judge", "units": {"ratio": "judgements/s vs the lowest concurrency",
                                                          "*_s": "seconds"}, "ratios": ratios, "results": rows}))


if __name__ == "__main__":
    main()
