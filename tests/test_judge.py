"""LLMJudge over real HTTP: a real ``toolgym serve model`` (tiny random model) and, for fault injection, a second
real aiohttp server on 127.0.0.1 that answers what each test tells it to."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from aiohttp import web

from toolgym.rewards import Combine, ExactMatch, JudgeErrorKind, LLMJudge, Score, parse_score
from toolgym.serve.model import ModelServer, load
from toolgym.trajectory import Trajectory, Turn


def traj(answer_text: str, task: dict | None = None) -> Trajectory:
    t = Trajectory(prompt_ids=[1], task=task or {})
    t.turns.append(Turn(index=0, action_start=0, action_end=1, text=answer_text, content=answer_text))
    return t


@pytest.mark.parametrize(
    ("text", "max_score", "expected"),
    [
        ("Reasoning... Score: 7/10", None, 0.7),
        ("score: 3 out of 4", None, 0.75),
        ("<score>8</score>", None, 0.8),
        ("<score>0.25</score>", None, 0.25),
        ("<score>4/5</score>", 10, 0.8),
        ("My rating is [[9]]", None, 0.9),
        ("Rating: **6**", 10, 0.6),
        ("Score: 2 (draft) ... final Score: 9/10", None, 0.9),  # last one wins
        ("7", 9, 7 / 9),
        ("7", None, 0.7),
        ("0.5", None, 0.5),
        ("85", None, 0.85),
        ("Score: 12/10", None, 1.0),  # clipped
        ("no number here", None, None),
        ("", None, None),
        ("Score: 3/0", None, None),
        ("5000", None, None),
    ],
)
def test_parse_score(text, max_score, expected):
    got = parse_score(text, max_score)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


# ----------------------------------------------------------------------------------------- fault-injection server
class FaultServer:
    """A real local OpenAI-style server whose replies are scripted: ``reply(body) -> (status, payload|bytes, delay)``."""

    def __init__(self, reply):
        self.reply = reply
        self.hits = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.bodies.append(body)
            status, payload, delay = self.reply(body, self.hits)
            if delay:
                await asyncio.sleep(delay)
            if isinstance(payload, bytes):
                return web.Response(status=status, body=payload)
            return web.json_response(payload, status=status)
        finally:
            self.in_flight -= 1

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def chat(text: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def ok(text="Score: 8/10", delay=0.0):
    return lambda body, hit: (200, chat(text), delay)


@pytest.fixture
async def fault_servers():
    started: list[FaultServer] = []

    async def make(reply) -> FaultServer:
        s = FaultServer(reply)
        await s.start()
        started.append(s)
        return s

    yield make
    for s in started:
        await s.stop()


def dead_url() -> str:
    """A URL nothing listens on (a port bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


TASK = {"question": "What is the capital of France?", "golden_answers": ["Paris"]}


# ------------------------------------------------------------------------------------------- the real model server
@pytest.fixture(scope="module")
def model_server():
    model, tok, name = load("tiny")
    server = ModelServer(model, tok, served_model_name=name)
    url = server.start_in_thread()
    yield url, tok, name
    server.stop_thread()


async def test_judge_against_toolgym_serve_model(model_server):
    """A constrained single-digit verdict (vLLM's ``allowed_token_ids``) makes the score deterministic."""
    url, tok, name = model_server
    digits = [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(10)]
    seven = tok("7", add_special_tokens=False)["input_ids"][0]
    common = dict(
        model=name,
        prompt_template="Grade 0-9. Q: {question} A: {prediction}. Digit:",
        max_score=9,
        max_tokens=1,
        cache=False,
    )
    forced = LLMJudge(url, extra_body={"allowed_token_ids": [seven]}, **common)
    t = traj("<answer>Paris</answer>", TASK)
    score = await forced.outcome(t, TASK)
    assert score.value == pytest.approx(7 / 9)
    assert score.components == {"judge/cached": 0.0}
    free = LLMJudge(url, extra_body={"allowed_token_ids": digits}, **common)
    scores = [(await free.outcome(t, TASK)).value for _ in range(2)]
    assert scores[0] == scores[1]  # greedy, same prompt: deterministic
    assert any(scores[0] == pytest.approx(d / 9) for d in range(10))
    assert free.metrics()["http_attempts"] == 2 and free.failures == {}
    # free-form output of a random model has no score in it: a classified parse error, not a crash
    garbage = LLMJudge(
        url,
        model=name,
        max_tokens=3,
        cache=False,
        extra_body={"allowed_token_ids": [tok(" hello", add_special_tokens=False)["input_ids"][0]]},
    )
    score = await garbage.outcome(t, TASK)
    assert score.value == 0.0
    assert score.components == {"judge/failed": 1.0, "judge/error/parse_error": 1.0}
    for j in (forced, free, garbage):
        await j.aclose()


async def test_failover_to_a_live_endpoint_when_one_is_down(fault_servers, model_server):
    live = await fault_servers(ok("Score: 9/10"))
    dead = dead_url()
    judge = LLMJudge([dead, live.url + "/v1"], max_retries=2, retry_backoff_s=0, down_cooldown_s=30)
    tasks = [{**TASK, "id": i} for i in range(8)]
    scores = await asyncio.gather(*(judge.outcome(traj(f"answer {i}"), task) for i, task in enumerate(tasks)))
    assert [s.value for s in scores] == [pytest.approx(0.9)] * 8
    m = judge.metrics()
    assert m["failed"] == 0 and live.hits == 8
    dead_stats = m["endpoints"][dead]
    n_conn = dead_stats["failures"].get("connection", 0)
    assert n_conn >= 1 and n_conn <= 8
    # once marked down, a later request goes straight to the live endpoint
    before = judge.counts["http_attempts"]
    assert (await judge.outcome(traj("later"), TASK)).value == pytest.approx(0.9)
    assert judge.counts["http_attempts"] == before + 1
    # failover also works in front of the real model server
    url, tok, name = model_server
    seven = tok("7", add_special_tokens=False)["input_ids"][0]
    real = LLMJudge(
        [dead_url(), url],
        model=name,
        max_tokens=1,
        max_score=9,
        retry_backoff_s=0,
        extra_body={"allowed_token_ids": [seven]},
    )
    assert (await real.outcome(traj("x"), TASK)).value == pytest.approx(7 / 9)
    await judge.aclose()
    await real.aclose()


async def test_all_endpoints_down_is_a_classified_failure():
    judge = LLMJudge([dead_url(), dead_url()], max_retries=3, retry_backoff_s=0, failure_score=-1.0)
    score = await judge.outcome(traj("x"), TASK)
    assert score.value == -1.0
    assert score.components == {"judge/failed": 1.0, "judge/error/connection": 1.0}
    assert judge.failures == {"connection": 1}
    await judge.aclose()


async def test_timeout_is_classified_and_bounded(fault_servers):
    slow = await fault_servers(ok(delay=5.0))
    judge = LLMJudge(slow.url, timeout_s=0.3, max_retries=1, retry_backoff_s=0)
    t0 = time.monotonic()
    score = await judge.outcome(traj("x"), TASK)
    elapsed = time.monotonic() - t0
    assert score == Score(0.0, {"judge/failed": 1.0, "judge/error/timeout": 1.0}) and elapsed < 3.0
    assert slow.hits == 2  # first attempt + one retry
    await judge.aclose()


async def test_retry_on_500_but_not_on_400(fault_servers):
    flaky = await fault_servers(lambda body, hit: (500, {"error": "boom"}, 0) if hit <= 2 else (200, chat("[[6]]"), 0))
    judge = LLMJudge(flaky.url, max_retries=2, retry_backoff_s=0)
    assert (await judge.outcome(traj("x"), TASK)).value == pytest.approx(0.6)
    assert flaky.hits == 3
    bad = await fault_servers(lambda body, hit: (400, {"error": {"message": "bad"}}, 0))
    judge2 = LLMJudge(bad.url, max_retries=3, retry_backoff_s=0)
    score = await judge2.outcome(traj("x"), TASK)
    assert score.value == 0.0
    assert score.components["judge/error/http_error"] == 1.0 and bad.hits == 1
    for j in (judge, judge2):
        await j.aclose()


async def test_bad_response_and_parse_error(fault_servers):
    garbled = await fault_servers(lambda body, hit: (200, b"<html>not json</html>", 0))
    judge = LLMJudge(garbled.url, max_retries=1, retry_backoff_s=0)
    score = await judge.outcome(traj("x"), TASK)
    assert score.value == 0.0
    assert score.components["judge/error/bad_response"] == 1.0 and garbled.hits == 2
    vague = await fault_servers(ok("It is probably fine."))
    judge2 = LLMJudge(vague.url)
    score = await judge2.outcome(traj("x"), TASK)
    assert score.value == 0.0
    assert score.components["judge/error/parse_error"] == 1.0 and vague.hits == 1  # not retried
    for j in (judge, judge2):
        await j.aclose()


async def test_template_fields_and_template_error(fault_servers):
    def grade(body, hit):
        prompt = body["messages"][-1]["content"]
        return 200, chat("Score: 10/10" if "pred=Paris|ref=Paris / Lyon|q=Capital?" in prompt else "Score: 0/10"), 0

    srv = await fault_servers(grade)
    judge = LLMJudge(
        srv.url,
        model="judge-x",
        prompt_template="pred={prediction}|ref={reference}|q={question}",
        system_prompt="You grade {topic}.",
        temperature=0.0,
        max_tokens=7,
    )
    task = {"question": "Capital?", "golden_answers": ["Paris", "Lyon"], "topic": "geography"}
    judge.reference_fields = ["golden_answers"]
    # golds are joined with " | " by default; use a custom field function to control it
    judge.fields_fn = lambda t, k: {
        "prediction": t.answer,
        "reference": " / ".join(k["golden_answers"]),
        "question": k["question"],
        "topic": k["topic"],
    }
    assert (await judge.outcome(traj("<answer>Paris</answer>"), task)).value == 1.0
    sent = srv.bodies[-1]
    assert sent["model"] == "judge-x" and sent["max_tokens"] == 7 and sent["temperature"] == 0.0
    assert sent["messages"][0] == {"role": "system", "content": "You grade geography."}
    broken = LLMJudge(srv.url, prompt_template="{no_such_field}")
    hits = srv.hits
    score = await broken.outcome(traj("x"), task)
    assert score.value == 0.0
    assert score.components["judge/error/template_error"] == 1.0 and srv.hits == hits
    for j in (judge, broken):
        await j.aclose()


async def test_cache_and_in_flight_deduplication(fault_servers):
    srv = await fault_servers(ok("Score: 5/10", delay=0.2))
    judge = LLMJudge(srv.url)
    same = [judge.outcome(traj("<answer>Paris</answer>"), TASK) for _ in range(5)]
    assert [s.value for s in await asyncio.gather(*same)] == [0.5] * 5
    assert srv.hits == 1  # concurrent identical prompts were sent once
    score = await judge.outcome(traj("<answer>Paris</answer>"), TASK)
    assert score.value == 0.5
    assert score.components == {"judge/cached": 1.0} and srv.hits == 1
    assert (await judge.outcome(traj("<answer>Lyon</answer>"), TASK)).value == 0.5
    assert srv.hits == 2 and judge.metrics()["cache_hits"] >= 1
    await judge.aclose()


async def test_least_in_flight_balancing_and_concurrency_cap(fault_servers):
    a = await fault_servers(ok(delay=0.3))
    b = await fault_servers(ok(delay=0.3))
    judge = LLMJudge([a.url, b.url], max_concurrency=4, cache=False)
    t0 = time.monotonic()
    scores = [s.value for s in await asyncio.gather(*(judge.outcome(traj(f"answer {i}"), TASK) for i in range(12)))]
    elapsed = time.monotonic() - t0
    assert scores == [pytest.approx(0.8)] * 12
    assert a.hits == b.hits == 6  # least-in-flight spreads the load evenly
    assert a.max_in_flight + b.max_in_flight <= 4 and max(a.max_in_flight, b.max_in_flight) == 2
    assert elapsed < 12 * 0.3 / 2  # far less than sequential
    await judge.aclose()


async def test_judge_in_combine_reports_failures_in_components(fault_servers):
    srv = await fault_servers(ok("Score: 4/10"))
    judge = LLMJudge(srv.url)
    combo = Combine({ExactMatch(): 1.0, judge: 0.5})
    t = traj("<answer>Paris</answer>", TASK)
    score = await combo.outcome(t, TASK)
    assert score.value == pytest.approx(1.0 + 0.5 * 0.4)
    assert score.components == {"exact_match": 1.0, "judge": pytest.approx(0.4), "judge/cached": 0.0}
    down = Combine({ExactMatch(): 1.0, LLMJudge(dead_url(), max_retries=0): 0.5})
    score = await down.outcome(t, TASK)
    assert score.value == pytest.approx(1.0)
    comps = score.components
    assert comps["judge/failed"] == 1.0 and comps["judge/error/connection"] == 1.0 and comps["judge"] == 0.0
    assert JudgeErrorKind.CONNECTION.value == "connection"
    await judge.aclose()


def test_request_body_is_json_serialisable_and_openai_shaped():
    judge = LLMJudge("http://127.0.0.1:1/v1/", model="m", extra_body={"stop": ["\n"]})
    assert judge.endpoints[0].url == "http://127.0.0.1:1"
    body = judge._body(judge.render(judge.template_fields(traj("<answer>x</answer>"), TASK)))
    json.dumps(body)
    assert body["model"] == "m" and body["stop"] == ["\n"] and body["messages"][-1]["role"] == "user"
    assert "Paris" in body["messages"][-1]["content"] and "x" in body["messages"][-1]["content"]
