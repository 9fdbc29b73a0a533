"""Retrieval tools: an embedded BM25 index and a client for remote Search-R1 style ``/retrieve`` services.

* :class:`BM25Retriever` indexes passages with `bm25s <https://github.com/xhluca/bm25s>`_ (numba backend when
  importable, warmed at construction so the first real query is not a JIT compile; plain numpy otherwise).
* :class:`RemoteRetriever` speaks Search-R1's API (``POST /retrieve`` with ``{"queries": [...], "topk": k,
  "return_scores": true}``); concurrent :meth:`~RemoteRetriever.asearch` calls from many episodes are
  micro-batched into one request. Connection failures and 5xx answers raise ``ToolError(retryable=True)``.
* :class:`SearchTool` is the ``search(query)`` tool over either, answering in Search-R1's
  ``Doc i (Title: ...) text`` form, truncated to a character budget.

Both retrievers share one interface: ``search(query, k)``, ``batch_search(queries, k)`` (sync) and
``await asearch(query, k)`` / ``await abatch_search(queries, k)``, each returning :class:`Hit` lists, best first.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from toolgym import runtime
from toolgym.batching import MicroBatcher
from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = [
    "BM25Retriever",
    "Hit",
    "Passage",
    "RemoteRetriever",
    "Retriever",
    "SearchTool",
    "format_docs",
    "numba_available",
]


# -- data types ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Passage:
    """One retrievable passage. ``contents`` is Search-R1's corpus form: ``'"Title"\\ntext'``."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def to_dict(self) -> dict[str, str]:
        """Search-R1's document dict (``id``, ``contents``) plus ``title`` and ``text``."""
        return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], default_id: str = "") -> Passage:
        """From ``{"id", "title", "text"}`` or Search-R1's ``{"id", "contents"}`` (first line = quoted title)."""
        pid = str(d.get("id", default_id))
        if "text" in d and "contents" not in d:
            return cls(pid, str(d.get("title", "")), str(d["text"]))
        if "contents" in d:
            title, sep, text = str(d["contents"]).partition("\n")
            if not sep:  # no title line
                return cls(pid, str(d.get("title", "")), title)
            return cls(pid, title.strip().strip('"'), text)
        raise ValueError(f"a passage needs 'text' or 'contents', got keys {sorted(d)}")


@dataclass(frozen=True)
class Hit:
    """A retrieved passage and its score (higher is better; BM25 or the remote retriever's own)."""

    passage: Passage
    score: float


def format_docs(hits: Sequence[Hit], max_chars: int | None = None) -> str:
    """Search-R1's observation text: ``Doc 1 (Title: T) text`` lines, one per hit.

    When the whole text exceeds ``max_chars`` characters, each passage is cut (at a word boundary, with ``…``)
    to an equal share of the budget, so every retrieved document stays visible.
    """
    if not hits:
        return "No results found."
    heads = [f"Doc {i} (Title: {h.passage.title}) " for i, h in enumerate(hits, 1)]
    bodies = [" ".join(h.passage.text.split()) for h in hits]
    full = "\n".join(h + b for h, b in zip(heads, bodies, strict=True))
    if max_chars is None or len(full) <= max_chars:
        return full
    share = max(max_chars // len(hits), 1)
    out = []
    for h, b in zip(heads, bodies, strict=True):
        room = max(share - len(h) - 1, 0)
        if len(b) > room:
            cut = b[:room]
            if " " in cut:
                cut = cut[: cut.rfind(" ")]
            b = cut + "…"
        out.append(h + b)
    return "\n".join(out)


@runtime_checkable
class Retriever(Protocol):
    """What :class:`SearchTool` needs from a retriever."""

    async def asearch(self, query: str, k: int) -> list[Hit]: ...

    async def aclose(self) -> None: ...


# -- micro-batching -------------------------------------------------------------------------------------
def _query_batcher(
    fn: Callable[[list[str], int], Awaitable[list[list[Hit]]]], window_s: float, max_batch: int
) -> MicroBatcher[tuple[str, int], list[Hit]]:
    """A :class:`~toolgym.batching.MicroBatcher` of ``(query, k)``: single queries arriving within ``window_s`` (or
    until ``max_batch``) become one batch, and ``fn(queries, k)`` is awaited once per distinct ``k`` in it. A
    failing call fails each of its queries with a fresh copy of the error. Lives on one event loop."""

    async def run(items: list[tuple[str, int]]) -> list[list[Hit] | BaseException]:
        groups: dict[int, list[int]] = {}
        for i, (_, k) in enumerate(items):
            groups.setdefault(k, []).append(i)
        out: list[list[Hit] | BaseException] = [[] for _ in items]

        async def one(k: int, idx: list[int]) -> None:
            try:
                results = await fn([items[i][0] for i in idx], k)
                if len(results) != len(idx):
                    raise ToolError(f"retriever returned {len(results)} result lists for {len(idx)} queries")
            except Exception as e:
                for i in idx:
                    out[i] = ToolError(e.message, kind=e.kind, retryable=e.retryable) if isinstance(e, ToolError) else e
                return
            for i, r in zip(idx, results, strict=True):
                out[i] = r

        await asyncio.gather(*(one(k, idx) for k, idx in groups.items()))
        return out

    return MicroBatcher(run, max_batch=max_batch, max_wait_s=window_s, concurrent=True)


# -- BM25 ---------------------------------------------------------------------------------------------
def numba_available() -> bool:
    """``True`` when numba imports (bm25s's fast backend)."""
    try:
        import numba  # noqa: F401
    except Exception:
        return False
    return True


def _enable_numba_cache() -> None:
    """Turn on numba's on-disk cache for bm25s's retrieval kernel (bm25s does not ask for one), so only the
    first process on a machine pays the ~10 s JIT compile; later ones load it in ~1 s. Best effort."""
    try:
        from bm25s.numba import retrieve_utils

        for name in ("_retrieve_internal_jitted_serial", "_retrieve_internal_jitted_parallel"):
            fn = getattr(retrieve_utils, name, None)
            if fn is not None and not fn.signatures and hasattr(fn, "enable_caching"):
                fn.enable_caching()
    except Exception:
        pass


_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s's (and scikit-learn's) default token pattern


class BM25Retriever:
    """BM25 over an in-memory corpus with ``bm25s``.

    Args:
        passages: ``Passage`` objects or dicts (``{"id","title","text"}`` or Search-R1's ``{"id","contents"}``).
            Title and text are both indexed.
        k1, b, method: BM25 parameters (defaults: Pyserini's ``k1=0.9, b=0.4``, Lucene scoring, as Search-R1's
            BM25 baseline).
        backend: ``"auto"`` (numba when importable, else numpy), ``"numba"`` or ``"numpy"``.
        stopwords: bm25s stopword set name (``"en"``) or ``None``.
        warm: run one query at construction so numba's JIT compile is paid here, not by the first episode.

    Queries are lower-cased and split like the corpus; words absent from the corpus are ignored, and a query
    with no known word returns no hits. Batch calls run serially on one thread (numba's ``nogil`` path), which
    was faster than 2 threads on a 2-core machine.
    """

    def __init__(
        self,
        passages: Iterable[Passage | Mapping[str, Any]],
        *,
        k1: float = 0.9,
        b: float = 0.4,
        method: str = "lucene",
        backend: str = "auto",
        stopwords: str | None = "en",
        warm: bool = True,
        batch_window_s: float = 0.001,
        max_batch: int = 1024,
    ) -> None:
        import bm25s
        from bm25s.stopwords import STOPWORDS_EN

        self.passages: list[Passage] = [
            p if isinstance(p, Passage) else Passage.from_dict(p, default_id=str(i)) for i, p in enumerate(passages)
        ]
        if not self.passages:
            raise ValueError("BM25Retriever needs at least one passage")
        if backend == "auto":
            backend = "numba" if numba_available() else "numpy"
        if backend not in ("numba", "numpy"):
            raise ValueError(f"backend must be 'auto', 'numba' or 'numpy', got {backend!r}")
        self.backend = backend
        self._stop = frozenset(STOPWORDS_EN) if stopwords in ("en", "english") else frozenset()
        texts = [f"{p.title}\n{p.text}" for p in self.passages]
        tok = bm25s.tokenize(texts, stopwords=list(self._stop) or None, show_progress=False)
        self.vocab: dict[str, int] = dict(tok.vocab)
        if backend == "numba":
            _enable_numba_cache()
        self._bm25 = bm25s.BM25(k1=k1, b=b, method=method, backend=backend)
        self._bm25.index(tok, show_progress=False)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bm25")
        self._batchers = runtime.PerLoop(lambda: _query_batcher(self._abatch_in_pool, batch_window_s, max_batch))
        if warm:
            self.batch_search([self.passages[0].title or self.passages[0].text[:40]], 1)

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"BM25Retriever({len(self)} passages, backend={self.backend!r})"

    def tokenize(self, query: str) -> list[int]:
        """Vocabulary ids of the query's known, non-stopword tokens."""
        v = self.vocab
        return [v[t] for t in _TOKEN.findall(query.lower()) if t not in self._stop and t in v]

    def batch_search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query (best first), ``k`` capped at the corpus size."""
        k = max(0, min(int(k), len(self.passages)))
        out: list[list[Hit]] = [[] for _ in queries]
        ids = [self.tokenize(q) for q in queries]
        live = [i for i, t in enumerate(ids) if t]
        if not live or k == 0:
            return out
        res = self._bm25.retrieve(
            [ids[i] for i in live], k=k, show_progress=False, n_threads=1, return_as="tuple"
        )
        docs, scores = np.asarray(res.documents).tolist(), np.asarray(res.scores).tolist()
        ps = self.passages
        for i, drow, srow in zip(live, docs, scores, strict=True):
            out[i] = [Hit(ps[d], s) for d, s in zip(drow, srow, strict=True) if s > 0]
        return out

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k)[0]

    async def _abatch_in_pool(self, queries: list[str], k: int) -> list[list[Hit]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.batch_search, queries, k)

    async def abatch_search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """:meth:`batch_search` on the retriever's worker thread (the event loop stays free)."""
        return await self._abatch_in_pool(list(queries), k)

    async def asearch(self, query: str, k: int) -> list[Hit]:
        """One query; concurrent calls on a loop are micro-batched into one :meth:`batch_search`."""
        return await self._batchers.get().submit((query, k))

    async def aclose(self) -> None:
        """Nothing to release per call site (the index may be shared); see :meth:`shutdown`."""

    def shutdown(self) -> None:
        """Stop the worker thread (the retriever is unusable afterwards)."""
        self._pool.shutdown(wait=False)


# -- remote -------------------------------------------------------------------------------------------
class RemoteRetriever:
    """Client of a Search-R1 style retrieval service (``toolgym serve retriever``, or Search-R1's own
    ``retrieval_server.py`` with e5 + FAISS).

    Args:
        url: the ``/retrieve`` endpoint, or several (requests go round-robin; a connection failure on one
            tries the next before giving up).
        timeout_s: per-request timeout in seconds (the executor's tool timeout bounds the whole call too).
        batch_window_s: how long a single query waits for others to share its request (seconds).
        max_batch: queries per request at most.
        return_scores: ask for scores (Search-R1's ``return_scores``).

    Errors raise :class:`~toolgym.tools.base.ToolError`: unreachable service, timeouts, 5xx / 429 with
    ``retryable=True``; other 4xx and malformed answers with ``retryable=False``.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        batch_window_s: float = 0.002,
        max_batch: int = 256,
        return_scores: bool = True,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("RemoteRetriever needs at least one url")
        self.urls = urls
        self.timeout_s = timeout_s
        self.return_scores = return_scores
        self.headers = dict(headers or {})
        self._rr = itertools.count()
        self._sessions = runtime.PerLoop(self._new_session)
        self._batchers = runtime.PerLoop(lambda: _query_batcher(self.abatch_search, batch_window_s, max_batch))
        self.requests = 0  #: POSTs sent (successful or not)
        self.queries = 0  #: queries sent

    def __repr__(self) -> str:
        return f"RemoteRetriever({self.urls!r})"

    @property
    def url(self) -> str:
        return self.urls[0]

    def _new_session(self) -> Any:
        import aiohttp

        return aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            headers=self.headers,
            connector=aiohttp.TCPConnector(limit=64),
        )

    async def abatch_search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """One POST for all ``queries``; returns the hits per query in order."""
        import aiohttp

        session = self._sessions.get()
        payload = {"queries": list(queries), "topk": int(k), "return_scores": self.return_scores}
        start = next(self._rr)
        last: Exception | None = None
        for j in range(len(self.urls)):
            url = self.urls[(start + j) % len(self.urls)]
            self.requests += 1
            self.queries += len(queries)
            try:
                async with session.post(url, json=payload) as resp:
                    body = await resp.text()
                    status = resp.status
            except (aiohttp.ClientConnectionError, OSError) as e:  # refused, reset, DNS, server gone
                last = e
                continue
            except TimeoutError as e:
                raise ToolError(
                    f"retriever at {url} did not answer within {self.timeout_s:g} s", kind=ToolErrorKind.TIMEOUT,
                    retryable=True,
                ) from e
            return self._parse(url, status, body, len(queries))
        raise ToolError(
            f"retriever unreachable at {', '.join(self.urls)}: {type(last).__name__}: {last}", retryable=True
        )

    @staticmethod
    def _parse(url: str, status: int, body: str, n: int) -> list[list[Hit]]:
        if status != 200:
            try:
                msg = json.loads(body).get("error", body)
            except Exception:
                msg = body
            msg = str(msg)[:300]
            raise ToolError(f"retriever at {url} answered HTTP {status}: {msg}", retryable=status >= 500 or status == 429)
        try:
            result = json.loads(body)["result"]
            if not isinstance(result, list) or len(result) != n:
                raise ValueError(f"expected {n} result lists")
            out = []
            for row in result:
                hits = []
                for i, item in enumerate(row):
                    if isinstance(item, Mapping) and "document" in item:
                        hits.append(Hit(Passage.from_dict(item["document"], str(i)), float(item.get("score", 0.0))))
                    else:
                        hits.append(Hit(Passage.from_dict(item, str(i)), 0.0))
                out.append(hits)
            return out
        except Exception as e:
            raise ToolError(f"retriever at {url} sent a malformed answer: {type(e).__name__}: {e}") from e

    async def asearch(self, query: str, k: int) -> list[Hit]:
        """One query; concurrent calls on a loop share one POST (micro-batching)."""
        return await self._batchers.get().submit((query, k))

    def batch_search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Sync :meth:`abatch_search` (runs on the toolgym runtime loop)."""
        return runtime.run_sync(self.abatch_search(queries, k))

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k)[0]

    async def aclose(self) -> None:
        """Close the HTTP session of the current loop (others are closed when their loop is)."""
        s = self._sessions.pop()
        if s is not None:
            await s.close()


# -- the tool -------------------------------------------------------------------------------------------
class SearchTool(Tool):
    """``search(query)``: the top-``topk`` passages for ``query`` in Search-R1's ``Doc i (Title: ...)`` form.

    Args:
        retriever: a :class:`BM25Retriever`, :class:`RemoteRetriever` or anything with ``await asearch(q, k)``.
        topk: passages per call.
        max_chars: character budget of the observation (each passage is cut to an equal share; the env also
            cuts observations to ``max_obs_tokens`` tokens).
        owns_retriever: close the retriever when the tool is closed (the shared embedded index is never closed).
    """

    name = "search"
    description = (
        "Search an encyclopedia and return the most relevant passages for a query. "
        "Use short, specific queries such as the name of a place or a country."
    )
    cacheable = True

    def __init__(
        self,
        retriever: Retriever,
        *,
        topk: int = 3,
        max_chars: int | None = 1800,
        timeout_s: float | None = None,
        owns_retriever: bool = False,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if topk < 1:
            raise ValueError("topk must be >= 1")
        self.parameters = {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query, e.g. an entity name."}},
            "required": ["query"],
            "additionalProperties": False,
        }
        self.retriever = retriever
        self.topk = topk
        self.max_chars = max_chars
        self.timeout_s = timeout_s
        self.owns_retriever = owns_retriever
        if name:
            self.name = name
        if description:
            self.description = description

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        query = str(arguments.get("query", "")).strip()
        if not query:
            raise ToolError("query must be a non-empty string", kind=ToolErrorKind.INVALID_ARGUMENTS)
        hits = await self.retriever.asearch(query, self.topk)
        return format_docs(hits, self.max_chars)

    async def aclose(self) -> None:
        if self.owns_retriever:
            await self.retriever.aclose()
