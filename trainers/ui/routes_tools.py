"""The environment tabs' API: the tool playground (``/api/tools/*``: load an env's or an MCP config's tools, call
one), the reward composer (``/api/rewards/score``) and Play an episode (``/api/play``: one episode as a job, then
its trajectory row; Play by hand, ``/api/hand/*``: a person's turns answered by the env), and the env cards
(``/api/envs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from trainers.ui import commands as C
from trainers.ui.playground import UIError, file_reward_defaults, score_file
from trainers.ui.state import UIDep, read_json

__all__ = ["router"]

router = APIRouter()


@router.post("/api/tools/load")
async def tools_load(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    if d.get("env"):
        tools = await run_in_threadpool(ui.tools.load_env, str(d["env"]), str(d.get("config", "")))
    else:
        tools = await run_in_threadpool(ui.tools.load_mcp, str(d.get("config", "")))
    return {"source": ui.tools.source, "tools": tools, "tasks": ui.tools.tasks}


@router.post("/api/tools/task")
async def tools_task(request: Request, ui: UIDep) -> Any:
    """An env whose tools are per task: the tools of the task picked."""
    d = await read_json(request)
    tools = await run_in_threadpool(ui.tools.pick_task, str(d.get("task", "")))
    return {"source": ui.tools.source, "tools": tools, "tasks": ui.tools.tasks, "task": ui.tools.task}


@router.get("/api/envs")
def envs() -> Any:
    """A card per registered env: what it needs from the page, whether its tools are per task."""
    from trainers.ui.envcards import env_cards

    return {"envs": env_cards()}


@router.post("/api/hand/reset")
async def hand_reset(request: Request, ui: UIDep) -> Any:
    """Play by hand: start (or start over) this tab's episode."""
    d = await read_json(request)
    seed = d.get("seed")
    try:
        seed = None if seed in (None, "") else int(seed)
    except (TypeError, ValueError):
        raise UIError(f"bad seed {seed!r}: a whole number from 0") from None
    return await run_in_threadpool(ui.hand.reset, str(d.get("session", "")), str(d.get("env", "")), seed=seed,
                                   task=str(d.get("task") or ""), mcp_config=str(d.get("config", "")),
                                   prompt=str(d.get("prompt", "")))


@router.post("/api/hand/step")
async def hand_step(request: Request, ui: UIDep) -> Any:
    """Play by hand: the assistant's turn as typed; the env's answer."""
    d = await read_json(request)
    return await run_in_threadpool(ui.hand.step, str(d.get("session", "")), str(d.get("text", "")))


@router.post("/api/tools/call")
async def tools_call(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    return await run_in_threadpool(ui.tools.call, str(d.get("name", "")), str(d.get("arguments", "")))


@router.post("/api/rewards/score")
async def rewards_score(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    path = C.inside(ui.runs, str(d.get("file", "")), what="trajectory file")
    parts = d.get("parts")
    if not isinstance(parts, list):
        raise UIError("parts must be a list of {name, weight}")
    return await run_in_threadpool(score_file, path, parts)


@router.get("/api/rewards/defaults")
async def rewards_defaults(file: str, ui: UIDep) -> Any:
    """The composition that fits a trajectory file's tasks (their gold field and its kind)."""
    path = C.inside(ui.runs, file, what="trajectory file")
    return await run_in_threadpool(file_reward_defaults, path)


@router.post("/api/play")
async def play(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    try:
        seed = int(d.get("seed", 0))
    except (TypeError, ValueError):
        raise UIError(f"bad seed {d.get('seed')!r}: a whole number from 0") from None
    argv, out = C.play_argv(ui.runs, str(d.get("policy", "")), str(d.get("env", "")),
                            str(d.get("split", "test")), seed)
    return ui.jobs.launch("play", argv, title=f"play {d.get('env')} with {d.get('policy')}",
                          extra={"command": C.display(argv), "play_out": str(out)})


@router.get("/api/play/{job_id}")
def play_episode(job_id: str, ui: UIDep) -> Any:
    """The played job's state and, once written, its episode (the validated trajectory row)."""
    from toolgym.trajectory import Trajectory, TrajectoryFileError, read_trajectories

    st = ui.jobs.state(job_id, log=True, metrics=False)
    if st.get("kind") != "play":
        raise UIError(f"job {job_id} is not an episode played from the Play page")
    path = Path(st["play_out"])
    st["episode"] = None
    if path.is_file():
        try:
            rows = read_trajectories(path)
        except (TrajectoryFileError, ValueError, OSError) as e:
            raise UIError(str(e)) from None
        st["episode"] = rows[0] if rows else None
        st["answer"] = Trajectory.from_dict(rows[0]).answer if rows else None
        st["view"] = str(path.relative_to(ui.runs))
    return st
