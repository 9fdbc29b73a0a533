"""toolgym's generation against bare ``model.generate`` on the same prompts: wall time ratio, same tokens checked.

The prompts are the first turns of ``N`` Calculator-v0 test episodes (the env's own prompt ids). Both sides
decode greedily for ``--new-tokens`` tokens with the env's stop ids, left-padded in one batch, on the same model,
device and dtype:

* **bare**: ``model.generate(input_ids, attention_mask, do_sample=False, max_new_tokens, eos_token_id)``;
* **toolgym**: :class:`toolgym.rollout.TransformersPolicy` ``generate`` on the same requests, once without and
  once with ``return_logprobs=True`` (the path the trainers and ``toolgym eval`` use).

Each contender runs once to warm up, then ``--repeats`` times in rotation; the script reports each one's median
seconds and its ratio to bare's median, and refuses to report (exit status 1) if any toolgym row's tokens differ
from bare's (the tokens up to and including the first stop id).

Run: ``python -m benchmarks.generate_vs_bare --episodes 64 --new-tokens 32 --repeats 3`` (``--device cuda`` on a
GPU, where the model runs in bfloat16; ``--json PATH`` writes the figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

__all__ = ["main", "measure"]


def _prompts(tok: Any, n: int) -> tuple[list[list[int]], list[int]]:
    """The first-turn prompt ids of ``n`` Calculator-v0 test episodes, and the env's stop ids."""
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation.tasks import draw_tasks

    env_id = "toolgym/Calculator-v0"
    tasks = draw_tasks(env_id, n, seed=0, split="test", env_kwargs={"tokenizer": tok})
    venv = make_vector_env(env_id, n, {"split": "test", "tokenizer": tok})
    try:
        obs, _ = venv.reset(seed=list(range(n)), options={"tasks": tasks})
        stop = [int(tok.convert_tokens_to_ids("<|im_end|>"))]
        return [list(map(int, o)) for o in obs], stop
    finally:
        venv.close()


def _cut(ids: list[int], stop: list[int]) -> list[int]:
    for j, t in enumerate(ids):
        if t in stop:
            return ids[: j + 1]
    return ids


def measure(model: Any, tok: Any, episodes: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Median seconds per contender (``bare``, ``toolgym``, ``toolgym_logprobs``), their ratios to bare, and
    whether every row's tokens agree; ``model`` is used where it is (device and dtype)."""
    import torch

    from toolgym.rollout import GenerationRequest, TransformersPolicy
    from toolgym.rollout.padding import left_pad

    prompts, stop = _prompts(tok, episodes)
    device = next(model.parameters()).device
    pad = int(tok.pad_token_id)
    requests = [GenerationRequest(prompt_ids=p, max_new_tokens=new_tokens, stop_ids=tuple(stop)) for p in prompts]
    policies = {name: TransformersPolicy(model, tok, do_sample=False, return_logprobs=lp, turn_cache_mb=0)
                for name, lp in (("toolgym", False), ("toolgym_logprobs", True))}
    tokens: dict[str, list[list[int]]] = {}

    def bare() -> None:
        ids, attn = left_pad(prompts, pad)
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=False,
                                 max_new_tokens=new_tokens, eos_token_id=stop, pad_token_id=pad)
        tokens["bare"] = [_cut(r, stop) for r in out[:, ids.shape[1]:].cpu().tolist()]

    def ours(name: str) -> None:
        tokens[name] = [_cut(g.token_ids, stop) for g in policies[name].generate(requests)]

    runs = {"bare": bare, "toolgym": lambda: ours("toolgym"), "toolgym_logprobs": lambda: ours("toolgym_logprobs")}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():  # warm-up
        fn()
    for _ in range(repeats):
        for k, fn in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    same = {k: sum(a == b for a, b in zip(tokens[k], tokens["bare"], strict=True)) for k in ("toolgym",
                                                                                          "toolgym_logprobs")}
    return {"episodes": episodes, "new_tokens": new_tokens, "repeats": repeats,
            "device": str(device), "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "seconds": times, "median_s": med, "ratio_to_bare": {k: med[k] / med["bare"] for k in med},
            "rows_with_bare_tokens": same, "same_tokens": all(v == episodes for v in same.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)
    import torch

    from toolgym.models import load_model
    from toolgym.placement import place

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model()
    model, placement = place(model, args.device)
    print(placement, file=sys.stderr)
    r = measure(model, tok, args.episodes, args.new_tokens, args.repeats)
    for k, s in r["median_s"].items():
        print(f"{k:<18} {s:8.2f} s  {r['ratio_to_bare'][k]:.2f}x bare")
    print(f"N={r['episodes']}, {r['new_tokens']} new tokens, {r['device']} {r['dtype']}; rows with bare's tokens: "
          f"{r['rows_with_bare_tokens']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    if not r["same_tokens"]:
        print("INVALID: toolgym's tokens differ from bare generate's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
