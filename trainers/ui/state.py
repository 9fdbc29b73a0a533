"""The state behind ``toolgym ui``'s page (the runs directory, the job store, the tool playground, saved setups)
and what every router shares: the ``UI`` of a request (:data:`UIDep`) and a request's JSON object body
(:func:`read_json`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import Depends, Request

from trainers.ui.form import SetupStore
from trainers.ui.handplay import HandSessions
from trainers.ui.jobs import JobStore
from trainers.ui.playground import ToolPlayground, UIError

__all__ = ["UI", "UIDep", "public_uri", "read_json", "ui_of"]

#: folders of a local tracking store's artifacts (copies of trajectories, evaluations and registered models)
_STORE_COPIES = frozenset({"mlartifacts", "mlruns"})


def public_uri(uri: str) -> str:
    """A tracking URI without its password (``http://user:pw@host`` -> ``http://user:***@host``)."""
    parts = urlsplit(uri)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


class UI:
    """The state behind the page: the runs directory, the job store, the tool playground, the hand-played
    episodes."""

    def __init__(self, runs: Path, token: str | None, max_upload: int) -> None:
        self.runs = runs.resolve()
        self.runs.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.max_upload = max_upload
        env = dict(os.environ)
        env.pop("TOOLGYM_UI_TOKEN", None)
        env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{self.runs / 'mlflow.db'}")
        self.env = env
        self.tracking_uri = env["MLFLOW_TRACKING_URI"]
        self.jobs = JobStore(self.runs, env)
        self.tools = ToolPlayground()
        self.hand = HandSessions()
        self.setups = SetupStore(self.runs)

    def files(self, kind: str) -> list[str]:
        """Paths (relative to the runs dir) of trajectory files (``jsonl``), evaluation summaries (``eval``) or
        saved models (``model``: directories with a ``config.json``); at most 500, skipping the UI's job dirs and
        the tracking store's own copies (``mlartifacts/``: run artifacts and registered models)."""
        out: list[str] = []
        pattern = {"jsonl": "*.jsonl", "eval": "*.json", "model": "config.json"}.get(kind)
        if pattern is None:
            raise UIError(f"unknown file kind {kind!r}")
        for p in sorted(self.runs.rglob(pattern)):
            rel = p.relative_to(self.runs)
            if rel.parts[:2] == ("ui", "jobs") or any(part.startswith(".") or part in _STORE_COPIES
                                                       for part in rel.parts):
                continue
            if kind == "eval":
                if not p.name.endswith("eval.json") and "eval" not in p.stem:
                    continue
            if kind == "model":
                rel = rel.parent
            out.append(str(rel))
            if len(out) >= 500:
                break
        return out

    def upload(self, name: str, content: str) -> str:
        """Save uploaded text under ``<runs>/ui/uploads/NAME`` (a plain name); returns its relative path."""
        base = Path(name or "").name
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", base) or base.endswith("."):
            raise UIError(f"bad file name {name!r}")
        if not base.endswith((".jsonl", ".json")):
            raise UIError("uploads are .jsonl trajectory files or .json configs / evaluations")
        d = self.runs / "ui" / "uploads"
        d.mkdir(parents=True, exist_ok=True)
        (d / base).write_text(content, encoding="utf-8")
        return str((d / base).relative_to(self.runs))

    def launched_run_names(self) -> set[str]:
        """The run names of the UI's training jobs (their ``--output_dir`` under the runs directory), taken
        whether or not the job has written anything there yet."""
        out: set[str] = set()
        for job in self.jobs.list():
            argv = job.get("argv", [])
            out |= {Path(argv[i + 1]).name for i in range(len(argv) - 1) if argv[i] == "--output_dir"}
        return out

    def ended_runs(self) -> dict[str, str]:
        """``{MLflow run id: "stopped" | "failed"}`` of the training jobs the UI stopped or that failed: the run id
        from the lineage file (``toolgym_run.json``) the trainer wrote into the job's ``--output_dir``. A trainer
        closes its run ``FINISHED`` even when Ctrl-C ended it; the job knows better."""
        out: dict[str, str] = {}
        for job in self.jobs.list():
            if job.get("kind") != "train" or job["status"] not in ("stopped", "failed"):
                continue
            argv = job.get("argv", [])
            dirs = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--output_dir"]
            try:
                lineage = json.loads((Path(dirs[-1]) / "toolgym_run.json").read_text(encoding="utf-8"))
            except (IndexError, OSError, ValueError):
                continue
            run_id = lineage.get("training_run_id") if isinstance(lineage, dict) else None
            if isinstance(run_id, str) and run_id:
                out[run_id] = job["status"]
        return out

    def eval_summary(self, job: dict[str, Any]) -> dict[str, Any]:
        """An evaluation job's summary: the JSON object on its log's last such line, saved next to its
        trajectories as ``eval.json`` (what ``toolgym registry register --eval`` takes)."""
        out = Path(job["eval_out"]).parent / "eval.json"
        if out.is_file():
            return json.loads(out.read_text(encoding="utf-8"))
        log = (self.jobs.root / job["id"] / "log.txt").read_text(encoding="utf-8", errors="replace")
        for line in reversed(log.splitlines()):
            if line.startswith("{") and '"success"' in line:
                try:
                    summary = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out.write_text(json.dumps(summary), encoding="utf-8")
                return summary
        raise UIError("the evaluation printed no summary")


def ui_of(request: Request) -> UI:
    """The ``UI`` the app was built with (``app.state.ui``)."""
    return request.app.state.ui


UIDep = Annotated[UI, Depends(ui_of)]
"""A handler parameter ``ui: UIDep`` receives the app's ``UI``."""


async def read_json(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (``{}`` when empty); anything else is a ``UIError``."""
    try:
        data = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UIError(f"request is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise UIError("request must be a JSON object")
    return data
