"""The retriever service (``toolgym serve retriever``) and the remote client, on real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
import gymnasium as gym
import pytest

import toolgym  # noqa: F401 - registers the envs
from tests.procs import free_port
from toolgym.data.geo import default_retriever, load_geo
from toolgym.format.parsers import get_parser
from toolgym.serve.retriever import BackgroundServer
from toolgym.tools.base import ToolError, ToolErrorKind
from toolgym.tools.search import RemoteRetriever

HERMES = get_parser("hermes")


@pytest.fixture(scope="module")
def local():
    return default_retriever()


@pytest.fixture(scope="module")
def server(local):
    with BackgroundServer(local, max_topk=50, max_queries=100, max_body_bytes=64 * 1024) as srv:
        yield srv


async def _post(url: str, data: Any, *, raw: bool = False) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        kw = {"data": data, "headers": {"Content-Type": "application/json"}} if raw else {"json": data}
        async with s.post(url, **kw) as r:
            return r.status, await r.json(content_type=None)


async def test_round_trip_matches_the_local_index(server, local):
    qs = ["France", "Tokyo", "currency of Kenya"]
    status, body = await _post(server.url, {"queries": qs, "topk": 4, "return_scores": True})
    assert status == 200
    want = local.batch_search(qs, 4)
    assert [[it["document"]["id"] for it in row] for row in body["result"]] == [
        [h.passage.id for h in row] for row in want
    ]
    first = body["result"][0][0]
    assert first["document"]["contents"].startswith('"France"\n') and first["score"] == pytest.approx(want[0][0].score)
    # without scores: the documents themselves (Search-R1's shape); topk defaults to the server's default_topk
    status, body = await _post(server.url, {"queries": ["Japan"]})
    assert status == 200 and len(body["result"][0]) == 3 and body["result"][0][0]["id"] == "country-JP"
    async with aiohttp.ClientSession() as s, s.get(server.url.replace("/retrieve", "/health")) as r:
        health = await r.json()
    assert health["status"] == "ok" and health["passages"] == len(local)


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (json.dumps(["France"]).encode(), 400, "JSON object"),
        (json.dumps({"queries": "France"}).encode(), 422, "non-empty list"),
        (json.dumps({"queries": []}).encode(), 422, "non-empty list"),
        (json.dumps({"queries": ["a", 3]}).encode(), 422, "queries[1]"),
        (json.dumps({"queries": ["a"], "topk": "3"}).encode(), 422, "integer"),
        (json.dumps({"queries": ["a"], "topk": True}).encode(), 422, "integer"),
        (json.dumps({"queries": ["a"], "topk": 10**9}).encode(), 422, "between 1 and 50"),
        (json.dumps({"queries": ["a"], "topk": 0}).encode(), 422, "between 1 and 50"),
        (json.dumps({"queries": ["a"], "return_scores": "yes"}).encode(), 422, "boolean"),
        (json.dumps({"queries": ["a"], "k": 3}).encode(), 422, "unknown field"),
        (json.dumps({"queries": ["a"] * 101}).encode(), 413, "too many queries"),
        (json.dumps({"queries": ["x" * 100_000]}).encode(), 413, ""),
    ],
)
async def test_bad_requests_get_a_4xx_json_error(server, payload, status, needle):
    got, body = await _post(server.url, payload, raw=True)
    assert got == status
    assert isinstance(body, dict) and needle in body["error"]


async def test_wrong_method_and_path_are_json_4xx_and_the_server_survives(server):
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url) as r:
            assert r.status == 405 and "error" in await r.json()
        async with s.post(server.url.replace("/retrieve", "/nope"), json={}) as r:
            assert r.status == 404 and "error" in await r.json()
    status, body = await _post(server.url, {"queries": ["Peru"], "topk": 1})
    assert status == 200 and body["result"][0][0]["id"] == "country-PE"


async def test_concurrent_client_calls_share_requests(server, local):
    client = RemoteRetriever(server.url)
    queries = [q["entity"] for q in load_geo("test")[:64]]
    results = await asyncio.gather(*(client.asearch(q, 3) for q in queries))
    assert client.requests <= 4  # 64 episodes' calls -> a handful of POSTs
    assert [[h.passage.id for h in r] for r in results] == [[h.passage.id for h in r] for r in local.batch_search(queries, 3)]
    assert results[0][0].passage.title and results[0][0].score > 0
    await client.aclose()


async def test_client_classifies_failures(server):
    client = RemoteRetriever(server.url)
    with pytest.raises(ToolError) as e:
        await client.abatch_search(["France"], 10**6)  # the server says 422
    assert not e.value.retryable and "422" in e.value.message and "between 1 and 50" in e.value.message
    await client.aclose()
    down = RemoteRetriever(f"http://127.0.0.1:{free_port()}/retrieve", timeout_s=2)
    with pytest.raises(ToolError) as e:
        await down.asearch("France", 3)
    assert e.value.retryable and e.value.kind is ToolErrorKind.EXCEPTION and "unreachable" in e.value.message
    await down.aclose()
    # several endpoints: a dead one is skipped
    both = RemoteRetriever([f"http://127.0.0.1:{free_port()}/retrieve", server.url])
    for _ in range(2):
        assert (await both.abatch_search(["Chile"], 1))[0][0].passage.id == "country-CL"
    await both.aclose()


def test_client_reads_search_r1_server_answers():
    body = json.dumps({"result": [[{"document": {"id": "12", "contents": '"Aaron"\nAaron is a prophet.'}, "score": 3.5}],
                                  [{"id": "7", "contents": '"Moses"\nMoses led.'}]]})
    hits = RemoteRetriever._parse("u", 200, body, 2)
    assert (hits[0][0].passage.title, hits[0][0].passage.text, hits[0][0].score) == ("Aaron", "Aaron is a prophet.", 3.5)
    assert hits[1][0].passage.id == "7" and hits[1][0].score == 0.0
    with pytest.raises(ToolError, match="malformed"):
        RemoteRetriever._parse("u", 200, '{"result": []}', 2)
    with pytest.raises(ToolError) as e:
        RemoteRetriever._parse("u", 503, '{"error": "busy"}', 1)
    assert e.value.retryable and "busy" in e.value.message


def test_retriever_going_down_mid_episode_is_a_tool_error_and_recovers(local):
    srv = BackgroundServer(local).start()
    try:
        env = gym.make("toolgym/Search-v0", split="test", hops=1, retriever_url=srv.url, retriever_timeout_s=2,
                       max_turns=5, executor_kwargs={"max_retries": 1, "retry_backoff_s": 0.01})
        u = env.unwrapped
        task = next(t for t in u.tasks if t["relation"] == "capital")
        env.reset(options={"task": task})

        def step(text: str) -> tuple[Any, ...]:
            return env.step(u.encode_action(text))

        obs, _, term, trunc, info = step(HERMES.format_calls([("search", {"query": task["entity"]})]))
        assert info["error_kinds"] == [] and "Its capital is" in u.tokenizer.decode(obs)
        srv.stop()
        obs, _, term, trunc, info = step(HERMES.format_calls([("search", {"query": task["entity"] + " capital"})]))
        assert not term and not trunc and len(obs) > 0  # the episode goes on
        assert info["error_kinds"] == ["exception"] and info["results"][0]["attempts"] == 2  # retried once
        assert "unreachable" in u.tokenizer.decode(obs)
        srv.start()  # same port
        obs, _, term, trunc, info = step(HERMES.format_calls([("search", {"query": task["entity"]})]))
        assert info["error_kinds"] == [] and "Its capital is" in u.tokenizer.decode(obs)
        _, r, term, _, info = step(f"<answer>{task['golden_answers'][0]}</answer>")
        assert term and r == 1.0
        assert info["trajectory"].reward_components["search_errors"] == 1.0
        env.close()
    finally:
        srv.close()


@pytest.mark.slow
def test_cli_serves_a_search_r1_corpus_file(tmp_path):
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(
        json.dumps({"id": str(i), "contents": f'"Page {i}"\nThis page is about topic{i} and nothing else.'}) + "\n"
        for i in range(50)
    ))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolgym.serve.retriever", "--corpus", str(corpus), "--port", str(port),
         "--backend", "numpy", "--max-topk", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = f"http://127.0.0.1:{port}/retrieve"
        client = RemoteRetriever(url, timeout_s=5)
        deadline = time.monotonic() + 120
        while True:
            try:
                hits = client.search("topic7", 2)
                break
            except ToolError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.3)
        assert hits[0].passage.id == "7" and hits[0].passage.title == "Page 7"
        with pytest.raises(ToolError, match="between 1 and 5"):
            client.search("topic7", 6)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "toolgym retriever" in out


def test_a_vector_step_sends_all_episodes_searches_in_one_request(server):
    venv = gym.make_vec("toolgym/Search-v0", num_envs=8, split="test", hops=1, retriever_url=server.url)
    try:
        tasks = [t for t in venv.envs[0].unwrapped.tasks if t["relation"] == "capital"][:8]
        venv.reset(options={"tasks": tasks})
        client = venv.executor.tools["search"].retriever
        before = client.requests
        enc = venv.envs[0].unwrapped.encode_action
        obs, _, term, trunc, infos = venv.step(
            [enc(HERMES.format_calls([("search", {"query": t["entity"]})])) for t in tasks]
        )
        assert client.requests - before == 1
        assert not term.any() and not trunc.any()
        texts = [venv.tokenizer.decode(o) for o in obs]
        assert all(f"Title: {t['entity']})" in x for t, x in zip(tasks, texts, strict=True))
    finally:
        venv.close()
