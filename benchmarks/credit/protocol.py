"""The credit experiment's knobs (:class:`CreditBenchConfig`, fixed before measuring) and the stages of a run
(:func:`plan`), from the configuration alone: no model, no tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.credit.stages import Stage

__all__ = ["ENV_ID", "RESULTS", "SMOKE", "SYSTEM", "CreditBenchConfig", "Plan", "default_results_dir", "plan"]

ENV_ID = "toolgym/CalculatorChain-v0"
SYSTEM = "Call the calculator once per step, then reply <answer>RESULT</answer>."
#: the committed stage records of the embedded model's runs
RESULTS = Path(__file__).resolve().parent / "results"



@dataclass
class CreditBenchConfig:
    """Knobs of the comparison (all fixed before measuring; see the module docstring)."""

    output_dir: str = "runs/credit"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    estimators: tuple[str, ...] = ("outcome", "turn_return", "gigpo")
    gamma: float = 1.0  # turn_return / gigpo discount: set from the validation run (--validate) before the comparison
    gamma_candidates: tuple[float, ...] = (1.0, 0.9, 0.7)  # --validate tries these
    steps: tuple[int, int] = (2, 2)  # chain lengths (dependent calculator calls per task): 2 keeps a CPU run short
    answer_step: bool = True  # the answer is a rewarded step; calls after the chain lose a share
    mid_fraction: float = 0.6  # turn-level arms are also evaluated when they cross this share of the budget
    threads: int = 2
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct; "tiny": a tiny random model (tests)
    max_turn_tokens: int = 48  # a chain step's call is ~42 tokens
    # held-out evaluation
    eval_tasks: int = 100
    eval_seed: int = 20_000
    eval_batch_size: int = 25  # episodes per generate() call (bounds the KV cache: one 100-episode batch needed >13 GB)
    # warm start (shared): masked SFT on oracle episodes of the train split
    warmstart_episodes: int = 32
    warmstart_steps: int = 3
    warmstart_lr: float = 7e-5  # chosen on a train-split validation draw (docs/training.md), never the test split
    eval_warmstart: bool = True  # one more 100-task evaluation (the warm start's own held-out success)
    warmstart_batch_size: int = 8
    # validation (--validate): a draw of train-split tasks, never the test split
    validation_tasks: int = 100
    validation_seed: int = 30_000
    # GRPO (per arm)
    token_budget: int = 20_000  # generated policy tokens per arm (5x the first protocol's 4,000)
    max_steps: int = 80
    warmup_steps: int = 4  # linear learning-rate warm-up (every arm): no first update at the full rate
    num_generations: int = 4
    prompts_per_step: int = 2
    lr: float = 1e-5  # 3e-5 in the first validation round, where outcome-only GRPO collapsed (docs/credit.md)
    temperature: float = 0.5
    max_completion_length: int = 320
    grpo_tasks: int = 128
    save_steps: int = 4  # a GRPO checkpoint every this many steps (and at the last): where a killed arm resumes
    extra: dict[str, Any] = field(default_factory=dict)


SMOKE = {
    "seeds": (0,), "estimators": ("outcome", "turn_return"), "eval_tasks": 4, "eval_warmstart": True,
    "warmstart_episodes": 8, "warmstart_steps": 1, "token_budget": 1, "max_steps": 1, "num_generations": 2,
    "prompts_per_step": 1, "grpo_tasks": 4, "max_completion_length": 200, "warmup_steps": 0,
    "validation_tasks": 4, "gamma_candidates": (1.0,),
}


def env_kwargs(cfg: CreditBenchConfig, split: str, tok: Any) -> dict[str, Any]:
    from trainers.demo.compact_prompt import compact_tools_template

    return {"split": split, "steps": tuple(cfg.steps), "tokenizer": tok, "system_prompt": SYSTEM,
            "chat_template": compact_tools_template(), "answer_step": cfg.answer_step}


def _arms(cfg: CreditBenchConfig, validate: bool) -> list[tuple[int, str, float]]:
    """(seed, estimator, gamma) of every arm in run order. The comparison: outcome and the first turn-level
    estimator over every seed first, then the others (a run cut short still has paired arms on several seeds).
    Validation: one seed, outcome and turn_return at every candidate gamma."""
    if validate:
        seed = cfg.seeds[0]
        return [(seed, "outcome", 1.0)] + [(seed, "turn_return", g) for g in cfg.gamma_candidates]
    order = [(s, e, cfg.gamma) for s in cfg.seeds for e in cfg.estimators[:2]]
    return order + [(s, e, cfg.gamma) for e in cfg.estimators[2:] for s in cfg.seeds]


def _arm_name(est: str, gamma: float, seed: int, validate: bool) -> str:
    return f"{est}@{gamma:g}/seed{seed}" if validate and est != "outcome" else f"{est}/seed{seed}"


@dataclass(frozen=True)
class Plan:
    """The stages of one run (:func:`plan`): the warm start, its evaluation, and ``(arm name, stage, estimator,
    seed, gamma)`` per arm in run order."""

    warmstart: Stage
    warmstart_eval: Stage
    arms: tuple[tuple[str, Stage, str, int, float], ...]


def plan(cfg: CreditBenchConfig, validate: bool = False) -> Plan:
    """The run's stages and their specs, from the configuration alone (no model, no tokenizer)."""
    env = {"id": ENV_ID, "steps": list(cfg.steps), "answer_step": cfg.answer_step, "system": SYSTEM,
           "template": "compact_tools", "max_turn_tokens": cfg.max_turn_tokens}
    ws = Stage("warmstart", {"env": env, "model": cfg.model or "embedded SmolLM2-135M-Instruct",
                             "episodes": cfg.warmstart_episodes, "task_seed": 1, "steps": cfg.warmstart_steps,
                             "lr": cfg.warmstart_lr, "batch_size": cfg.warmstart_batch_size, "torch_seed": 0})
    if validate:  # train-split tasks minus every task a GRPO arm of these seeds trains on
        ev = {"split": "validation", "tasks": cfg.validation_tasks, "seed": cfg.validation_seed,
              "excluded_grpo_draws": {"seeds": sorted(cfg.seeds), "tasks": cfg.grpo_tasks}}
    else:
        ev = {"split": "test", "tasks": cfg.eval_tasks, "seed": cfg.eval_seed}
    ev["batch_size"] = cfg.eval_batch_size
    wse = Stage(f"warmstart-eval-{ev['split']}", {"warmstart": ws.key, "eval": ev})
    arms = []
    for seed, est, gamma in _arms(cfg, validate):
        mid = est != "outcome" and not validate
        spec = {"warmstart": ws.key, "env": env, "eval": ev, "estimator": est, "seed": seed,
                "gamma": None if est == "outcome" else gamma,  # outcome ignores gamma
                "mid_fraction": cfg.mid_fraction if mid else None, "token_budget": cfg.token_budget,
                "max_steps": cfg.max_steps, "warmup_steps": cfg.warmup_steps, "num_generations": cfg.num_generations,
                "prompts_per_step": cfg.prompts_per_step, "lr": cfg.lr, "temperature": cfg.temperature,
                "max_completion_length": cfg.max_completion_length, "grpo_tasks": cfg.grpo_tasks,
                "task_seed": 100 + seed, "extra": cfg.extra}
        g = "" if est == "outcome" else f"-g{gamma:g}"
        stage = Stage(f"{'val' if validate else 'arm'}-{est}{g}-seed{seed}", spec)
        arms.append((_arm_name(est, gamma, seed, validate), stage, est, seed, gamma))
    return Plan(ws, wse, tuple(arms))


def default_results_dir(cfg: CreditBenchConfig) -> Path:
    """``benchmarks/credit/results`` (committed) for a run of the embedded model; ``OUT/results`` for the tiny
    test model, so a test never writes into the repository."""
    if cfg.model == "tiny":
        return Path(cfg.output_dir) / "results"
    return RESULTS
