"""Agreement of a learned reward model with Calculator-v0's rule reward on held-out trajectories.

Labelled episodes come from the real env with a scripted "noisy oracle" (a fixed third each, by episode index):
the oracle (calls ``calculator``, answers its result: reward 1), a slip (calls the tool, answers the result with
its last digit changed: reward 0) and a guess (answers the expression's value rounded to 2 significant digits
without a tool call: reward 0). A slip and an oracle episode differ in one answer digit, so the model has to
compare the answer with the tool result in its context. Training episodes use ``train``-split tasks, held-out ones
``test``-split tasks (disjoint expressions). The reward model is trained with ``trainers/reward_model.py`` (TRL
``RewardTrainer``, pairs across tasks) and scored through :class:`toolgym.rewards.RewardModelReward`; the
metrics are :func:`trainers.reward_model.agreement` (accuracy of ``score >= 0.5`` and ROC AUC).

Run::

    python -m benchmarks.reward_model_agreement                 # tiny random base model (3.2M params)
    python -m benchmarks.reward_model_agreement --base embedded --steps 40 --lr 2e-5  # SmolLM2-135M base (~12 min)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENV = "toolgym/Calculator-v0"


def noisy_oracle(state: Any) -> str:
    from toolgym.tools.calculator import evaluate

    kind = state.index % 3
    if kind == 2:  # guess without the tool
        value = float(evaluate(state.task["expression"]))
        return f"<answer>{int(float(f'{value:.2g}'))}</answer>"
    if state.turn == 0 or kind == 0:
        return state.env.oracle(state)
    right = state.env.oracle(state)[len("<answer>"):-len("</answer>")]
    last = str((int(right[-1]) + 3) % 10) if right[-1].isdigit() else "7"
    return f"<answer>{right[:-1]}{last}</answer>"


def episodes(split: str, n: int, seed: int, tok: Any) -> list[Any]:
    import numpy as np

    from toolgym.envs.calculator import generate_task
    from toolgym.rollout import RolloutDriver, ScriptedPolicy

    rng = np.random.default_rng(seed)
    tasks = [generate_task(rng, split) for _ in range(n)]
    driver = RolloutDriver(ENV, ScriptedPolicy(noisy_oracle), num_envs=16,
                           env_kwargs={"split": split, "tokenizer": tok})
    try:
        return driver.run(tasks, seeds=seed)
    finally:
        driver.venv.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="tiny", help="'tiny' (random 3.2M Llama), 'embedded' or a model path")
    ap.add_argument("--train-episodes", type=int, default=240)
    ap.add_argument("--heldout-episodes", type=int, default=120)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("runs/rm_agreement"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    import torch

    from toolgym.models import load_tokenizer, tiny_random_model
    from toolgym.rollout import summarize
    from trainers.reward_model import evaluate_agreement, load_reward_base, reward_pairs, train_reward_model

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    tok = load_tokenizer()
    train = episodes("train", a.train_episodes, 1, tok)
    held = episodes("test", a.heldout_episodes, 2, tok)
    base = a.base
    if base == "tiny":
        base = str(a.out / "tiny_base")
        tiny_random_model(tok, seed=0).save_pretrained(base)
        tok.save_pretrained(base)
    model, rtok = load_reward_base(None if base == "embedded" else base)
    pairs = reward_pairs(train, margin=0.5)
    train_reward_model(model, rtok, pairs, output_dir=a.out / "rm", learning_rate=a.lr, batch_size=a.batch_size,
                       max_steps=a.steps, logging_steps=max(1, a.steps // 10), save=True, disable_tqdm=True)
    result = {
        "base": a.base, "train_episodes": len(train), "train_success": summarize(train)["success"],
        "pairs": len(pairs), "steps": a.steps,
        "heldout": evaluate_agreement(str(a.out / "rm"), held),
        "train": evaluate_agreement(str(a.out / "rm"), train),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (a.out / "agreement.json").write_text(json.dumps(result, indent=2))
    h, tr = result["heldout"], result["train"]
    print(f"held-out ({h['n']} episodes, {h['positives']} successes): accuracy {h['accuracy']:.3f}, AUC {h['auc']:.3f}"
          f" | train ({tr['n']}): accuracy {tr['accuracy']:.3f}, AUC {tr['auc']:.3f} | {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
