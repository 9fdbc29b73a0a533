"""``make demo``: GRPO teaches the embedded SmolLM2-135M to use a calculator on a 2-core CPU, measurably.

1. Held-out evaluation of the untrained model: ``eval_tasks`` (100) distinct tasks of Calculator-v0's ``test``
   split with fixed seeds, greedy decoding, all in one batch. Untrained, it never calls a tool.
2. A deliberately short warm start: ``warmstart_steps`` (3) masked-SFT steps on oracle episodes of the
   ``train`` split. It teaches the *format* of a call (``<tool_call>{...}</tool_call>`` then ``<answer>``), not
   yet reliable use: held-out success stays low, which leaves GRPO room to learn.
3. Held-out evaluation again (same tasks, same seeds); the checkpoint is saved (``warmstart/``).
4. GRPO through the algorithm contract (``trainers.ALGORITHMS["grpo"].run``: :mod:`trainers.grpo`,
   :class:`trainers.grpo.rollout_adapter.ToolgymRollout`) on ``train``-split tasks: the model's own multi-turn episodes, the env's reward. Per step: reward,
   ``frac_reward_zero_std`` (share of groups GRPO cannot learn from), success, tool-call rate, error kinds.
5. Held-out evaluation again; the paired difference (after GRPO - after warm start, same tasks and seeds) with
   its 95% CI; the final checkpoint (``final/``), a plot (``demo.png``), ``metrics.json`` and every trajectory
   (``trajectories/*.jsonl``) under ``output_dir``.

No test-split task is ever trained on: Calculator-v0's splits are disjoint by a hash of the expression, and the
warm-start and GRPO tasks are drawn from ``train``.

Speed (2 CPU cores): generation prefill dominates, so the demo renders the tool list compactly and uses a short
system prompt (:mod:`trainers.demo.compact_prompt`, ~95 prompt tokens instead of ~290), identically for warm start, GRPO and
every evaluation; both checkpoints carry that chat template in their tokenizer.

Run::

    python -m trainers.demo --config trainers/configs/demo_cpu.yaml
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from toolgym.evaluation import paired_difference_ci

__all__ = ["DemoConfig", "main", "run_demo"]

ENV_ID = "toolgym/Calculator-v0"
#: the held-out evaluations' trajectory files under ``<output_dir>/trajectories/`` (plain names: the docs quote them)
EVAL_FILES = {"before": "eval_before.jsonl", "after warm start": "eval_after_warmstart.jsonl",
              "after GRPO": "eval_after_grpo.jsonl"}


@dataclass
class DemoConfig:
    """Knobs of the demo (``trainers/configs/demo_cpu.yaml``)."""

    output_dir: str = "runs/demo"
    seed: int = 0
    threads: int = 2
    device: str = "auto"  # where the model runs: auto (the GPU when torch sees one), cpu, cuda, cuda:N
    compact_prompt: bool = True
    # evaluation (held-out: Calculator-v0 "test" split, fixed distinct tasks and seeds, greedy, one batch)
    eval_tasks: int = 100
    eval_seed: int = 10_000
    max_turn_tokens: int = 64
    eval_batch_size: int = 25  # episodes per generate() call (bounds the KV cache; may flip rare greedy near-ties)
    # memory: micro-batches of the training forward/backward (gradients accumulated; same step, less activation
    # memory) and activation checkpointing (recompute instead of keep)
    train_micro_batch_size: int = 2
    gradient_checkpointing: bool = True
    grpo_gradient_checkpointing: bool | None = None  # GRPO's own setting (None: gradient_checkpointing)
    grpo_micro_batch_size: int | None = None  # GRPO's own micro-batch (None: train_micro_batch_size)
    # precision and optimizer state (memory and time): bfloat16 autocast for generation and the training
    # forward/backward (weights, gradients and optimizer math stay float32); AdamW with 8-bit moments
    bf16: bool = False
    optim: str = "adamw_torch"
    trim_heap: bool = False  # hand freed heap pages back to the OS after every training micro-batch and generation
    shared_prefix: bool = True  # GRPO computes each group's prompt once (generation and loss; trainers.grpo.Config)
    lora: dict[str, Any] | None = None  # GRPO trains LoRA adapters (peft.LoraConfig fields), merged in after it
    freeze_embeddings: bool = False  # train everything but the (tied) input embedding / LM head
    # warm start: masked SFT on oracle episodes ("train" split)
    warmstart_episodes: int = 32
    warmstart_steps: int = 3
    warmstart_batch_size: int = 8
    warmstart_lr: float = 5e-5
    # GRPO through the adapter ("train" split)
    grpo_steps: int = 10
    grpo_tasks: int = 256
    grpo_num_generations: int = 4
    grpo_prompts_per_step: int = 4
    grpo_lr: float = 3e-5
    grpo_temperature: float = 0.5
    grpo_max_completion_length: int = 160
    grpo_beta: float = 0.0


def _load(path: str | None) -> DemoConfig:
    if path is None:
        return DemoConfig()
    from trainers.runconfig import read_config

    raw = read_config(path)  # a file, or a shipped config by name (demo_cpu)
    known = {f.name for f in fields(DemoConfig)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{path}: unknown demo keys {sorted(unknown)}")
    return DemoConfig(**raw)


# ---------------------------------------------------------------------------------------------------------------
# Pieces
# ---------------------------------------------------------------------------------------------------------------


def prompt_kwargs(compact: bool) -> dict[str, Any]:
    """The env kwargs that fix the prompt (same for warm start, GRPO and evaluation)."""
    if not compact:
        return {}
    from trainers.demo.compact_prompt import COMPACT_SYSTEM_PROMPT, compact_tools_template

    return {"system_prompt": COMPACT_SYSTEM_PROMPT, "chat_template": compact_tools_template()}


def _fmt(s: dict[str, Any]) -> str:
    errs = ", ".join(f"{k}={v}" for k, v in sorted(s.get("errors", {}).items())) or "none"
    lo, hi = s["success_ci95"]
    return (f"success {s['success']:.1%} [95% CI {lo:.1%}, {hi:.1%}]  tool-call rate {s['tool_call_rate']:.1%}  "
            f"calls/ep {s['calls_per_episode']:.2f}  turns {s['turns']:.2f}  errors: {errs}  ({s['wall_s']:.0f} s)")


def _decode_completion(tok: Any, traj: Any) -> str:
    return tok.decode(list(traj.completion_ids), skip_special_tokens=False).replace("\n", "\\n")


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the whole demo; returns the metrics dict (also written to ``output_dir/metrics.json``)."""
    from toolgym.resources import Phases

    t_start = time.perf_counter()
    phases = Phases()
    phases.mark("load")
    import torch
    from transformers import TrainerCallback

    import toolgym  # noqa: F401
    from toolgym.checkpoint import save_checkpoint
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import oracle_policy
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.placement import describe, resolve_device
    from toolgym.precision import describe_precision
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from toolgym.trajectory import write_trajectories
    from trainers import ALGORITHMS
    from trainers.demo.record import heldout_summary
    from trainers.sft import collect, masked_sft

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    (out / "trajectories").mkdir(parents=True, exist_ok=True)
    for old in (out / "trajectories").glob("**/*.jsonl"):
        old.unlink()

    print("[demo] loading the embedded model (SmolLM2-135M-Instruct) ...", flush=True)
    model, tok = load_model()
    model = model.to(resolve_device(cfg.device))  # weights stay float32: they are trained (bf16: autocast)
    print(f"[demo] model on {model.device}: {describe_precision(model.device.type, 'float32', 'bfloat16' if cfg.bf16 else None)}"
          f" (bf16: {str(cfg.bf16).lower()} in the config)", flush=True)
    if cfg.freeze_embeddings:  # SmolLM2 ties it to the LM head: 28.3M of 134.5M parameters stay as loaded
        model.get_input_embeddings().weight.requires_grad_(False)
    pk = prompt_kwargs(cfg.compact_prompt)
    eval_tasks = draw_tasks(ENV_ID, cfg.eval_tasks, seed=cfg.eval_seed, split="test", env_kwargs={"tokenizer": tok})
    eval_seeds = list(range(cfg.eval_seed, cfg.eval_seed + len(eval_tasks)))
    venv = make_vector_env(ENV_ID, len(eval_tasks), {"split": "test", "tokenizer": tok, **pk})
    prompt_len = len(venv.reset(seed=eval_seeds, options={"tasks": eval_tasks})[0][0])
    print(f"[demo] held-out set: {len(eval_tasks)} distinct Calculator-v0 test tasks, seeds {eval_seeds[0]}.."
          f"{eval_seeds[-1]}, greedy; prompt {'compact' if pk else 'default'} ({prompt_len} tokens)", flush=True)

    autocast = "bfloat16" if cfg.bf16 else None  # the evaluations' generation; the checkpoints record it

    def evaluate(tag: str) -> tuple[dict[str, Any], list[float], list[Any]]:
        t0 = time.perf_counter()
        policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False,
                                    max_batch_size=cfg.eval_batch_size or None, autocast=autocast)
        driver = RolloutDriver(venv, policy, max_turn_tokens=cfg.max_turn_tokens)
        trajs = driver.run(eval_tasks, seeds=eval_seeds, progress=False)
        write_trajectories(out / "trajectories" / EVAL_FILES[tag], trajs)
        s = heldout_summary(trajs, out / "trajectories" / EVAL_FILES[tag], time.perf_counter() - t0)
        wins = s["per_task_success"]
        print(f"[demo] held-out {tag:<16}: {_fmt(s)}", flush=True)
        return s, wins, trajs

    run_settings = {"env_id": ENV_ID, "env_kwargs": pk, "max_turn_tokens": cfg.max_turn_tokens, "autocast": autocast,
                    "device": describe(model),
                    "eval": {"split": "test", "tasks": cfg.eval_tasks, "seed": cfg.eval_seed,  # toolgym_run.json
                             "num_envs": len(eval_tasks), "batch_size": cfg.eval_batch_size or len(eval_tasks)}}
    metrics: dict[str, Any] = {
        "env_id": ENV_ID, "eval_split": "test", "eval_task_ids": [t["id"] for t in eval_tasks],
        "eval_seeds": eval_seeds, "prompt": {"compact": bool(pk), "system_prompt": pk.get("system_prompt"),
                                             "prompt_tokens": prompt_len},
        "config": asdict(cfg),
    }
    phases.mark("eval_before")
    metrics["eval_before"], wins_before, _ = evaluate("before")
    phases.mark("warmstart")

    # -- warm start: a few masked-SFT steps on oracle episodes ----------------------------------------------------
    t0 = time.perf_counter()
    ws_tasks = draw_tasks(ENV_ID, cfg.warmstart_episodes, seed=cfg.seed + 1, split="train",
                          env_kwargs={"tokenizer": tok})
    kept, alltr = collect(ENV_ID, oracle_policy(), ws_tasks, seeds=cfg.seed, num_envs=16,
                          max_turn_tokens=cfg.max_turn_tokens, env_kwargs={"split": "train", "tokenizer": tok, **pk},
                          trajectory_path=out / "trajectories" / "warmstart_oracle.jsonl")
    n_tok = sum(sum(t.loss_mask) for t in kept)
    print(f"[demo] warm start: {cfg.warmstart_steps} masked-SFT steps (batch {cfg.warmstart_batch_size}, lr "
          f"{cfg.warmstart_lr:g}) on {len(kept)} oracle episodes of the train split ({n_tok} policy tokens; env "
          "tokens masked).\n[demo]   it shows the format of a call and an answer, e.g.: "
          f"{_decode_completion(tok, kept[0])}", flush=True)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    losses = masked_sft(model, kept, steps=cfg.warmstart_steps, lr=cfg.warmstart_lr,
                        batch_size=cfg.warmstart_batch_size, seed=cfg.seed,
                        micro_batch_size=cfg.train_micro_batch_size or None, optim=cfg.optim, autocast=autocast,
                        trim_heap=cfg.trim_heap)
    metrics["warmstart"] = {"episodes": len(kept), "policy_tokens": n_tok, "steps": cfg.warmstart_steps,
                            "loss": losses, "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"[demo] warm start done in {metrics['warmstart']['wall_s']:.0f} s: loss "
          + " -> ".join(f"{x:.2f}" for x in losses), flush=True)
    phases.mark("eval_after_warmstart")
    metrics["eval_after_warmstart"], wins_ws, trajs_ws = evaluate("after warm start")
    phases.mark("save")
    ckpt_ws = save_checkpoint(model, tok, out / "warmstart", chat_template=pk.get("chat_template"),
                              run_settings=run_settings)
    print(f"[demo]   e.g. held-out task {eval_tasks[0]['expression']!r} -> {_decode_completion(tok, trajs_ws[0])}",
          flush=True)

    # -- GRPO through the adapter --------------------------------------------------------------------------------
    phases.mark("grpo")  # (every mark collects garbage and trims the heap: toolgym.resources.release_memory)
    t0 = time.perf_counter()
    per_step: list[dict[str, Any]] = []
    last = [time.perf_counter()]

    class StepPrinter(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            last[0] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
            now = time.perf_counter()
            errs = {k.split("/")[-1]: v for k, v in logs.items() if k.startswith("toolgym/errors/") and v}
            row = {"step": state.global_step, "reward": logs.get("reward"), "reward_std": logs.get("reward_std"),
                   "frac_reward_zero_std": logs.get("frac_reward_zero_std"),
                   "success": logs.get("toolgym/success"), "tool_call_rate": logs.get("toolgym/tool_call_rate"),
                   "calls_per_episode": logs.get("toolgym/calls_per_episode"), "errors": errs,
                   "turns": logs.get("toolgym/turns"), "loss": logs.get("loss"),
                   "step_s": round(now - last[0], 1)}
            last[0] = now
            per_step.append(row)
            err_s = ", ".join(f"{k}={v:.2f}" for k, v in errs.items()) or "none"
            print(f"[grpo] step {row['step']:>3}/{cfg.grpo_steps}  reward {row['reward']:.3f}  "
                  f"frac_reward_zero_std {row['frac_reward_zero_std']:.2f}  tool-call rate "
                  f"{row['tool_call_rate']:.2f}  errors/ep: {err_s}  ({row['step_s']:.0f} s)", flush=True)

    bs = cfg.grpo_num_generations * cfg.grpo_prompts_per_step
    mb = min(bs, (cfg.grpo_micro_batch_size if cfg.grpo_micro_batch_size is not None
                  else cfg.train_micro_batch_size) or bs)
    grpo_ckpt = cfg.gradient_checkpointing if cfg.grpo_gradient_checkpointing is None else cfg.grpo_gradient_checkpointing
    grpo = ALGORITHMS["grpo"]
    grpo_cfg = grpo.Config(
        env_id=ENV_ID, env_kwargs={"split": "train", **pk}, max_turn_tokens=cfg.max_turn_tokens, lora=cfg.lora,
        trim_heap=cfg.trim_heap,  # after every generation, micro-batch and step
        shared_prefix=cfg.shared_prefix,
        trajectory_dir=str(out / "trajectories" / "grpo"), save_model=False,  # saved below, with the template
        trl=dict(
            output_dir=str(out / "grpo"), max_steps=cfg.grpo_steps, learning_rate=cfg.grpo_lr,
            per_device_train_batch_size=mb, generation_batch_size=bs, gradient_accumulation_steps=bs // mb,
            num_generations=cfg.grpo_num_generations,
            max_completion_length=cfg.grpo_max_completion_length, temperature=cfg.grpo_temperature,
            beta=cfg.grpo_beta, logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed,
            use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
            gradient_checkpointing=grpo_ckpt, bf16=cfg.bf16, optim=cfg.optim,
        ),
    )
    grpo_tasks = draw_tasks(ENV_ID, cfg.grpo_tasks, seed=cfg.seed + 2, split="train", env_kwargs={"tokenizer": tok})
    print(f"[demo] GRPO: {cfg.grpo_steps} steps x {cfg.grpo_prompts_per_step} train tasks x "
          f"{cfg.grpo_num_generations} samples (temperature {cfg.grpo_temperature:g}, lr {cfg.grpo_lr:g}, "
          f"beta {cfg.grpo_beta:g}) through trainers.grpo.rollout_adapter.ToolgymRollout", flush=True)
    if not grpo_ckpt and cfg.gradient_checkpointing:
        model.gradient_checkpointing_disable()
    model.train()
    grpo.run(grpo_cfg, model=model, tokenizer=tok, tasks=grpo_tasks,
             callbacks=[StepPrinter()])
    model.eval()
    model.zero_grad(set_to_none=True)  # no gradients kept into the last evaluation
    metrics["grpo"] = {"steps": per_step, "wall_s": round(time.perf_counter() - t0, 1),
                       "episodes": cfg.grpo_steps * bs}
    phases.mark("eval_after_grpo")
    metrics["eval_after_grpo"], wins_after, trajs_after = evaluate("after GRPO")
    phases.mark("save")
    print(f"[demo]   e.g. held-out task {eval_tasks[0]['expression']!r} -> {_decode_completion(tok, trajs_after[0])}",
          flush=True)
    ckpt_final = save_checkpoint(model, tok, out / "final", chat_template=pk.get("chat_template"),
                                 run_settings=run_settings)
    metrics["checkpoints"] = {"warmstart": str(ckpt_ws), "final": str(ckpt_final)}
    metrics["grpo_gain"] = paired_difference_ci(wins_ws, wins_after)
    metrics["warmstart_gain"] = paired_difference_ci(wins_before, wins_ws)
    metrics["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    metrics["resources"] = phases.to_dict()  # wall/CPU seconds and peak RSS (MiB) of each phase, process peak

    _plot(metrics, out / "demo.png")
    tmp = out / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2, default=str))
    tmp.replace(out / "metrics.json")
    _record(metrics, out)
    b, m, a = metrics["eval_before"], metrics["eval_after_warmstart"], metrics["eval_after_grpo"]
    g = metrics["grpo_gain"]
    print(f"\n[demo] ===== held-out success, {a['n_tasks']} Calculator-v0 test tasks (same tasks and seeds, greedy) "
          "=====")
    for name, s in (("before training", b), ("after warm start", m), ("after GRPO", a)):
        lo, hi = s["success_ci95"]
        print(f"[demo]   {name:<17}: {s['success']:6.1%}  [95% CI {lo:.1%}, {hi:.1%}]   "
              f"tool-call rate {s['tool_call_rate']:.1%}")
    verdict = "excludes 0" if g["lo"] > 0 or g["hi"] < 0 else "includes 0"
    print(f"[demo]   GRPO's own gain (paired, after GRPO - after warm start): {g['mean']:+.1%} "
          f"[95% CI {g['lo']:+.1%}, {g['hi']:+.1%}] ({verdict})")
    print(f"[demo] wrote {out / 'demo.png'}, {out / 'metrics.json'}, checkpoints {ckpt_ws} and {ckpt_final}, "
          f"trajectories in {out / 'trajectories'}/ -- total {metrics['total_wall_s']:.0f} s, peak RSS "
          f"{metrics['resources']['peak_rss_mb']:.0f} MiB")
    return metrics


def _record(metrics: dict[str, Any], out: Path) -> None:
    """The evaluation reports the registry takes, and the run in the tracking store (a store that cannot be
    written is a warning: the demo's results are on disk already)."""
    from toolgym.errors import CLIError
    from trainers.demo.record import eval_reports, log_run
    from trainers.tracking import tracking_uri

    reports = eval_reports(metrics, out)
    try:
        run_id = log_run(metrics, out)
    except (CLIError, OSError) as e:
        print(f"[demo] not in the tracking store: {getattr(e, 'message', e)}", flush=True)
        return
    print(f"[demo] run {run_id} in the tracking store {tracking_uri()} (`toolgym ui --runs runs` shows it); "
          "evaluations to register with: " + ", ".join(str(p) for p in reports), flush=True)


def _plot(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = metrics["grpo"]["steps"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [s["step"] for s in steps]
    ax1.plot(xs, [s["reward"] for s in steps], "o-", label="mean reward (= success)")
    ax1.plot(xs, [s["tool_call_rate"] for s in steps], "s--", label="tool-call rate")
    ax1.plot(xs, [s["frac_reward_zero_std"] for s in steps], "x:", label="frac_reward_zero_std")
    ax1.set_xlabel("GRPO step")
    ax1.set_ylim(-0.05, 1.05)
    ax1.set_title("GRPO on Calculator-v0 (training episodes, train split)")
    ax1.legend(loc="lower right", fontsize=8)
    names = ["before", "after warm start", "after GRPO"]
    keys = ["eval_before", "eval_after_warmstart", "eval_after_grpo"]
    vals = [metrics[k]["success"] for k in keys]
    err = [[v - metrics[k]["success_ci95"][0] for k, v in zip(keys, vals, strict=True)],
           [metrics[k]["success_ci95"][1] - v for k, v in zip(keys, vals, strict=True)]]
    bars = ax2.bar(names, vals, yerr=err, capsize=4, color=["#bbb", "#7aa6d8", "#2f6db5"])
    for bar, v, k in zip(bars, vals, keys, strict=True):
        ax2.text(bar.get_x() + bar.get_width() * 0.75, metrics[k]["success_ci95"][1] + 0.02, f"{v:.0%}", ha="center")
    ax2.set_ylim(0, 1.15)
    g = metrics["grpo_gain"]
    ax2.set_title(f"held-out success ({metrics['eval_before']['n_tasks']} test tasks, same seeds)\n"
                  f"GRPO gain {g['mean']:+.0%} [95% CI {g['lo']:+.0%}, {g['hi']:+.0%}]", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="toolgym demo: warm start + GRPO on Calculator-v0 with the embedded model")
    ap.add_argument("--config", default=None, help="YAML with DemoConfig fields (trainers/configs/demo_cpu.yaml)")
    ap.add_argument("--output-dir", default=None)
    ap.add_argument("--grpo-steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="also show the libraries' own warnings and logs (TOOLGYM_VERBOSE=1 does the same)")
    a = ap.parse_args(argv)
    from toolgym.console import configure

    configure(a.verbose)
    cfg = _load(a.config)
    if a.output_dir:
        cfg.output_dir = a.output_dir
    if a.grpo_steps is not None:
        cfg.grpo_steps = a.grpo_steps
    if a.seed is not None:
        cfg.seed = a.seed
    run_demo(cfg)
