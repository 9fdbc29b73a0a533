"""``toolgym ui``: the web page over the CLI's own code paths (a FastAPI app served by uvicorn).

Security rules (see ``docs/ui.md``):

* binds ``127.0.0.1`` by default; any other ``--host`` needs a token (``TOOLGYM_UI_TOKEN`` or ``--token-file``,
  16+ characters), else the command refuses to start (exit 2). With a token every request must carry it (the
  ``toolgym_ui_token`` cookie, set by opening ``/?token=...`` once, or ``Authorization: Bearer ...``);
* without a token the ``Host`` header must be a loopback name (no DNS rebinding), and state-changing requests must
  be ``application/json`` with a same-origin ``Origin`` (a foreign page cannot post to the UI);
* request bodies (uploads included) are limited to ``--max-upload-mb``; every file path a form names is resolved
  inside the runs directory (no traversal); commands are argument lists (no shell); the token and the values of
  secret-looking environment variables never reach a page, a job log shown or the server's own log (no access log).
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response

from toolgym.errors import CLIError, ExitCode
from toolgym.serve import access
from toolgym.serve.access import add_ui_arguments
from trainers.ui import commands as C
from trainers.ui.form import SetupStore
from trainers.ui.jobs import JobError, JobStore, redact
from trainers.ui.playground import ToolPlayground, UIError, reward_library, score_file

__all__ = ["build_app", "build_parser", "check_bind", "main"]

PAGE = Path(__file__).resolve().parent / "page.html"
SCRIPT = PAGE.with_name("page.js")
#: the UI pages' Content-Security-Policy: scripts only from the UI's own static file (no inline script, no
#: script a page's data could smuggle in), nothing loaded from elsewhere
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
COOKIE = "toolgym_ui_token"
_LOOPBACK_NAMES = access.LOOPBACK_NAMES


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token, and a token too short to guess at (``CLIError``, exit 2)."""
    access.check_bind(host, token, what="the UI")


def public_uri(uri: str) -> str:
    """A tracking URI without its password (``http://user:pw@host`` -> ``http://user:***@host``)."""
    parts = urlsplit(uri)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


class UI:
    """The state behind the page: the runs directory, the job store, the tool playground."""

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
        self.setups = SetupStore(self.runs)

    def files(self, kind: str) -> list[str]:
        """Paths (relative to the runs dir) of trajectory files (``jsonl``), evaluation summaries (``eval``) or
        saved models (``model``: directories with a ``config.json``); at most 500, skipping the UI's job dirs."""
        out: list[str] = []
        pattern = {"jsonl": "*.jsonl", "eval": "*.json", "model": "config.json"}.get(kind)
        if pattern is None:
            raise UIError(f"unknown file kind {kind!r}")
        for p in sorted(self.runs.rglob(pattern)):
            rel = p.relative_to(self.runs)
            if rel.parts[:2] == ("ui", "jobs") or any(part.startswith(".") for part in rel.parts):
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


def build_app(ui: UI) -> Any:
    """The FastAPI app: the page, its JSON API and the security middleware."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        ui.tools.close()  # stop the MCP servers the playground started

    app = FastAPI(title="toolgym ui", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.ui = ui

    def deny(status: int, msg: str) -> Any:
        return PlainTextResponse(msg, status_code=status)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        if ui.token is None and (request.url.hostname or "") not in _LOOPBACK_NAMES:
            return deny(403, "toolgym ui answers loopback names only (no token is set)")
        if ui.token is not None:
            given = request.cookies.get(COOKIE) or ""
            auth = request.headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            query = request.query_params.get("token")
            if request.method == "GET" and query is not None:
                if not hmac.compare_digest(query.encode(), ui.token.encode()):
                    return deny(401, "wrong token")
                resp = RedirectResponse(request.url.path, status_code=303)
                resp.set_cookie(COOKIE, ui.token, httponly=True, samesite="strict")
                return resp
            if not hmac.compare_digest(given.encode(), ui.token.encode()):
                return deny(401, "toolgym ui: token required (open /?token=YOUR_TOKEN once, or send "
                                 "Authorization: Bearer YOUR_TOKEN)")
        if request.method not in ("GET", "HEAD"):
            if not request.headers.get("content-type", "").startswith("application/json"):
                return deny(415, "requests that change state are application/json")
            origin = request.headers.get("origin")
            if origin and urlsplit(origin).netloc != request.headers.get("host"):
                return deny(403, "cross-origin request refused")
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return deny(411, "a request body needs a Content-Length")
            if int(length) > ui.max_upload:
                return deny(413, f"request too large: {int(length)} bytes, the limit is {ui.max_upload} "
                                 f"(--max-upload-mb)")
        try:
            resp = await call_next(request)
        except Exception as e:  # noqa: BLE001 - a bug is a message, never a traceback on the page
            resp = JSONResponse({"error": redact(f"internal error: {type(e).__name__}: {e}")}, status_code=500)
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"  # a token in a URL never leaves in a Referer
        resp.headers["X-Frame-Options"] = "SAMEORIGIN"
        resp.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        return resp

    @app.exception_handler(UIError)
    async def ui_error(request: Request, e: UIError) -> Any:
        return JSONResponse({"error": redact(str(e))}, status_code=400)

    @app.exception_handler(JobError)
    async def job_error(request: Request, e: JobError) -> Any:
        return JSONResponse({"error": str(e)}, status_code=400)

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UIError(f"request is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise UIError("request must be a JSON object")
        return data

    @app.get("/", response_class=HTMLResponse)
    def page() -> Any:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/static/page.js")
    def page_js() -> Any:
        return Response(SCRIPT.read_text(encoding="utf-8"), media_type="text/javascript; charset=utf-8")

    @app.get("/api/info")
    def info() -> Any:
        from toolgym.envs.registration import ENVS

        return {"runs": str(ui.runs), "tracking_uri": public_uri(ui.tracking_uri), "algorithms": C.algorithms(),
                "configs": C.configs(), "rewards": reward_library(), "envs": list(ENVS),
                "max_upload": ui.max_upload, "gpu": C.has_gpu()}

    @app.get("/api/files")
    def files(kind: str) -> Any:
        return {"files": ui.files(kind)}

    @app.post("/api/upload")
    async def upload(request: Request) -> Any:
        d = await body(request)
        return {"path": ui.upload(str(d.get("name", "")), str(d.get("content", "")))}

    # -- environments and tools --
    @app.post("/api/tools/load")
    async def tools_load(request: Request) -> Any:
        d = await body(request)
        from starlette.concurrency import run_in_threadpool

        if d.get("env"):
            tools = await run_in_threadpool(ui.tools.load_env, str(d["env"]))
        else:
            tools = await run_in_threadpool(ui.tools.load_mcp, str(d.get("config", "")))
        return {"source": ui.tools.source, "tools": tools}

    @app.post("/api/tools/call")
    async def tools_call(request: Request) -> Any:
        d = await body(request)
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(ui.tools.call, str(d.get("name", "")), str(d.get("arguments", "")))

    # -- rewards --
    @app.post("/api/rewards/score")
    async def rewards_score(request: Request) -> Any:
        d = await body(request)
        from starlette.concurrency import run_in_threadpool

        path = C.inside(ui.runs, str(d.get("file", "")), what="trajectory file")
        parts = d.get("parts")
        if not isinstance(parts, list):
            raise UIError("parts must be a list of {name, weight}")
        return await run_in_threadpool(score_file, path, parts)

    # -- train --
    @app.get("/api/train/config")
    def train_config(name: str) -> Any:
        return C.config_fields(name)

    @app.get("/api/train/fields")
    def train_fields(algorithm: str) -> Any:
        if algorithm not in C.algorithms():
            raise UIError(f"unknown algorithm {algorithm!r}; one of {', '.join(C.algorithms())}")
        return {"fields": [{"key": k, "help": h} for k, h in sorted(C.field_helps(algorithm).items())]}

    def _train(d: dict[str, Any], *, fresh: bool = False) -> list[str]:
        overrides = d.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise UIError("overrides must be an object {field: value}")
        return C.train_argv(ui.runs, str(d.get("algorithm", "")), str(d.get("config", "")), overrides,
                            str(d.get("run_name", "")), fresh=fresh)

    @app.post("/api/train/command")
    async def train_command(request: Request) -> Any:
        return {"command": C.display(_train(await body(request)))}

    @app.get("/api/setups")
    def setups() -> Any:
        return {"setups": ui.setups.names()}

    @app.get("/api/setups/{name}")
    def setup_load(name: str) -> Any:
        return ui.setups.load(name)

    @app.post("/api/setups")
    async def setup_save(request: Request) -> Any:
        d = await body(request)
        return {"name": ui.setups.save(str(d.get("name", "")), d.get("setup") or {}), "setups": ui.setups.names()}

    @app.get("/api/train/run_name")
    def train_run_name(base: str) -> Any:
        return {"run_name": C.free_run_name(ui.runs, base)}

    @app.post("/api/train/launch")
    async def train_launch(request: Request) -> Any:
        d = await body(request)
        argv = _train(d, fresh=True)
        return ui.jobs.launch("train", argv, title=f"{d.get('algorithm')} {d.get('run_name')}",
                              extra={"command": C.display(argv)})

    @app.get("/api/jobs")
    def jobs() -> Any:
        return {"jobs": ui.jobs.list()}

    @app.get("/api/jobs/{job_id}")
    def job(job_id: str) -> Any:
        st = ui.jobs.state(job_id, log=True)
        if st.get("kind") == "eval" and st["status"] == "finished":
            try:
                st["summary"] = ui.eval_summary(st)
                st["eval_json"] = str((Path(st["eval_out"]).parent / "eval.json").relative_to(ui.runs))
            except UIError as e:
                st["error"] = str(e)
        return st

    @app.post("/api/jobs/{job_id}/stop")
    def job_stop(job_id: str) -> Any:
        return ui.jobs.stop(job_id)

    # -- runs --
    @app.get("/api/runs")
    def runs() -> Any:
        return {"tracking_uri": public_uri(ui.tracking_uri), "runs": C.runs_table(ui.tracking_uri)}

    @app.get("/api/runs/{run_id}/metrics")
    def run_metrics(run_id: str) -> Any:
        return {"metrics": C.run_metrics(ui.tracking_uri, run_id)}

    @app.get("/view", response_class=HTMLResponse)
    def view(file: str, compare: str | None = None) -> Any:
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
                           labels=(a.parent.name or "A", b.parent.name if b is not None else "B"))
        # the viewer's own policy (its one script, by hash) in a sandbox of its own: even a script that got in
        # would run in an opaque origin, without the UI's cookie or same-origin access to its API
        csp = content_security_policy() + "; sandbox allow-scripts; frame-ancestors 'self'"
        return HTMLResponse(page, headers={"Content-Security-Policy": csp})

    # -- evaluate and registry --
    @app.post("/api/eval/launch")
    async def eval_launch(request: Request) -> Any:
        d = await body(request)
        argv, out = C.eval_argv(ui.runs, str(d.get("checkpoint", "")), str(d.get("env", "")),
                                str(d.get("split", "test")), str(d.get("tasks", "all")), str(d.get("name", "")))
        return ui.jobs.launch("eval", argv, title=f"eval {d.get('name')}",
                              extra={"command": C.display(argv), "eval_out": str(out)})

    # -- play one episode --
    @app.post("/api/play")
    async def play(request: Request) -> Any:
        d = await body(request)
        try:
            seed = int(d.get("seed", 0))
        except (TypeError, ValueError):
            raise UIError(f"bad seed {d.get('seed')!r}: a whole number from 0") from None
        argv, out = C.play_argv(ui.runs, str(d.get("policy", "")), str(d.get("env", "")),
                                str(d.get("split", "test")), seed)
        return ui.jobs.launch("play", argv, title=f"play {d.get('env')} with {d.get('policy')}",
                              extra={"command": C.display(argv), "play_out": str(out)})

    @app.get("/api/play/{job_id}")
    def play_episode(job_id: str) -> Any:
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

    @app.post("/api/registry/{action}")
    async def registry(action: str, request: Request) -> Any:
        d = await body(request)
        from starlette.concurrency import run_in_threadpool

        res = await run_in_threadpool(C.registry, ui.runs, action, d, ui.env)
        res["error"] = redact(res["error"]) if res["error"] else None
        return res

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="toolgym ui", description="The web page: environments and tools, rewards, training jobs, runs, "
        "evaluation and the model registry (docs/ui.md).",
        epilog="A non-loopback --host needs a token: TOOLGYM_UI_TOKEN or --token-file (16+ characters). "
               "Exit codes: 0 stopped, 2 bad arguments or a refused bind, 3 the [ui] extra is missing.")
    add_ui_arguments(p)
    return p


def read_token(token_file: str | None) -> str | None:
    return access.read_token(token_file, "TOOLGYM_UI_TOKEN")


def main(argv: Sequence[str] | None = None) -> int:
    """``toolgym ui ...``; returns the exit code once the server stops."""
    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    token = read_token(a.token_file)
    check_bind(a.host, token)
    if not 0 < a.port < 65536:
        raise CLIError(f"bad --port {a.port}", ExitCode.USAGE)
    import uvicorn

    ui = UI(Path(a.runs), token, int(a.max_upload_mb * 1_000_000))
    app = build_app(ui)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"toolgym ui: http://{shown}:{a.port}/  (runs: {ui.runs}; tracking: {public_uri(ui.tracking_uri)})"
          + ("; open /?token=... once with your token" if token else ""), flush=True)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)
    return ExitCode.OK
