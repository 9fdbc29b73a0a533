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
docs/credit.md. Nothing is chosen on the held-out tasks.

Resumable stages (:mod:`benchmarks.credit_stages`): the warm start, its evaluation and every arm (with its
mid-budget and final evaluations) is a stage keyed by a hash of its configuration. A finished stage leaves
``OUTPUT/<stage>-<key>/done.json`` and a small record ``RESULTS/<stage>-<key>.json`` (default
``benchmarks/results/credit/``, committed) and is skipped by a rerun; an arm cut short resumes from its last GRPO
checkpoint (every ``save_steps`` steps and its last step). The verdict is computed from the records alone
(``--report``), so a run continues on another machine with what remains. ``OUTPUT/results.json`` and
``OUTPUT/credit.png`` collect the finished arms after each one.

Run::

    python -m benchmarks.credit --validate --output-dir runs/credit-validation   # the knobs, on train tasks
    python -m benchmarks.credit --gamma G --output-dir runs/credit               # the comparison (resumable)
    python -m benchmarks.credit --gamma G --report                               # table and verdict from records
    python -m benchmarks.credit --smoke --output-dir runs/credit-smoke           # the pipeline end to end
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.credit_stages import (  # noqa: E402
    Stage,
    finish,
    latest_checkpoint,
    load_done,
    state_digest,
    system_info,
    write_json,
)
from benchmarks.stages import claim_each, stage_lock  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["CreditBenchConfig", "Plan", "collect_results", "main", "plan", "run"]

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


def _env_kwargs(cfg: CreditBenchConfig, split: str, tok: Any) -> dict[str, Any]:
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
    """``benchmarks/results/credit`` (committed) for a run of the embedded model; ``OUT/results`` for the tiny
    test model, so a test never writes into the repository."""
    if cfg.model == "tiny":
        return Path(cfg.output_dir) / "results"
    return Path(__file__).resolve().parent / "results" / "credit"


def collect_results(cfg: CreditBenchConfig, validate: bool = False,
                    results_dir: str | Path | None = None) -> dict[str, Any]:
    """The run's results assembled from its stage records (``RESULTS/<stage>-<key>.json``) alone: the arms
    finished so far, the warm start's evaluation, the summary statistics. What ``--report`` prints."""
    p = plan(cfg, validate)
    rdir = Path(results_dir) if results_dir is not None else default_results_dir(cfg)
    out = Path(cfg.output_dir)
    results: dict[str, Any] = {"config": asdict(cfg), "env_id": ENV_ID,
                               "eval_split": "validation (train split)" if validate else "test",
                               "results_dir": str(rdir), "arms": {}, "warmstart": None}
    ws_rec = load_done(p.warmstart, out, rdir)
    wse_rec = load_done(p.warmstart_eval, out, rdir)
    if ws_rec or wse_rec:
        results["warmstart"] = {**{k: (ws_rec or {}).get(k) for k in ("episodes", "loss", "wall_s", "digest")},
                                "eval": (wse_rec or {}).get("eval")}
    for name, stage, *_ in p.arms:
        rec = load_done(stage, out, rdir)
        if rec is not None:
            results["arms"][name] = rec
            results.setdefault("eval_task_ids", rec.get("eval_task_ids"))
    if wse_rec:
        results.setdefault("eval_task_ids", wse_rec.get("eval_task_ids"))
    for name, rec in [*results["arms"].items(), ("warm start", wse_rec or {})]:
        if rec.get("eval_task_ids") not in (None, results.get("eval_task_ids")):  # paired statistics need one task set
            raise ValueError(f"{name}: evaluated on other tasks than the other records in {rdir}")
    results["summary"] = summarize(results)
    results["total_wall_s"] = round(sum(a.get("train_s", 0) + a["eval"]["wall_s"] for a in results["arms"].values()), 1)
    return results


def _fault(point: str) -> bool:
    """Fault injection for the resume tests: ``TOOLGYM_CREDIT_FAULT`` names the point (``save:N``: right after the
    checkpoint of step N is saved; ``trained``: after an arm's training, before its evaluation) where the process
    kills itself with SIGKILL. Unset: never."""
    if os.environ.get("TOOLGYM_CREDIT_FAULT") == point:
        print(f"[credit] fault injection: SIGKILL at {point}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return False


def run(cfg: CreditBenchConfig, *, validate: bool = False, results_dir: str | Path | None = None) -> dict[str, Any]:
    """Run (or resume) the comparison, or with ``validate`` the validation run on train-split tasks; returns the
    results (also ``OUT/results.json``).

    Every finished stage is skipped and read back from its record (:mod:`benchmarks.credit_stages`); an arm cut
    short resumes from its last complete GRPO checkpoint (every ``save_steps`` steps and at its last step)."""
    t_start = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rdir = Path(results_dir) if results_dir is not None else default_results_dir(cfg)
    p = plan(cfg, validate)
    todo = []
    for name, stage, est, seed, gamma in p.arms:
        if load_done(stage, out, rdir) is not None:
            print(f"[credit] skip {name}: finished ({stage.record_path(rdir)})", flush=True)
        else:
            todo.append((name, stage, est, seed, gamma))
    need_ws_eval = cfg.eval_warmstart and load_done(p.warmstart_eval, out, rdir) is None
    if todo or need_ws_eval:
        _run_stages(cfg, p, todo, need_ws_eval, out, rdir, validate)
    results = collect_results(cfg, validate, rdir)
    _write_outputs(results, out)
    print(json.dumps(results["summary"], indent=1), flush=True)
    print(f"[credit] {len(results['arms'])}/{len(p.arms)} arms finished ({time.perf_counter() - t_start:.0f} s)",
          flush=True)
    return results


def _write_outputs(results: dict[str, Any], out: Path) -> None:
    write_json(out / "results.json", results)
    if results["arms"]:
        plot(results, out / "credit.png")


def _run_stages(cfg: CreditBenchConfig, p: Plan, todo: list[tuple[str, Stage, str, int, float]], need_ws_eval: bool,
                out: Path, rdir: Path, validate: bool) -> None:
    import torch

    import toolgym  # noqa: F401
    from toolgym.envs.calculator_chain import chain_progress
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import oracle_policy, wilson_interval
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from trainers.sft import collect, masked_sft

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
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
    eval_ids = [t["id"] for t in eval_tasks]
    venv = make_vector_env(ENV_ID, len(eval_tasks), eval_env_kw)

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

    # -- warm start (shared): its weights stay under OUT; on a machine without them they are recomputed ----------
    ws_dir = p.warmstart.dir(out)
    ws_file = ws_dir / "warmstart.pt"
    with _locked(p.warmstart, out):  # held until this process has the weights (made here or elsewhere meanwhile)
        ws_done = (ws_dir / "done.json").exists() and ws_file.exists()
        if ws_done:
            model.load_state_dict(torch.load(ws_file))
            print(f"[credit] skip warm start: weights from {ws_file}", flush=True)
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            torch.manual_seed(0)
            ws_tasks = draw_tasks(ENV_ID, cfg.warmstart_episodes, seed=1, split="train", env_kwargs=tr_kw)
            kept, _ = collect(ENV_ID, oracle_policy(), ws_tasks, seeds=0, num_envs=min(16, len(ws_tasks)),
                              max_turn_tokens=cfg.max_turn_tokens, env_kwargs=tr_kw)
            losses = masked_sft(model, kept, steps=cfg.warmstart_steps, lr=cfg.warmstart_lr,
                                batch_size=cfg.warmstart_batch_size, seed=0)
            ws_dir.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), ws_dir / "warmstart.pt.tmp")
            os.replace(ws_dir / "warmstart.pt.tmp", ws_file)
            digest = state_digest(model.state_dict())
            prior = load_done(p.warmstart, out, rdir)
            if prior is not None and prior.get("digest") != digest:
                print(f"[credit] warning: the recomputed warm start's weights differ from the recorded ones "
                      f"({digest} vs {prior.get('digest')}); arms started from either are recorded with their digest",
                      flush=True)
            rec = {"episodes": len(kept), "loss": losses, "digest": digest,
                   "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
                   "system": system_info(cfg.threads)}
            if prior is None:
                finish(p.warmstart, out, rdir, rec)
            else:  # the committed record stays; this machine's weights are marked done under OUT only
                write_json(ws_dir / "done.json", {**prior, "recomputed": rec})
    ws_digest = state_digest(model.state_dict())
    if need_ws_eval:
        with _locked(p.warmstart_eval, out):
            if load_done(p.warmstart_eval, out, rdir) is None:
                ev = evaluate(model)
                finish(p.warmstart_eval, out, rdir, {"eval": ev, "eval_task_ids": eval_ids,
                                                     "warmstart_digest": ws_digest, "system": system_info(cfg.threads)})
                print(f"[credit] warm start: held-out success {ev['success']:.1%} steps reached "
                      f"{ev['steps_reached']:.1%} ({ev['wall_s']:.0f} s eval)", flush=True)
    ws_state = copy.deepcopy(model.state_dict())

    # arms another process is training are left for later, then waited for (benchmarks.stages.claim_each)
    for name, stage, est, seed, gamma in claim_each(todo, lambda item, wait: _locked(item[1], out, wait)):
        if load_done(stage, out, rdir) is not None:  # another process finished it meanwhile
            print(f"[credit] skip {name}: finished by another process", flush=True)
            continue
        rec = _train_arm(cfg, stage, name, est, seed, gamma, validate, model, tok, ws_state, tr_kw, evaluate, out)
        rec.update(eval_task_ids=eval_ids, warmstart_digest=ws_digest, system=system_info(cfg.threads))
        finish(stage, out, rdir, rec)
        shutil.rmtree(stage.dir(out) / "grpo", ignore_errors=True)  # the checkpoints: the record holds the result
        ev = rec["eval"]
        print(f"[credit] {name}: {rec['steps']} steps, {rec['tokens']} policy tokens, "
              f"held-out success {ev['success']:.1%} steps reached {ev['steps_reached']:.1%} "
              f"(train {rec['train_s']:.0f} s, eval {ev['wall_s']:.0f} s) -> {stage.record_path(rdir)}", flush=True)
        _write_outputs(collect_results(cfg, validate, rdir), out)
    venv.close()


def _locked(stage: Stage, out: Path, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
    """The stage's lock, ``OUT/<stage>-<key>.lock`` (:func:`benchmarks.stages.stage_lock`; yields whether it is
    held): processes sharing ``OUT`` never run one stage at once."""
    return stage_lock(stage.dir(out).with_name(stage.id + ".lock"), stage.id, wait)


def _train_arm(cfg: CreditBenchConfig, stage: Stage, name: str, est: str, seed: int, gamma: float, validate: bool,
               model: Any, tok: Any, ws_state: dict[str, Any], tr_kw: dict[str, Any], evaluate: Any,
               out: Path) -> dict[str, Any]:
    """Train one arm from the warm start (or resume it from its last complete checkpoint) and evaluate it; returns
    its record (without the stage fields)."""
    import torch

    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.resources import release_memory
    from trainers.grpo import Config as GRPORun
    from trainers.grpo import build_trainer

    sdir = stage.dir(out)
    grpo_dir, progress_dir = sdir / "grpo", sdir / "progress"
    last = latest_checkpoint(grpo_dir, progress_dir)
    progress: dict[str, Any] = dict(last[2]) if last else {"tokens": 0, "curve": [], "mid_eval": None,
                                                            "train_s": 0.0, "cpu_s": 0.0, "runs": []}
    start = last[1] if last else 0
    model.load_state_dict(ws_state)
    model.train()
    torch.manual_seed(seed)
    if last and progress.get("finished"):  # trained to the end; killed before its evaluation finished
        print(f"[credit] {name}: trained ({start} steps); weights from {last[0]}", flush=True)
        _load_checkpoint_weights(model, last[0])
    else:
        print(f"[credit] {name}: " + (f"resume from step {start} ({last[0]})" if last else "train"), flush=True)
        holder: dict[str, Any] = {"progress": progress, "start": start, "t0": time.perf_counter(),
                                  "c0": time.process_time(), "budget": cfg.token_budget, "max_steps": cfg.max_steps,
                                  "dir": progress_dir}
        if est != "outcome" and not validate:  # held-out success at mid_fraction of the budget
            holder["mid"] = (cfg.mid_fraction * cfg.token_budget, evaluate)
        bs = cfg.num_generations * cfg.prompts_per_step
        trl = {
            "output_dir": str(grpo_dir), "max_steps": cfg.max_steps, "learning_rate": cfg.lr,
            "per_device_train_batch_size": bs, "num_generations": cfg.num_generations,
            "max_completion_length": cfg.max_completion_length, "temperature": cfg.temperature, "beta": 0.0,
            "logging_steps": 1, "save_strategy": "steps", "save_steps": cfg.save_steps, "save_total_limit": 1,
            "report_to": [], "seed": seed, "use_cpu": not torch.cuda.is_available(), "disable_tqdm": True,
            "gradient_checkpointing": False, "warmup_steps": cfg.warmup_steps,
            "lr_scheduler_type": "constant_with_warmup",
        }
        gcfg = GRPORun(env_id=ENV_ID, env_kwargs={k: v for k, v in tr_kw.items() if k != "tokenizer"},
                       max_turn_tokens=cfg.max_turn_tokens, advantage=est, gamma=gamma, save_model=False,
                       trajectory_dir=str(sdir / "trajectories"), trl=trl)
        tasks = draw_tasks(ENV_ID, cfg.grpo_tasks, seed=100 + seed, split="train", env_kwargs=tr_kw)
        trainer, rollout = build_trainer(gcfg, model=model, tokenizer=tok, tasks=tasks,
                                         callbacks=[_budget_callback()(holder)])
        holder["rollout"] = rollout
        trainer.train(resume_from_checkpoint=str(last[0]) if last else None)
        rollout.close()
        # free this arm's trainer (AdamW moments, accelerate's references) before the next: kept alive, the 9
        # arms' trainers took the process to a 20 GB peak (docs/training.md)
        trainer.accelerator.free_memory()
        del trainer, rollout
        holder.clear()
        model.zero_grad(set_to_none=True)
        release_memory()
        _fault("trained")
        last = latest_checkpoint(grpo_dir, progress_dir)
        if last is None or not last[2].get("finished"):
            raise RuntimeError(f"{name}: training ended without a final checkpoint under {grpo_dir}")
        progress = dict(last[2])
    ev = evaluate(model)
    return {"name": name, "kind": "validation" if validate else "comparison", "estimator": est, "gamma": gamma,
            "seed": seed, "curve": progress["curve"], "tokens": progress["tokens"], "steps": last[1],
            "train_s": round(progress["train_s"], 1), "cpu_s": round(progress["cpu_s"], 1), "runs": progress["runs"],
            "eval": ev, "mid_eval": progress.get("mid_eval")}


def _load_checkpoint_weights(model: Any, path: Path) -> None:
    """The model weights of a Trainer checkpoint (``*.safetensors``; tied weights are stored once)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(str(f)))
    res = model.load_state_dict(state, strict=False)
    tied = {k for k, v in model.state_dict().items()
            if any(v.data_ptr() == w.data_ptr() for n, w in model.state_dict().items() if n != k)}
    if res.unexpected_keys or set(res.missing_keys) - tied:
        raise RuntimeError(f"checkpoint {path}: unexpected {res.unexpected_keys}, missing {res.missing_keys}")


def _budget_callback() -> type:
    from transformers import TrainerCallback

    class Budget(TrainerCallback):
        """Stops training once the budget of generated policy tokens is spent (the last step is saved as a
        checkpoint); keeps the arm's progress (tokens, learning curve, mid-budget evaluation, time) in
        ``progress/step-N.json`` at every step, where a resumed arm reads it back."""

        def __init__(self, holder: dict[str, Any]) -> None:
            self.holder = holder
            self.progress = holder["progress"]
            self.progress["runs"] = [*self.progress["runs"], {"from_step": holder["start"], "to_step": holder["start"],
                                                              "wall_s": 0.0, "cpu_s": 0.0}]
            self.base = (float(self.progress["train_s"]), float(self.progress["cpu_s"]))

        def _dump(self, state: Any) -> None:
            h, pr = self.holder, self.progress
            wall, cpu = time.perf_counter() - h["t0"], time.process_time() - h["c0"]
            pr["train_s"], pr["cpu_s"] = self.base[0] + wall, self.base[1] + cpu
            pr["runs"][-1].update(to_step=state.global_step, wall_s=round(wall, 1), cpu_s=round(cpu, 1))
            pr["step"] = state.global_step
            pr["finished"] = pr["tokens"] >= h["budget"] or state.global_step >= h["max_steps"]
            write_json(h["dir"] / f"step-{state.global_step}.json", pr)

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            trajs = self.holder["rollout"].last_trajectories
            self.progress["tokens"] += sum(sum(t.loss_mask) for t in trajs)
            mid = self.holder.get("mid")
            if (mid is not None and self.progress.get("mid_eval") is None and self.progress["tokens"] >= mid[0]
                    and model is not None):
                was_training = model.training
                self.progress["mid_eval"] = {**mid[1](model), "step": state.global_step,
                                             "tokens": self.progress["tokens"]}
                model.train(was_training)
            if self.progress["tokens"] >= self.holder["budget"]:
                control.should_training_stop = True
            if control.should_training_stop or state.global_step >= self.holder["max_steps"]:
                control.should_save = True  # the final weights are a checkpoint: a kill during the evaluation
            self._dump(state)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                self.progress["curve"].append({
                    "step": state.global_step, "tokens": self.progress["tokens"], "reward": logs.get("reward"),
                    "success": logs.get("toolgym/success"), "process_reward": logs.get("toolgym/process_reward"),
                    "frac_reward_zero_std": logs.get("frac_reward_zero_std")})
                self._dump(state)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _fault(f"save:{state.global_step}")

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
    # the differences and their mean in exact arithmetic (Fraction holds every float exactly): float rounding
    # must not move a mean that is exactly 0 (e.g. +7, -1, -2, 0, -4 points) below the verdict's ">= 0"
    exact = [sum(map(Fraction, arm[k])) / len(arm[k]) - sum(map(Fraction, base[k])) / len(base[k]) for k in common]
    per_seed = [float(d) for d in exact]
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
    return {"seeds": common, "per_seed": per_seed, "mean": float(sum(exact) / len(exact)), "t_lo": t["lo"],
            "t_hi": t["hi"], "boot_lo": float(np.quantile(stats, 0.025)), "boot_hi": float(np.quantile(stats, 0.975)),
            "positive": sum(d > 0 for d in exact)}


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


def broken_baseline(results: dict[str, Any]) -> str | None:
    """The protocol's broken-baseline rule: a sentence when ``outcome`` ends below the warm start's held-out
    success on most of its seeds (the comparison is then inconclusive), else ``None``."""
    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("success")
    outs = [a["eval"]["success"] for a in results["arms"].values() if a["estimator"] == "outcome"]
    below = sum(o < ws for o in outs) if ws is not None else 0
    if ws is None or not outs or 2 * below <= len(outs):
        return None
    return (f"outcome-only GRPO ends below the warm start ({ws:.0%}) on {below} of {len(outs)} seeds: a broken "
            "baseline, not a win for credit")


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
    lines += _per_seed_tables(results, summary)
    for est, s in summary.items():
        if est == "outcome":
            continue
        for key, label in (("vs_outcome_pooled", "success"), ("steps_reached_vs_outcome_pooled", "steps reached")):
            d = s.get(key)
            if d:
                lines.append(f"\n{est} - outcome, {label} (paired over {d['n']} tasks, seeds {s['seeds']}): "
                             f"{d['mean']:+.3f} [95% CI {d['lo']:+.3f}, {d['hi']:+.3f}]")
        if not str(results.get("eval_split", "test")).startswith("validation"):
            planned, done = len(results["config"]["seeds"]), len(s.get("seeds") or ())
            label = "Verdict" if done >= planned else f"Provisional verdict ({done} of {planned} seeds finished)"
            lines.append(f"\n{label}: {verdict(summary, est)}")
    broken = broken_baseline(results)
    if broken and not str(results.get("eval_split", "")).startswith("validation"):
        lines.append(f"\nInconclusive: {broken}")
    if str(results.get("eval_split", "")).startswith("validation"):
        lines.append(f"\nValidation decisions: {json.dumps(validation_choice(results), default=str)}")
    return "\n".join(lines)


def _per_seed_tables(results: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Held-out success per seed (one column per estimator, and its 60%-budget evaluation for a turn-level one) and
    the across-seed statistics of each turn-level estimator against ``outcome``'s final success (the verdict's
    inputs: the per-seed differences in points, their mean, the t-interval and the bootstrap CI); the warm start's
    success and the arms' summed wall time under them. Empty for a validation run."""
    if str(results.get("eval_split", "test")).startswith("validation") or not results["arms"]:
        return []
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for a in results["arms"].values():
        by.setdefault(a["estimator"], {})[a["seed"]] = a
    ests = [e for e in ("outcome", "turn_return", "gigpo") if e in by]
    cols = [(e, "eval") for e in ests if e == "outcome"] + [(e, k) for e in ests if e != "outcome"
                                                             for k in ("mid_eval", "eval")]
    head = [f"{e} (60% of the budget)" if k == "mid_eval" else e for e, k in cols]
    lines = ["", "| seed | " + " | ".join(head) + " |", "|---" * (len(cols) + 1) + "|"]
    for seed in sorted({k for seeds in by.values() for k in seeds}):
        cells = []
        for e, k in cols:
            ev = (by[e].get(seed) or {}).get(k)
            cells.append("-" if not ev else f"{ev['success']:.0%}")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    stats = [(e, label, (summary.get(e) or {}).get(key) or {}) for e in ests if e != "outcome"
             for key, label in (("final_vs_outcome_across_seeds", "final - outcome's final"),
                                ("mid_vs_outcome_final_across_seeds", "at 60% of the budget - outcome's final"))]
    stats = [x for x in stats if x[2].get("seeds")]
    if stats:
        lines += ["", "| estimator | held-out success, points | per seed | mean | t 95% CI | bootstrap 95% CI "
                  "| seeds above 0 |", "|---|---|---|---|---|---|---|"]
        for e, label, d in stats:
            per = ", ".join(f"{100 * x:+.0f}" for x in d["per_seed"])
            lines.append(f"| {e} | {label} | {per} | {100 * d['mean']:+.1f} | [{100 * _num(d['t_lo']):+.1f}, "
                         f"{100 * _num(d['t_hi']):+.1f}] | [{100 * d['boot_lo']:+.1f}, {100 * d['boot_hi']:+.1f}] "
                         f"| {d['positive']} of {len(d['seeds'])} |")
    ws = ((results.get("warmstart") or {}).get("eval") or {}).get("success")
    lines.append("")
    lines.append(("" if ws is None else f"Warm start: {ws:.0%} held-out success. ")
                 + f"The {len(results['arms'])} arms took {results['total_wall_s'] / 3600:.1f} h of training and "
                 "evaluation in all "
                 "(`train s` includes a turn-level arm's 60%-budget evaluation).")
    return lines


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
    ap.add_argument("--output-dir", default=None,
                    help="working files: one directory per stage (checkpoints, trajectories), results.json, credit.png")
    ap.add_argument("--results-dir", default=None,
                    help="one small JSON record per finished stage (default benchmarks/results/credit; with "
                         "--model tiny OUTPUT/results)")
    ap.add_argument("--smoke", action="store_true", help="a ~2-minute end-to-end run (1 seed, 1 step, 4 tasks)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default 0 1 2 3 4)")
    ap.add_argument("--estimators", nargs="+", default=None, help="default: outcome turn_return gigpo")
    ap.add_argument("--token-budget", type=int, default=None, help="generated policy tokens per arm")
    ap.add_argument("--max-steps", type=int, default=None, help="GRPO steps per arm at most")
    ap.add_argument("--save-steps", type=int, default=None, help="a GRPO checkpoint every this many steps")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--report", action="store_true",
                    help="the table, statistics and verdict from the results records alone; redraws OUTPUT/credit.png")
    ap.add_argument("--model", default=None, help="model path; default the embedded SmolLM2-135M ('tiny': tests)")
    ap.add_argument("--validate", action="store_true",
                    help="the validation run: outcome and turn_return at each candidate gamma, one seed, evaluated on "
                         "train-split tasks no arm trains on (chooses gamma; checks that outcome GRPO learns)")
    ap.add_argument("--gamma", type=float, default=None, help="turn_return / gigpo discount (from --validate)")
    ap.add_argument("--lr", type=float, default=None,
                    help="GRPO learning rate of every arm (default 1e-5; 3e-5 reproduces the first validation round)")
    a = ap.parse_args(argv)
    cfg = CreditBenchConfig()
    if a.smoke:
        cfg = replace(cfg, output_dir="runs/credit-smoke", **SMOKE)  # type: ignore[arg-type]
    if a.output_dir:
        cfg.output_dir = a.output_dir
    for name in ("token_budget", "max_steps", "save_steps", "threads", "model", "gamma", "lr"):
        if getattr(a, name) is not None:
            setattr(cfg, name, getattr(a, name))
    if a.seeds:
        cfg.seeds = tuple(a.seeds)
    if a.estimators:
        cfg.estimators = tuple(a.estimators)
    if a.validate and not a.output_dir:
        cfg.output_dir += "-validation"
    rdir = a.results_dir or (str(Path(cfg.output_dir) / "results") if a.smoke else None)  # a smoke run: not committed
    if a.report:
        results = collect_results(cfg, a.validate, rdir)
        if results["arms"]:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            plot(results, Path(cfg.output_dir) / "credit.png")
        print(f"{len(results['arms'])}/{len(plan(cfg, a.validate).arms)} arms finished "
              f"(records in {results['results_dir']})\n")
        print(report_markdown(results))
        return 0
    run(cfg, validate=a.validate, results_dir=rdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
