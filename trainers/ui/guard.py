"""The UI's security middleware and error answers (the rules in ``docs/ui.md``): loopback names only without a
token; with one, the token on every request (cookie or bearer header); state-changing requests JSON, same-origin
and within the upload limit; the security headers on every answer; a ``UIError`` / ``JobError`` a 400 with its
message and any other exception a 500 with a redacted one line, never a traceback.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse

from toolgym.serve import access
from trainers.ui.jobs import JobError, redact
from trainers.ui.playground import UIError
from trainers.ui.state import UI

__all__ = ["COOKIE", "PAGE_CSP", "install_guard"]

#: the UI pages' Content-Security-Policy: scripts only from the UI's own static file (no inline script, no
#: script a page's data could smuggle in), nothing loaded from elsewhere
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
COOKIE = "toolgym_ui_token"


def _deny(status: int, msg: str) -> Any:
    return PlainTextResponse(msg, status_code=status)


def _refusal(ui: UI, request: Request) -> Any:
    """The answer that refuses ``request`` (a token redirect counts), or ``None`` when it may go on."""
    if ui.token is None and (request.url.hostname or "") not in access.LOOPBACK_NAMES:
        return _deny(403, "toolgym ui answers loopback names only (no token is set)")
    if ui.token is not None:
        given = request.cookies.get(COOKIE) or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        query = request.query_params.get("token")
        if request.method == "GET" and query is not None:
            if not hmac.compare_digest(query.encode(), ui.token.encode()):
                return _deny(401, "wrong token")
            resp = RedirectResponse(request.url.path, status_code=303)
            resp.set_cookie(COOKIE, ui.token, httponly=True, samesite="strict")
            return resp
        if not hmac.compare_digest(given.encode(), ui.token.encode()):
            return _deny(401, "toolgym ui: token required (open /?token=YOUR_TOKEN once, or send "
                              "Authorization: Bearer YOUR_TOKEN)")
    if request.method not in ("GET", "HEAD"):
        if not request.headers.get("content-type", "").startswith("application/json"):
            return _deny(415, "requests that change state are application/json")
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            return _deny(403, "cross-origin request refused")
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            return _deny(411, "a request body needs a Content-Length")
        if int(length) > ui.max_upload:
            return _deny(413, f"request too large: {int(length)} bytes, the limit is {ui.max_upload} "
                              f"(--max-upload-mb)")
    return None


def install_guard(app: FastAPI, ui: UI) -> None:
    """Put the middleware and the error handlers on ``app``."""

    async def guard(request: Request, call_next: Any) -> Any:
        resp = _refusal(ui, request)
        if resp is None:
            try:
                resp = await call_next(request)
            except Exception as e:  # noqa: BLE001 - a bug is a message, never a traceback on the page
                resp = JSONResponse({"error": redact(f"internal error: {type(e).__name__}: {e}")}, status_code=500)
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"  # a token in a URL never leaves in a Referer
        resp.headers["X-Frame-Options"] = "SAMEORIGIN"
        resp.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        return resp

    async def ui_error(request: Request, e: UIError) -> Any:
        return JSONResponse({"error": redact(str(e))}, status_code=400)

    async def job_error(request: Request, e: JobError) -> Any:
        return JSONResponse({"error": str(e)}, status_code=400)

    app.middleware("http")(guard)
    app.add_exception_handler(UIError, ui_error)
    app.add_exception_handler(JobError, job_error)
