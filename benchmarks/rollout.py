"""Rollout throughput on a tool-latency-bound workload: TRL's native ``tools=`` loop vs the toolgym adapter.

Same model, same prompts, same tool latency for every contender:

* model: a tiny randomly initialised Llama over the embedded tokenizer, fine-tuned for a few seconds
  (:func:`trainers.sft.train_sft` on oracle episodes) to call the ``wait`` tool and then answer: a real model that
  really calls the tool, cheap enough that tool latency dominates;
* tokenizer/template: the embedded tokenizer with TRL's ``qwen2_5`` chat template (so TRL can parse tool calls);
  the env renders its prompts with the same template, so both sides see identical prompt tokens;
* tool: ``wait()`` sleeps (``asyncio.sleep`` for toolgym, ``time.sleep`` for TRL, which runs sync tools).

Workload A (``--episodes 32 --latency 2``): every call takes 2 s. TRL native (``GRPOTrainer(tools=[wait])`` and
``trainer._generate``) vs the adapter (``GRPOTrainer(rollout_func=ToolgymRollout(...))``, same ``_generate``)
in lock-step and continuous schedules. Target: adapter >= 3x TRL native episodes/s.

Workload B (``--slots 16``, 64 episodes): latencies vary widely (every 10th job's tool takes 4 s, the others
0.05 s), more episodes than env slots; :class:`toolgym.rollout.RolloutDriver` lock-step (waves) vs continuous
(slots refill at once), with a server-like stand-in policy (fixed 50 ms per request, requests overlapping) so the
comparison measures scheduling. Target: continuous >= 1.5x lock-step.

Run: ``python benchmarks/rollout.py`` (about 3-4 minutes on 2 cores; ``--quick`` for a smaller run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import numpy as np

PROMPT = "Job {k}: call the wait tool once, then answer done."


class Latency:
    """The tool's latency: fixed, or a seeded mixture (``p_slow`` of calls take ``slow`` s, the rest ``fast``)."""

    def __init__(self) -> None:
        self.set_fixed(2.0)

    def set_fixed(self, s: float) -> None:
        self.mode, self.value = "fixed", s

    def set_mixture(self, fast: float, slow: float, p_slow: float, seed: int) -> None:
        self.mode, self.fast, self.slow, self.p_slow = "mix", fast, slow, p_slow
        self.rng = np.random.default_rng(seed)

    def draw(self) -> float:
        if self.mode == "fixed":
            return self.value
        return self.slow if self.rng.random() < self.p_slow else self.fast


LAT = Latency()


def wait_sync() -> str:
    """Wait for the job to finish and return its status."""
    time.sleep(LAT.draw())
    return "finished"


def make_env_fn(tok: Any):
    from toolgym.envs.base import ToolEnv
    from toolgym.rewards.base import as_reward
    from toolgym.tools.function import tool
    from toolgym.vector import ToolVectorEnv

    @tool(timeout_s=30, cacheable=False)
    async def wait() -> str:
        """Wait for the job to finish and return its status."""
        await asyncio.sleep(LAT.draw())
        return "finished"

    def reward(traj: Any, task: Any) -> float:
        return float(traj.answer == "done")

    tasks = [{"id": f"job-{k}", "prompt": PROMPT.format(k=k)} for k in range(64)]

    def one(executor: Any = None, **kw: Any) -> ToolEnv:
        kw.pop("tokenizer", None)
        return ToolEnv(tasks, [wait], reward=as_reward(reward), tokenizer=tok, max_turns=3, executor=executor,
                       executor_kwargs={"max_concurrency": 1024}, **kw)

    def vector(num_envs: int, **kw: Any) -> ToolVectorEnv:
        return ToolVectorEnv(one, num_envs=num_envs, autoreset_mode="disabled", **kw)

    return tasks, vector


def oracle(state: Any) -> str:
    if state.turn == 0:
        return state.env.format.parser.format_calls([("wait", {})])
    return "<answer>done</answer>"


def build_model(tok: Any, vector: Any, tasks: list[dict]) -> Any:
    """The tiny model, taught to call ``wait`` then answer (SFT on 8 oracle episodes, zero-latency tool)."""
    import torch

    from toolgym.models import tiny_random_model
    from toolgym.rollout import RolloutDriver, ScriptedPolicy, TransformersPolicy, summarize
    from trainers.sft import train_sft

    LAT.set_fixed(0.0)
    venv = vector(16)
    kept = RolloutDriver(venv, ScriptedPolicy(oracle)).run(tasks[:8])
    torch.manual_seed(0)
    model = tiny_random_model(tok, seed=0)
    train_sft(model, tok, kept, output_dir="/tmp/toolgym-bench-sft", max_steps=40, learning_rate=3e-3,
              batch_size=4, logging_steps=20, disable_tqdm=True)
    check = RolloutDriver(venv, TransformersPolicy(model, tok, do_sample=False), max_turn_tokens=32).run(tasks[:16])
    s = summarize(check)
    print(f"[bench] tiny model after SFT: success {s['success']:.0%}, tool-call rate {s['tool_call_rate']:.0%}")
    venv.close()
    return model


def grpo_trainer(model: Any, tok: Any, n: int, *, tools: list | None = None, rollout_func: Any = None) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="/tmp/toolgym-bench-grpo", per_device_train_batch_size=n, num_generations=n,
                      max_completion_length=96, temperature=0.05, report_to=[], use_cpu=True, save_strategy="no",
                      max_tool_calling_iterations=2, disable_tqdm=True)
    if tools:
        ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": PROMPT.format(k=0)}]]})
    else:
        ds = Dataset.from_dict({"prompt": ["job-0"]})
    return GRPOTrainer(model=model, processing_class=tok, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                       args=args, train_dataset=ds, tools=tools, rollout_func=rollout_func)


def workload_a(model: Any, tok: Any, vector: Any, tasks: list[dict], n: int, latency: float) -> dict[str, float]:
    from trainers.rollout_func import ToolgymRollout

    out: dict[str, float] = {}
    LAT.set_fixed(latency)
    # TRL native: conversational prompts, TRL's own tool loop (one sample's tools at a time)
    native = grpo_trainer(model, tok, n, tools=[wait_sync])
    prompts = [[{"role": "user", "content": PROMPT.format(k=k)}] for k in range(n)]
    t0 = time.perf_counter()
    res = native._generate(prompts)
    out["trl_native"] = time.perf_counter() - t0
    calls = sum(m.count(0) > 0 for m in res[2]) if res[2] is not None else 0
    print(f"[bench] A: TRL native      {n} episodes in {out['trl_native']:.1f} s ({calls} with tool output)")
    for schedule in ("lockstep", "continuous"):
        rf = ToolgymRollout(vector, tasks, max_turn_tokens=48, schedule=schedule)
        tr = grpo_trainer(model, tok, n, rollout_func=rf)
        t0 = time.perf_counter()
        tr._generate([t["id"] for t in tasks[:n]])
        out[f"adapter_{schedule}"] = time.perf_counter() - t0
        rate = np.mean([t.num_tool_calls > 0 for t in rf.last_trajectories])
        print(f"[bench] A: adapter {schedule:<10} {n} episodes in {out[f'adapter_{schedule}']:.1f} s "
              f"(tool-call rate {rate:.0%})")
    return out


class ServerLikePolicy:
    """The oracle's text after a fixed generation time per request, requests overlapping (``concurrent``): the
    cost model of a serving engine with continuous batching (vLLM), with no model on this CPU to blur it."""

    concurrent = True

    def __init__(self, gen_s: float) -> None:
        from toolgym.rollout import ScriptedPolicy

        self.inner = ScriptedPolicy(oracle_job)
        self.gen_s = gen_s

    async def agenerate(self, requests: Any) -> Any:
        await asyncio.sleep(self.gen_s)
        return await self.inner.agenerate(requests)


def oracle_job(state: Any) -> str:
    if state.turn == 0:
        return state.env.format.parser.format_calls([("wait", {"job": state.env.task["id"]})])
    return "<answer>done</answer>"


def workload_b(tok: Any, n: int, slots: int, gen_s: float = 0.05) -> dict[str, float]:
    """Latencies vary widely and are a fixed property of each job (every 10th job, ``job-3``, ``job-13``, ...:
    4 s; the rest 0.05 s), so both schedules face the same work; the policy is :class:`ServerLikePolicy`."""

    def is_slow(job: str) -> bool:
        return int(job.rsplit("-", 1)[1]) % 10 == 3

    from toolgym.envs.base import ToolEnv
    from toolgym.rollout import RolloutDriver
    from toolgym.tools.function import tool
    from toolgym.vector import ToolVectorEnv

    @tool(timeout_s=30, cacheable=False)
    async def wait(job: str) -> str:
        """Wait for a job to finish and return its status.

        Args:
            job: the job id
        """
        await asyncio.sleep(4.0 if is_slow(job) else 0.05)
        return "finished"

    tasks = [{"id": f"job-{k}", "prompt": PROMPT.format(k=k)} for k in range(n)]
    n_slow = sum(is_slow(t["id"]) for t in tasks)

    def one(executor: Any = None, **kw: Any) -> ToolEnv:
        return ToolEnv(tasks, [wait], reward=lambda traj, task: float(traj.answer == "done"), tokenizer=tok,
                       max_turns=3, executor=executor, **kw)

    out: dict[str, float] = {}
    for schedule in ("lockstep", "continuous"):
        venv = ToolVectorEnv(one, num_envs=slots, autoreset_mode="disabled")
        d = RolloutDriver(venv, ServerLikePolicy(gen_s), schedule=schedule, max_turn_tokens=64)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        trajs = d.run(tasks)
        out[schedule] = time.perf_counter() - t0
        ok = np.mean([t.reward == 1.0 for t in trajs])
        print(f"[bench] B: driver {schedule:<10} {n} episodes ({n_slow} with a 4 s tool) / {slots} slots in "
              f"{out[schedule]:.1f} s (success {ok:.0%}, {d.stats.policy_calls} policy calls)")
        venv.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--latency", type=float, default=2.0)
    ap.add_argument("--b-episodes", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="16 episodes, 1 s tool, 32 episodes in B")
    ap.add_argument("--workload", choices=["a", "b", "all"], default="all")
    a = ap.parse_args()
    if a.quick:
        a.episodes, a.latency, a.b_episodes, a.slots = 16, 1.0, 32, 8
    import torch
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from toolgym.models import embedded_cache_dir, load_tokenizer

    torch.set_num_threads(2)
    load_tokenizer()  # make sure the converted tokenizer is cached
    tok = AutoTokenizer.from_pretrained(str(embedded_cache_dir() / "tokenizer"))  # a private copy we may modify
    tok.chat_template = qwen2_5_chat_template
    b_res = workload_b(tok, a.b_episodes, a.slots) if a.workload in ("b", "all") else None
    a_res = None
    if a.workload in ("a", "all"):
        tasks, vector = make_env_fn(tok)
        model = build_model(tok, vector, tasks)
        a_res = workload_a(model, tok, vector, tasks, a.episodes, a.latency)
    n = a.episodes
    print("\n| workload | contender | wall s | episodes/s | ratio |")
    print("|---|---|---:|---:|---:|")
    if a_res is not None:
        base = a_res["trl_native"]
        for k in ("trl_native", "adapter_lockstep", "adapter_continuous"):
            print(f"| A: {n} eps, {a.latency:g} s tool | {k} | {a_res[k]:.1f} | {n / a_res[k]:.2f} | "
                  f"{base / a_res[k]:.1f}x vs TRL native |")
    if b_res is not None:
        m = a.b_episodes
        for k in ("lockstep", "continuous"):
            print(f"| B: {m} eps, {a.slots} slots, 10% of jobs 4 s / 90% 0.05 s | driver {k} | {b_res[k]:.1f} | "
                  f"{m / b_res[k]:.2f} | {b_res['lockstep'] / b_res[k]:.1f}x vs lock-step |")


if __name__ == "__main__":
    main()
