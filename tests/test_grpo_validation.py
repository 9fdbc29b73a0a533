"""GRPO's validation and checkpoint selection (trainers/grpo/validation.py) with real GRPO runs of a tiny model.

The runs train a tiny random model on Calculator-v0 for a few steps. Such a model never solves a task, so its
advantages are all zero; the runs turn off the zero-advantage shortcuts and give AdamW a large weight decay, so that
every optimizer step changes the weights by a known, real update (``p *= 1 - lr * weight_decay``) and each step's
weights are distinct. Where a test needs validation scores that differ, the greedy evaluation is replaced by a fixed
score sequence (fault injection at the evaluation seam only: the selection, the files, the weights saved and loaded
back are the real ones); one end-to-end run uses the real greedy evaluation throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="GRPO needs the [train] extra (trl)")

import torch
from transformers import TrainerCallback

import trainers.grpo.validation as validation
from toolgym.evaluation.tasks import TaskSelectionError, draw_tasks, holdout_tasks, task_id
from trainers.grpo import Config, build_trainer, run
from trainers.grpo.validation import BEST_DIR, STATE_FILE, best_record, evaluations_since_best, should_stop

ENV = "toolgym/Calculator-v0"


def _config(out: Path, *, steps: int, save_steps: int | None = None, **fields) -> Config:
    trl = dict(output_dir=str(out), per_device_train_batch_size=4, num_generations=4, max_completion_length=16,
               max_steps=steps, logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
               learning_rate=0.1, weight_decay=0.5, lr_scheduler_type="constant",
               save_strategy="steps" if save_steps else "no", **({"save_steps": save_steps} if save_steps else {}))
    return Config(model="tiny", num_train_tasks=4, max_turn_tokens=8, validation_tasks=2, validation_every=1,
                  skip_zero_advantage=False, skip_no_signal_steps=False, trl=trl, **fields)


class WeightLog(TrainerCallback):
    """One weight of the model at train begin (step 0 or the resumed step) and after every optimizer step."""

    def __init__(self) -> None:
        self.by_step: dict[int, torch.Tensor] = {}

    def _keep(self, state, model) -> None:
        self.by_step[int(state.global_step)] = model.get_input_embeddings().weight.detach().clone()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._keep(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._keep(state, model)


def _scores(monkeypatch, by_step: dict[int, float], calls: list[int]) -> None:
    """Fault injection: the validation score of each step comes from ``by_step``; ``calls`` records the steps."""

    def fake(trainer, venv, tasks, *, seed, max_turn_tokens, processor=None):
        step = int(trainer.state.global_step)
        calls.append(step)
        return {"success": by_step[step], "reward": by_step[step], "parse_rate": None, "tool_call_rate": 0.0,
                "truncated": 0.0, "n_tasks": len(tasks), "wall_s": 0.0}

    monkeypatch.setattr(validation, "greedy_evaluation", fake)


def _saved_weight(directory: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    sd = load_file(str(directory / "model.safetensors"))
    return sd["model.embed_tokens.weight"]


# ---------------------------------------------------------------------------------------------------------------
# The selection rule and the held-out tasks
# ---------------------------------------------------------------------------------------------------------------


def test_best_record_is_the_highest_score_and_the_earliest_on_ties():
    history = [{"step": 0, "score": 0.2}, {"step": 5, "score": 0.6}, {"step": 10, "score": 0.6},
               {"step": 15, "score": 0.1}, {"step": 20, "score": float("nan")}]
    assert best_record(history)["step"] == 5
    assert evaluations_since_best(history) == 3
    assert should_stop(history, 3) and not should_stop(history, 4) and not should_stop(history, None)
    assert best_record([]) is None and evaluations_since_best([]) == 0


def test_holdout_tasks_hash_split_is_disjoint_from_the_training_draw():
    pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by make install (docs/bfcl.md)")
    kw = {"split": "train", "category": "simple_python"}
    held = holdout_tasks("toolgym/BFCL-v0", 8, seed=3, env_kwargs=kw)
    ids = [task_id(t) for t in held]
    assert len(set(ids)) == 8 and ids == [task_id(t) for t in holdout_tasks("toolgym/BFCL-v0", 8, seed=3,
                                                                                env_kwargs=kw)]
    assert ids != [task_id(t) for t in holdout_tasks("toolgym/BFCL-v0", 8, seed=4, env_kwargs=kw)]
    train = draw_tasks("toolgym/BFCL-v0", 10_000, seed=0, env_kwargs=kw, exclude=ids)
    every = draw_tasks("toolgym/BFCL-v0", 10_000, seed=0, env_kwargs=kw)
    assert not {task_id(t) for t in train} & set(ids)
    assert {task_id(t) for t in train} | set(ids) == {task_id(t) for t in every}  # the rest of the split trains
    with pytest.raises(TaskSelectionError, match="leaves none to train on"):
        holdout_tasks("toolgym/BFCL-v0", len(every), seed=0, env_kwargs=kw)


def test_validation_tasks_are_not_trained_on(tmp_path):
    config = _config(tmp_path, steps=1, validation_seed=5)
    config.validation_tasks, config.num_train_tasks = 6, 40
    trainer, rollout = build_trainer(config)
    try:
        held = {task_id(t) for t in holdout_tasks(ENV, 6, seed=5, env_kwargs={"tokenizer": trainer.processing_class})}
        train = {task_id(rollout.task_for(row["prompt"])) for row in trainer.train_dataset}
        cb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, validation.ValidationCallback))
        assert {task_id(t) for t in cb.tasks} == held and len(train) == 40
        assert not train & held
        with pytest.raises(ValueError, match="are validation tasks"):  # tasks given by the caller are checked
            build_trainer(config, model=trainer.model, tokenizer=trainer.processing_class, tasks=cb.tasks[:1])
    finally:
        rollout.close()


def test_bad_validation_settings_are_refused():
    for bad in ({"validation_every": 0}, {"validation_patience": 0}, {"validation_metric": "accuracy"},
                {"validation_tasks": -1}):
        with pytest.raises(ValueError, match="validation"):
            Config(**bad)


# ---------------------------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------------------------


def test_end_to_end_greedy_validation_writes_history_and_best(tmp_path):
    """Real greedy evaluations at steps 0, 1, 2: the history file, the best directory, the run's metrics."""
    weights = WeightLog()
    result = run(_config(tmp_path, steps=2), callbacks=[weights])
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert [r["step"] for r in state["history"]] == [0, 1, 2]
    assert result.metrics["validation_history"] == state["history"]
    for r in state["history"]:
        assert r["n_tasks"] == 2 and 0.0 <= r["success"] <= 1.0 and r["score"] == r["success"]
    assert state["history"][0]["entropy"] is None  # step 0: no training step yet
    assert all(r["entropy"] > 0 and r["frac_reward_zero_std"] is not None for r in state["history"][1:])
    best = best_record(state["history"])
    assert result.metrics["selected_step"] == state["selected_step"] == best["step"]
    marker = json.loads((tmp_path / BEST_DIR / "toolgym_best.json").read_text())
    assert marker["step"] == best["step"]
    # the run's saved model and best/ hold the selected step's weights, which differ from the last step's
    assert torch.equal(_saved_weight(tmp_path), weights.by_step[best["step"]])
    assert torch.equal(_saved_weight(tmp_path / BEST_DIR), weights.by_step[best["step"]])
    if best["step"] != 2:
        assert not torch.equal(weights.by_step[best["step"]], weights.by_step[2])
    assert any(e.get("toolgym/validation/score") is not None and e["step"] == 0 for e in result.metrics["log_history"])


def test_selection_keeps_the_best_validation_step(tmp_path, monkeypatch):
    calls: list[int] = []
    _scores(monkeypatch, {0: 0.1, 1: 0.5, 2: 0.3, 3: 0.5}, calls)
    weights = WeightLog()
    result = run(_config(tmp_path, steps=3), callbacks=[weights])
    assert calls == [0, 1, 2, 3]
    assert result.metrics["selected_step"] == 1 and result.metrics["validation_best"] == {"step": 1, "score": 0.5}
    assert len({weights.by_step[s].sum().item() for s in range(4)}) == 4  # each step's weights are distinct
    assert torch.equal(_saved_weight(tmp_path), weights.by_step[1])
    assert torch.equal(_saved_weight(tmp_path / BEST_DIR), weights.by_step[1])


def test_patience_stops_the_run(tmp_path, monkeypatch):
    calls: list[int] = []
    _scores(monkeypatch, {0: 0.5, 1: 0.4, 2: 0.5, 3: 0.1, 4: 0.9, 5: 0.9}, calls)
    result = run(_config(tmp_path, steps=5, validation_patience=2))
    assert calls == [0, 1, 2] and result.metrics["global_step"] == 2
    assert result.metrics["validation_stopped"]["step"] == 2 and result.metrics["selected_step"] == 0


def test_resume_keeps_history_and_best_and_does_not_re_evaluate(tmp_path, monkeypatch):
    """A run that got to step 3 (checkpoint at step 2; step 3 made a new best) resumes from checkpoint-2: it keeps
    steps 0-2, evaluates 3 and 4 again on the branch it trains, and its best/ is step 2's again."""
    calls: list[int] = []
    _scores(monkeypatch, {0: 0.1, 1: 0.2, 2: 0.4, 3: 0.9}, calls)
    first = WeightLog()
    run(_config(tmp_path, steps=3, save_steps=2), callbacks=[first])
    assert calls == [0, 1, 2, 3] and json.loads((tmp_path / BEST_DIR / "toolgym_best.json").read_text())["step"] == 3
    assert json.loads((tmp_path / "checkpoint-2" / STATE_FILE).read_text())["best"]["step"] == 2

    calls.clear()
    _scores(monkeypatch, {3: 0.3, 4: 0.35}, calls)
    second = WeightLog()
    result = run(_config(tmp_path, steps=4, save_steps=2), callbacks=[second],
                 resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert calls == [3, 4]  # steps 0-2 are not evaluated again
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert [(r["step"], r["score"]) for r in state["history"]] == [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.3), (4, 0.35)]
    assert [(r["step"], r["score"]) for r in state["superseded"]] == [(3, 0.9)]
    assert result.metrics["selected_step"] == 2
    assert torch.equal(second.by_step[2], first.by_step[2])  # resumed from the checkpoint's weights
    assert torch.equal(_saved_weight(tmp_path / BEST_DIR), first.by_step[2])
    assert torch.equal(_saved_weight(tmp_path), first.by_step[2])


def test_runs_from_the_same_weights_reuse_the_step_0_evaluation(tmp_path, monkeypatch):
    """A sweep's arms start from one checkpoint: with ``validation_reuse_dir`` the second run reads the first run's
    step-0 evaluation instead of evaluating again; other tasks or other weights are evaluated."""
    calls: list[int] = []
    _scores(monkeypatch, {0: 0.25, 1: 0.5}, calls)
    shared = tmp_path / "shared"
    first = run(_config(tmp_path / "a", steps=1, validation_reuse_dir=str(shared)))
    assert calls == [0, 1] and len(list(shared.glob("validation0-*.json"))) == 1
    second = run(_config(tmp_path / "b", steps=1, validation_reuse_dir=str(shared)))
    assert calls == [0, 1, 1]  # step 0 not evaluated again
    h1, h2 = first.metrics["validation_history"][0], second.metrics["validation_history"][0]
    assert h2["reused"] is True and h2["score"] == h1["score"] == 0.25 and h2["n_tasks"] == h1["n_tasks"]
    run(_config(tmp_path / "c", steps=1, validation_seed=7, validation_reuse_dir=str(shared)))
    assert calls == [0, 1, 1, 0, 1] and len(list(shared.glob("validation0-*.json"))) == 2  # other tasks


def test_the_step_0_key_follows_the_weights_tasks_and_budget():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(torch.bfloat16)
    tasks = [{"id": "a"}, {"id": "b"}]
    key = validation.initial_key(model, tasks, 0, 16, None)
    assert key == validation.initial_key(model, tasks, 0, 16, None)
    assert key != validation.initial_key(model, tasks[:1], 0, 16, None)
    assert key != validation.initial_key(model, tasks, 0, 32, None)
    assert key != validation.initial_key(model, tasks, 0, 16, "bfloat16")
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1.0
    assert key != validation.initial_key(model, tasks, 0, 16, None)
