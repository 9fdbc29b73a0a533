"""The oracle (BFCL's ground truth in toolgym's call format) on every entry of every served BFCL category, scored
by BFCL's checkers: how many entries the ground truth passes, per category (docs/bfcl.md quotes the result).

    python -m benchmarks.bfcl.oracle [--categories all] [--max-turn-tokens 1024]
"""

from __future__ import annotations

import argparse
import collections
import time

import toolgym  # noqa: F401 - registers the envs
from toolgym.envs.bfcl.data import load_category, parse_categories
from toolgym.rollout import RolloutDriver, ScriptedPolicy


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--categories", default="all")
    p.add_argument("--split", default="all")
    p.add_argument("--max-turn-tokens", type=int, default=1024)
    args = p.parse_args(argv)
    for cat in parse_categories(args.categories):
        t0 = time.perf_counter()
        rows = load_category(cat, args.split)
        driver = RolloutDriver("toolgym/BFCL-v0", ScriptedPolicy(lambda s: s.env.oracle(s)),
                               max_turn_tokens=args.max_turn_tokens, num_envs=8, env_kwargs={"category": cat})
        try:
            trajs = driver.run(rows, seeds=list(range(len(rows))))
        finally:
            driver.venv.close()
        verdicts = [t.task["bfcl"] for t in trajs]
        errors = collections.Counter(v["error_type"] for v in verdicts if not v["valid"])
        print(f"{cat:<24} {sum(v['valid'] for v in verdicts):>5}/{len(rows):<5} truncated "
              f"{sum(v['truncated'] for v in verdicts):>3}  {time.perf_counter() - t0:6.1f} s  {dict(errors)}",
              flush=True)


if __name__ == "__main__":
    main()
