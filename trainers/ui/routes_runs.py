"""The Runs tab's API: the MLflow store's runs, several side by side (every parameter), one run's metric curves, and ``/view``, the trajectory viewer
of a file (or two, compared) in a sandbox of its own."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from trainers.ui import commands as C
from trainers.ui.playground import UIError
from trainers.ui.state import UIDep, public_uri

__all__ = ["router"]

router = APIRouter()


@router.get("/api/runs")
def runs(ui: UIDep) -> Any:
    return {"tracking_uri": public_uri(ui.tracking_uri), "runs": C.runs_table(ui.tracking_uri, ended=ui.ended_runs())}


@router.get("/api/runs/compare")
def runs_compare(ids: str, ui: UIDep) -> Any:
    """``ids``: run ids separated by commas (2 to 8)."""
    return C.runs_diff(ui.tracking_uri, [i.strip() for i in ids.split(",") if i.strip()])


@router.get("/api/runs/{run_id}/metrics")
def run_metrics(run_id: str, ui: UIDep) -> Any:
    return {"metrics": C.run_metrics(ui.tracking_uri, run_id)}


@router.get("/view", response_class=HTMLResponse)
def view(file: str, ui: UIDep, compare: str | None = None) -> Any:
    from toolgym.report.viewer import (
        TrajectoryFileError,
        content_security_policy,
        load_trajectory_rows,
        render_html,
    )

    a = C.inside(ui.runs, file, what="trajectory file")
    b = C.inside(ui.runs, compare, what="trajectory file") if compare else None
    try:
        rows = load_trajectory_rows(a)
        other = load_trajectory_rows(b) if b is not None else None
    except (TrajectoryFileError, ValueError, OSError) as e:
        raise UIError(str(e)) from None
    title = a.name if b is None else f"{a.name} vs {b.name}"
    page = render_html(rows[:5000], tokenizer=None, title=title, compare=None if other is None else other[:5000],
                       labels=C.compare_labels(ui.runs, a, b) if b is not None else (a.name, "B"))
    # the viewer's own policy (its one script, by hash) in a sandbox of its own: even a script that got in
    # would run in an opaque origin, without the UI's cookie or same-origin access to its API
    csp = content_security_policy() + "; sandbox allow-scripts; frame-ancestors 'self'"
    return HTMLResponse(page, headers={"Content-Security-Policy": csp})
