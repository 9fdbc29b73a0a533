"""Launch helper for a verl PPO run on a toolgym env: dataset rows, the parquet files, the ``main_ppo`` overrides.

``python -m trainers.verl.launch --env toolgym/CalculatorChain-v0 --model /models/Qwen3-1.7B --out data/chain``
writes ``train.parquet`` / ``val.parquet`` (one row per task; the env renders the prompt, see
:mod:`trainers.verl.agent_loop`) and prints the ``python -m verl.trainer.main_ppo ...`` command (PPO with a critic,
``algorithm.adv_estimator=gae``; ``--estimator toolgym_turn_return`` for turn-level GRPO-style credit without a
critic). ``--check`` imports verl and says whether the agent loop and the estimator are registered (verl swallows
plugin import errors). Nothing here imports verl at module level; writing parquet needs pandas + pyarrow (verl
brings both). Full PPO training needs GPUs (vLLM/SGLang rollout servers, FSDP actor and critic): docs/verl.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["check_registration", "main", "make_rows", "ppo_overrides", "write_parquet"]


def make_rows(
    env_id: str,
    tasks: Sequence[Mapping[str, Any] | None],
    *,
    seeds: Sequence[int | None] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    max_turn_tokens: int | None = None,
    start_index: int = 0,
) -> list[dict[str, Any]]:
    """verl dataset rows (``RLHFDataset`` columns) for toolgym episodes, one per task.

    Args:
        env_id: a registered toolgym env id.
        tasks: task rows (``None``: the env draws one from the row's seed).
        seeds: one seed per task (default: the row index).
        env_kwargs: JSON-serialisable env keyword arguments (``split``, ``max_turns``, ...).
        max_turn_tokens: tokens sampled per assistant turn (default: the loop's, i.e. the response budget).
        start_index: the first row's ``extra_info.index``.

    Returns:
        Rows with ``data_source`` (the env id), ``agent_name`` (``"toolgym"``), ``prompt`` (the task's user text as
        one chat message: verl logs it and may filter on its length; the env renders the real prompt),
        ``reward_model`` (unused: the env's reward is the reward), ``extra_info`` (``index``, ``toolgym_env``,
        ``toolgym_task`` and ``toolgym_env_kwargs`` as JSON strings, ``toolgym_seed``, ``toolgym_max_turn_tokens``).
    """
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    kwargs_json = json.dumps(dict(env_kwargs or {}), sort_keys=True)
    rows = []
    for k, task in enumerate(tasks):
        i = start_index + k
        seed = (seeds[k] if seeds is not None else i)
        text = str(task.get("prompt", "")) if task is not None else ""
        rows.append({
            "data_source": env_id,
            "agent_name": "toolgym",
            "prompt": [{"role": "user", "content": text}],
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {
                "index": i,
                "toolgym_env": env_id,
                "toolgym_task": json.dumps(dict(task)) if task is not None else "",
                "toolgym_seed": seed,
                "toolgym_env_kwargs": kwargs_json,
                "toolgym_max_turn_tokens": int(max_turn_tokens or 0),
            },
        })
    return rows


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write ``rows`` as a parquet file verl's ``RLHFDataset`` reads (needs pandas + pyarrow)."""
    import pandas as pd

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(list(rows)).to_parquet(out)
    return out


def ppo_overrides(
    *,
    train_files: str,
    val_files: str,
    model_path: str,
    critic_path: str | None = None,
    estimator: str = "gae",
    nnodes: int = 1,
    gpus_per_node: int = 8,
    rollout: str = "vllm",
    rollout_n: int = 1,
    batch_size: int = 64,
    micro_batch_per_gpu: int = 2,
    prompt_length: int = 2048,
    response_length: int = 2048,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> list[str]:
    """Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl 0.9.x) selecting the toolgym agent loop.

    ``estimator="gae"`` trains a critic (``critic.model.path``, default: the actor's) and uses GAE over the
    per-token rewards (each turn's reward on its last policy token); ``"toolgym_turn_return"`` is the turn-level
    estimator of :mod:`trainers.credit` (no critic; use ``rollout_n`` > 1 for groups).
    """
    critic = estimator == "gae"
    out = [
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch_per_gpu}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch_per_gpu}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro_batch_per_gpu}",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.n={rollout_n}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=toolgym",
        f"algorithm.adv_estimator={estimator}",
        f"algorithm.gamma={gamma}",
        f"algorithm.lam={lam}",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={gpus_per_node}",
    ]
    if critic:
        out += [f"critic.model.path={critic_path or model_path}",
                f"critic.ppo_micro_batch_size_per_gpu={micro_batch_per_gpu}"]
    return out


def check_registration() -> dict[str, bool]:
    """Import verl (which loads the ``verl.plugins`` entry points) and report what toolgym registered."""
    import verl  # noqa: F401
    from verl.experimental.agent_loop import agent_loop as al
    from verl.trainer.ppo import core_algos

    return {
        "agent_loop:toolgym": "toolgym" in vars(al)["_agent_loop_registry"],
        "adv_estimator:toolgym_turn_return": "toolgym_turn_return" in core_algos.ADV_ESTIMATOR_REGISTRY,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainers.verl.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="report whether verl sees toolgym's loop and estimator")
    p.add_argument("--env", default="toolgym/CalculatorChain-v0", help="toolgym env id")
    p.add_argument("--train", type=int, default=1024, help="training rows (tasks drawn from seeds 0..N-1)")
    p.add_argument("--val", type=int, default=128, help="validation rows (the env's test split when it has one)")
    p.add_argument("--out", default="data/verl", help="directory for train.parquet / val.parquet")
    p.add_argument("--model", default="MODEL_PATH", help="actor (and critic) model path on the training nodes")
    p.add_argument("--estimator", default="gae", help="gae (PPO with a critic) or toolgym_turn_return")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--rollout", default="vllm", choices=("vllm", "sglang"))
    p.add_argument("--n", type=int, default=1, help="samples per prompt (rollout.n)")
    args = p.parse_args(argv)
    if args.check:
        status = check_registration()
        for k, v in status.items():
            print(f"{k}: {'registered' if v else 'MISSING'}")
        return 0 if all(status.values()) else 1
    out = Path(args.out)
    train = write_parquet(make_rows(args.env, [None] * args.train, env_kwargs={"split": "train"}),
                          out / "train.parquet")
    val = write_parquet(make_rows(args.env, [None] * args.val, env_kwargs={"split": "test"},
                                  seeds=[10**6 + i for i in range(args.val)]), out / "val.parquet")
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *ppo_overrides(
        train_files=str(train), val_files=str(val), model_path=args.model, estimator=args.estimator,
        nnodes=args.nnodes, gpus_per_node=args.gpus_per_node, rollout=args.rollout, rollout_n=args.n)]
    print(" \\\n  ".join(shlex.quote(c) for c in cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
