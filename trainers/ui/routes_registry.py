"""The Evaluate & registry tab's API: an evaluation launched as a job (``/api/eval/launch``) and ``toolgym
registry register / promote / list`` run to completion (``/api/registry/{action}``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from trainers.ui import commands as C
from trainers.ui.jobs import redact
from trainers.ui.state import UIDep, read_json

__all__ = ["router"]

router = APIRouter()


@router.post("/api/eval/launch")
async def eval_launch(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    argv, out = C.eval_argv(ui.runs, str(d.get("checkpoint", "")), str(d.get("env", "")),
                            str(d.get("split", "test")), str(d.get("tasks", "all")), str(d.get("name", "")))
    return ui.jobs.launch("eval", argv, title=f"eval {d.get('name')}",
                          extra={"command": C.display(argv), "eval_out": str(out)})


@router.post("/api/registry/{action}")
async def registry(action: str, request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    res = await run_in_threadpool(C.registry, ui.runs, action, d, ui.env)
    res["error"] = redact(res["error"]) if res["error"] else None
    return res
