"""Task selection: which task rows an evaluation or a training run uses, drawn from the env's own tasks.

An env's ``tasks`` is either a finite split (a sequence of rows: Search-v0, SQL-v0, MCP-v0 with a task file) or a
generator ``fn(np_random) -> row`` (a procedural split: Calculator-v0, Python-v0). Both functions here draw from
it with a fixed order given by ``seed``, and never return the same task twice (tasks are identified by
:func:`task_id`):

* :func:`select_tasks` (``toolgym eval --tasks all|N|FILE``): strict, for evaluations where every task must run
  exactly once: ``"all"`` of a finite split, ``N`` distinct tasks (an error when the split has fewer or has
  duplicate ids), or the rows of a ``.jsonl`` task file;
* :func:`draw_tasks` (trainers: the demo, GRPO, RFT, DPO): up to ``n`` distinct tasks, none of ``exclude``;
* :func:`holdout_tasks` (GRPO's validation set): ``n`` tasks of a training split set apart by a hash of their ids,
  for the trainer to pass to :func:`draw_tasks` as ``exclude``.

The order, for both: a finite split's rows in the order of ``np.random.default_rng(seed).permutation``; a
generator's distinct draws from one ``np.random.default_rng(seed)``, in the order drawn. So ``draw_tasks(env, n,
seed=s)`` equals ``select_tasks(env, tasks=n, seed=s)`` whenever the latter succeeds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from toolgym.envs.registration import import_env_id
from toolgym.errors import InputFileError

T = TypeVar("T")

__all__ = [
    "TaskFileError", "TaskSelectionError", "base_env", "check_unique", "draw_tasks", "holdout_tasks", "import_env_id",
    "round_tasks", "select_tasks", "task_id",
]


class TaskSelectionError(ValueError):
    """The requested tasks cannot be selected (``all`` on an infinite split, more tasks than the split has...)."""


class TaskFileError(TaskSelectionError, InputFileError):
    """A task file is missing, unreadable, malformed, empty, or has duplicate task ids."""


def task_id(row: Mapping[str, Any]) -> str:
    """A task's id: ``row["id"]``, else a stable hash of the row's JSON (``task-<12 hex>``)."""
    if row.get("id") is not None:
        return str(row["id"])
    blob = json.dumps(row, sort_keys=True, default=str).encode()
    return "task-" + hashlib.sha256(blob).hexdigest()[:12]


def base_env(env: Any) -> Any:
    """The ToolEnv behind ``env`` (a ToolEnv, a wrapped env, or a vector env's first sub-env)."""
    envs = getattr(env, "envs", None)
    if envs:
        env = envs[0]
    return getattr(env, "unwrapped", env)


def _read_task_file(path: Path) -> list[dict[str, Any]]:
    from toolgym.jsonl import read_jsonl

    try:
        rows = read_jsonl(path, error=TaskFileError)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise TaskFileError(f"cannot read task file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TaskFileError(f"{path}: not a UTF-8 JSONL task file") from None
    if not rows:
        raise TaskFileError(f"{path}: no tasks")
    return rows


def check_unique(rows: Sequence[Mapping[str, Any]], where: str, error: type[Exception] = TaskSelectionError) -> None:
    """Raise ``error`` naming both rows when two of ``rows`` have the same :func:`task_id` (``where``: the source,
    for the message): a task is run exactly once."""
    seen: dict[str, int] = {}
    for i, r in enumerate(rows):
        tid = task_id(r)
        if tid in seen:
            raise error(f"{where}: task id {tid!r} appears twice (rows {seen[tid] + 1} and {i + 1}); "
                        "each task must be run exactly once")
        seen[tid] = i


@contextmanager
def _task_source(
    env: Any, split: str | None, env_kwargs: Mapping[str, Any] | None
) -> Iterator[tuple[Sequence[Mapping[str, Any]] | Callable[[np.random.Generator], Mapping[str, Any]], str]]:
    """``(the env's tasks, a name for messages)``; an env id is built (with ``split`` + ``env_kwargs``) and closed."""
    owned = None
    if isinstance(env, str):
        import gymnasium as gym

        import toolgym  # noqa: F401  (registers the envs)

        kw = dict(env_kwargs or {})
        if split is not None:
            kw["split"] = split
        owned = gym.make(import_env_id(env), disable_env_checker=True, **kw)
        env = owned
    try:
        base = base_env(env)
        env_split = getattr(base, "split", None)
        if split is not None and env_split is not None and env_split != split:
            raise TaskSelectionError(f"the env is on split {env_split!r}, not {split!r}")
        yield base.tasks, f"{getattr(getattr(base, 'spec', None), 'id', type(base).__name__)} split {env_split!r}"
    finally:
        if owned is not None:
            owned.close()


def _draw(source: Any, n: int, seed: int, name: str, exclude: Collection[str] = ()) -> list[dict[str, Any]]:
    """Up to ``n`` distinct rows not in ``exclude``: a finite split in seeded-permutation order, or exactly ``n``
    distinct draws of a generator (``TaskSelectionError`` when it cannot produce them)."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    seen = set(exclude)
    if not callable(source):
        for i in rng.permutation(len(source)):
            row = dict(source[int(i)])
            tid = task_id(row)
            if tid not in seen:
                seen.add(tid)
                out.append(row)
                if len(out) == n:
                    break
        return out
    tries = 0
    limit = 50 * n + 1000
    while len(out) < n and tries < limit:
        tries += 1
        row = dict(source(rng))
        tid = task_id(row)
        if tid not in seen:
            seen.add(tid)
            out.append(row)
    if len(out) < n:
        raise TaskSelectionError(f"{name}: only {len(out)} distinct tasks in {tries} draws; cannot select {n}")
    return out


def select_tasks(
    env: Any,
    *,
    tasks: str | int | os.PathLike[str] = "all",
    seed: int = 0,
    split: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The task rows to evaluate, each exactly once.

    Args:
        env: a ToolEnv (or wrapped env), a vector env, or an env id (then built with ``split`` + ``env_kwargs``).
        tasks: ``"all"`` (the whole finite split), ``N`` (an int or a digit string: N distinct tasks chosen
            reproducibly from ``seed``), or a ``.jsonl`` path (those rows, in file order).
        seed: the selection seed (a seeded permutation of a finite split; a seeded task generator otherwise).
        split: with an env id: the split to build; with an env instance: checked against ``env.split``.

    Raises:
        TaskSelectionError: ``all`` on an infinite (generated) split, N larger than the split, a generator that
            cannot produce N distinct tasks, a missing/malformed task file, duplicate task ids.
    """
    if isinstance(tasks, os.PathLike) or (isinstance(tasks, str) and tasks.endswith(".jsonl")):
        rows = _read_task_file(Path(tasks))
        check_unique(rows, str(tasks), TaskFileError)
        return [dict(r) for r in rows]
    if isinstance(tasks, str) and tasks != "all":
        if not tasks.strip().isdigit():
            raise TaskSelectionError(f"tasks must be 'all', a positive number or a .jsonl file, got {tasks!r}")
        tasks = int(tasks)
    if isinstance(tasks, int) and tasks < 1:
        raise TaskSelectionError(f"the number of tasks must be >= 1, got {tasks}")

    with _task_source(env, split, env_kwargs) as (source, name):
        if callable(source):
            if tasks == "all":
                raise TaskSelectionError(
                    f"{name} generates its tasks from seeds (an infinite split): 'all' is undefined; "
                    "pass a number of tasks (--tasks N) or a task file"
                )
            return _draw(source, int(tasks), seed, name)
        rows = [dict(r) for r in source]
        check_unique(rows, name)
        if tasks == "all":
            return rows
        if int(tasks) > len(rows):
            raise TaskSelectionError(f"{name} has {len(rows)} tasks; cannot select {tasks} distinct ones "
                                     "(use --tasks all)")
        return _draw(rows, int(tasks), seed, name)


def draw_tasks(
    env: Any,
    n: int,
    *,
    seed: int = 0,
    split: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    exclude: Collection[str] = (),
) -> list[dict[str, Any]]:
    """``n`` distinct task rows of the env's split for training, none whose :func:`task_id` is in ``exclude``, in
    a fixed order from ``seed`` (see the module docstring).

    A finite split with fewer than ``n`` such tasks gives all of them (a task id that appears twice counts once);
    a generated split gives exactly ``n``.

    Args:
        env: a ToolEnv (or wrapped env), a vector env, or an env id (then built with ``split`` + ``env_kwargs``
            and closed again).
        n: how many tasks (>= 0).
        seed: the drawing seed.
        split: with an env id: the split to build; with an env instance: checked against ``env.split``.
        env_kwargs: kwargs for building an env id (e.g. ``tokenizer``, ``dataset``).
        exclude: task ids never to return (e.g. the held-out evaluation set).

    Raises:
        TaskSelectionError: ``n < 0``, a split other than ``split``, or a generator that cannot produce ``n``
            distinct tasks.
    """
    if n < 0:
        raise TaskSelectionError(f"the number of tasks must be >= 0, got {n}")
    with _task_source(env, split, env_kwargs) as (source, name):
        return _draw(source, n, seed, name, {str(x) for x in exclude})


def holdout_tasks(
    env: Any,
    n: int,
    *,
    seed: int = 0,
    split: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``n`` task rows of the env's split set apart from training (a validation set), in a fixed order.

    A finite split: the ``n`` rows whose ``sha256(f"{seed}:{task_id}")`` is smallest, in that order (a hash split:
    whether a task is held out depends on its id and on the other ids, not on the order of the split's rows; the
    same ``seed`` gives the same rows on every machine). A split with at most ``n`` distinct tasks is an error: no
    task would be left to train on. A generated split: ``n`` distinct draws from ``np.random.default_rng(seed)``
    (its task space has no list to hash). Either way a trainer keeps them out of its own draw by passing their
    :func:`task_id` values to :func:`draw_tasks` as ``exclude``.

    Args:
        env: a ToolEnv (or wrapped env), a vector env, or an env id (then built with ``split`` + ``env_kwargs``).
        n: how many tasks (>= 1).
        seed: the hash salt (finite split) or the drawing seed (generated split).
        split, env_kwargs: as :func:`draw_tasks`.

    Raises:
        TaskSelectionError: ``n < 1``, a finite split with ``<= n`` distinct tasks, a generator that cannot
            produce ``n`` distinct tasks.
    """
    if n < 1:
        raise TaskSelectionError(f"the number of held-out tasks must be >= 1, got {n}")
    with _task_source(env, split, env_kwargs) as (source, name):
        if callable(source):
            return _draw(source, n, seed, name)
        rows: dict[str, dict[str, Any]] = {}
        for r in source:
            rows.setdefault(task_id(r), dict(r))
        if len(rows) <= n:
            raise TaskSelectionError(f"{name} has {len(rows)} distinct tasks; holding out {n} leaves none to train on")

        def key(tid: str) -> str:
            return hashlib.sha256(f"{seed}:{tid}".encode()).hexdigest()

        return [rows[tid] for tid in sorted(rows, key=key)[:n]]


def round_tasks(pool: Sequence[T], n: int, round_index: int) -> list[T]:
    """The tasks of round ``round_index`` when each round takes the next ``min(n, len(pool))`` rows of ``pool``,
    wrapping around: ``pool[(round_index * m + i) % len(pool)]`` for ``i < m``. A pool of at most ``n`` rows gives
    the same tasks every round; an empty pool gives none."""
    m = min(n, len(pool))
    return [pool[(round_index * m + i) % len(pool)] for i in range(m)]
