"""Rollout throughput on a tool-latency-bound workload: TRL's native ``tools=`` loop vs the toolgym adapter.

Workload A (``--episodes 32 --latency 2``): one GRPO rollout step
(``GRPOTrainer._generate_and_score_completions``) of 32 episodes whose ``wait()`` tool takes 2 s a call.
TRL native = ``GRPOTrainer(tools=[wait])`` (its own tool loop, which runs one sample's tool calls before the next
sample's: ~32 x 2 s) vs the adapter = ``GRPOTrainer(rollout_func=ToolgymRollout(...))`` in the lock-step and the
continuous schedule (every episode's tool call in flight at once). Target: adapter >= 3x TRL native episodes/s.
Same model, prompts, decoding and tool latency for every contender:

* model: a tiny randomly initialised Llama over the embedded tokenizer (:func:`toolgym.models.tiny_random_model`),
  fine-tuned for ~30 s (:func:`trainers.sft.masked_sft`, 100 steps on one oracle episode per task) to call ``wait`` and
  then answer ``<answer>done</answer>``: a real model that really calls the tool, cheap enough that tool latency
  dominates. Decoding is greedy (``generation_kwargs={"do_sample": False}``) through the trainer's own
  ``_generate_single_turn`` on both sides, so both sides generate the same tokens (checked: the script counts the
  episodes whose prompt + completion ids are identical);
* prompt: the embedded tokenizer with TRL's ``qwen2_5`` chat template (TRL knows its response parser); TRL renders
  ``tools=[wait]`` and the env renders its ``wait`` tool: the script asserts the prompt ids are identical;
* tool: ``wait()`` sleeps (``time.sleep`` in TRL's sync tool, ``--trl-tool async`` for an ``asyncio.sleep`` one;
  ``asyncio.sleep`` in the env's tool). TRL's function is named ``wait`` (the name the model writes and TRL
  dispatches on) and has no return annotation (TRL would render a ``"return"`` key the env's schema lacks).

Each contender runs a 0 s warm-up round, a 0 s **control** round (the same work without tool latency: what the
adapter costs over TRL when there is nothing to overlap), then the timed round. The script refuses to report
(``INVALID: ...``, exit status 1) if the prompts differ or any contender executed the tool in < 90% of its
episodes in any round: the first version of this benchmark timed TRL native without a single tool call (its tool
was named ``wait_sync``, so TRL's prompt differed from the one the model was trained on and no call was parsed).

Workload B (``--slots 16``, 64 episodes): latencies vary widely (every 10th job's tool takes 4 s, the others
0.05 s), more episodes than env slots; :class:`toolgym.rollout.RolloutDriver` lock-step (waves) vs continuous
(slots refill at once), with a server-like stand-in policy (fixed 50 ms per request, requests overlapping) so the
comparison measures scheduling. Target: continuous >= 1.5x lock-step.

Run: ``python -m benchmarks.rollout`` (about 2.5 minutes on 2 cores: A ~1m50s, B ~25 s; ``--workload a|b``;
``--quick`` for a smaller run; ``--threads 1`` on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

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


CALLS = {"trl": 0, "env": 0}  # tool executions on each side (the ground truth for "the policy called the tool")


# TRL native's tools. The name must be the env's (``wait``: the model calls it by that name, and TRL renders it in
# the prompt); no return annotation, because toolgym's tool schema has no "return" key and TRL would render one.
def wait():
    """Wait for the job to finish and return its status."""
    CALLS["trl"] += 1
    time.sleep(LAT.draw())
    return "finished"


async def wait_async():
    """Wait for the job to finish and return its status."""
    CALLS["trl"] += 1
    await asyncio.sleep(LAT.draw())
    return "finished"


wait_async.__name__ = "wait"  # TRL looks tools up by __name__ and renders it in the prompt
TRL_TOOLS = {"sync": wait, "async": wait_async}


def make_env_fn(tok: Any):
    from toolgym.envs.base import ToolEnv
    from toolgym.envs.vector import ToolVectorEnv
    from toolgym.rewards.base import as_reward
    from toolgym.tools.function import tool

    @tool(timeout_s=30, cacheable=False)
    async def wait() -> str:
        """Wait for the job to finish and return its status."""
        CALLS["env"] += 1
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


def build_model(tok: Any, vector: Any, tasks: list[dict], n_check: int, steps: int) -> Any:
    """The tiny model, taught to call ``wait`` then answer: SFT on one oracle episode per task (all 64, a
    zero-latency tool), then a greedy check on the first ``n_check`` tasks (the benchmark's episodes)."""
    from toolgym.models import tiny_random_model
    from toolgym.rollout import RolloutDriver, ScriptedPolicy, TransformersPolicy, summarize

    LAT.set_fixed(0.0)
    venv = vector(16)
    kept = RolloutDriver(venv, ScriptedPolicy(oracle)).run(tasks)
    model = tiny_random_model(tok, seed=0)
    t0 = time.perf_counter()
    from trainers.sft import masked_sft

    # lr 1e-2 with a one-cycle schedule; gradient-norm clipping (without it lr 1e-2 diverged now and then)
    losses = masked_sft(model, kept, steps=steps, lr=1e-2, batch_size=8, schedule="onecycle")
    t_sft = time.perf_counter() - t0
    check = RolloutDriver(venv, TransformersPolicy(model, tok, do_sample=False), max_turn_tokens=48)
    s = summarize(check.run(tasks[:n_check]))
    loss = f"loss {losses[0]:.2f} -> {np.mean(losses[-10:]):.4f}" if losses else "untrained"
    print(f"[bench] tiny model: SFT {steps} steps on {len(kept)} oracle episodes in {t_sft:.0f} s ({loss}); "
          f"greedy check on {n_check} tasks: tool-call rate "
          f"{s['tool_call_rate']:.0%}, success {s['success']:.0%}")
    venv.close()
    return model


class Recorder:
    """A zero reward function that keeps what TRL gave it (``completions``: chat messages for TRL native, text for
    the adapter; ``completion_ids``): how the benchmark sees what each side generated."""

    def __init__(self) -> None:
        self.__name__ = "recorder"
        self.completions: list[Any] = []
        self.completion_ids: list[list[int]] = []

    def __call__(self, completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
        self.completions, self.completion_ids = list(completions), [list(c) for c in completion_ids]
        return [0.0] * len(completions)


def grpo_trainer(model: Any, tok: Any, n: int, recorder: Recorder, *, tools: list | None = None,
                 rollout_func: Any = None) -> Any:
    """A GRPOTrainer used for its rollout step (``_generate_and_score_completions``); greedy decoding
    (``do_sample=False``) for both sides, ``max_completion_length=96`` (the episode needs ~45 tokens)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="/tmp/toolgym-bench-grpo", per_device_train_batch_size=n, num_generations=n,
                      max_completion_length=96, generation_kwargs={"do_sample": False}, report_to=[], use_cpu=True,
                      save_strategy="no", max_tool_calling_iterations=2, disable_tqdm=True)
    if tools:
        ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": PROMPT.format(k=0)}]]})
    else:
        ds = Dataset.from_dict({"prompt": ["job-0"]})
    return GRPOTrainer(model=model, processing_class=tok, reward_funcs=[recorder], args=args, train_dataset=ds,
                       tools=tools, rollout_func=rollout_func)


class Invalid(RuntimeError):
    """The measurement would not compare like with like (the reason is the message)."""


def workload_a(model: Any, tok: Any, vector: Any, tasks: list[dict], n: int, latency: float,
               min_rate: float = 0.9, trl_tool: str = "sync") -> dict[str, dict[str, Any]]:
    """TRL native vs the adapter (lock-step, continuous): one GRPO rollout step
    (``trainer._generate_and_score_completions``) of ``n`` episodes per contender and round. Rounds: ``"warm-up"``
    (0 s tool), ``"control"`` (0 s tool: the same work without tool latency), ``"timed"`` (``latency`` s per
    ``wait()`` call). ``trl_tool``: TRL native's tool is ``"sync"`` (``time.sleep``) or ``"async"``
    (``asyncio.sleep``).

    Refuses (:class:`Invalid`) unless TRL and the env render token-identical prompts (checked before timing and on
    the prompts actually used) and, in every round, every contender executed the tool in at least ``min_rate`` of
    its episodes. Returns ``{round: {contender: wall_s, f"{contender}_rate": ..., "_success", "_calls"}}``."""
    from trainers.grpo.rollout_adapter import ToolgymRollout

    rec = Recorder()
    native = grpo_trainer(model, tok, n, rec, tools=[TRL_TOOLS[trl_tool]])
    prompts = [[{"role": "user", "content": PROMPT.format(k=k)}] for k in range(n)]
    trl_prompt_ids = [list(p) for p in native._tokenize_prompts(prompts)[0]]
    LAT.set_fixed(0.0)
    venv = vector(n)
    venv.reset(options={"tasks": tasks[:n]})
    env_prompt_ids = [list(venv.envs[i].unwrapped.trajectory.prompt_ids) for i in range(n)]
    venv.close()
    same = sum(a == b for a, b in zip(trl_prompt_ids, env_prompt_ids, strict=True))
    print(f"[bench] A: TRL (tools=[wait]) and the env render token-identical prompts for {same}/{n} tasks "
          f"({len(trl_prompt_ids[0])} tokens)")
    if same != n:
        k = next(i for i in range(n) if trl_prompt_ids[i] != env_prompt_ids[i])
        raise Invalid(f"prompt {k} differs:\nTRL: {tok.decode(trl_prompt_ids[k])!r}\n"
                      f"env: {tok.decode(env_prompt_ids[k])!r}")
    adapters = {}
    for schedule in ("lockstep", "continuous"):
        rf = ToolgymRollout(vector, tasks, max_turn_tokens=48, schedule=schedule)
        adapters[schedule] = (rf, grpo_trainer(model, tok, n, Recorder(), rollout_func=rf))
    out = {}
    for name, lat in (("warm-up", 0.0), ("control", 0.0), ("timed", latency)):
        out[name] = _round_a(name, lat, native, rec, prompts, env_prompt_ids, adapters, tasks[:n], min_rate)
    return out


def _round_a(name: str, latency: float, native: Any, rec: Recorder, prompts: list, env_prompt_ids: list,
             adapters: dict[str, Any], tasks: list[dict], min_rate: float) -> dict[str, Any]:
    from toolgym.trajectory import extract_answer

    n = len(tasks)
    out: dict[str, Any] = {}
    LAT.set_fixed(latency)
    tag = f"[bench] A ({name}, {latency:g} s tool):"
    # TRL native: conversational prompts, TRL's own tool loop (one sample's tool calls at a time)
    CALLS["trl"] = 0
    t0 = time.perf_counter()
    res = native._generate_and_score_completions([{"prompt": p} for p in prompts])
    out["trl_native"] = time.perf_counter() - t0
    used = [ids[m.bool()].tolist() for ids, m in zip(res["prompt_ids"], res["prompt_mask"], strict=True)]
    if used != env_prompt_ids:
        raise Invalid("TRL native generated from other prompt ids than the env's")
    msgs = rec.completions
    out["trl_native_rate"] = float(np.mean([any(m["role"] == "tool" and m["content"] == "finished" for m in c)
                                            for c in msgs]))
    out["trl_native_success"] = float(np.mean([extract_answer(c[-1].get("content") or "") == "done" for c in msgs]))
    out["trl_native_calls"] = CALLS["trl"]
    print(f"{tag} TRL native          {n} episodes in {out['trl_native']:5.1f} s: {CALLS['trl']} tool executions, "
          f"tool-call rate {out['trl_native_rate']:.0%}, success {out['trl_native_success']:.0%}")
    trl_seqs = [p + c for p, c in zip(used, rec.completion_ids, strict=True)]
    for schedule, (rf, tr) in adapters.items():
        CALLS["env"] = 0
        t0 = time.perf_counter()
        tr._generate_and_score_completions([{"prompt": t["id"]} for t in tasks])
        key = f"adapter_{schedule}"
        out[key] = time.perf_counter() - t0
        trajs = rf.last_trajectories
        out[f"{key}_rate"] = float(np.mean([t.num_tool_calls > 0 and not t.error_kinds for t in trajs]))
        out[f"{key}_success"] = float(np.mean([t.answer == "done" for t in trajs]))
        out[f"{key}_calls"] = CALLS["env"]
        same = sum(list(t.prompt_ids) + list(t.completion_ids) == q for t, q in zip(trajs, trl_seqs, strict=True))
        print(f"{tag} adapter {schedule:<11} {n} episodes in {out[key]:5.1f} s: {CALLS['env']} tool executions, "
              f"tool-call rate {out[f'{key}_rate']:.0%}, success {out[f'{key}_success']:.0%}, "
              f"{rf.last_stats.policy_calls} generate calls; {same}/{n} episodes token-identical to TRL native's")
    for side in ("trl_native", "adapter_lockstep", "adapter_continuous"):
        if out[f"{side}_rate"] < min_rate or out[f"{side}_calls"] < min_rate * n:
            raise Invalid(f"{name} round: {side} executed the tool in {out[f'{side}_rate']:.0%} of episodes "
                          f"({out[f'{side}_calls']} executions; need >= {min_rate:.0%}): the contenders did not do "
                          "the same tool-bound work, so no ratio is reported")
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
    from toolgym.envs.vector import ToolVectorEnv
    from toolgym.rollout import RolloutDriver
    from toolgym.tools.function import tool

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--latency", type=float, default=2.0)
    ap.add_argument("--sft-steps", type=int, default=100,
                    help="SFT steps for the tiny model (workload A; 0 = untrained, which the validity check refuses)")
    ap.add_argument("--b-episodes", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--trl-tool", choices=["sync", "async"], default="sync",
                    help="TRL native's wait tool: a sync (time.sleep) or an async (asyncio.sleep) function")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (1 on a shared machine)")
    ap.add_argument("--quick", action="store_true", help="16 episodes, 1 s tool, 32 episodes in B")
    ap.add_argument("--workload", choices=["a", "b", "all"], default="all")
    a = ap.parse_args()
    if a.quick:
        a.episodes, a.latency, a.b_episodes, a.slots = 16, 1.0, 32, 8
    if not 1 <= a.episodes <= 64:
        ap.error("--episodes must be between 1 and 64 (the task set)")
    import torch
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from toolgym.models import embedded_cache_dir, load_tokenizer

    torch.set_num_threads(a.threads)
    load_tokenizer()  # make sure the converted tokenizer is cached
    tok = AutoTokenizer.from_pretrained(str(embedded_cache_dir() / "tokenizer"))  # a private copy we may modify
    tok.chat_template = qwen2_5_chat_template
    b_res = workload_b(tok, a.b_episodes, a.slots) if a.workload in ("b", "all") else None
    a_res = None
    invalid = None
    if a.workload in ("a", "all"):
        tasks, vector = make_env_fn(tok)
        model = build_model(tok, vector, tasks, a.episodes, a.sft_steps)
        try:
            a_res = workload_a(model, tok, vector, tasks, a.episodes, a.latency, trl_tool=a.trl_tool)
        except Invalid as e:
            invalid = str(e)
    n = a.episodes
    if a_res is not None or b_res is not None:
        print("\n| workload | contender | wall s | episodes/s | ratio |")
        print("|---|---|---:|---:|---:|")
    if a_res is not None:
        for rnd, lat in (("timed", a.latency), ("control", 0.0)):
            r = a_res[rnd]
            for k in ("trl_native", "adapter_lockstep", "adapter_continuous"):
                who = f"{k} ({a.trl_tool} tool)" if k == "trl_native" else k
                print(f"| A{' (control)' if rnd == 'control' else ''}: {n} eps, {lat:g} s tool | {who} | {r[k]:.1f} | "
                      f"{n / r[k]:.2f} | {r['trl_native'] / r[k]:.1f}x vs TRL native |")
    if b_res is not None:
        m = a.b_episodes
        for k in ("lockstep", "continuous"):
            print(f"| B: {m} eps, {a.slots} slots, 10% of jobs 4 s / 90% 0.05 s | driver {k} | {b_res[k]:.1f} | "
                  f"{m / b_res[k]:.2f} | {b_res['lockstep'] / b_res[k]:.1f}x vs lock-step |")
    ratios: dict[str, float] = {}
    if a_res is not None:
        for k in ("adapter_lockstep", "adapter_continuous"):
            ratios[f"A: {k} vs TRL native (wall)"] = round(a_res["timed"]["trl_native"] / a_res["timed"][k], 3)
    if b_res is not None:
        ratios["B: continuous vs lock-step (wall)"] = round(b_res["lockstep"] / b_res["continuous"], 3)
    # the summary line `toolgym bench` reads (last stdout line, one JSON object)
    print(json.dumps({"toolgym_bench": "rollout", "units": {"wall": "seconds", "ratio": "speed-up (wall ratio)"},
                      "ratios": ratios, "invalid": invalid, "results": {"a": a_res, "b": b_res}}, default=str))
    if invalid is not None:
        print(f"\nINVALID: workload A: {invalid}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
