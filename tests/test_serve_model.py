"""``toolgym serve model``: real HTTP on 127.0.0.1 against a tiny random model over the embedded tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from toolgym.serve.model import ModelServer, load


@pytest.fixture(scope="module")
def served():
    model, tok, name = load("tiny")
    server = ModelServer(model, tok, served_model_name=name, max_batch_size=8)
    url = server.start_in_thread()
    yield server, url, model, tok
    server.stop_thread()


def post(url: str, path: str, body: object, *, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def forward_logprobs(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    """Teacher-forced log-softmax rows that predicted each of ``out`` (shape ``[len(out), vocab]``)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    return torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) - 1 + len(out)]


def test_health_and_models(served):
    server, url, _, _ = served
    assert get(url, "/health") == (200, {"status": "ok"})
    status, body = get(url, "/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["tiny-random"]
    assert body["data"][0]["max_model_len"] == server.max_model_len


def test_completions_token_ids_and_logprobs_match_a_forward_pass(served):
    _, url, model, tok = served
    prompt = tok("The quick brown fox", add_special_tokens=False)["input_ids"]
    status, body = post(
        url,
        "/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0,
            "logprobs": 3,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    [choice] = body["choices"]
    ids = choice["token_ids"]
    assert choice["prompt_token_ids"] == prompt
    assert len(ids) == 6 and choice["finish_reason"] == "length" and choice["stop_reason"] is None
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    ref = forward_logprobs(model, prompt, ids)
    for j, t in enumerate(ids):
        assert lp["token_logprobs"][j] == pytest.approx(ref[j, t].item(), abs=1e-4)
        assert ref[j, t].item() >= ref[j].max().item() - 1e-4  # greedy: the argmax was taken
        assert len(lp["top_logprobs"][j]) >= 3
    assert choice["text"] == tok.decode(ids, skip_special_tokens=True)
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 6, "total_tokens": len(prompt) + 6}


def test_tokens_as_token_ids_and_string_prompt_equivalence(served):
    _, url, _, tok = served
    text = "Once upon a time"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    common = {"max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    _, a = post(url, "/v1/completions", {"prompt": text, **common})
    _, b = post(url, "/v1/completions", {"prompt": ids, **common})
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    toks = b["choices"][0]["logprobs"]["tokens"]
    assert toks == [f"token_id:{t}" for t in b["choices"][0]["token_ids"]]


def test_several_prompts_n_and_seed(served):
    _, url, _, _ = served
    body = {
        "prompt": [[5, 6, 7], "hello"],
        "n": 3,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 1234,
        "ignore_eos": True,
    }
    s1, r1 = post(url, "/v1/completions", body)
    s2, r2 = post(url, "/v1/completions", body)
    assert s1 == s2 == 200
    assert [c["index"] for c in r1["choices"]] == list(range(6))
    assert [c["prompt_token_ids"] for c in r1["choices"]][:3] == [[5, 6, 7]] * 3
    seqs1 = [c["token_ids"] for c in r1["choices"]]
    assert seqs1 == [c["token_ids"] for c in r2["choices"]]  # same seed, same samples
    assert len({tuple(s) for s in seqs1[:3]}) == 3  # the n samples differ from each other
    _, r3 = post(url, "/v1/completions", {**body, "seed": 99})
    assert [c["token_ids"] for c in r3["choices"]] != seqs1


def test_stop_token_ids_stop_strings_and_allowed_ids(served):
    _, url, _, tok = served
    hello = tok(" hello", add_special_tokens=False)["input_ids"]
    assert len(hello) == 1
    h = hello[0]
    _, r = post(
        url, "/v1/completions", {"prompt": "x", "max_tokens": 10, "allowed_token_ids": [h], "stop_token_ids": [h]}
    )
    c = r["choices"][0]
    assert (c["token_ids"], c["finish_reason"], c["stop_reason"], c["text"]) == ([h], "stop", h, "")
    _, r = post(
        url, "/v1/completions", {"prompt": "x", "max_tokens": 10, "allowed_token_ids": [h], "stop": ["hello hello"]}
    )
    c = r["choices"][0]
    assert (c["token_ids"], c["finish_reason"], c["stop_reason"], c["text"]) == ([h, h], "stop", "hello hello", " ")
    _, r = post(
        url,
        "/v1/completions",
        {
            "prompt": "x",
            "max_tokens": 10,
            "allowed_token_ids": [h],
            "stop": ["hello hello"],
            "include_stop_str_in_output": True,
        },
    )
    assert r["choices"][0]["text"] == " hello hello"
    # the end-of-sequence token ends a choice: kept in token_ids, cut from the text
    eos = tok.eos_token_id
    _, r = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 5, "allowed_token_ids": [eos]})
    c = r["choices"][0]
    assert (c["token_ids"], c["finish_reason"], c["stop_reason"], c["text"]) == ([eos], "stop", None, "")


def test_chat_completions(served):
    _, url, model, tok = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    status, body = post(
        url,
        "/v1/chat/completions",
        {
            "messages": messages,
            "max_tokens": 4,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
            "ignore_eos": True,
        },
    )
    assert status == 200, body
    expected_prompt = tok(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    assert body["prompt_token_ids"] == expected_prompt
    [c] = body["choices"]
    assert c["message"]["role"] == "assistant"
    assert len(c["token_ids"]) == len(c["logprobs"]["content"]) == 4
    ref = forward_logprobs(model, expected_prompt, c["token_ids"])
    for j, entry in enumerate(c["logprobs"]["content"]):
        assert entry["logprob"] == pytest.approx(ref[j, c["token_ids"][j]].item(), abs=1e-4)
        assert len(entry["top_logprobs"]) == 2
    # OpenAI content parts are accepted
    status, _ = post(
        url,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2},
    )
    assert status == 200


def test_concurrent_requests_are_batched_and_correct(served):
    server, url, model, tok = served
    from concurrent.futures import ThreadPoolExecutor

    prompts = [
        tok(t, add_special_tokens=False)["input_ids"]
        for t in ["a", "a longer prompt than the first", "mid length prompt", "x y z w v u t s r q p"]
    ] * 3
    before = server.engine.batches
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(
            pool.map(
                lambda p: post(
                    url,
                    "/v1/completions",
                    {"prompt": p, "max_tokens": 5, "temperature": 0, "logprobs": 0, "ignore_eos": True},
                ),
                prompts,
            )
        )
    assert all(s == 200 for s, _ in results)
    assert server.engine.batches - before < len(prompts)  # some requests shared a batch
    for p, (_, body) in zip(prompts, results, strict=True):
        c = body["choices"][0]
        ref = forward_logprobs(model, p, c["token_ids"])  # left padding did not change any sequence's numbers
        for j, t in enumerate(c["token_ids"]):
            assert c["logprobs"]["token_logprobs"][j] == pytest.approx(ref[j, t].item(), abs=1e-4)
            assert ref[j, t].item() >= ref[j].max().item() - 1e-4


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": []}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, -2, 3]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [10**9]}, 400, "prompt"),
        ("/v1/completions", {"prompt": 17}, 400, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**7}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "hi", "stop": [1]}, 400, "stop"),
        ("/v1/completions", {"prompt": "hi", "stop_token_ids": ["a"]}, 400, "stop_token_ids"),
        ("/v1/completions", {"prompt": "hi", "stream": True}, 400, "stream"),
        ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "echo"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 99},
            400,
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, 400, "logprobs"),
    ],
)
def test_bad_requests_get_json_4xx(served, path, body, status, param):
    _, url, _, _ = served
    got, err = post(url, path, body)
    assert got == status
    assert err["error"]["code"] == status and err["error"]["param"] == param and err["error"]["message"]


def test_malformed_json_wrong_method_and_unknown_path(served):
    _, url, _, _ = served
    status, err = post(url, "/v1/completions", None, raw=b"{not json")
    assert status == 400 and "JSON" in err["error"]["message"]
    status, err = post(url, "/v1/completions", None, raw=b"[1, 2]")
    assert status == 400
    assert get(url, "/v1/completions")[0] == 405
    status, err = get(url, "/v2/nothing")
    assert status == 404 and err["error"]["type"] == "NotFoundError"
    assert get(url, "/health")[0] == 200  # still serving


@pytest.mark.slow
def test_cli_main_serves_in_a_subprocess(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolgym.serve.model", "--model", "tiny", "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if get(url, "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.3)
        status, body = post(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True})
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 3
    finally:
        proc.terminate()
        proc.wait(30)
