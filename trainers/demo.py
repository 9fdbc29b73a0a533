"""``make demo``: teach the embedded SmolLM2-135M to use a calculator on a 2-core CPU, for real.

1. Held-out evaluation of the untrained model (greedy, ``test`` split of Calculator-v0, a fixed seed set).
   Untrained, it never calls a tool, so it fails at 3-5 digit arithmetic.
2. RFT/SFT warm start: an oracle rolls out ``train``-split episodes (call ``calculator``, answer with the
   result); the model is fine-tuned on them with the env's loss mask (:mod:`trainers.sft`).
3. Held-out evaluation again (same tasks, same seeds).
4. GRPO through the TRL adapter (:mod:`trainers.rollout_func`): the model's own multi-turn episodes, env reward.
   A progress bar, and per step: reward, success, tool-call rate, error kinds.
5. Held-out evaluation again; a plot (``demo.png``), the metrics (``metrics.json``) and every trajectory
   (``trajectories/*.jsonl``) are written under the output directory.

Run::

    python -m trainers.demo --config trainers/configs/demo_cpu.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["DemoConfig", "main", "run_demo"]

ENV_ID = "toolgym/Calculator-v0"


@dataclass
class DemoConfig:
    """Knobs of the demo (``trainers/configs/demo_cpu.yaml``)."""

    output_dir: str = "runs/demo"
    seed: int = 0
    threads: int = 2
    # evaluation (held-out: Calculator-v0 "test" split, fixed seeds)
    eval_tasks: int = 24
    eval_seed: int = 10_000
    max_turn_tokens: int = 64
    # RFT/SFT warm start on oracle trajectories ("train" split)
    sft_episodes: int = 64
    sft_epochs: float = 2.0
    sft_lr: float = 1e-4
    sft_batch_size: int = 8
    # GRPO through the adapter
    grpo_steps: int = 8
    grpo_tasks: int = 64
    grpo_num_generations: int = 8
    grpo_prompts_per_step: int = 1
    grpo_lr: float = 5e-6
    grpo_temperature: float = 1.0
    grpo_max_completion_length: int = 160
    grpo_beta: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _load(path: str | None) -> DemoConfig:
    if path is None:
        return DemoConfig()
    import yaml

    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    known = {f.name for f in fields(DemoConfig)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{path}: unknown demo keys {sorted(unknown)}")
    return DemoConfig(**raw)


def _tasks(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    import numpy as np

    from toolgym.envs.calculator import generate_task

    rng = np.random.default_rng(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < n:
        t = generate_task(rng, split)
        rows.setdefault(t["id"], t)
    return list(rows.values())


def _fmt(s: dict[str, Any]) -> str:
    errs = ", ".join(f"{k}={v}" for k, v in sorted(s.get("errors", {}).items())) or "none"
    return (f"success {s['success']:.1%}  reward {s['reward']:.3f}  tool-call rate {s['tool_call_rate']:.1%}  "
            f"calls/ep {s['calls_per_episode']:.2f}  turns {s['turns']:.2f}  errors: {errs}")


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the whole demo; returns the metrics dict (also written to ``output_dir/metrics.json``)."""
    import gymnasium as gym
    import torch
    from gymnasium.vector import AutoresetMode
    from transformers import TrainerCallback

    import toolgym  # noqa: F401
    from toolgym.models import load_model
    from toolgym.rollout import RolloutDriver, TransformersPolicy, summarize, write_trajectories
    from trainers.grpo import ToolgymGRPOArgs, build_trainer
    from trainers.sft import collect, oracle_policy, train_sft

    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output_dir)
    (out / "trajectories").mkdir(parents=True, exist_ok=True)
    for old in (out / "trajectories").glob("*.jsonl"):
        old.unlink()

    print("[demo] loading the embedded model (SmolLM2-135M-Instruct) ...", flush=True)
    model, tok = load_model()
    eval_tasks = _tasks("test", cfg.eval_tasks, cfg.eval_seed)
    eval_seeds = list(range(cfg.eval_seed, cfg.eval_seed + len(eval_tasks)))
    venv = gym.make_vec(ENV_ID, num_envs=min(32, len(eval_tasks)), autoreset_mode=AutoresetMode.DISABLED,
                        split="test", tokenizer=tok)

    def evaluate(tag: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False)
        driver = RolloutDriver(venv, policy, max_turn_tokens=cfg.max_turn_tokens)
        trajs = driver.run(eval_tasks, seeds=eval_seeds, progress=True)
        write_trajectories(out / "trajectories" / f"eval_{tag}.jsonl", trajs)
        s = summarize(trajs)
        s["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"[demo] held-out ({len(trajs)} tasks) {tag}: {_fmt(s)}", flush=True)
        return s

    metrics: dict[str, Any] = {"config": asdict(cfg)}
    metrics["eval_before"] = evaluate("before")

    # -- RFT/SFT warm start --------------------------------------------------------------------------
    t0 = time.perf_counter()
    sft_tasks = _tasks("train", cfg.sft_episodes, cfg.seed + 1)
    kept, alltr = collect(ENV_ID, oracle_policy(ENV_ID), sft_tasks, seeds=cfg.seed, num_envs=16,
                          env_kwargs={"split": "train", "tokenizer": tok},
                          trajectory_path=out / "trajectories" / "sft_oracle.jsonl")
    print(f"[demo] RFT: oracle rolled out {len(alltr)} episodes, kept {len(kept)} with reward 1; fine-tuning "
          f"on {sum(sum(t.loss_mask) for t in kept)} model tokens (env tokens masked) ...", flush=True)
    sft = train_sft(model, tok, kept, output_dir=out / "sft", epochs=cfg.sft_epochs, learning_rate=cfg.sft_lr,
                    batch_size=cfg.sft_batch_size, seed=cfg.seed, logging_steps=4)
    metrics["sft"] = {"episodes": len(kept), "wall_s": round(time.perf_counter() - t0, 1),
                      "loss": [h["loss"] for h in sft.state.log_history if "loss" in h]}
    metrics["eval_after_sft"] = evaluate("after_sft")

    # -- GRPO through the adapter ---------------------------------------------------------------------
    from trl import GRPOConfig

    t0 = time.perf_counter()
    per_step: list[dict[str, Any]] = []

    class StepPrinter(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
            errs = {k.split("/")[-1]: v for k, v in logs.items() if k.startswith("toolgym/errors/") and v}
            row = {"step": state.global_step, "reward": logs.get("reward"),
                   "success": logs.get("toolgym/success"), "tool_call_rate": logs.get("toolgym/tool_call_rate"),
                   "calls_per_episode": logs.get("toolgym/calls_per_episode"), "errors": errs,
                   "turns": logs.get("toolgym/turns"), "loss": logs.get("loss")}
            per_step.append(row)
            err_s = ", ".join(f"{k}={v:.2f}" for k, v in errs.items()) or "none"
            print(f"\n[grpo] step {row['step']:>3}  reward {row['reward']:.3f}  success {row['success']:.2f}  "
                  f"tool-call rate {row['tool_call_rate']:.2f}  errors/ep: {err_s}", flush=True)

    bs = cfg.grpo_num_generations * cfg.grpo_prompts_per_step
    args = GRPOConfig(
        output_dir=str(out / "grpo"), max_steps=cfg.grpo_steps, learning_rate=cfg.grpo_lr,
        per_device_train_batch_size=bs, num_generations=cfg.grpo_num_generations,
        max_completion_length=cfg.grpo_max_completion_length, temperature=cfg.grpo_temperature,
        beta=cfg.grpo_beta, logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(), **cfg.extra,
    )
    tg = ToolgymGRPOArgs(env_id=ENV_ID, env_kwargs={"split": "train"}, max_turn_tokens=cfg.max_turn_tokens,
                         trajectory_dir=str(out / "trajectories" / "grpo"))
    model.train()
    trainer, _ = build_trainer(tg, args, model=model, tokenizer=tok,
                               tasks=_tasks("train", cfg.grpo_tasks, cfg.seed + 2), callbacks=[StepPrinter()])
    trainer.train()
    model.eval()
    metrics["grpo"] = {"steps": per_step, "wall_s": round(time.perf_counter() - t0, 1)}
    metrics["eval_after_grpo"] = evaluate("after_grpo")
    metrics["total_wall_s"] = round(time.perf_counter() - t_start, 1)

    _plot(metrics, out / "demo.png")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    b, m, a = metrics["eval_before"], metrics["eval_after_sft"], metrics["eval_after_grpo"]
    print("\n[demo] ===== held-out success (same tasks, same seeds) =====")
    print(f"[demo]   before training : {b['success']:.1%}   (tool-call rate {b['tool_call_rate']:.1%})")
    print(f"[demo]   after RFT/SFT   : {m['success']:.1%}   (tool-call rate {m['tool_call_rate']:.1%})")
    print(f"[demo]   after GRPO      : {a['success']:.1%}   (tool-call rate {a['tool_call_rate']:.1%})")
    print(f"[demo] wrote {out / 'demo.png'}, {out / 'metrics.json'}, {out / 'trajectories'}/ "
          f"in {metrics['total_wall_s']:.0f} s")
    return metrics


def _plot(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = metrics["grpo"]["steps"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [s["step"] for s in steps]
    ax1.plot(xs, [s["reward"] for s in steps], "o-", label="reward (env)")
    ax1.plot(xs, [s["tool_call_rate"] for s in steps], "s--", label="tool-call rate")
    ax1.set_xlabel("GRPO step")
    ax1.set_ylim(-0.05, 1.05)
    ax1.set_title("GRPO on Calculator-v0 (training episodes)")
    ax1.legend()
    names = ["before", "after RFT/SFT", "after GRPO"]
    keys = ["eval_before", "eval_after_sft", "eval_after_grpo"]
    vals = [metrics[k]["success"] for k in keys]
    bars = ax2.bar(names, vals, color=["#bbb", "#7aa6d8", "#2f6db5"])
    for b, v in zip(bars, vals, strict=True):
        ax2.text(b.get_x() + b.get_width() / 2, v + 0.02, f"{v:.0%}", ha="center")
    ax2.set_ylim(0, 1.1)
    ax2.set_title(f"held-out success ({metrics['eval_before']['episodes']} test tasks, same seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="toolgym demo: RFT + GRPO on Calculator-v0 with the embedded model")
    ap.add_argument("--config", default=None, help="YAML with DemoConfig fields (trainers/configs/demo_cpu.yaml)")
    ap.add_argument("--output-dir", default=None)
    ap.add_argument("--grpo-steps", type=int, default=None)
    a = ap.parse_args(argv)
    cfg = _load(a.config)
    if a.output_dir:
        cfg.output_dir = a.output_dir
    if a.grpo_steps is not None:
        cfg.grpo_steps = a.grpo_steps
    run_demo(cfg)


if __name__ == "__main__":
    main()
