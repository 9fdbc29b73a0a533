"""``toolgym serve retriever``: a Search-R1 compatible retrieval service over any local index.

API (Search-R1's ``retrieval_server.py``)::

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    -> 200 {"result": [[{"document": {"id", "contents", "title", "text"}, "score": 12.3}, ...], ...]}
       (without ``return_scores`` each item is the document itself)
    GET /health     -> 200 {"status": "ok", "passages": N, "backend": "numba"}

Malformed requests get a 4xx JSON ``{"error": "..."}`` and never a 500: 400 for a body that is not JSON or not
an object, 422 for wrong types or values (missing/empty ``queries``, ``topk`` out of ``1..max_topk``), 413 for
a body over ``max_body_bytes`` or more than ``max_queries`` queries. Retrieval runs on the index's worker thread,
so the event loop keeps accepting requests.

Run it with ``toolgym serve retriever --corpus geo --port 8000`` (see :func:`main`), from Python with
:func:`run`, or in a background thread with :class:`BackgroundServer` (tests, notebooks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from toolgym.serve import access
from toolgym.tools.search import BM25Retriever, Hit

__all__ = ["BackgroundServer", "build_retriever", "create_app", "main", "run"]

log = logging.getLogger(__name__)

RETRIEVER_KEY: web.AppKey[Any] = web.AppKey("retriever", object)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _hit_json(hit: Hit, with_score: bool) -> dict[str, Any]:
    doc = hit.passage.to_dict()
    return {"document": doc, "score": hit.score} if with_score else doc


def _validate(body: Any, *, max_topk: int, max_queries: int, default_topk: int) -> tuple[list[str], int, bool]:
    if not isinstance(body, dict):
        raise _BadRequest(400, f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"queries", "topk", "return_scores"})
    if unknown:
        raise _BadRequest(422, f"unknown field(s) {unknown}; expected queries, topk, return_scores")
    queries = body.get("queries")
    if not isinstance(queries, list) or not queries:
        raise _BadRequest(422, "'queries' must be a non-empty list of strings")
    if len(queries) > max_queries:
        raise _BadRequest(413, f"too many queries: {len(queries)} > {max_queries}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise _BadRequest(422, f"'queries[{i}]' must be a string, got {type(q).__name__}")
    topk = body.get("topk")
    if topk is None:
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise _BadRequest(422, f"'topk' must be an integer, got {type(topk).__name__}")
    if not 1 <= topk <= max_topk:
        raise _BadRequest(422, f"'topk' must be between 1 and {max_topk}, got {topk}")
    ret = body.get("return_scores", False)
    if not isinstance(ret, bool):
        raise _BadRequest(422, f"'return_scores' must be a boolean, got {type(ret).__name__}")
    return queries, topk, ret


def create_app(
    retriever: Any,
    *,
    max_topk: int = 100,
    max_queries: int = 4096,
    default_topk: int = 3,
    max_body_bytes: int = 8 * 1024 * 1024,
) -> web.Application:
    """The aiohttp application serving ``retriever`` (anything with ``await abatch_search(queries, k)``).

    Args:
        max_topk: largest ``topk`` accepted (422 above).
        max_queries: most queries per request (413 above).
        default_topk: ``topk`` when the request omits it (Search-R1's ``retrieval_topk``).
        max_body_bytes: largest request body (413 above).
    """

    @web.middleware
    async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:  # 404/405/413 from aiohttp itself: keep the status, answer JSON
            if e.status < 400:
                raise
            return _error(e.status, e.reason or str(e))

    async def retrieve(request: web.Request) -> web.Response:
        raw = await request.read()  # 413 (HTTPRequestEntityTooLarge) beyond client_max_size
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"request body is not valid JSON: {e}")
        try:
            queries, topk, with_scores = _validate(
                body, max_topk=max_topk, max_queries=max_queries, default_topk=default_topk
            )
        except _BadRequest as e:
            return _error(e.status, e.message)
        hits = await request.app[RETRIEVER_KEY].abatch_search(queries, topk)
        return web.json_response({"result": [[_hit_json(h, with_scores) for h in row] for row in hits]})

    async def health(request: web.Request) -> web.Response:
        r = request.app[RETRIEVER_KEY]
        return web.json_response(
            {
                "status": "ok",
                "passages": len(r) if hasattr(r, "__len__") else None,
                "backend": getattr(r, "backend", None),
            }
        )

    app = web.Application(middlewares=[json_errors], client_max_size=max_body_bytes)
    app[RETRIEVER_KEY] = retriever
    app.router.add_post("/retrieve", retrieve)
    app.router.add_get("/health", health)
    return app


def build_retriever(corpus: str = "geo", *, backend: str = "auto", limit: int | None = None) -> BM25Retriever:
    """A BM25 index over ``corpus``: ``"geo"`` (embedded GeoNames), ``"geo-100k"`` (with synthetic passages), or a
    path to a Search-R1 corpus JSONL (``{"id", "contents"}`` per line; ``limit`` keeps the first N)."""
    if corpus in ("geo", "geo-100k"):
        from toolgym.data.geo import default_retriever

        return default_retriever("100k" if corpus == "geo-100k" else "default", backend=backend)
    from toolgym.data.search_r1 import load_corpus

    return BM25Retriever(load_corpus(corpus, limit=limit), backend=backend)


def run(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    retriever: Any | None = None,
    corpus: str = "geo",
    backend: str = "auto",
    token: str | None = None,
    **app_kwargs: Any,
) -> None:
    """Serve until interrupted (blocking). ``retriever`` defaults to :func:`build_retriever` over ``corpus``. A
    non-loopback ``host`` needs ``token``, carried by every request as ``Authorization: Bearer``
    (:mod:`toolgym.serve.access`)."""
    access.check_bind(host, token, what="serve retriever", env=access.SERVE_TOKEN_ENV)
    if retriever is None:
        retriever = build_retriever(corpus, backend=backend)
    app = create_app(retriever, **app_kwargs)
    app.middlewares.insert(0, access.aiohttp_guard(token))
    print(f"toolgym retriever: {retriever!r} on http://{host}:{port}/retrieve", flush=True)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: ``toolgym serve retriever [--host H] [--port P] [--corpus geo|geo-100k|PATH.jsonl] ...``."""
    p = argparse.ArgumentParser(prog="toolgym serve retriever", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; any other needs a "
                   "token)")
    p.add_argument("--port", type=int, default=8000)
    access.add_token_argument(p, access.SERVE_TOKEN_ENV)
    p.add_argument("--corpus", default="geo", help="geo | geo-100k | path to a Search-R1 corpus JSONL")
    p.add_argument("--limit", type=int, default=None, help="index only the first N passages of a JSONL corpus")
    p.add_argument("--backend", default="auto", choices=["auto", "numba", "numpy"])
    p.add_argument("--max-topk", type=int, default=100)
    p.add_argument("--max-queries", type=int, default=4096)
    p.add_argument("--default-topk", type=int, default=3)
    a = p.parse_args(argv)
    token = access.read_token(a.token_file, access.SERVE_TOKEN_ENV)
    access.check_bind(a.host, token, what="serve retriever", env=access.SERVE_TOKEN_ENV)  # exit 2 before indexing
    retriever = build_retriever(a.corpus, backend=a.backend, limit=a.limit)
    run(
        a.host, a.port, retriever=retriever, token=token, max_topk=a.max_topk, max_queries=a.max_queries,
        default_topk=a.default_topk,
    )
    return 0


class BackgroundServer:
    """The service on its own event loop in a daemon thread; ``port=0`` picks a free port.

    ``with BackgroundServer(retriever) as srv: srv.url`` -> ``"http://127.0.0.1:PORT/retrieve"``. :meth:`stop`
    closes the listening socket (clients then see connection errors); :meth:`start` again serves on the same
    port, which is how tests simulate a service going down and coming back.
    """

    def __init__(self, retriever: Any, host: str = "127.0.0.1", port: int = 0, **app_kwargs: Any) -> None:
        self.retriever, self.host, self.port, self.app_kwargs = retriever, host, port, app_kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/retrieve"

    def start(self) -> BackgroundServer:
        if self._runner is not None:
            return self
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="toolgym-retriever", daemon=True)
            self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        runner = web.AppRunner(create_app(self.retriever, **self.app_kwargs), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._runner = runner

    def stop(self) -> None:
        """Stop serving (the thread's loop stays, so :meth:`start` can resume on the same port)."""
        if self._runner is not None and self._loop is not None:
            runner, self._runner = self._runner, None
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(30)

    def close(self) -> None:
        self.stop()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            if self._thread is None or not self._thread.is_alive():
                self._loop.close()
            self._loop = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":  # python -m toolgym.serve.retriever
    raise SystemExit(main())
