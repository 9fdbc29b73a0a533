"""Faults that must cost one episode or one call, never the run: a reward that never returns, raises or scores
NaN/inf; a turn with thousands of tool calls; a prompt that alone fills the token budget. Real envs, the embedded
tokenizer and the oracle policy throughout; the faulty rewards are the only fakes."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

import toolgym  # noqa: F401 - registers the envs
from toolgym.envs.base import ToolEnv
from toolgym.evaluation import evaluate
from toolgym.rewards.base import Reward
from toolgym.tools.function import tool

CALC = "toolgym/Calculator-v0"


def _strict_rows(path) -> list[dict]:
    def refuse(const: str) -> None:
        raise ValueError(f"non-standard JSON constant {const}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


class _HangsOnce:
    """A sync reward that never returns on the first task it sees scored second; 1.0 elsewhere."""

    def __init__(self, bad) -> None:
        self.bad, self.seen, self.lock = bad, 0, threading.Lock()
        self.__name__ = "faulty"

    def __call__(self, traj, task):
        with self.lock:
            self.seen += 1
            mine = self.seen == 2
        return self.bad() if mine else 1.0


class _AsyncHang(Reward):
    name = "async_hang"

    def __init__(self) -> None:
        self.seen = 0

    async def outcome(self, trajectory, task):
        self.seen += 1
        if self.seen == 2:
            await asyncio.Event().wait()  # never set
        return 1.0


def _forever() -> float:
    threading.Event().wait()
    return 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reward", ["sync", "async"])
def test_a_reward_that_never_returns_costs_its_episode_only(tmp_path, reward) -> None:
    out = tmp_path / "rows.jsonl"
    fn = _HangsOnce(_forever) if reward == "sync" else _AsyncHang()
    rep = evaluate(CALC, "oracle", 4, env_kwargs={"reward": fn, "reward_timeout_s": 1.0}, num_envs=2, out=str(out))
    rows = _strict_rows(out)
    assert len(rows) == 4  # before: eval hung for ever and no row was written
    bad = [r for r in rows if r["errors"]]
    assert len(bad) == 1 and list(bad[0]["errors"]) == ["reward_timeout"], [r["errors"] for r in rows]
    assert bad[0]["outcome_reward"] == 0.0 and bad[0]["truncated"] and not bad[0]["terminated"]
    assert rep.episode_errors == {"reward_timeout": 1}
    assert rep.success == 0.75


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("value", "kind"), [
    (lambda: float("nan"), "reward_non_finite"),
    (lambda: float("inf"), "reward_non_finite"),
    (lambda: -float("inf"), "reward_non_finite"),
    (lambda: 1 / 0, "reward_exception"),
])
def test_a_reward_that_cannot_score_is_a_classified_error(tmp_path, value, kind) -> None:
    out = tmp_path / "rows.jsonl"
    rep = evaluate(CALC, "oracle", 4, env_kwargs={"reward": _HangsOnce(value)}, num_envs=2, out=str(out))
    rows = _strict_rows(out)  # before: a bare NaN / Infinity in the rows
    assert [list(r["errors"]) for r in rows].count([kind]) == 1
    assert sum(r["outcome_reward"] for r in rows) == 3.0
    json.dumps(rep.to_dict(), allow_nan=False)  # the --json report is strict JSON
    assert rep.success == 0.75  # before: inf counted as a success, NaN made the mean reward NaN
    assert rep.episode_errors == {kind: 1}
    assert f"{kind}=1" in rep.format_table()


_RAN: list[int] = []


@tool
def tick(n: int) -> str:
    """Count one call.

    Args:
        n: the call's number
    """
    _RAN.append(n)
    return str(n)


def _calls(n: int) -> str:
    return "".join(f'<tool_call>\n{{"name": "tick", "arguments": {{"n": {i}}}}}\n</tool_call>' for i in range(n))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cap", "n"), [(None, 200), (5, 12)])
def test_calls_past_the_per_turn_cap_are_answered_but_not_run(cap, n) -> None:
    kw = {} if cap is None else {"max_calls_per_turn": cap}
    env = ToolEnv([{"id": "a", "prompt": "p"}], [tick], max_episode_tokens=32768, max_turns=3, **kw)
    limit = env.max_calls_per_turn
    assert limit == (cap or 32)
    _RAN.clear()
    env.reset(seed=0)
    _, _, terminated, _, info = env.step(env.encode_action(_calls(n)))
    assert sorted(_RAN) == list(range(limit))  # before: all n ran
    kinds = [r["error_kind"] for r in info["results"]]
    assert len(kinds) == n and kinds[:limit] == [None] * limit and kinds[limit:] == ["call_limit"] * (n - limit)
    assert f"at most {limit} run per turn" in info["results"][-1]["content"]
    env.close()


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


@pytest.mark.timeout(120)
def test_a_prompt_longer_than_the_budget_is_an_error_not_the_models_answer() -> None:
    scored: list[int] = []

    def reward(traj, task) -> float:
        scored.append(1)
        return 1.0

    env = ToolEnv([{"id": "a", "prompt": "word " * 400}], [noop], reward=reward, max_episode_tokens=128)
    _, info = env.reset(seed=0)
    assert "prompt_too_long" in info["errors"]
    _, r, terminated, truncated, info = env.step(env.encode_action("<answer>1</answer>"))
    assert (terminated, truncated, r) == (False, True, 0.0)  # before: terminated, scored as the model's answer
    assert "prompt_too_long" in info["trajectory"].errors and not scored
    env.close()


@pytest.mark.timeout(120)
def test_eval_counts_prompts_over_budget_apart(tmp_path) -> None:
    out = tmp_path / "rows.jsonl"
    rep = evaluate(CALC, "oracle", 3, env_kwargs={"max_episode_tokens": 40}, num_envs=2, out=str(out))
    assert rep.episode_errors == {"prompt_too_long": 3}
    assert rep.truncated == 1.0 and rep.turns == 0.0
    assert all(not r["terminated"] and "prompt_too_long" in r["errors"] for r in _strict_rows(out))


# -- one writer per output file ------------------------------------------------------------------------------------

_HOLDER = """
import sys
from toolgym.jsonl import JSONLStream
s = JSONLStream(sys.argv[1])
s.write({"row": "first"})
print("ready", flush=True)
sys.stdin.readline()
s.write({"row": "second"})
s.close()
"""


def _holder(path):
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).parent.parent)
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**__import__("os").environ, "PYTHONPATH": root})
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.timeout(120)
def test_a_second_writer_of_an_output_file_is_refused_and_the_first_keeps_its_rows(tmp_path) -> None:
    import errno

    from toolgym.errors import OutputFileError
    from toolgym.jsonl import JSONLStream, read_jsonl

    out = tmp_path / "rows.jsonl"
    p = _holder(out)
    try:
        with pytest.raises(OutputFileError) as e:
            JSONLStream(out)  # before: accepted; its first row replaced the file under the first writer
        assert e.value.errno == errno.EBUSY and f"process {p.pid}" in str(e.value)
        link = tmp_path / "link.jsonl"
        link.symlink_to(out)
        with pytest.raises(OutputFileError):
            JSONLStream(link)  # the same file by another name
    finally:
        p.communicate("go\n", timeout=60)
    assert p.returncode == 0
    assert read_jsonl(out) == [{"row": "first"}, {"row": "second"}]
    with JSONLStream(out) as s:  # free again once the first writer closed
        s.write({"row": "third"})
    assert read_jsonl(out) == [{"row": "third"}]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["link.jsonl", "rows.jsonl"]  # no lock file left


@pytest.mark.timeout(120)
def test_a_killed_writer_leaves_no_lock(tmp_path) -> None:
    from toolgym.jsonl import JSONLStream, read_jsonl

    out = tmp_path / "rows.jsonl"
    p = _holder(out)
    p.kill()
    p.wait(60)
    with JSONLStream(out) as s:
        s.write({"row": "next"})
    assert read_jsonl(out) == [{"row": "next"}]


@pytest.mark.timeout(180)
def test_eval_to_an_output_another_run_writes_exits_3_before_any_work(tmp_path, capsys) -> None:
    from toolgym.cli import main
    from toolgym.jsonl import read_jsonl

    out = tmp_path / "rows.jsonl"
    p = _holder(out)
    try:
        code = main(["eval", CALC, "--policy", "oracle", "--tasks", "2", "--out", str(out)])
        assert code == 3  # before: 0, and the first run's rows were gone
        assert "another run is writing it" in capsys.readouterr().err
        assert read_jsonl(out) == [{"row": "first"}]
    finally:
        p.communicate("go\n", timeout=60)


# -- a tool result whose text is slow to make ---------------------------------------------------------------------

_EVENTS: list[tuple[str, float]] = []


class _SlowText:
    """A result whose ``__str__`` takes seconds (the tool's own code, run after the tool returned)."""

    def __str__(self) -> str:
        import time

        time.sleep(4)
        _EVENTS.append(("str done", __import__("time").monotonic()))
        return "slow"


class _SlowStr(str):
    def __str__(self) -> str:
        _EVENTS.append(("subclass __str__", 0.0))
        return "from __str__"

    def encode(self, *a, **k):  # noqa: ANN002, ANN003
        _EVENTS.append(("subclass encode", 0.0))
        return super().encode(*a, **k)


@tool(timeout_s=0.5)
async def slow_text() -> str:
    """Return a result slow to print."""
    return _SlowText()  # type: ignore[return-value]


@tool(timeout_s=0.5)
async def str_subclass() -> str:
    """Return a str subclass."""
    return _SlowStr("plain text")


@tool
async def healthy(n: int) -> str:
    """Answer after a short wait.

    Args:
        n: the call's number
    """
    await asyncio.sleep(0.05)
    _EVENTS.append(("healthy", __import__("time").monotonic()))
    return str(n)


@pytest.mark.timeout(120)
def test_a_slow_str_of_a_result_is_timed_out_off_the_loop() -> None:
    env = ToolEnv([{"id": "a", "prompt": "p"}], [slow_text, healthy, str_subclass], max_episode_tokens=8192)
    env.reset(seed=0)
    _EVENTS.clear()
    calls = '<tool_call>\n{"name": "slow_text", "arguments": {}}\n</tool_call>' + "".join(
        f'<tool_call>\n{{"name": "healthy", "arguments": {{"n": {i}}}}}\n</tool_call>' for i in range(8))
    _, _, _, _, info = env.step(env.encode_action(calls))
    kinds = [r["error_kind"] for r in info["results"]]
    assert kinds == ["timeout"] + [None] * 8, kinds  # before: "ok" after the whole __str__
    import time

    deadline = time.monotonic() + 30
    while not any(e == "str done" for e, _ in _EVENTS) and time.monotonic() < deadline:
        time.sleep(0.1)
    done = next(t for e, t in _EVENTS if e == "str done")
    assert all(t < done for e, t in _EVENTS if e == "healthy")  # before: the healthy calls waited for it
    _EVENTS.clear()
    _, _, _, _, info = env.step(env.encode_action(
        '<tool_call>\n{"name": "str_subclass", "arguments": {}}\n</tool_call>'))
    assert info["results"][0]["content"] == "plain text" and type(info["results"][0]["content"]) is str
    assert _EVENTS == []  # none of the subclass's code ran after the call
    env.close()


# -- toolgym serve model: a prompt too big to fit is refused before it is tokenised ---------------------------------


@pytest.fixture(scope="module")
def small_server():
    from toolgym.serve.model import ModelServer, load

    model, tok, name = load("tiny")
    server = ModelServer(model, tok, served_model_name=name, max_batch_size=2, max_body_bytes=16 * 1024**2)
    url = server.start_in_thread()
    yield server, url
    server.stop_thread()


def _post_raw(url: str, data: bytes) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_that_cannot_fit_is_refused_without_tokenising(small_server, path) -> None:
    server, url = small_server
    tokenised: list[str] = []
    for attr in ("_prompts", "_chat_prompt"):
        real = getattr(type(server), attr)
        setattr(server, attr, lambda *a, _real=real, _name=attr: (tokenised.append(_name), _real(server, *a))[1])
    try:
        text = "lorem ipsum " * 700_000  # 8.4 MB
        body = {"prompt": text} if "chat" not in path else {"messages": [{"role": "user", "content": text}]}
        status, out = _post_raw(url + path, json.dumps({**body, "max_tokens": 2}).encode())
        assert status == 400 and "characters" in out["error"]["message"], out
        assert tokenised == []  # before: seconds of tokenising, then the same 400
        short = {"prompt": "hi"} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]}
        status, _ = _post_raw(url + path, json.dumps({**short, "max_tokens": 2}).encode())
        assert status == 200 and tokenised
    finally:
        server.__dict__.pop("_prompts", None)
        server.__dict__.pop("_chat_prompt", None)


@pytest.mark.timeout(120)
def test_a_body_over_the_size_limit_is_refused_before_it_is_read(small_server) -> None:
    import socket
    from urllib.parse import urlsplit

    _, url = small_server
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        # announces 17 MiB and sends none of it: the answer comes from the header alone
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (17 * 1024**2))
        head = s.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head[:200]
