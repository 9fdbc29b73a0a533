"""The credit experiment's training: the shared warm start, its evaluation and every arm (GRPO from the warm
start until the token budget is spent, resumable from its last checkpoint), each under its stage's lock."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.common.stages import claim_each, stage_lock
from benchmarks.credit.protocol import ENV_ID, CreditBenchConfig, Plan, env_kwargs
from benchmarks.credit.report import collect_results, write_outputs
from benchmarks.credit.stages import (
    Stage,
    finish,
    latest_checkpoint,
    load_done,
    state_digest,
    system_info,
    write_json,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["run_stages"]


def _fault(point: str) -> bool:
    """Fault injection for the resume tests: ``TOOLGYM_CREDIT_FAULT`` names the point (``save:N``: right after the
    checkpoint of step N is saved; ``trained``: after an arm's training, before its evaluation) where the process
    kills itself with SIGKILL. Unset: never."""
    if os.environ.get("TOOLGYM_CREDIT_FAULT") == point:
        print(f"[credit] fault injection: SIGKILL at {point}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return False


def run_stages(cfg: CreditBenchConfig, p: Plan, todo: list[tuple[str, Stage, str, int, float]], need_ws_eval: bool,
                out: Path, rdir: Path, validate: bool) -> None:
    import torch

    import toolgym  # noqa: F401
    from toolgym.envs.calculator_chain import chain_progress
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import wilson_interval
    from toolgym.evaluation.tasks import draw_tasks
    from toolgym.models import load_model
    from toolgym.rollout import RolloutDriver, TransformersPolicy
    from trainers import ALGORITHMS

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.model == "tiny":
        from toolgym.models import load_tokenizer, tiny_random_model

        tok = load_tokenizer()
        model = tiny_random_model(tok)
    else:
        model, tok = load_model(cfg.model)
    ev_kw = env_kwargs(cfg, "test", tok)
    tr_kw = env_kwargs(cfg, "train", tok)
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
            sft = ALGORITHMS["sft"]  # masked SFT on the oracle's episodes that reach reward 1
            ws_cfg = sft.Config(
                env_id=ENV_ID, env_kwargs={k: v for k, v in tr_kw.items() if k != "tokenizer"}, policy="oracle",
                episodes=cfg.warmstart_episodes, task_seed=0, max_turn_tokens=cfg.max_turn_tokens,
                num_envs=min(16, len(ws_tasks)), update="masked", save_model=False,
                trl={"output_dir": str(ws_dir / "sft"), "max_steps": cfg.warmstart_steps,
                     "learning_rate": cfg.warmstart_lr, "per_device_train_batch_size": cfg.warmstart_batch_size,
                     "seed": 0, "report_to": [], "use_cpu": not torch.cuda.is_available(), "disable_tqdm": True})
            ws_run = sft.run(ws_cfg, model=model, tokenizer=tok, tasks=ws_tasks).metrics
            losses = ws_run["loss"]
            ws_dir.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), ws_dir / "warmstart.pt.tmp")
            os.replace(ws_dir / "warmstart.pt.tmp", ws_file)
            digest = state_digest(model.state_dict())
            prior = load_done(p.warmstart, out, rdir)
            if prior is not None and prior.get("digest") != digest:
                print(f"[credit] warning: the recomputed warm start's weights differ from the recorded ones "
                      f"({digest} vs {prior.get('digest')}); arms started from either are recorded with their digest",
                      flush=True)
            rec = {"episodes": ws_run["kept"], "loss": losses, "digest": digest,
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

    # arms another process is training are left for later, then waited for (benchmarks.common.stages.claim_each)
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
        write_outputs(collect_results(cfg, validate, rdir), out)
    venv.close()


def _locked(stage: Stage, out: Path, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
    """The stage's lock, ``OUT/<stage>-<key>.lock`` (:func:`benchmarks.common.stages.stage_lock`; yields whether it is
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
    from trainers import ALGORITHMS

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
        grpo = ALGORITHMS["grpo"]  # its trainer, built with this arm's budget callback
        gcfg = grpo.Config(env_id=ENV_ID, env_kwargs={k: v for k, v in tr_kw.items() if k != "tokenizer"},
                           max_turn_tokens=cfg.max_turn_tokens, advantage=est, gamma=gamma, save_model=False,
                           trajectory_dir=str(sdir / "trajectories"), trl=trl)
        tasks = draw_tasks(ENV_ID, cfg.grpo_tasks, seed=100 + seed, split="train", env_kwargs=tr_kw)
        trainer, rollout = grpo.build_trainer(gcfg, model=model, tokenizer=tok, tasks=tasks,
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
