"""toolgym/Search-v0: embedded GeoNames data, BM25 retriever, the search tool, Search-R1 files, oracle episodes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import toolgym  # noqa: F401 - registers the envs
from toolgym.data import geo
from toolgym.data.geo import default_retriever
from toolgym.data.search_r1 import load_corpus, load_qa
from toolgym.envs.search import SearchEnv, SearchReward, load_tasks
from toolgym.format.parsers import get_parser
from toolgym.rewards.rules import normalize_answer
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.search import BM25Retriever, Hit, Passage, SearchTool, format_docs
from toolgym.trajectory import Trajectory, Turn

HERMES = get_parser("hermes")
_DOC = re.compile(r"^Doc \d+ \(Title: (.*?)\) (.*)$", re.MULTILINE)
_EXTRACT = {
    "capital": re.compile(r"Its capital is (.+?)\. "),
    "currency": re.compile(r"The currency of .+? is the (.+?) \("),
    "continent": re.compile(r" is a country in (.+?)\."),
    "calling_code": re.compile(r"international calling code is (\S+?)\.(?:\s|$)"),
    "city_country": re.compile(r" is a city in (.+?)\."),
}


@pytest.fixture(scope="module")
def retriever() -> BM25Retriever:
    return default_retriever()


@pytest.fixture(scope="module")
def env() -> Any:
    e = gym.make("toolgym/Search-v0", split="test")
    yield e
    e.close()


def _sample(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    idx = np.random.default_rng(0).permutation(len(rows))[:n]
    return [rows[int(i)] for i in sorted(idx)]


# -- scripted policies ------------------------------------------------------------------------------------
def _docs(obs_text: str) -> list[tuple[str, str]]:
    return _DOC.findall(obs_text)


def _read(obs_text: str, title: str, relation: str) -> str | None:
    """What a reader finds for ``relation`` in the doc titled ``title`` (else in any doc)."""
    docs = _docs(obs_text)
    docs = [d for d in docs if d[0] == title] + [d for d in docs if d[0] != title]
    for _, text in docs:
        m = _EXTRACT[relation].search(text + " ")
        if m:
            return m.group(1)
    return None


def run_episode(env: Any, task: dict[str, Any], policy: Callable[[dict[str, Any], list[str]], str]) -> tuple[float, Trajectory, list[str]]:
    """Drive one episode; ``policy(task, observations) -> assistant text``. Returns (return, trajectory, obs)."""
    u = env.unwrapped
    env.reset(options={"task": task})
    seen: list[str] = []
    total = 0.0
    while True:
        obs, r, term, trunc, info = env.step(u.encode_action(policy(task, seen)))
        total += r
        if term or trunc:
            return total, info["trajectory"], seen
        seen.append(u.tokenizer.decode(obs, skip_special_tokens=False))


def search(q: str) -> str:
    return HERMES.format_calls([("search", {"query": q})])


def oracle(task: dict[str, Any], seen: list[str]) -> str:
    """Search the entity; for two-hop read the bridge country and search it; answer from the passage."""
    rel = task["relation"].split(">")
    if not seen:
        return search(task["entity"])
    if len(rel) == 2 and len(seen) == 1:
        bridge = _read(seen[0], task["entity"], "city_country")
        return search(bridge or task["entity"])
    title = task["entity"] if len(rel) == 1 else _read(seen[0], task["entity"], "city_country")
    ans = _read(seen[-1], title or "", rel[-1])
    return f"<answer>{ans or 'unknown'}</answer>"


# -- data ---------------------------------------------------------------------------------------------
def test_corpus_has_titled_passages_of_real_facts():
    corpus = geo.geo_corpus()
    assert len(corpus) > 30_000
    ids = [p["id"] for p in corpus]
    assert len(set(ids)) == len(ids)
    by_id = {p["id"]: p for p in corpus}
    fr = by_id["country-FR"]
    assert fr["title"] == "France"
    assert "Its capital is Paris." in fr["text"] and "Euro (EUR)" in fr["text"] and "Europe" in fr["text"]
    words = [len(p["text"].split()) for p in corpus]
    assert 40 <= np.mean(words) <= 130
    assert all(p["title"] and p["text"] for p in corpus)


def test_questions_are_many_verified_stable_and_split_by_seed():
    qs = geo.geo_questions()
    assert len(qs) >= 2000
    ids = [q["id"] for q in qs]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    hops = {q["hops"] for q in qs}
    assert hops == {1, 2}
    assert sum(q["hops"] == 2 for q in qs) >= 500
    by_id = {q["id"]: q for q in qs}
    assert by_id["geo-capital-FR"]["golden_answers"] == ["Paris"]
    assert "Euro" in by_id["geo-currency-DE"]["golden_answers"]
    assert all(q["question"].endswith("?") and q["golden_answers"] for q in qs)

    train, test = geo.load_geo("train"), geo.load_geo("test")
    assert len(train) + len(test) == len(qs)
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    assert 0.15 < len(test) / len(qs) < 0.25
    assert [q["id"] for q in geo.load_geo("test", seed=0)] == [q["id"] for q in test]  # deterministic
    other = {q["id"] for q in geo.load_geo("test", seed=1)}
    assert other != {q["id"] for q in test}
    assert {q["hops"] for q in geo.load_geo("test", hops=2)} == {2}
    with pytest.raises(ValueError):
        geo.load_geo("dev")


def test_candidate_generation_is_deterministic():
    a, b = geo._candidates(), geo._candidates()
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert [r["question"] for r in a] == [r["question"] for r in b]


def test_two_hop_answers_are_not_in_the_top_results_for_the_raw_question(retriever):
    """The passages certainly in the raw question's top ``RAW_TOPK`` hold no answer. BM25 scores tie often (short
    passages of one template), and which of the tied passages at the cut-off make the top k depends on the float
    summation order of the backend and the CPU: a passage counts as certainly in the top k when its score is above
    the first score past the cut-off by more than rounding."""
    two = [q for q in geo.geo_questions() if q["hops"] == 2]
    k = geo.RAW_TOPK
    hits = retriever.batch_search([q["question"] for q in two], k + 8)
    checked = 0
    for q, hs in zip(two, hits, strict=True):
        cut = hs[k].score if len(hs) > k else float("-inf")
        sure = [h for h in hs[:k] if h.score > cut + 1e-4 * max(1.0, abs(cut))]
        checked += len(sure)
        text = " " + normalize_answer(" ".join(h.passage.title + " " + h.passage.text for h in sure)) + " "
        assert not any(f" {normalize_answer(g)} " in text for g in q["golden_answers"]), q
    assert checked > 2 * len(two)  # most of each top k is unambiguous


def test_synthetic_100k_corpus_is_labelled():
    big = geo.geo_corpus("100k")
    assert len(big) == 100_000
    base = geo.geo_corpus()
    assert big[: len(base)] == base
    syn = big[len(base):]
    assert all(p["id"].startswith("syn-") and p["text"].startswith("[synthetic]") for p in syn)
    assert len({p["id"] for p in big}) == len(big)
    with pytest.raises(ValueError):
        geo.geo_corpus("huge")


# -- retriever and tool -----------------------------------------------------------------------------------
def test_bm25_finds_entities_and_handles_odd_queries(retriever):
    top = retriever.search("France", 3)
    assert top[0].passage.title == "France" and top[0].score > top[-1].score > 0
    assert retriever.search("", 3) == []
    assert retriever.search("zzqxj qqqvvv", 3) == []  # no known word -> no hits
    assert retriever.search("the of and", 3) == []  # stopwords only
    batch = retriever.batch_search(["Germany", "", "Japan"], 2)
    assert [len(b) for b in batch] == [2, 0, 2] and batch[2][0].passage.title == "Japan"
    assert retriever.backend in ("numba", "numpy")


def test_numpy_backend_agrees_with_numba_on_a_small_corpus():
    rows = [p for p in geo.geo_corpus() if p["id"].startswith("country-")]
    queries = ["France", "currency Dollar", "capital Tokyo", "Africa borders Kenya", "nothingknown"]
    a = BM25Retriever(rows, backend="numpy").batch_search(queries, 5)
    b = BM25Retriever(rows, backend="auto").batch_search(queries, 5)
    assert [r[0].passage.id for r in a[:4]] == [r[0].passage.id for r in b[:4]]
    for ra, rb in zip(a, b, strict=True):  # same scores (ties may be ordered differently)
        assert [h.score for h in ra] == pytest.approx([h.score for h in rb], rel=1e-4)
    assert a[0][0].passage.id == "country-FR" and a[-1] == []
    small = BM25Retriever(rows[:2], backend="numpy")
    assert len(small.search(rows[0]["title"], 10)) <= 2  # k capped at the corpus size
    with pytest.raises(ValueError):
        BM25Retriever([], backend="numpy")
    with pytest.raises(ValueError):
        BM25Retriever(rows, backend="gpu")


def test_format_docs_is_search_r1_form_and_respects_the_budget():
    hits = [Hit(Passage(str(i), f"T{i}", "word " * 200), 1.0) for i in range(3)]
    full = format_docs(hits)
    assert full.splitlines()[0].startswith("Doc 1 (Title: T0) word word")
    assert len(full.splitlines()) == 3
    cut = format_docs(hits, max_chars=600)
    assert len(cut) <= 600 + 3
    assert [ln[:16] for ln in cut.splitlines()] == ["Doc 1 (Title: T0", "Doc 2 (Title: T1", "Doc 3 (Title: T2"]
    assert all(ln.endswith("…") for ln in cut.splitlines())
    assert format_docs([]) == "No results found."
    p = Passage.from_dict({"id": "7", "contents": '"Aaron"\nAaron is a prophet.'})
    assert (p.title, p.text, p.contents) == ("Aaron", "Aaron is a prophet.", '"Aaron"\nAaron is a prophet.')


async def test_search_tool_through_the_executor_classifies_bad_calls(retriever):
    ex = ToolExecutor([SearchTool(retriever, topk=2)])
    ok = await ex.run(ToolCall("search", {"query": "Canada"}, id="a"))
    assert ok.ok and ok.content.startswith("Doc 1 (Title: Canada)") and "Doc 3" not in ok.content
    empty = await ex.run(ToolCall("search", {"query": "  "}, id="b"))
    assert empty.error_kind is ToolErrorKind.INVALID_ARGUMENTS and "non-empty" in empty.content
    wrong = await ex.run(ToolCall("search", {"q": "Canada"}, id="c"))
    assert wrong.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    typed = await ex.run(ToolCall("search", {"query": 5}, id="d"))
    assert typed.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    await ex.aclose()


async def test_concurrent_local_searches_are_micro_batched(retriever):
    queries = [q["entity"] for q in geo.geo_questions()[:64]]
    batcher = retriever._batchers.get()
    before = batcher.batches
    results = await asyncio.gather(*(retriever.asearch(q, 3) for q in queries))
    assert batcher.batches - before <= 4  # 64 calls -> a handful of index calls
    assert [[h.passage.id for h in r] for r in results] == [
        [h.passage.id for h in r] for r in retriever.batch_search(queries, 3)
    ]


# -- the env --------------------------------------------------------------------------------------------
def test_prompt_shows_the_search_tool_and_the_answer_convention(env):
    obs, info = env.reset(seed=3)
    text = info["prompt_text"]
    assert '"name": "search"' in text and "<tools>" in text
    assert "<answer>" in text and info["task"]["question"] in text
    task = info["task"]
    assert {"id", "question", "golden_answers", "hops"} <= set(task)
    assert task["split"] == "test"
    assert env.unwrapped.tokenizer.decode(obs, skip_special_tokens=False) == text
    _, info2 = env.reset(seed=3)
    assert info2["task"]["id"] == task["id"]  # seeded draw


def test_oracle_reaches_high_em_on_one_hop_questions(env):
    tasks = _sample(load_tasks(split="test", hops=1), 120)
    rewards, searches = [], []
    for t in tasks:
        r, traj, _ = run_episode(env, t, oracle)
        rewards.append(r)
        searches.append(traj.reward_components["searches"])
        assert traj.drift == {}
    assert np.mean(rewards) >= 0.95
    assert set(searches) == {1.0}


def test_two_hop_questions_need_two_searches(env):
    tasks = _sample(load_tasks(split="test", hops=2), 80)
    oracle_r, one_search_r = [], []

    def one_search(task: dict[str, Any], seen: list[str]) -> str:
        """Searches the raw question once and answers from whatever came back."""
        if not seen:
            return search(task["question"])
        rel = task["relation"].split(">")[-1]
        docs = _docs(seen[0])
        return f"<answer>{_read(seen[0], docs[0][0] if docs else '', rel) or 'unknown'}</answer>"

    for t in tasks:
        r, traj, seen = run_episode(env, t, oracle)
        oracle_r.append(r)
        assert traj.reward_components["searches"] == 2.0
        golds = [normalize_answer(g) for g in t["golden_answers"]]
        first = " " + normalize_answer(seen[0]) + " "
        if t["relation"].endswith(("currency", "continent")):  # the entity's own search does not reveal them
            assert not any(f" {g} " in first for g in golds)
        r1, _, _ = run_episode(env, t, one_search)
        one_search_r.append(r1)
    assert np.mean(oracle_r) >= 0.95
    assert np.mean(one_search_r) <= 0.05


def test_answering_without_searching_scores_low(env):
    tasks = _sample(load_tasks(split="test"), 150)
    guesses = [lambda t, s: "<answer>Euro</answer>", lambda t, s: f"<answer>{t['entity']}</answer>",
               lambda t, s: "<answer>United States</answer>"]
    for guess in guesses:
        rewards = [run_episode(env, t, guess)[0] for t in tasks]
        assert np.mean(rewards) < 0.1


def test_reward_options_format_f1_and_useful_search_bonus():
    task = next(q for q in geo.load_geo("test", hops=2) if q["relation"].endswith("continent"))
    e = SearchEnv(split="test", metric="f1", format_weight=0.2, search_reward=0.5)
    try:
        r, traj, _ = run_episode(e, task, oracle)
        comps = traj.reward_components
        assert comps["em"] == 1.0 and comps["f1"] == 1.0 and comps["format"] == 1.0
        assert traj.outcome_reward == pytest.approx(1.2)
        # the bridge search finds no gold; the second search does -> one bonus
        assert traj.turn_rewards == [0.0, 0.5, 0.0] and r == pytest.approx(1.7)
        # repeating the useful search earns nothing more
        seq = iter([search(task["entity"]), search("x"), None])

        def repeat(t: dict[str, Any], seen: list[str]) -> str:
            if len(seen) == 1:
                return search(_read(seen[0], t["entity"], "city_country") or "")
            if len(seen) == 2:
                return search(_read(seen[0], t["entity"], "city_country") or "")
            return next(seq) or oracle(t, seen[:2])

        _, traj2, _ = run_episode(e, task, repeat)
        assert sum(traj2.turn_rewards) == pytest.approx(0.5)
    finally:
        e.close()


async def test_search_reward_scores_unanswered_and_partial_answers():
    rew = SearchReward("f1", format_weight=0.5)
    task = {"golden_answers": ["New Zealand Dollar", "NZD"]}
    partial = Trajectory(prompt_ids=[1], turns=[Turn(0, 0, 1, text="<answer>Dollar</answer>", content="<answer>Dollar</answer>")])
    v, comps = await rew.outcome(partial, task)
    assert comps["em"] == 0.0 and 0.0 < comps["f1"] < 1.0
    assert v == pytest.approx(comps["f1"] + 0.5)
    unanswered = Trajectory(prompt_ids=[1], turns=[Turn(0, 0, 1, text="x", content="NZD", calls=[ToolCall("search", {"query": "q"})])])
    assert (await rew.outcome(unanswered, task)).value == 0.0
    em = SearchReward()
    right = Trajectory(prompt_ids=[1], turns=[Turn(0, 0, 1, text="<answer>the nzd.</answer>", content="<answer>the nzd.</answer>")])
    assert (await em.outcome(right, task)).value == 1.0
    with pytest.raises(ValueError):
        SearchReward("bleu")


def test_make_vec_shares_one_search_tool():
    venv = gym.make_vec("toolgym/Search-v0", num_envs=3, split="test", hops=1)
    try:
        ex = venv.executor
        assert list(ex.tools) == ["search"]
        obs, _ = venv.reset(seed=0)
        assert len(obs) == 3
    finally:
        venv.close()


# -- Search-R1 files ----------------------------------------------------------------------------------------
@pytest.fixture
def search_r1_files(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    docs = [
        {"id": "0", "contents": '"Aaron Burr"\nAaron Burr was the third vice president of the United States.'},
        {"id": "1", "contents": '"Hamilton (musical)"\nHamilton is a musical by Lin-Manuel Miranda about Alexander Hamilton.'},
        {"id": "2", "contents": '"Lin-Manuel Miranda"\nLin-Manuel Miranda was born in New York City in 1980.'},
        {"id": "3", "contents": '"Weehawken"\nWeehawken is a township in New Jersey where the Burr-Hamilton duel took place.'},
    ]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    rows = [
        {"id": "nq_1", "question": "who wrote the musical hamilton?", "golden_answers": ["Lin-Manuel Miranda"]},
        {"id": "nq_2", "question": "where was the burr hamilton duel?", "golden_answers": ["Weehawken", "Weehawken, New Jersey"]},
    ]
    jsonl = tmp_path / "qa.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pa = pytest.importorskip("pyarrow", reason="parquet support comes with the train extra (pyarrow/datasets)")
    import pyarrow.parquet as pq

    # Search-R1's processed parquet: question + golden_answers (numpy arrays on read) + reward_model + prompt
    table = pa.Table.from_pylist([
        {**r, "data_source": "nq", "prompt": [{"role": "user", "content": "..."}],
         "reward_model": {"style": "rule", "ground_truth": {"target": r["golden_answers"]}}}
        for r in rows
    ])
    parquet = tmp_path / "train.parquet"
    pq.write_table(table, parquet)
    return corpus, jsonl, parquet


def test_search_r1_loaders(search_r1_files, tmp_path):
    corpus, jsonl, parquet = search_r1_files
    ps = load_corpus(corpus)
    assert ps[1].title == "Hamilton (musical)" and ps[1].text.startswith("Hamilton is a musical")
    assert len(load_corpus(corpus, limit=2)) == 2
    for path in (jsonl, parquet):
        rows = load_qa(path)
        assert [r["id"] for r in rows] == ["nq_1", "nq_2"]
        assert rows[1]["golden_answers"] == ["Weehawken", "Weehawken, New Jersey"]
        assert all(isinstance(g, str) for r in rows for g in r["golden_answers"])
    # gold answers only in reward_model (older processed files)
    only_rm = tmp_path / "rm.jsonl"
    only_rm.write_text(json.dumps({"question": "q?", "reward_model": {"ground_truth": {"target": ["a"]}}}) + "\n")
    assert load_qa(only_rm)[0]["golden_answers"] == ["a"] and load_qa(only_rm)[0]["id"] == "rm-0"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?"}\n')
    with pytest.raises(ValueError, match="golden_answers"):
        load_qa(bad)
    with pytest.raises(FileNotFoundError):
        load_qa(tmp_path / "missing.parquet")
    with pytest.raises(ValueError, match="unsupported"):
        load_qa(corpus.with_suffix(".csv").write_text("x") and corpus.with_suffix(".csv"))


def test_env_over_search_r1_files(search_r1_files):
    corpus, _, parquet = search_r1_files
    with pytest.raises(ValueError, match="retriever_url"):
        SearchEnv(dataset=str(parquet))
    e = SearchEnv(dataset=str(parquet), corpus=str(corpus), topk=2)
    try:
        task = next(t for t in e.unwrapped.tasks if t["id"] == "nq_2")
        assert task["question"] == "where was the burr hamilton duel?" and task["hops"] is None

        def policy(t: dict[str, Any], seen: list[str]) -> str:
            if not seen:
                return search("Burr Hamilton duel")
            assert "Doc 1 (Title: Weehawken)" in seen[0]
            return "<answer>Weehawken</answer>"

        r, traj, _ = run_episode(e, task, policy)
        assert r == 1.0 and traj.terminated
    finally:
        e.close()
