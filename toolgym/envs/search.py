"""``toolgym/Search-v0``: Search-R1 style question answering with a ``search`` tool.

Out of the box it runs offline on the embedded GeoNames data (:mod:`toolgym.data.geo`): ~2.8k one- and two-hop
questions over a ~34k-passage corpus indexed with BM25. The same env scales to the real Search-R1 setup by
pointing it at local files and a retrieval service::

    gym.make("toolgym/Search-v0")                                    # embedded data, local BM25
    gym.make("toolgym/Search-v0", split="test", hops=2)              # held-out two-hop questions
    gym.make("toolgym/Search-v0", dataset="nq_hotpotqa_train/train.parquet",
             retriever_url="http://gpu-host:8000/retrieve")          # Search-R1 data + e5/FAISS service

The model sees the ``search`` tool through the chat template's tool schemas, calls it in its native format
(hermes ``<tool_call>`` for the embedded model), and answers with ``<answer>...</answer>``. Task rows keep
Search-R1's names: ``question``, ``golden_answers``, plus ``id`` and ``hops``. The reward (:class:`SearchReward`)
is exact match (SQuAD normalisation, best over all gold answers) by default; F1, a format bonus and a per-turn
bonus for the first search that surfaces a gold answer are options.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.envs.base import ToolEnv
from toolgym.rewards.base import Reward, Score
from toolgym.rewards.rules import answer_format, exact_match, f1_score, normalize_answer
from toolgym.tools.search import BM25Retriever, RemoteRetriever, SearchTool
from toolgym.trajectory import Trajectory, Turn, extract_answer

__all__ = ["SYSTEM_PROMPT", "SearchEnv", "SearchReward", "load_tasks", "read_relation"]

SYSTEM_PROMPT = (
    "You answer questions with the help of a search tool. Call the search tool to look up facts; you may "
    "search several times, for example first for a city to learn its country and then for that country. "
    "Each search returns the most relevant passages for your query. When you know the answer, reply without "
    "calling a tool and write only the final answer, a few words, inside answer tags, for example "
    "<answer>Paris</answer>."
)


class SearchReward(Reward):
    """Search-R1's outcome reward plus optional shaping.

    Outcome = ``metric`` of the final answer (``"em"``: exact match, ``"f1"``: token F1; SQuAD normalisation,
    best over ``task[field]``) + ``format_weight`` x (the final turn holds exactly one non-empty
    ``<answer>`` block). An episode whose last turn still called a tool (cut by the turn/token budget) has no
    answer and scores 0 on both.

    Per turn (only when ``search_reward`` is non-zero): ``search_reward`` for the first turn whose successful
    ``search`` results contain a gold answer (once per episode, so repeating a search earns nothing).

    Components: ``em``, ``f1``, ``format``, ``searches`` (calls to the search tool), ``search_errors``; per turn
    ``useful_search``.
    """

    name = "search"

    def __init__(
        self,
        metric: str = "em",
        *,
        format_weight: float = 0.0,
        search_reward: float = 0.0,
        field: str = "golden_answers",
        tool_name: str = "search",
    ) -> None:
        if metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
        self.metric, self.format_weight, self.search_reward = metric, format_weight, search_reward
        self.field, self.tool_name = field, tool_name
        self.per_turn = search_reward != 0.0

    def _golds(self, task: Mapping[str, Any]) -> list[str]:
        g = task.get(self.field) or []
        return [g] if isinstance(g, str) else [str(x) for x in g]

    async def outcome(self, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        golds = self._golds(task)
        last = trajectory.turns[-1] if trajectory.turns else None
        answered = last is not None and not last.calls
        pred = extract_answer(last.content) if answered and last is not None else ""
        em = exact_match(pred, golds) if answered else 0.0
        f1 = f1_score(pred, golds) if answered else 0.0
        fmt = answer_format(last.text) if answered and last is not None else 0.0
        searches = [r for r in trajectory.tool_results if r.call.name == self.tool_name]
        return Score((em if self.metric == "em" else f1) + self.format_weight * fmt, {
            "em": em, "f1": f1, "format": fmt, "searches": float(len(searches)),
            "search_errors": float(sum(not r.ok for r in searches)),
        })

    def _finds_gold(self, turn: Turn, golds: list[str]) -> bool:
        gold = [f" {normalize_answer(g)} " for g in golds if normalize_answer(g)]
        for r in turn.results:
            if r.ok and r.call.name == self.tool_name:
                text = f" {normalize_answer(r.content)} "
                if any(g in text for g in gold):
                    return True
        return False

    async def turn(self, turn: Turn, trajectory: Trajectory, task: Mapping[str, Any]) -> Score:
        if not self.search_reward:
            return Score(0.0)
        golds = self._golds(task)
        useful = self._finds_gold(turn, golds) and not any(
            self._finds_gold(t, golds) for t in trajectory.turns if t is not turn
        )
        return Score(self.search_reward if useful else 0.0, {"useful_search": float(useful)})


#: how a reader finds each relation in the embedded passages (the sentence templates of :mod:`toolgym.data.geo`)
_GEO_READ = {
    "capital": re.compile(r"Its capital is (.+?)\. "),
    "currency": re.compile(r"The currency of .+? is the (.+?) \("),
    "continent": re.compile(r" is a country in (.+?)\."),
    "calling_code": re.compile(r"international calling code is (\S+?)\.(?:\s|$)"),
    "city_country": re.compile(r" is a city in (.+?)\."),
}
_DOC = re.compile(r"^Doc \d+ \(Title: (.*?)\) (.*)$", re.MULTILINE)


def read_relation(results_text: str, title: str, relation: str) -> str | None:
    """What a reader finds for ``relation`` (a :mod:`toolgym.data.geo` relation) in search results
    (``Doc i (Title: T) text`` lines): the doc titled ``title`` first, then the others in rank order."""
    pattern = _GEO_READ.get(relation)
    if pattern is None:
        return None
    docs = _DOC.findall(results_text)
    docs = [d for d in docs if d[0] == title] + [d for d in docs if d[0] != title]
    for _, text in docs:
        m = pattern.search(text + " ")
        if m:
            return m.group(1)
    return None


_ROWS_CACHE: dict[tuple[str, float, int | None], list[dict[str, Any]]] = {}
_INDEX_CACHE: dict[tuple[str, float, int | None, str], BM25Retriever] = {}
_CACHE_LOCK = threading.Lock()


def load_tasks(
    dataset: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None = None,
    *,
    split: str = "train",
    seed: int = 0,
    test_fraction: float = 0.2,
    hops: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The env's task rows: ``id``, ``question``, ``golden_answers``, ``hops``, ``prompt`` (= the question), ...

    Args:
        dataset: ``None``/``"geo"`` (embedded, split by ``seed``/``test_fraction``), a QA file path (Search-R1
            parquet or JSONL; used as is, ``split`` ignored), or a list of rows.
        hops: keep only rows with this ``hops`` value (rows of unknown hops are dropped when set).
        limit: keep the first N rows (after filtering).
    """
    from toolgym.data.geo import load_geo
    from toolgym.data.search_r1 import load_qa, normalize_qa_row

    if dataset is None or (isinstance(dataset, str) and dataset == "geo"):
        rows = load_geo(split, seed=seed, test_fraction=test_fraction, hops=hops)
    elif isinstance(dataset, (str, os.PathLike)):
        p = Path(dataset).resolve()
        key = (str(p), p.stat().st_mtime if p.exists() else 0.0, None)
        with _CACHE_LOCK:
            cached = _ROWS_CACHE.get(key)
        if cached is None:
            cached = load_qa(p)
            with _CACHE_LOCK:
                _ROWS_CACHE[key] = cached
        rows = cached
    else:
        rows = [normalize_qa_row(r, i, "rows") for i, r in enumerate(dataset)]
    if hops is not None:
        rows = [r for r in rows if r.get("hops") == hops]
    if limit is not None:
        rows = rows[:limit]
    out = [{**r, "prompt": r.get("prompt") if isinstance(r.get("prompt"), str) else r["question"]} for r in rows]
    if not out:
        raise ValueError(f"no Search tasks left (dataset={dataset!r}, split={split!r}, hops={hops!r})")
    return out


def _local_index(corpus: str | os.PathLike[str], backend: str, limit: int | None) -> BM25Retriever:
    from toolgym.data.geo import default_retriever

    if isinstance(corpus, str) and corpus in ("geo", "default"):
        return default_retriever("default", backend)
    if isinstance(corpus, str) and corpus in ("geo-100k", "100k"):
        return default_retriever("100k", backend)
    from toolgym.data.search_r1 import load_corpus

    p = Path(corpus).resolve()
    key = (str(p), p.stat().st_mtime if p.exists() else 0.0, limit, backend)
    with _CACHE_LOCK:
        r = _INDEX_CACHE.get(key)
    if r is None:
        r = BM25Retriever(load_corpus(p, limit=limit), backend=backend)
        with _CACHE_LOCK:
            _INDEX_CACHE[key] = r
    return r


class SearchEnv(ToolEnv):
    """Search-R1 style QA with one ``search`` tool.

    Args:
        dataset: ``None``/``"geo"`` (embedded GeoNames questions), a Search-R1 QA file (``.parquet``/``.jsonl``
            with ``question`` + ``golden_answers``), or a list of rows. See :func:`load_tasks`.
        corpus: the local index: ``None``/``"geo"`` (embedded, ~34k passages), ``"geo-100k"`` (plus synthetic
            passages), or a Search-R1 corpus JSONL (``{"id", "contents"}``), indexed with BM25 once per process.
        retriever_url: a Search-R1 ``/retrieve`` endpoint (or a list of them) to use instead of a local index.
        retriever: any object with ``await asearch(query, k)`` (overrides ``corpus``/``retriever_url``).
        split: ``"train"`` or ``"test"`` (embedded data; Search-R1 files come already split).
        topk: passages per search.
        seed, test_fraction: the embedded train/test split.
        hops: keep only 1- or 2-hop questions.
        limit: keep the first N tasks.
        max_chars: character budget of one search result (before the token cut ``max_obs_tokens``).
        metric, format_weight, search_reward: the default :class:`SearchReward` (``reward=`` replaces it).
        backend: BM25 backend (``"auto"``, ``"numba"``, ``"numpy"``).
        retriever_timeout_s: request timeout of the remote retriever.
        **kwargs: :class:`~toolgym.envs.base.ToolEnv` options (tokenizer, max_turns, executor, ...).

    A data file without ``corpus``/``retriever_url``/``retriever`` is an error: its questions are not about the
    embedded corpus.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None = None,
        corpus: str | os.PathLike[str] | None = None,
        retriever_url: str | Sequence[str] | None = None,
        *,
        retriever: Any | None = None,
        split: str = "train",
        topk: int = 3,
        seed: int = 0,
        test_fraction: float = 0.2,
        hops: int | None = None,
        limit: int | None = None,
        corpus_limit: int | None = None,
        max_chars: int | None = 1800,
        metric: str = "em",
        format_weight: float = 0.0,
        search_reward: float = 0.0,
        backend: str = "auto",
        retriever_timeout_s: float = 10.0,
        max_turns: int = 4,
        max_episode_tokens: int = 2048,
        max_obs_tokens: int = 640,
        **kwargs: Any,
    ) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        embedded = dataset is None or (isinstance(dataset, str) and dataset == "geo")
        if not embedded and corpus is None and retriever_url is None and retriever is None:
            raise ValueError(
                "a Search-R1 dataset needs a retriever: pass retriever_url='http://host:8000/retrieve' "
                "(see docs/search.md) or corpus='path/to/corpus.jsonl'"
            )
        self.split, self.topk = split, topk
        tasks = load_tasks(dataset, split=split, seed=seed, test_fraction=test_fraction, hops=hops, limit=limit)
        tools: list[SearchTool] = []
        if kwargs.get("executor") is None:  # vector sub-envs share the first env's executor (and tool)
            if retriever is not None:
                tools.append(SearchTool(retriever, topk=topk, max_chars=max_chars))
            elif retriever_url is not None:
                remote = RemoteRetriever(retriever_url, timeout_s=retriever_timeout_s)
                tools.append(SearchTool(remote, topk=topk, max_chars=max_chars,
                                        timeout_s=retriever_timeout_s * 2 + 1, owns_retriever=True))
            else:
                tools.append(SearchTool(_local_index(corpus or "geo", backend, corpus_limit), topk=topk,
                                        max_chars=max_chars))
        kwargs.setdefault("reward", SearchReward(metric, format_weight=format_weight, search_reward=search_reward))
        kwargs.setdefault("system_prompt", SYSTEM_PROMPT)
        super().__init__(
            tasks, tools, max_turns=max_turns, max_episode_tokens=max_episode_tokens,
            max_obs_tokens=max_obs_tokens, **kwargs,
        )

    def build_messages(self, task: Mapping[str, Any]) -> list[dict[str, Any]]:
        """System prompt + the question as the user turn (rows given via ``reset(options={"task": row})`` may
        carry only Search-R1's ``question``)."""
        if "messages" not in task and not isinstance(task.get("prompt"), str) and "question" in task:
            task = {**task, "prompt": task["question"]}
        return super().build_messages(task)

    def oracle(self, state: Any) -> str:
        """Search like a careful reader, then answer from the passages.

        Embedded GeoNames rows (with ``entity`` and ``relation``): search the entity; for two-hop questions
        read the bridge country from those results and search it; answer with the fact read from the last
        results (:func:`read_relation`). Other rows (Search-R1 files): search the question and answer with the
        first gold answer found in the results, else the top passage's title (an upper bound of the retrieval,
        not of reading). A failed search is repeated while turns remain.
        """
        task = state.task
        traj = state.trajectory
        found = [t for t in (traj.turns if traj is not None else []) if any(r.ok for r in t.results)]
        last = self.last_results(state)
        if last and not any(r.ok for r in last) and state.turn < self.max_turns - 1:
            return self._search(str(last[0].call.arguments.get("query") or ""))
        texts = ["\n".join(r.content for r in t.results if r.ok) for t in found]
        rel = str(task.get("relation") or "").split(">")
        entity = task.get("entity")
        if entity and rel[-1] in _GEO_READ:
            if not found:
                return self._search(str(entity))
            if len(rel) == 2 and len(found) == 1:
                return self._search(read_relation(texts[0], str(entity), rel[0]) or str(entity))
            title = str(entity) if len(rel) == 1 else str(found[-1].calls[0].arguments.get("query") or "")
            return f"<answer>{read_relation(texts[-1], title, rel[-1]) or 'unknown'}</answer>"
        if not found:
            return self._search(str(task.get("question") or task.get("prompt") or ""))
        norm = f" {normalize_answer(texts[-1])} "
        golds = task.get("golden_answers") or []
        golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
        hit = next((g for g in golds if normalize_answer(g) and f" {normalize_answer(g)} " in norm), None)
        docs = _DOC.findall(texts[-1])
        return f"<answer>{hit or (docs[0][0] if docs else 'unknown')}</answer>"

    def _search(self, query: str) -> str:
        return self.format.parser.format_calls([("search", {"query": query})])
