"""Task drawing (toolgym/evaluation/tasks.py): one function for the demo, GRPO, RFT and DPO, the same order as ``toolgym eval``'s
selection, and the demo's tasks equal to a direct seeded draw (its documented numbers were measured on them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import toolgym  # noqa: F401
from tests import eval_env
from toolgym.envs.calculator import generate_task
from toolgym.evaluation.tasks import TaskSelectionError, draw_tasks, round_tasks, select_tasks, task_id
from toolgym.models import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CALC = "toolgym/Calculator-v0"
ECHO = "tests.eval_env:EvalEcho-v0"


def _direct_demo_draw(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    """The demo's tasks drawn directly: ``n`` distinct rows of one seeded Calculator generator, in draw order (the
    reference :func:`draw_tasks` must reproduce)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, dict[str, Any]] = {}
    while len(rows) < n:
        t = generate_task(rng, split)
        rows.setdefault(t["id"], t)
    return list(rows.values())


@pytest.fixture(scope="module")
def kw() -> dict[str, Any]:
    return {"tokenizer": load_tokenizer()}


def test_the_demo_draws_the_direct_seeded_tasks(kw: dict[str, Any]) -> None:
    import yaml

    cfg = yaml.safe_load((ROOT / "trainers" / "configs" / "demo_cpu.yaml").read_text())
    draws = [("test", cfg["eval_tasks"], cfg["eval_seed"]),  # held-out evaluation
             ("train", cfg["warmstart_episodes"], cfg["seed"] + 1),  # warm start
             ("train", cfg["grpo_tasks"], cfg["seed"] + 2)]  # GRPO
    got = {}
    for split, n, seed in draws:
        got[split, seed] = draw_tasks(CALC, n, seed=seed, split=split, env_kwargs=kw)
        assert got[split, seed] == _direct_demo_draw(split, n, seed)  # same rows, same order
        assert len({t["id"] for t in got[split, seed]}) == n
    held_out = {t["id"] for t in got["test", cfg["eval_seed"]]}
    assert not held_out & {t["id"] for (split, _), rows in got.items() if split == "train" for t in rows}
    # the same tasks as `toolgym eval --tasks 100 --seed 10000 --split test`
    assert select_tasks(CALC, tasks=cfg["eval_tasks"], seed=cfg["eval_seed"], split="test", env_kwargs=kw) == \
        got["test", cfg["eval_seed"]]


def test_generated_split_distinct_in_seeded_order_with_exclude(kw: dict[str, Any]) -> None:
    a = draw_tasks(CALC, 20, seed=5, split="train", env_kwargs=kw)
    assert [t["id"] for t in a] == [t["id"] for t in draw_tasks(CALC, 20, seed=5, split="train", env_kwargs=kw)]
    assert a[:5] == draw_tasks(CALC, 5, seed=5, split="train", env_kwargs=kw)  # a prefix: n only cuts
    assert {t["id"] for t in a}.isdisjoint(t["id"] for t in draw_tasks(CALC, 20, seed=6, split="train",
                                                                     env_kwargs=kw))
    skip = {a[0]["id"], a[3]["id"]}
    b = draw_tasks(CALC, 20, seed=5, split="train", env_kwargs=kw, exclude=skip)
    assert len(b) == 20 and not skip & {t["id"] for t in b}
    assert [t for t in a if t["id"] not in skip] == b[:18]  # the rest keep their order
    assert draw_tasks(CALC, 0, seed=5, split="train", env_kwargs=kw) == []
    with pytest.raises(TaskSelectionError, match=">= 0"):
        draw_tasks(CALC, -1, env_kwargs=kw)


def test_finite_split_is_a_seeded_permutation_and_never_more_than_the_split(kw: dict[str, Any]) -> None:
    n = eval_env.N_TASKS
    five = draw_tasks(ECHO, 5, seed=3, split="test", env_kwargs=kw)
    assert five == select_tasks(ECHO, tasks=5, seed=3, split="test", env_kwargs=kw)  # one order for eval and training
    every = draw_tasks(ECHO, 10 * n, seed=3, split="test", env_kwargs=kw)  # more than there are: all, permuted
    assert len(every) == n and every[:5] == five
    assert sorted(map(task_id, every)) == sorted(map(task_id, select_tasks(ECHO, tasks="all", split="test",
                                                                           env_kwargs=kw)))
    rest = draw_tasks(ECHO, n, seed=3, split="test", env_kwargs=kw, exclude=[task_id(t) for t in five])
    assert len(rest) == n - 5 and rest == every[5:]


def test_an_env_instance_and_its_split_are_checked(kw: dict[str, Any]) -> None:
    import gymnasium as gym

    env = gym.make(CALC, split="test", **kw)
    try:
        assert draw_tasks(env, 4, seed=1) == draw_tasks(CALC, 4, seed=1, split="test", env_kwargs=kw)
        with pytest.raises(TaskSelectionError, match="on split 'test', not 'train'"):
            draw_tasks(env, 4, split="train")
    finally:
        env.close()


def test_split_in_env_kwargs_draws_what_the_split_argument_draws(kw: dict[str, Any]) -> None:
    """The trainers pass the split inside ``env_kwargs`` (the env kwargs their episodes run with)."""
    assert draw_tasks(CALC, 8, seed=2, env_kwargs={"split": "train", **kw}) == \
        draw_tasks(CALC, 8, seed=2, split="train", env_kwargs=kw)


def test_round_tasks_walks_the_pool_in_windows_and_wraps():
    pool = list("abcde")
    assert [round_tasks(pool, 2, r) for r in range(4)] == [["a", "b"], ["c", "d"], ["e", "a"], ["b", "c"]]
    assert round_tasks(pool, 9, 3) == pool  # a pool of at most n rows: the same tasks every round
    assert round_tasks([], 3, 1) == []
