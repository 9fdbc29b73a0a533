"""Time and peak memory of GRPO steps on a CPU, with one of toolgym's changes to TRL's step off and on
(``--compare``):

* ``scored_positions`` (default): TRL's fused LM head scoring every position of a micro-batch (TRL 1.16 on any
  device without Triton) vs only the completion positions (:func:`trainers.grpo.trainer.scored_positions_only`);
* ``zero_advantage``: every micro-batch computed vs those whose advantages are all zero left out
  (:mod:`trainers.grpo.zero_advantage`, ``grpo.Config.skip_zero_advantage``);
* ``sampling``: transformers' ``torch.multinomial`` vs inverse-CDF sampling (:mod:`trainers.grpo.sampling`): the same
  distribution, other draws, so the episodes differ; compare the generation time;
* ``frozen_cast``: the frozen (tied) embedding / LM head cast to bfloat16 at every decoding step (autocast caches
  only weights that require grad) vs once per ``generate()`` call (:func:`toolgym.checkpoint.autocast_context`);
* ``shared_prefix``: every row's prompt computed in the loss forward and backward vs each group's prompt once
  (:mod:`trainers.grpo.prompt_packing`, ``grpo.Config.shared_prefix``); every micro-batch is computed
  (``skip_zero_advantage`` off), so that the untrained model's all-zero advantages still cost their training.

"on" is what ``toolgym train grpo`` does. Each setting runs in a fresh child process, alternating, ``--reps``
times: load ``--checkpoint`` (e.g. the demo's
warm start), then ``--steps`` GRPO steps with the demo's settings (``--env calculator``: 16 episodes of
Calculator-v0's train split per step, groups of 4, micro-batches of 2, bfloat16 autocast, 8-bit AdamW, frozen
embedding, gradient checkpointing, ``trim_heap``) or ``benchmarks/bfcl/``'s (``--env bfcl_multiple``: one prompt
of BFCL-v0's ``multiple`` train split per step with 8 samples in one micro-batch, 64 tokens a turn; the same
autocast, optimizer and memory settings).
Reports the wall time of the steps, the time in generation, in the loss forward and in the backward, the peak
RSS (sampled every 5 ms by :class:`toolgym.resources.Phases`) and each step's loss (equal losses = the same
function). With ``shared_prefix`` the "on" process then also times the loss forward + backward of its last step's
micro-batches packed and unshared in turn (medians of 3), which a loaded machine's drift between processes does not
bias.

    make demo   # or any run that saved runs/demo/warmstart
    MALLOC_ARENA_MAX=1 .venv/bin/python -m benchmarks.grpo_step --checkpoint runs/demo/warmstart --reps 2
    MALLOC_ARENA_MAX=1 .venv/bin/python -m benchmarks.grpo_step --checkpoint runs/demo/warmstart --compare sampling
    nice -n 15 .venv/bin/python -m benchmarks.grpo_step --compare shared_prefix --env bfcl_multiple --threads 1

``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

COMPARES = ("scored_positions", "zero_advantage", "sampling", "frozen_cast", "shared_prefix")
ENVS = ("calculator", "bfcl_multiple")
BFCL_ENV_ID = "toolgym/BFCL-v0"


def _turn_off(compare: str) -> None:
    """Put back TRL's / transformers' own behaviour for ``compare`` in this (child) process."""
    if compare == "scored_positions":  # TRL's own choice on a CPU
        import trainers.grpo.trainer as turn_grpo

        turn_grpo.scored_positions_only = contextlib.nullcontext
    elif compare == "sampling":
        import trainers.grpo.sampling as sampling

        sampling.sampling_warpers = lambda config: None  # every call goes to transformers' multinomial
    elif compare == "frozen_cast":
        import toolgym.checkpoint as checkpoint
        import trainers.grpo.generation as generation

        own = checkpoint.autocast_context
        generation.autocast_context = lambda device_type, dtype, model=None: own(device_type, dtype)


def child(checkpoint: str | None, steps: int, on: bool, compare: str = "scored_positions", env: str = "calculator",
          threads: int = 2) -> dict[str, Any]:

    import toolgym  # noqa: F401  (registers the envs)
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.resources import Phases
    from trainers import ALGORITHMS
    from trainers.contract import prepare
    from trainers.demo import ENV_ID, prompt_kwargs

    if not on:
        _turn_off(compare)
    prepare(threads=threads)
    model, tok = load_model(checkpoint)
    model.get_input_embeddings().weight.requires_grad_(False)
    grpo = ALGORITHMS["grpo"]
    trl = dict(output_dir="/tmp/toolgym-grpo-step-bench", max_steps=steps, learning_rate=3e-5,
               per_device_train_batch_size=2, generation_batch_size=16, gradient_accumulation_steps=8,
               num_generations=4, max_completion_length=160, temperature=0.5, beta=0.0, logging_steps=1,
               save_strategy="no", report_to=[], seed=1, use_cpu=True, bf16=True, optim="adamw_bnb_8bit",
               disable_tqdm=True, gradient_checkpointing=True)
    env_id, env_kwargs, turn_tokens = ENV_ID, {"split": "train", **prompt_kwargs(True)}, 64
    if env == "bfcl_multiple":
        env_id, env_kwargs = BFCL_ENV_ID, {"category": "multiple", "split": "train"}
        trl.update(per_device_train_batch_size=8, generation_batch_size=8, gradient_accumulation_steps=1,
                   num_generations=8, max_completion_length=64, temperature=1.0)
    cfg = grpo.Config(
        env_id=env_id, env_kwargs=env_kwargs, max_turn_tokens=turn_tokens, save_model=False, trim_heap=True,
        skip_zero_advantage=(on or compare != "zero_advantage") and compare != "shared_prefix",
        shared_prefix=on or compare != "shared_prefix", trl=trl,
    )
    tasks = draw_tasks(env_id, 256 if env == "calculator" else 64, seed=3, split="train",
                       env_kwargs={**env_kwargs, "tokenizer": tok})
    trainer, rollout = grpo.build_trainer(cfg, model=model, tokenizer=tok, tasks=tasks)
    spent = {"generation": 0.0, "loss_forward": 0.0, "backward": 0.0}

    def timed(obj: Any, name: str, key: str) -> None:
        inner = getattr(obj, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t

        setattr(obj, name, call)

    timed(trainer, "_generate_and_score_completions", "generation")
    timed(trainer, "compute_loss", "loss_forward")
    timed(trainer.accelerator, "backward", "backward")
    phases = Phases()  # the steps' wall time and their peak RSS (sampled every 5 ms)
    model.train()
    try:
        with phases("grpo"):
            trainer.train()
    finally:
        rollout.close()
    interleaved = _interleaved_loss(trainer, model) if compare == "shared_prefix" and on else None
    grpo = phases.to_dict()["phases"]["grpo"]
    wall, peak = grpo["wall_s"], grpo["peak_rss_mb"]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h and "reward" in h]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"compare": compare, "env": env, "on": on, "wall_s": round(wall, 1), "generation_s": round(spent["generation"], 1),
            "loss_forward_s": round(spent["loss_forward"], 1), "backward_s": round(spent["backward"], 1),
            "peak_rss_mb": round(peak), "losses": losses, "completion_tokens": [round(x, 1) for x in lengths],
            "skipped_micro_batches": int(getattr(trainer, "skipped_micro_batches", 0)),
            "shared_prefix_forwards": int(getattr(trainer, "shared_prefix_forwards", 0)),
            "interleaved_loss_s": interleaved}


def _interleaved_loss(trainer: Any, model: Any, reps: int = 3) -> dict[str, float]:
    """Median seconds of one loss forward + backward over the last step's micro-batches, packed and unshared in
    turn in this one process (so that a machine's changing load falls on both alike)."""
    times: dict[str, list[float]] = {"off": [], "on": []}
    trainer.current_gradient_accumulation_steps = 1
    for _ in range(reps):
        for key in ("off", "on"):
            trainer.shared_prefix = key == "on"
            t = time.perf_counter()
            for mb in trainer._buffered_inputs:
                trainer._compute_loss(model, mb).backward()
            times[key].append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="model to start from (default: the embedded model, which "
                                                       "never calls a tool: the loss stays 0)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", choices=COMPARES, default="scored_positions")
    ap.add_argument("--env", choices=ENVS, default="calculator")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads of each child")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.checkpoint, a.steps, a.child == "1", a.compare, a.env, a.threads)))
        return
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "1")}
    for rep in range(a.reps):
        for on in (False, True):
            cmd = [sys.executable, __file__, "--child", "1" if on else "0", "--steps", str(a.steps),
                   "--compare", a.compare, "--env", a.env, "--threads", str(a.threads),
                   *(["--checkpoint", a.checkpoint] if a.checkpoint else [])]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["rep"] = rep
            rows.append(row)
            print(f"rep {rep}  {a.compare} {'on ' if on else 'off'}  wall {row['wall_s']:6.1f} s  generation "
                  f"{row['generation_s']:5.1f} s  forward {row['loss_forward_s']:5.1f} s  backward "
                  f"{row['backward_s']:5.1f} s  peak {row['peak_rss_mb']:5d} MiB  skipped "
                  f"{row['skipped_micro_batches']}  packed {row['shared_prefix_forwards']}  completion tokens "
                  f"{row['completion_tokens']}  losses {row['losses']}"
                  + (f"  interleaved loss fwd+bwd s {row['interleaved_loss_s']}" if row["interleaved_loss_s"] else ""),
                  flush=True)

    def med(on: bool, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["on"] is on)

    def ratio(*keys: str) -> float:
        return sum(med(True, k) for k in keys) / max(1e-9, sum(med(False, k) for k in keys))

    wall, gen, train = ratio("wall_s"), ratio("generation_s"), ratio("loss_forward_s", "backward_s")
    peak = med(True, "peak_rss_mb") - med(False, "peak_rss_mb")
    same = len({json.dumps(r["losses"]) for r in rows}) == 1
    print(f"{a.compare} ({a.env}) on / off: wall x{wall:.2f}, generation x{gen:.2f}, forward+backward x{train:.2f}, peak "
          f"{peak:+.0f} MiB; losses {'identical' if same else 'differ'}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"compare": a.compare, "env": a.env, "rows": rows, "wall_ratio": wall, "generation_ratio": gen,
                       "train_ratio": train, "peak_delta_mb": peak, "same_losses": same}, fh, indent=1)


if __name__ == "__main__":
    main()
