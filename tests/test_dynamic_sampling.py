"""trainers.grpo.dynamic_sampling: GRPO steps that train on groups with reward spread (a real GRPOTrainer on CPU,
tiny random model, toolgym/Calculator-v0).

Which groups have spread is set by :class:`ScriptedPolicy` (fault injection of "a model that solves some tasks
sometimes"): the trainer's real generation runs for every request (``generate=False``: skipped, in the tests of
the draws alone, which roll out dozens of groups), then each episode's answer is replaced by a right or a wrong
``<answer>``, as the test's script says per task and sample; env, rewards, the rollout adapter, TRL's batch,
advantages and loss are real.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("trl", reason="dynamic sampling needs the [train] extra (trl)")

from toolgym.envs.calculator import generate_task
from toolgym.rollout import Generation
from trainers.grpo.dynamic_sampling import (
    MAX_SKIP,
    PREFIX,
    DynamicSampler,
    DynamicSamplingGRPOTrainer,
    SpreadHistory,
    check_layout,
    has_spread,
    skip_probability,
)
from trainers.grpo.rollout_adapter import ToolgymRollout, TRLPolicy, env_reward, make_dataset

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ENV = "toolgym/Calculator-v0"
G = 4


def calc_tasks(n: int = 8, seed: int = 11) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [generate_task(rng) for _ in range(n)]


TASKS = calc_tasks()
IDS = [t["id"] for t in TASKS]


class ScriptedPolicy(TRLPolicy):
    """The trainer's real generation (unless ``generate`` is false); then episode ``i`` answers right when
    ``right(task_id, i % G)``, else wrong. ``rolled``: the task id of every group rolled out, in order."""

    def __init__(self, trainer: Any, right: Callable[[str, int], bool], generate: bool = True) -> None:
        super().__init__(trainer)
        self.right = right
        self.real = generate
        self.rolled: list[str] = []

    def generate(self, requests):
        out = super().generate(requests) if self.real else [None] * len(requests)
        for j, r in enumerate(requests):
            st = r.episode
            if st is None:
                continue
            if st.turn == 0 and st.index % G == 0:
                self.rolled.append(st.task["id"])
            answer = st.task["answer"] if self.right(st.task["id"], st.index % G) else st.task["answer"] + "7"
            ids = [int(x) for x in st.env.encode_action(f"<answer>{answer}</answer>")]
            out[j] = Generation.from_sampled(ids, None, r.stop_ids, r.max_new_tokens)
        return out


def script(spread: set[str], solved: set[str] = frozenset()) -> Callable[[str, int], bool]:
    """Tasks in ``spread``: sample 0 of each group right, the others wrong; ``solved``: all right; else all wrong."""
    return lambda tid, k: tid in solved or (tid in spread and k == 0)


def make_trainer(out: Path, sampler: DynamicSampler | None, right: Callable[[str, int], bool], *,
                 tasks: list[dict] = TASKS, batch: int = 8, advantage: str = "outcome", shared_prefix: bool = True,
                 seed: int = 0, generate: bool = True, **cfg: Any):
    import torch
    from trl import GRPOConfig

    from toolgym.models import load_tokenizer, tiny_random_model

    torch.manual_seed(0)
    tok = load_tokenizer()
    rollout = ToolgymRollout(ENV, tasks, max_turn_tokens=32, dynamic_sampling=sampler)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=batch, num_generations=G, max_completion_length=64,
        logging_steps=1, report_to=[], use_cpu=True, seed=seed, disable_tqdm=True, beta=0.0,
        **{"save_strategy": "no", "max_steps": 1, **cfg},
    )
    trainer = DynamicSamplingGRPOTrainer(
        model=tiny_random_model(tok), processing_class=tok, reward_funcs=[env_reward], args=args,
        train_dataset=make_dataset(tasks), rollout_func=rollout, advantage=advantage, shared_prefix=shared_prefix)
    rollout.policy = ScriptedPolicy(trainer, right, generate)
    trainer.model.train()
    return trainer, rollout


def groups(ids: list[str]) -> list[str]:
    assert len(ids) % G == 0 and all(ids[k] == ids[k - k % G] for k in range(len(ids)))  # adjacent copies
    return ids[::G]


def prompts_of(*task_ids: str) -> list[str]:
    return [tid for tid in task_ids for _ in range(G)]


# -- the pure parts ----------------------------------------------------------------------------------------------

def test_skip_probability_grows_with_the_streak_and_is_capped():
    assert skip_probability(0, 0.5) == 0.0
    assert skip_probability(1, 0.5) == pytest.approx(0.5)
    assert skip_probability(2, 0.5) == pytest.approx(0.75)
    assert skip_probability(50, 0.5) == MAX_SKIP < 1.0
    h = SpreadHistory()
    h.observe("a", False)
    h.observe("a", False)
    assert h.streak("a") == 2
    h.observe("a", True)
    assert h.streak("a") == 0 and "a" not in h.streaks


def test_layout_and_config_errors():
    from trainers.grpo import Config

    check_layout(8, 4, 2)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        check_layout(2, 4, 2)
    with pytest.raises(ValueError, match="dynamic_sampling_max_draws"):
        Config(dynamic_sampling=True, dynamic_sampling_max_draws=0)
    with pytest.raises(ValueError, match="dynamic_sampling_skip"):
        DynamicSampler(2, history=True, skip=1.0)


def test_the_command_line_sets_the_knobs():
    from trainers.grpo import Config
    from trainers.grpo.build import trainer_class
    from trainers.runconfig import parse_overrides, resolve

    cfg = resolve(Config, None, parse_overrides(["--toolgym.dynamic_sampling", "true",
                                                 "--toolgym.dynamic_sampling_max_draws", "3",
                                                 "--toolgym.dynamic_sampling_history"]))
    assert cfg.dynamic_sampling is True and cfg.dynamic_sampling_max_draws == 3 and cfg.dynamic_sampling_history
    assert trainer_class(cfg) is DynamicSamplingGRPOTrainer
    assert trainer_class(Config()) is not DynamicSamplingGRPOTrainer


# -- one step's draws ---------------------------------------------------------------------------------------------

def test_keeps_only_groups_with_spread_and_fills_the_quota(tmp_path):
    sampler = DynamicSampler(max_draws=5)
    trainer, rollout = make_trainer(tmp_path, sampler, script({IDS[5], IDS[6]}), generate=False)
    out = rollout(prompts_of(IDS[1], IDS[2]), trainer)

    assert len(out["completion_ids"]) == len(out["env_reward"]) == 2 * G  # the rows TRL expects
    kept = groups(out["task_id"])
    assert sorted(kept) == sorted([IDS[5], IDS[6]])  # only the groups with spread ...
    for k in range(2):
        rewards = out["env_reward"][k * G:(k + 1) * G]
        assert max(rewards) > min(rewards)
    assert out["prompt"] == out["task_id"]  # ... and TRL is told which tasks they are
    rolled = rollout.policy.rolled
    assert rolled[:2] == [IDS[1], IDS[2]]  # TRL's own groups were rolled out first, then replacements
    assert len(set(rolled)) == len(rolled)  # no task twice while unused ones are left
    last = sampler.last
    assert last["groups_kept"] == 2 and not last["bound_hit"] and last["draws"] >= 2
    assert last["groups_drawn"] == len(rolled) and last["drawn_ids"] == rolled
    assert last["kept_share"] == pytest.approx(2 / len(rolled))
    assert trainer._pending_metrics[PREFIX + "groups_kept"] == [2.0]
    assert trainer._pending_metrics[PREFIX + "groups_drawn"] == [float(len(rolled))]
    assert trainer._pending_metrics[PREFIX + "bound_hit"] == [0.0]
    assert [t.task["id"] for t in rollout.last_trajectories] == out["task_id"]


def test_the_bound_trains_on_what_it_kept_and_says_so(tmp_path, caplog):
    sampler = DynamicSampler(max_draws=2)
    trainer, rollout = make_trainer(tmp_path, sampler, script({IDS[5]}), generate=False)
    with caplog.at_level(logging.WARNING, logger="trainers.grpo.dynamic_sampling"):
        out = rollout(prompts_of(IDS[5], IDS[1]), trainer)
    kept = groups(out["task_id"])
    assert kept[0] == IDS[5] and kept[1] != IDS[5]  # the group with spread, then a zero-spread filler
    filler = out["env_reward"][G:]
    assert max(filler) == min(filler)
    assert sampler.last["bound_hit"] and sampler.last["draws"] == 2 and sampler.last["groups_kept"] == 1
    assert sampler.bound_hits == 1
    assert trainer._pending_metrics[PREFIX + "bound_hit"] == [1.0]
    warnings = [r.getMessage() for r in caplog.records if "dynamic sampling" in r.getMessage()]
    assert len(warnings) == 1 and "1 of 2 groups" in warnings[0] and "so far: 1" in warnings[0]
    trainer.state.global_step = 1
    rollout(prompts_of(IDS[5], IDS[1]), trainer)
    assert sampler.bound_hits == 2


def test_eval_mode_and_ungrouped_prompts(tmp_path):
    sampler = DynamicSampler(max_draws=3)
    trainer, rollout = make_trainer(tmp_path, sampler, script(set()), generate=False)
    trainer.model.eval()  # evaluation rolls out what it is given
    out = rollout(prompts_of(IDS[1]), trainer)
    assert out["task_id"] == prompts_of(IDS[1]) and "prompt" not in out
    trainer.model.train()
    with pytest.raises(ValueError, match="not one group"):
        rollout([IDS[1], IDS[2], IDS[1], IDS[1]], trainer)


# -- history (GRESO) and determinism -------------------------------------------------------------------------------

def _steps(trainer, rollout, n_steps: int) -> list[str]:
    """Run ``n_steps`` rollout calls as a training run would, TRL's prompts cycling through the pool."""
    drawn: list[str] = []
    for s in range(n_steps):
        trainer.state.global_step = s
        rollout(prompts_of(IDS[(2 * s) % 8], IDS[(2 * s + 1) % 8]), trainer)
        drawn += rollout.dynamic_sampling.last["drawn_ids"]
    return drawn


def test_history_draws_prompts_without_spread_less(tmp_path):
    spread, failing = set(IDS[:4]), set(IDS[4:])
    counts = {}
    for history in (False, True):
        sampler = DynamicSampler(max_draws=3, history=history, skip=0.5)
        trainer, rollout = make_trainer(tmp_path / str(history), sampler, script(spread), generate=False)
        drawn = _steps(trainer, rollout, 8)
        counts[history] = sum(d in failing for d in drawn) / len(drawn)
        if history:
            assert all(sampler.history.streak(t) >= 1 for t in failing)
            assert all(sampler.history.streak(t) == 0 for t in spread)
            assert sum(trainer._pending_metrics[PREFIX + "groups_skipped"]) > 0  # prompts skipped before rollout
    assert counts[True] < counts[False]


def test_same_seed_same_draws_and_a_resumed_sampler_draws_the_same(tmp_path):
    right = script(set(IDS[:3]))

    def run(seed: int, n: int, sampler: DynamicSampler, start: int = 0) -> list[str]:
        trainer, rollout = make_trainer(tmp_path / f"s{seed}-{start}", sampler, right, seed=seed, generate=False)
        drawn: list[str] = []
        for s in range(start, start + n):
            trainer.state.global_step = s
            rollout(prompts_of(IDS[(2 * s) % 8], IDS[(2 * s + 1) % 8]), trainer)
            drawn.append(list(sampler.last["drawn_ids"]))
        return drawn

    a = run(0, 4, DynamicSampler(3, history=True))
    b = run(0, 4, DynamicSampler(3, history=True))
    assert a == b
    assert run(1, 4, DynamicSampler(3, history=True)) != a
    first = DynamicSampler(3, history=True)
    head = run(0, 2, first)
    first.save(tmp_path / "ckpt")
    resumed = DynamicSampler(3, history=True)
    assert resumed.load(tmp_path / "ckpt") and resumed.history.streaks == first.history.streaks
    assert head + run(0, 2, resumed, start=2) == a


# -- whole training steps ----------------------------------------------------------------------------------------

def _train_step(trainer):
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs[PREFIX + "groups_kept"] == 2.0 and logs[PREFIX + "bound_hit"] == 0.0
    assert logs["frac_reward_zero_std"] == 0.0  # every trained group has spread
    trained = [t.task["id"] for t in trainer.rollout_func.last_trajectories]
    assert set(trained) == {IDS[5], IDS[6]}
    # the prompts TRL logs (and gives reward functions) are the rolled-out tasks, not the ones it sampled
    assert list(trainer._logs["prompt"])[-len(trained):] == trained
    return logs


def test_a_training_step_with_the_shared_prefix(tmp_path):
    tasks = [TASKS[i] for i in (1, 2, 5, 6)]
    sampler = DynamicSampler(max_draws=4)
    # TRL samples 2 of the 4 tasks; whichever it picks, the step trains on the two with spread
    trainer, rollout = make_trainer(tmp_path, sampler, script({IDS[5], IDS[6]}), tasks=tasks)
    assert trainer.shared_prefix
    _train_step(trainer)
    assert trainer.shared_prefix_forwards > 0  # the loss packed each group's rows on one prompt


def test_a_training_step_with_turn_return_advantages(tmp_path):
    tasks = [TASKS[i] for i in (1, 2, 5, 6)]
    sampler = DynamicSampler(max_draws=4)
    trainer, rollout = make_trainer(tmp_path, sampler, script({IDS[5], IDS[6]}), tasks=tasks,
                                    advantage="turn_return")
    _train_step(trainer)
    advs = trainer.last_turn_advantages
    assert len(advs) == 2 * G and any(abs(a) > 0 for row in advs for a in row)


def test_has_spread_follows_the_estimator():
    from toolgym.trajectory import Trajectory, Turn

    def traj(turn_rewards, outcome):
        turns = [Turn(index=k, action_start=k, action_end=k + 1, reward=float(r)) for k, r in enumerate(turn_rewards)]
        return Trajectory(prompt_ids=[1], completion_ids=[5] * len(turns), loss_mask=[1] * len(turns), turns=turns,
                          task={"id": "x"}, outcome_reward=float(outcome))

    tie = [traj([1.0, 0.0], 0.0), traj([0.0, 1.0], 0.0)]  # the same total, different turns
    assert tie[0].reward == tie[1].reward
    assert not has_spread(tie, "outcome")
    assert has_spread(tie, "turn_return")
    same = [traj([0.5], 1.0), traj([0.5], 1.0)]
    assert not has_spread(same, "outcome") and not has_spread(same, "turn_return")
    assert has_spread([traj([0.0], 1.0), traj([0.0], 0.0)], "outcome")


def test_checkpoints_carry_the_history_and_resume_reads_it(tmp_path):
    tasks = [TASKS[i] for i in (1, 2, 5, 6)]
    sampler = DynamicSampler(max_draws=2, history=True)
    trainer, _ = make_trainer(tmp_path, sampler, script({IDS[5]}), tasks=tasks, generate=False,
                              save_strategy="steps", save_steps=1)
    trainer.train()
    saved = tmp_path / "checkpoint-1" / "dynamic_sampling_rank0.json"
    state = json.loads(saved.read_text())
    assert state == {"streaks": sampler.history.streaks, "bound_hits": 1} and state["streaks"]
    fresh = DynamicSampler(max_draws=2, history=True)
    again, _ = make_trainer(tmp_path, fresh, script({IDS[5]}), tasks=tasks, generate=False, max_steps=2)
    loaded = []
    real_load = fresh.load
    fresh.load = lambda d, rank=0: loaded.append(real_load(d, rank)) or loaded[-1]
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert loaded == [True]
    assert fresh.bound_hits == 2  # the saved count, then the resumed step's own short quota
