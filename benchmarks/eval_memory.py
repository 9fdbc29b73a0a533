"""Peak memory of a batched greedy evaluation: ``TransformersPolicy`` with its preallocated key/value cache
(``reserve_cache=True``, the default) vs transformers' own ``DynamicCache`` (``reserve_cache=False``).

Each setting runs in a fresh child process, alternating, ``--reps`` times: load the model, touch its weights once,
then evaluate ``--tasks`` held-out Calculator-v0 tasks (the demo's split, seeds and prompt) in batches of
``--batch`` under ``--autocast``. Reports the peak RSS above the loaded model (sampled every 3 ms), the wall time
and the successes (which must agree: the cache changes no number).

    MALLOC_ARENA_MAX=1 .venv/bin/python -m benchmarks.eval_memory                       # embedded model
    MALLOC_ARENA_MAX=1 .venv/bin/python -m benchmarks.eval_memory --model runs/demo/final --reps 2

``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any


def child(model_path: str | None, tasks: int, batch: int, autocast: str | None, reserve: bool) -> dict[str, Any]:
    import torch

    import toolgym  # noqa: F401  (registers the envs)
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.resources import current_rss_mb, trim_heap
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from trainers.demo import ENV_ID, prompt_kwargs

    torch.set_num_threads(2)
    model, tok = load_model(model_path)
    model.eval()
    eval_tasks = draw_tasks(ENV_ID, tasks, seed=10_000, split="test", env_kwargs={"tokenizer": tok})
    venv = make_vector_env(ENV_ID, tasks, {"split": "test", "tokenizer": tok, **prompt_kwargs(True)})
    with torch.no_grad():
        model(input_ids=torch.ones(1, 4, dtype=torch.long))  # touch every weight page
    trim_heap()
    base = current_rss_mb()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], current_rss_mb())
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False, max_batch_size=batch,
                                autocast=autocast, reserve_cache=reserve)
    t0 = time.perf_counter()
    trajs = RolloutDriver(venv, policy, max_turn_tokens=64).run(
        eval_tasks, seeds=list(range(10_000, 10_000 + tasks)), progress=False)
    wall = time.perf_counter() - t0
    stop.set()
    return {"reserve_cache": reserve, "base_mb": round(base), "peak_above_model_mb": round(peak[0] - base),
            "wall_s": round(wall, 1), "successes": sum(t.outcome_reward >= 1.0 for t in trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint path (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--autocast", default="bfloat16", help="bfloat16, float16 or none")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    autocast = None if a.autocast in ("none", "") else a.autocast
    if a.child is not None:
        print(json.dumps(child(a.model, a.tasks, a.batch, autocast, a.child == "1")))
        return
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "1")}
    for rep in range(a.reps):
        for reserve in (True, False):
            cmd = [sys.executable, __file__, "--child", "1" if reserve else "0", "--tasks", str(a.tasks),
                   "--batch", str(a.batch), "--autocast", a.autocast, *(["--model", a.model] if a.model else [])]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["rep"] = rep
            rows.append(row)
            print(f"rep {rep}  reserve_cache={reserve!s:5s}  peak above the model {row['peak_above_model_mb']:5d} "
                  f"MiB  wall {row['wall_s']:5.1f} s  successes {row['successes']}", flush=True)
    ours = [r for r in rows if r["reserve_cache"]]
    theirs = [r for r in rows if not r["reserve_cache"]]
    ratio = statistics.median(r["peak_above_model_mb"] for r in ours) / max(
        1, statistics.median(r["peak_above_model_mb"] for r in theirs))
    wall = statistics.median(r["wall_s"] for r in ours) / statistics.median(r["wall_s"] for r in theirs)
    same = len({r["successes"] for r in rows}) == 1
    print(f"reserved / transformers' cache: peak above the model x{ratio:.2f}, wall x{wall:.2f}; "
          f"successes {'identical' if same else 'DIFFER'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "peak_ratio": ratio, "wall_ratio": wall, "same_successes": same}, fh, indent=1)


if __name__ == "__main__":
    main()
