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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from toolgym.errors import CLIError, ExitCode
from toolgym.serve import access
from toolgym.serve.access import add_ui_arguments
from trainers.ui import routes_page, routes_registry, routes_runs, routes_tools, routes_train
from trainers.ui.guard import install_guard
from trainers.ui.state import UI, public_uri

__all__ = ["UI", "build_app", "build_parser", "check_bind", "main"]

#: the routers, one per group of the page's tabs
ROUTERS = (routes_page.router, routes_tools.router, routes_train.router, routes_runs.router,
           routes_registry.router)


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token, and a token too short to guess at (``CLIError``, exit 2)."""
    access.check_bind(host, token, what="the UI")


def build_app(ui: UI) -> FastAPI:
    """The FastAPI app over ``ui``: the security middleware, then the page's routers; the tool playground's MCP
    servers and the hand-played episodes stop with the app."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        ui.tools.close()
        ui.hand.close()

    app = FastAPI(title="toolgym ui", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.ui = ui
    install_guard(app, ui)
    for router in ROUTERS:
        app.include_router(router)
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
