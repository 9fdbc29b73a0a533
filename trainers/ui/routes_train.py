"""The Train tab's API and the jobs it starts: a config's form fields, the command a form makes, saved setups, a
free run name, Launch, and the job list, a job's state (log, metrics, an evaluation's summary) and Stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from trainers.ui import commands as C
from trainers.ui.playground import UIError
from trainers.ui.state import UI, UIDep, read_json

__all__ = ["router"]

router = APIRouter()


def _train_argv(ui: UI, d: dict[str, Any], *, fresh: bool = False) -> list[str]:
    overrides = d.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise UIError("overrides must be an object {field: value}")
    return C.train_argv(ui.runs, str(d.get("algorithm", "")), str(d.get("config", "")), overrides,
                        str(d.get("run_name", "")), fresh=fresh)


@router.get("/api/train/config")
def train_config(name: str) -> Any:
    return C.config_fields(name)


@router.get("/api/train/fields")
def train_fields(algorithm: str) -> Any:
    if algorithm not in C.algorithms():
        raise UIError(f"unknown algorithm {algorithm!r}; one of {', '.join(C.algorithms())}")
    return {"fields": [{"key": k, "help": h} for k, h in sorted(C.field_helps(algorithm).items())]}


@router.post("/api/train/command")
async def train_command(request: Request, ui: UIDep) -> Any:
    return {"command": C.display(_train_argv(ui, await read_json(request)))}


@router.get("/api/train/run_name")
def train_run_name(base: str, ui: UIDep) -> Any:
    return {"run_name": C.free_run_name(ui.runs, base, taken=ui.launched_run_names())}


@router.post("/api/train/launch")
async def train_launch(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    argv = _train_argv(ui, d, fresh=True)
    return ui.jobs.launch("train", argv, title=f"{d.get('algorithm')} {d.get('run_name')}",
                          extra={"command": C.display(argv)})


@router.get("/api/setups")
def setups(ui: UIDep) -> Any:
    return {"setups": ui.setups.names()}


@router.get("/api/setups/{name}")
def setup_load(name: str, ui: UIDep) -> Any:
    return ui.setups.load(name)


@router.post("/api/setups")
async def setup_save(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    return {"name": ui.setups.save(str(d.get("name", "")), d.get("setup") or {}), "setups": ui.setups.names()}


@router.get("/api/jobs")
def jobs(ui: UIDep) -> Any:
    return {"jobs": ui.jobs.list()}


@router.get("/api/jobs/{job_id}")
def job(job_id: str, ui: UIDep) -> Any:
    st = ui.jobs.state(job_id, log=True)
    if st.get("kind") == "train":
        st["max_steps"] = C.step_budget(st.get("argv", []))
    if st.get("kind") == "eval" and st["status"] == "finished":
        try:
            st["summary"] = ui.eval_summary(st)
            st["eval_json"] = str((Path(st["eval_out"]).parent / "eval.json").relative_to(ui.runs))
        except UIError as e:
            st["error"] = str(e)
    return st


@router.post("/api/jobs/{job_id}/stop")
def job_stop(job_id: str, ui: UIDep) -> Any:
    return ui.jobs.stop(job_id)
