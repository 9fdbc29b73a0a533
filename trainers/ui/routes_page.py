"""The page itself and what every tab shares: ``/`` and its scripts, ``/api/info`` (algorithms, configs, rewards,
envs, limits), ``/api/files`` (the runs directory's trajectory files, evaluations and models) and
``/api/upload``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from trainers.ui import commands as C
from trainers.ui.playground import UIError, reward_library
from trainers.ui.state import UIDep, public_uri, read_json

__all__ = ["PAGE", "SCRIPT", "SCRIPTS", "router"]

PAGE = Path(__file__).resolve().parent / "page.html"
SCRIPT = PAGE.with_name("page.js")

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def page() -> Any:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))


#: the page's scripts, served by name (no other file under this directory is served)
SCRIPTS = ("page.js", "hand.js")


@router.get("/static/{name}")
def page_js(name: str) -> Any:
    if name not in SCRIPTS:
        raise UIError(f"no script {name!r}")
    return Response(PAGE.with_name(name).read_text(encoding="utf-8"), media_type="text/javascript; charset=utf-8")


@router.get("/api/info")
def info(ui: UIDep) -> Any:
    from toolgym.envs.registration import ENVS

    return {"runs": str(ui.runs), "tracking_uri": public_uri(ui.tracking_uri), "algorithms": C.algorithms(),
            "configs": C.configs(), "rewards": reward_library(), "envs": list(ENVS),
            "max_upload": ui.max_upload, "gpu": C.has_gpu()}


@router.get("/api/files")
def files(kind: str, ui: UIDep) -> Any:
    return {"files": ui.files(kind)}


@router.post("/api/upload")
async def upload(request: Request, ui: UIDep) -> Any:
    d = await read_json(request)
    return {"path": ui.upload(str(d.get("name", "")), str(d.get("content", "")))}
