"""Turn-level credit vs outcome-only GRPO on ``toolgym/CalculatorChain-v0``, measured on held-out tasks.

Protocol v2 (docs/credit.md states it in full; every arm identical except the ``advantage`` estimator):

1. The task: CalculatorChain-v0 with ``answer_step=True`` (chains of 2 dependent steps): the process reward pays
   each verified chain value *and* the answer turn (the final value answered with no call after the chain), and a
   call after the chain is complete loses a share; process rewards stay below a right outcome.
2. One warm start, shared by every arm: a few masked-SFT steps of the embedded SmolLM2-135M on oracle episodes of
   the ``train`` split.
3. For each training seed (5) and estimator (``outcome``, ``turn_return``, ``gigpo``): GRPO through
   :func:`trainers.grpo.build_trainer` from the warm-start weights, the same train tasks and seed, a linear
   learning-rate warm-up, until the same budget of **generated policy tokens** is spent (``token_budget``; the
   step that crosses it finishes). Every turn-level arm is also evaluated when it crosses ``mid_fraction`` (60%)
   of the budget.
4. Held-out evaluation of every model: ``eval_tasks`` distinct ``test``-split chains, fixed seeds, greedy. Per seed:
   paired 95% CIs over tasks (arm - outcome). Across seeds: the paired t-interval over the per-seed differences and
   a hierarchical bootstrap (seeds, then tasks within a seed) 95% CI.
5. Verdict: turn-level credit helps when, across seeds, its held-out success at 60% of the budget reaches outcome's
   final success (the across-seed CI of mid - outcome-final excludes values below 0 by its lower end >= 0 and its
   mean >= 0), or its final success beats outcome's (the across-seed CI excludes 0); otherwise it does not.

Knobs chosen before any test-split run: ``--validate`` runs ``outcome`` and ``turn_return`` at each candidate
gamma on one seed and evaluates on a validation draw of ``train`` tasks (disjoint ids from the GRPO draws); it
checks that outcome-only GRPO learns (validation success above the warm start's) and picks gamma by the rule in
docs/credit.md. Nothing is chosen on the held-out tasks. Results go to ``OUTPUT/results.json`` after every arm (a
rerun with the same output dir resumes: finished arms are skipped), the plot to ``OUTPUT/credit.png``.

Run::

    python -m benchmarks.credit --validate --output-dir runs/credit-validation   # the knobs, on train tasks
    python -m benchmarks.credit --gamma G --output-dir runs/credit               # the comparison (resumable)
    python -m benchmarks.credit --report --output-dir runs/credit                # table and verdict from results
    python -m benchmarks.credit --smoke --output-dir runs/credit-smoke           # the pipeline end to end
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["CreditBenchConfig", "main", "run"]

ENV_ID = "toolgym/CalculatorChain-v0"
SYSTEM = "Call the calculator once per step, then reply <answer>RESULT</answer>."


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
    lr: float = 3e-5
    temperature: float = 0.5
    max_completion_length: int = 320
    grpo_tasks: int = 128
    extra: dict[str, Any] = field(default_factory=dict)


SMOKE = {
    "seeds": (0,), "estimators": ("outcome", "turn_return"), "eval_tasks": 4, "eval_warmstart": True,
    "warmstart_episodes": 8, "warmstart_steps": 1, "token_budget": 1, "max_steps": 1, "num_generations": 2,
    "prompts_per_step": 1, "grpo_tasks": 4, "max_completion_length": 200, "warmup_steps": 0,
    "validation_tasks": 4, "gamma_candidates": (1.0,),
}


def _env_kwargs(cfg: CreditBenchConfig, split: str, tok: Any) -> dict[str, Any]:
    from trainers.demo.compact_prompt import compact_tools_template

    return {"split": split, "steps": tuple(cfg.steps), "tokenizer": tok, "system_prompt": SYSTEM,
            "chat_template": compact_tools_template(), "answer_step": cfg.answer_step}


def _save(out: Path, results: dict[str, Any]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(out / "results.json")


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


def run(cfg: CreditBenchConfig, *, validate: bool = False) -> dict[str, Any]:
    """Run (or resume) the comparison, or with ``validate`` the validation run on train-split tasks; returns the
    results dict (also ``output_dir/results.json``)."""
    import torch

    import toolgym  # noqa: F401
    from toolgym.envs.calculator_chain import chain_progress
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import oracle_policy, wilson_interval
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.resources import release_memory
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from trainers.grpo import Config as GRPORun
    from trainers.grpo import build_trainer
    from trainers.sft import collect, masked_sft

    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prev = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    results: dict[str, Any] = {"config": asdict(cfg), "env_id": ENV_ID, "arms": prev.get("arms", {}),
                               "warmstart": prev.get("warmstart")}
    if cfg.model == "tiny":
        from toolgym.models import load_tokenizer, tiny_random_model

        tok = load_tokenizer()
        model = tiny_random_model(tok)
    else:
        model, tok = load_model(cfg.model)
    ev_kw = _env_kwargs(cfg, "test", tok)
    tr_kw = _env_kwargs(cfg, "train", tok)
    if validate:  # a draw of train-split tasks that no GRPO arm of these seeds trains on
        trained = {t["id"] for seed in cfg.seeds
                   for t in draw_tasks(ENV_ID, cfg.grpo_tasks, seed=100 + seed, split="train", env_kwargs=tr_kw)}
        pool = draw_tasks(ENV_ID, 2 * cfg.validation_tasks, seed=cfg.validation_seed, split="train", env_kwargs=tr_kw)
        eval_tasks = [t for t in pool if t["id"] not in trained][:cfg.validation_tasks]
        eval_first, eval_env_kw = cfg.validation_seed, tr_kw
    else:
        eval_tasks = draw_tasks(ENV_ID, cfg.eval_tasks, seed=cfg.eval_seed, split="test", env_kwargs=ev_kw)
        eval_first, eval_env_kw = cfg.eval_seed, ev_kw
    eval_seeds = list(range(eval_first, eval_first + len(eval_tasks)))
    venv = make_vector_env(ENV_ID, len(eval_tasks), eval_env_kw)
    results["eval_split"] = "validation (train split)" if validate else "test"
    results["eval_task_ids"] = [t["id"] for t in eval_tasks]

    def evaluate(m: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        m.eval()
        policy = TransformersPolicy(m, tok, do_sample=False, return_logprobs=False,
                                    max_batch_size=cfg.eval_batch_size or None)
        driver = RolloutDriver(venv, policy, max_turn_tokens=cfg.max_turn_tokens)
        trajs = driver.run(eval_tasks, seeds=eval_seeds, progress=False)
        wins = [float(t.outcome_reward >= 1.0) for t in trajs]
        prog = [chain_progress(t.turns, t.task) / len(t.task["values"]) for t in trajs]
        return {"success": sum(wins) / len(wins), "success_ci95": list(wilson_interval(sum(wins), len(wins))),
                "wins": wins, "steps_reached": sum(prog) / len(prog), "per_task_progress": prog,
                "tool_call_rate": sum(bool(t.tool_calls) for t in trajs) / len(trajs),
                "wall_s": round(time.perf_counter() - t0, 1)}

    # -- warm start (shared) ------------------------------------------------------------------------------------
    ws_path = out / "warmstart.pt"
    if ws_path.exists():
        model.load_state_dict(torch.load(ws_path))
    else:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        ws_tasks = draw_tasks(ENV_ID, cfg.warmstart_episodes, seed=1, split="train", env_kwargs=tr_kw)
        kept, _ = collect(ENV_ID, oracle_policy(), ws_tasks, seeds=0, num_envs=min(16, len(ws_tasks)),
                          max_turn_tokens=cfg.max_turn_tokens, env_kwargs=tr_kw)
        losses = masked_sft(model, kept, steps=cfg.warmstart_steps, lr=cfg.warmstart_lr,
                            batch_size=cfg.warmstart_batch_size, seed=0)
        torch.save(model.state_dict(), ws_path)
        results["warmstart"] = {"episodes": len(kept), "loss": losses, "wall_s": round(time.perf_counter() - t0, 1)}
    _save(out, results)
    if cfg.eval_warmstart and not (results.get("warmstart") or {}).get("eval"):
        results.setdefault("warmstart", {})["eval"] = evaluate(model)
        _save(out, results)
    ws = (results.get("warmstart") or {}).get("eval")
    if ws:
        print(f"[credit] warm start: held-out success {ws['success']:.1%} steps reached {ws['steps_reached']:.1%} "
              f"({ws['wall_s']:.0f} s eval)", flush=True)
    ws_state = copy.deepcopy(model.state_dict())
    Budget = _budget_callback()  # noqa: N806

    # -- arms ---------------------------------------------------------------------------------------------------
    for seed, est, gamma in _arms(cfg, validate):
        name = _arm_name(est, gamma, seed, validate)
        if name not in results["arms"]:
            t0 = time.perf_counter()
            model.load_state_dict(ws_state)
            model.train()
            torch.manual_seed(seed)
            curve: list[dict[str, Any]] = []
            holder: dict[str, Any] = {"tokens": 0}
            if est != "outcome" and not validate:  # held-out success at mid_fraction of the budget
                holder["mid"] = (cfg.mid_fraction * cfg.token_budget, evaluate)

            bs = cfg.num_generations * cfg.prompts_per_step
            trl = {
                "output_dir": str(out / "grpo" / name), "max_steps": cfg.max_steps, "learning_rate": cfg.lr,
                "per_device_train_batch_size": bs, "num_generations": cfg.num_generations,
                "max_completion_length": cfg.max_completion_length, "temperature": cfg.temperature, "beta": 0.0,
                "logging_steps": 1, "save_strategy": "no", "report_to": [], "seed": seed,
                "use_cpu": not torch.cuda.is_available(), "disable_tqdm": True, "gradient_checkpointing": False,
                "warmup_steps": cfg.warmup_steps, "lr_scheduler_type": "constant_with_warmup",
            }
            gcfg = GRPORun(env_id=ENV_ID, env_kwargs={k: v for k, v in tr_kw.items() if k != "tokenizer"},
                           max_turn_tokens=cfg.max_turn_tokens, advantage=est, gamma=gamma, save_model=False,
                           trajectory_dir=str(out / "trajectories" / name.replace("/", "_")), trl=trl)
            tasks = draw_tasks(ENV_ID, cfg.grpo_tasks, seed=100 + seed, split="train", env_kwargs=tr_kw)
            trainer, rollout = build_trainer(gcfg, model=model, tokenizer=tok, tasks=tasks,
                                             callbacks=[Budget(holder, curve, cfg.token_budget)])
            holder["rollout"] = rollout
            trainer.train()
            rollout.close()
            train_s = time.perf_counter() - t0
            steps_done = trainer.state.global_step
            # free this arm's trainer (AdamW moments, accelerate's references) before the next: kept alive, the 9
            # arms' trainers took the process to a 20 GB peak (docs/training.md)
            trainer.accelerator.free_memory()
            del trainer, rollout
            holder.pop("rollout", None)
            model.zero_grad(set_to_none=True)
            release_memory()
            ev = evaluate(model)
            results["arms"][name] = {"estimator": est, "gamma": gamma, "seed": seed, "curve": curve,
                                     "tokens": holder["tokens"], "steps": steps_done, "train_s": round(train_s, 1),
                                     "eval": ev, "mid_eval": holder.get("mid_eval")}
            print(f"[credit] {name}: {steps_done} steps, {holder['tokens']} policy tokens, "
                  f"held-out success {ev['success']:.1%} steps reached {ev['steps_reached']:.1%} "
                  f"(train {train_s:.0f} s, eval {ev['wall_s']:.0f} s)", flush=True)
            results["summary"] = summarize(results)
            results["total_wall_s"] = round(time.perf_counter() - t_start + prev.get("total_wall_s", 0.0), 1)
            _save(out, results)
            plot(results, out / "credit.png")
    results["summary"] = summarize(results)
    _save(out, results)
    plot(results, out / "credit.png")
    venv.close()
    print(json.dumps(results["summary"], indent=1), flush=True)
    return results


def _budget_callback() -> type:
    from transformers import TrainerCallback

    class Budget(TrainerCallback):
        """Stops training once ``budget`` generated policy tokens are spent; records the learning curve."""

        def __init__(self, holder: dict[str, Any], curve: list[dict[str, Any]], budget: int) -> None:
            self.holder, self.curve, self.budget = holder, curve, budget

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            trajs = self.holder["rollout"].last_trajectories
            self.holder["tokens"] += sum(sum(t.loss_mask) for t in trajs)
            mid = self.holder.get("mid")
            if mid is not None and "mid_eval" not in self.holder and self.holder["tokens"] >= mid[0] and model is not None:
                was_training = model.training
                self.holder["mid_eval"] = {**mid[1](model), "step": state.global_step, "tokens": self.holder["tokens"]}
                model.train(was_training)
            if self.holder["tokens"] >= self.budget:
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                self.curve.append({"step": state.global_step, "tokens": self.holder["tokens"],
                                   "reward": logs.get("reward"), "success": logs.get("toolgym/success"),
                                   "process_reward": logs.get("toolgym/process_reward"),
                                   "frac_reward_zero_std": logs.get("frac_reward_zero_std")})

    return Budget


#: non-inferiority margin of the "reaches outcome's final success in 60% of the budget" criterion (success points)
MID_MARGIN = 0.05


def across_seeds(base: dict[int, list[float]], arm: dict[int, list[float]], *, n_boot: int = 4000,
                 seed: int = 0) -> dict[str, Any]:
    """``arm - base`` held-out success across training seeds, each a list of per-task wins on the same tasks.

    Returns ``per_seed`` differences (mean over tasks), their ``mean``, the paired t-interval over seeds
    (``t_lo``, ``t_hi``: n_seeds - 1 degrees of freedom), a hierarchical bootstrap 95% CI (``boot_lo``,
    ``boot_hi``: resample seeds, then tasks within each drawn seed) and ``positive`` (seeds with a difference > 0).
    """
    import numpy as np

    from toolgym.evaluation import paired_difference_ci

    common = sorted(set(base) & set(arm))
    if not common:
        return {"seeds": []}
    b = {k: np.asarray(base[k], dtype=float) for k in common}
    a = {k: np.asarray(arm[k], dtype=float) for k in common}
    per_seed = [float(a[k].mean() - b[k].mean()) for k in common]
    t = paired_difference_ci([float(b[k].mean()) for k in common], [float(a[k].mean()) for k in common])
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    for i in range(n_boot):
        drawn = rng.choice(len(common), size=len(common), replace=True)
        diffs = []
        for j in drawn:
            k = common[int(j)]
            idx = rng.integers(0, len(b[k]), size=len(b[k]))
            diffs.append(float(a[k][idx].mean() - b[k][idx].mean()))
        stats[i] = float(np.mean(diffs))
    return {"seeds": common, "per_seed": per_seed, "mean": float(np.mean(per_seed)), "t_lo": t["lo"],
            "t_hi": t["hi"], "boot_lo": float(np.quantile(stats, 0.025)), "boot_hi": float(np.quantile(stats, 0.975)),
            "positive": sum(d > 0 for d in per_seed)}


def verdict(summary: dict[str, Any], est: str) -> str:
    """The protocol's one-sentence answer for ``est`` from :func:`summarize`'s across-seed statistics."""
    s = summary.get(est) or {}
    final, mid = s.get("final_vs_outcome_across_seeds") or {}, s.get("mid_vs_outcome_final_across_seeds") or {}
    if not final.get("seeds"):
        return f"{est}: no paired seeds yet"
    n = len(final["seeds"])
    beats = final["t_lo"] > 0 and final["boot_lo"] > 0
    reaches = bool(mid.get("seeds")) and mid["mean"] >= 0 and mid["boot_lo"] > -MID_MARGIN
    if beats or reaches:
        how = []
        if reaches:
            how.append(f"reaches outcome-only GRPO's final held-out success at 60% of the budget "
                       f"({mid['mean']:+.1%}, bootstrap CI [{mid['boot_lo']:+.1%}, {mid['boot_hi']:+.1%}])")
        if beats:
            how.append(f"beats it at equal budget ({final['mean']:+.1%}, t CI [{final['t_lo']:+.1%}, "
                       f"{final['t_hi']:+.1%}], bootstrap CI [{final['boot_lo']:+.1%}, {final['boot_hi']:+.1%}])")
        return f"{est} helps across {n} seeds: it " + " and ".join(how) + "."
    return (f"{est} does not help across {n} seeds: at equal budget {final['mean']:+.1%} (t CI [{final['t_lo']:+.1%}, "
            f"{final['t_hi']:+.1%}], bootstrap CI [{final['boot_lo']:+.1%}, {final['boot_hi']:+.1%}]), at 60% of the "
            f"budget vs outcome's final {mid.get('mean', float('nan')):+.1%}.")


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Per estimator: held-out success per seed; vs ``outcome``: paired differences per seed and pooled, and the
    across-seed statistics of the final and the 60%-budget evaluations (:func:`across_seeds`)."""
    from toolgym.evaluation import paired_difference_ci

    arms = results["arms"]
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for a in arms.values():
        by.setdefault(a["estimator"], {})[a["seed"]] = a
    out: dict[str, Any] = {}
    base = by.get("outcome", {})
    for est, seeds in by.items():
        s: dict[str, Any] = {"seeds": sorted(seeds), "success": {k: v["eval"]["success"] for k, v in seeds.items()},
                             "steps_reached": {k: v["eval"]["steps_reached"] for k, v in seeds.items()},
                             "tokens": {k: v["tokens"] for k, v in seeds.items()}}
        if est != "outcome":
            common = sorted(set(seeds) & set(base))
            s["vs_outcome_per_seed"] = {k: paired_difference_ci(base[k]["eval"]["wins"], seeds[k]["eval"]["wins"])
                                        for k in common}
            if common:
                n = len(base[common[0]]["eval"]["wins"])
                mean_b = [sum(base[k]["eval"]["wins"][i] for k in common) / len(common) for i in range(n)]
                mean_e = [sum(seeds[k]["eval"]["wins"][i] for k in common) / len(common) for i in range(n)]
                s["vs_outcome_pooled"] = paired_difference_ci(mean_b, mean_e)
                pb = [sum(base[k]["eval"]["per_task_progress"][i] for k in common) / len(common) for i in range(n)]
                pe = [sum(seeds[k]["eval"]["per_task_progress"][i] for k in common) / len(common) for i in range(n)]
                s["steps_reached_vs_outcome_pooled"] = paired_difference_ci(pb, pe)
            base_wins = {k: base[k]["eval"]["wins"] for k in common}
            s["final_vs_outcome_across_seeds"] = across_seeds(base_wins, {k: seeds[k]["eval"]["wins"] for k in common})
            mids = {k: seeds[k]["mid_eval"]["wins"] for k in common if seeds[k].get("mid_eval")}
            s["mid_vs_outcome_final_across_seeds"] = across_seeds(base_wins, mids)
        out[est] = s
    return out


def validation_choice(results: dict[str, Any]) -> dict[str, Any]:
    """The validation run's decisions, by the rules fixed in docs/credit.md: does outcome-only GRPO learn (its
    validation success above the warm start's, the paired 95% CI over tasks above 0), and gamma = the candidate
    whose turn_return arm has the highest validation success (ties: the larger gamma)."""
    from toolgym.evaluation import paired_difference_ci

    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("wins")
    arms = list(results["arms"].values())
    outcome = next((a for a in arms if a["estimator"] == "outcome"), None)
    learns = None
    if ws is not None and outcome is not None:
        d = paired_difference_ci(ws, outcome["eval"]["wins"])
        learns = {"warmstart": sum(ws) / len(ws), "outcome": outcome["eval"]["success"], "diff": d,
                  "learns": d["lo"] > 0}
    tr = [a for a in arms if a["estimator"] == "turn_return"]
    best = max(tr, key=lambda a: (a["eval"]["success"], a.get("gamma", 1.0)), default=None)
    return {"outcome_learns": learns, "gamma": best.get("gamma") if best else None,
            "turn_return_success_by_gamma": {str(a.get("gamma")): a["eval"]["success"] for a in tr}}


def report_markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per finished arm) plus the paired comparisons available."""
    lines = ["| arm | GRPO steps | policy tokens | held-out success [95% CI] | chain steps reached | train s | eval s |",
             "|---|---|---|---|---|---|---|"]
    for name, a in results["arms"].items():
        ev = a["eval"]
        lo, hi = ev["success_ci95"]
        lines.append(f"| {name} | {a['steps']} | {a['tokens']} | {ev['success']:.0%} [{lo:.0%}, {hi:.0%}] | "
                     f"{ev['steps_reached']:.1%} | {a['train_s']:.0f} | {ev['wall_s']:.0f} |")
    summary = results.get("summary") or {}
    for est, s in summary.items():
        if est == "outcome":
            continue
        for key, label in (("vs_outcome_pooled", "success"), ("steps_reached_vs_outcome_pooled", "steps reached")):
            d = s.get(key)
            if d:
                lines.append(f"\n{est} - outcome, {label} (paired over {d['n']} tasks, seeds {s['seeds']}): "
                             f"{d['mean']:+.3f} [95% CI {d['lo']:+.3f}, {d['hi']:+.3f}]")
        if not str(results.get("eval_split", "test")).startswith("validation"):
            lines.append(f"\nVerdict: {verdict(summary, est)}")
    if str(results.get("eval_split", "")).startswith("validation"):
        lines.append(f"\nValidation decisions: {json.dumps(validation_choice(results), default=str)}")
    return "\n".join(lines)


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def plot(results: dict[str, Any], path: Path) -> None:
    """Learning curves (training success and training process reward vs generated tokens, one line per arm,
    colour per estimator) and the held-out result per estimator (success and chain steps reached: mean over seeds,
    each seed a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"outcome": "#777", "turn_return": "#2f6db5", "gigpo": "#d9822b"}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    seen = set()
    for a in results["arms"].values():
        est = a["estimator"]
        xs = [c["tokens"] for c in a["curve"]]
        label = None if est in seen else est
        ax1.plot(xs, [_num(c["success"]) for c in a["curve"]], "o-", color=colors.get(est, "k"), alpha=0.6, ms=3,
                 label=label)
        ax2.plot(xs, [_num(c["process_reward"]) for c in a["curve"]], "o-", color=colors.get(est, "k"), alpha=0.6, ms=3,
                 label=label)
        seen.add(est)
    for ax, what in ((ax1, "success"), (ax2, "process reward (max 0.5)")):
        ax.set_xlabel("generated policy tokens")
        ax.set_ylabel(f"training {what}, per step")
        ax.legend(fontsize=8)
    ax1.set_ylim(-0.05, 1.05)
    ax2.set_ylim(-0.02, 0.52)
    ax1.set_title("GRPO learning curves, train split (line = seed)", fontsize=10)
    ax2.set_title("verified intermediate steps, train split", fontsize=10)
    ests = [e for e in ("outcome", "turn_return", "gigpo") if any(a["estimator"] == e for a in results["arms"].values())]
    ws = (results.get("warmstart") or {}).get("eval") or {}
    for i, est in enumerate(ests):
        arms = [a for a in results["arms"].values() if a["estimator"] == est]
        for off, key, alpha in ((-0.2, "success", 0.8), (0.2, "steps_reached", 0.4)):
            vals = [a["eval"][key] for a in arms]
            ax3.bar(i + off, sum(vals) / len(vals), width=0.38, color=colors.get(est, "k"), alpha=alpha)
            ax3.plot([i + off] * len(vals), vals, "ko", ms=4)
    if ws:
        ax3.axhline(ws["success"], color="k", ls=":", lw=1, label=f"warm start: success {ws['success']:.0%}")
        ax3.axhline(ws["steps_reached"], color="k", ls="--", lw=1,
                    label=f"warm start: steps reached {ws['steps_reached']:.0%}")
        ax3.legend(fontsize=8)
    ax3.set_xticks(range(len(ests)), [f"{e}\n(success | steps)" for e in ests])
    ax3.set_ylim(0, 1.05)
    n = len(results.get("eval_task_ids", []))
    ax3.set_title(f"held-out: {n} test chains, greedy (dots = seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="turn-level credit vs outcome-only GRPO on CalculatorChain-v0")
    ap.add_argument("--output-dir", default=None, help="where results.json, credit.png, trajectories go")
    ap.add_argument("--smoke", action="store_true", help="a ~2-minute end-to-end run (1 seed, 1 step, 4 tasks)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default 0 1 2)")
    ap.add_argument("--estimators", nargs="+", default=None, help="default: outcome turn_return gigpo")
    ap.add_argument("--token-budget", type=int, default=None, help="generated policy tokens per arm")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--report", action="store_true", help="print OUTPUT/results.json as Markdown, redraw OUTPUT/credit.png and exit")
    ap.add_argument("--model", default=None, help="model path; default the embedded SmolLM2-135M ('tiny': tests)")
    ap.add_argument("--validate", action="store_true",
                    help="the validation run: outcome and turn_return at each candidate gamma, one seed, evaluated on "
                         "train-split tasks no arm trains on (chooses gamma; checks that outcome GRPO learns)")
    ap.add_argument("--gamma", type=float, default=None, help="turn_return / gigpo discount (from --validate)")
    a = ap.parse_args(argv)
    cfg = CreditBenchConfig()
    if a.smoke:
        cfg = replace(cfg, output_dir="runs/credit-smoke", **SMOKE)  # type: ignore[arg-type]
    if a.output_dir:
        cfg.output_dir = a.output_dir
    if a.seeds:
        cfg.seeds = tuple(a.seeds)
    if a.estimators:
        cfg.estimators = tuple(a.estimators)
    if a.token_budget is not None:
        cfg.token_budget = a.token_budget
    if a.threads is not None:
        cfg.threads = a.threads
    if a.model is not None:
        cfg.model = a.model
    if a.gamma is not None:
        cfg.gamma = a.gamma
    if a.validate and not a.output_dir:
        cfg.output_dir += "-validation"
    if a.report:
        results = json.loads((Path(cfg.output_dir) / "results.json").read_text())
        plot(results, Path(cfg.output_dir) / "credit.png")
        print(report_markdown(results))
        return 0
    run(cfg, validate=a.validate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
