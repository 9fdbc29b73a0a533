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
        [sys.executable, "-m", "toolgym.serve.model", "--model", "tiny", "--port", str(port), "--threads", "1",
         "--tool-call-parser", "hermes"],
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
        # --tool-call-parser reached the server: a chat request with tools is served (a 400 without a parser)
        status, body = post(url, "/v1/chat/completions", {"messages": QUESTION, "tools": [CALC_TOOL], "max_tokens": 3})
        assert status == 200 and body["choices"][0]["message"]["tool_calls"] == [], body
    finally:
        proc.terminate()
        proc.wait(30)


# ----------------------------------------------------------------------------------------------------------------
# The official OpenAI SDK against the server: tools -> tool_calls, sampling fields, models.retrieve
# ----------------------------------------------------------------------------------------------------------------

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
QUESTION = [{"role": "user", "content": "What is 2+3? Use the calculator."}]


def _train_to_call(model, tok) -> None:
    """Overfit a tiny model (~5 s on a CPU) so that greedy decoding of QUESTION's chat prompt writes CALL_TEXT
    and then ``<|im_end|>``: a real model whose tool call is deterministic."""
    prompt = tok(tok.apply_chat_template(QUESTION, tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True),
                 add_special_tokens=False)["input_ids"]
    target = tok(CALL_TEXT, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for step in range(400):
            model.train()
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 9:
                model.eval()
                with torch.no_grad():
                    logits = model(ids).logits[0, len(prompt) - 1 : -1]
                if logits.argmax(-1).tolist() == target:  # teacher-forced greedy = the target: done
                    return
    raise AssertionError("the tiny model did not learn the tool call")


@pytest.fixture(scope="module")
def caller():
    """A tiny model trained to call the calculator, served with ``--tool-call-parser hermes``."""
    model, tok, _ = load("tiny")
    _train_to_call(model, tok)
    server = ModelServer(model, tok, served_model_name="caller", tool_call_parser="hermes")
    url = server.start_in_thread()
    yield server, url
    server.stop_thread()


def sdk(url: str):
    openai = pytest.importorskip("openai")
    return openai, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.slow  # trains a tiny model for ~80 steps (seconds on an idle CPU)
@pytest.mark.timeout(900)
def test_openai_sdk_chat_with_tools_returns_tool_calls(caller):
    _, url = caller
    openai, client = sdk(url)
    r = client.chat.completions.create(model="caller", messages=QUESTION, tools=[CALC_TOOL], temperature=0,
                                       max_tokens=64)
    [c] = r.choices
    assert c.finish_reason == "tool_calls"
    assert c.message.content is None
    [call] = c.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2+3"}
    # the SDK sends the call back in the next request: the server renders that conversation and answers
    follow = [*QUESTION, c.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r2 = client.chat.completions.create(model="caller", messages=follow, tools=[CALC_TOOL], temperature=0,
                                        max_tokens=8)
    assert r2.choices[0].message.role == "assistant"
    # tool_choice "none": the same text comes back as plain content, nothing parsed
    r = client.chat.completions.create(model="caller", messages=QUESTION, tools=[CALC_TOOL], tool_choice="none",
                                       temperature=0, max_tokens=64)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == CALL_TEXT
    # a call cut by max_tokens is malformed: plain content, finish_reason "length" (as vLLM's parsers do)
    r = client.chat.completions.create(model="caller", messages=QUESTION, tools=[CALC_TOOL], temperature=0,
                                       max_tokens=10)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls
    assert CALL_TEXT.startswith(r.choices[0].message.content)
    # a forced call needs guided decoding: refused, never silently unforced
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="caller", messages=QUESTION, tools=[CALC_TOOL], tool_choice="required")
    assert e.value.status_code == 400 and "tool_choice" in str(e.value)


def test_openai_sdk_tools_without_a_parser_are_refused(served):
    _, url, _, _ = served
    openai, client = sdk(url)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-random", messages=QUESTION, tools=[CALC_TOOL], max_tokens=4)
    assert e.value.status_code == 400 and "--tool-call-parser" in str(e.value)
    # tool_choice "none" needs no parser: the tools are rendered, nothing is parsed
    r = client.chat.completions.create(model="tiny-random", messages=QUESTION, tools=[CALC_TOOL],
                                       tool_choice="none", max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls


def test_openai_sdk_models_retrieve(served):
    server, url, _, _ = served
    openai, client = sdk(url)
    m = client.models.retrieve("tiny-random")
    assert m.id == "tiny-random" and m.object == "model"
    assert [x.id for x in client.models.list()] == ["tiny-random"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("response_format", {"response_format": {"type": "json_object"}}),
        ("bad_words", {"extra_body": {"bad_words": ["red"]}}),
        ("prompt_logprobs", {"extra_body": {"prompt_logprobs": 1}}),
        ("min_p", {"extra_body": {"min_p": 0.1}}),
        ("guided_json", {"extra_body": {"guided_json": {"type": "object"}}}),
        ("parallel_tool_calls", {"parallel_tool_calls": False}),
        ("logit_bias", {"logit_bias": {"99999999": 5}}),
        ("presence_penalty", {"presence_penalty": 3}),
        ("repetition_penalty", {"extra_body": {"repetition_penalty": 0}}),
        ("top_k", {"extra_body": {"top_k": -5}}),
    ],
)
def test_openai_sdk_unsupported_or_invalid_fields_get_a_400_naming_them(served, field, kwargs):
    _, url, _, _ = served
    openai, client = sdk(url)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-random", messages=QUESTION, max_tokens=2, **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == field and field in e.value.body["message"]
    # neutral values pass: a client that always sends them is not refused
    neutral = {"response_format": {"type": "text"}, "bad_words": [], "min_p": 0, "parallel_tool_calls": True}
    if field in neutral:
        body = {"messages": QUESTION, "max_tokens": 2, field: neutral[field]}
        assert post(url, "/v1/chat/completions", body)[0] == 200


def _reference_greedy(model, prompt: list[int], steps: int, *, bias: dict[int, float], freq: float, pres: float,
                      rep: float) -> list[int]:
    """Greedy decoding with vLLM's logit processors written out token by token (the test's own reference)."""
    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1].float().tolist()
        for t, b in bias.items():
            logits[t] += b
        for t in set(prompt) | set(out):
            logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
        for t in set(out):
            logits[t] -= freq * out.count(t) + pres
        out.append(max(range(len(logits)), key=logits.__getitem__))
    return out


def test_openai_sdk_logit_bias_penalties_and_top_k_change_sampling(served):
    _, url, model, tok = served
    _, client = sdk(url)
    prompt = tok("The cat sat on the mat and", add_special_tokens=False)["input_ids"]
    h = tok(" hello", add_special_tokens=False)["input_ids"][0]
    # logit_bias +100 on one token: sampled every time, whatever the temperature
    r = client.completions.create(model="tiny-random", prompt=prompt, max_tokens=6, temperature=1.0, seed=3,
                                  logit_bias={str(h): 100}, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == [h] * 6
    # penalties and a bias on greedy decoding match the reference, and differ from plain greedy
    bias = {h: 0.2, prompt[-1]: 0.3}
    got = client.completions.create(
        model="tiny-random", prompt=prompt, max_tokens=12, temperature=0, logit_bias={str(k): v for k, v in bias.items()},
        frequency_penalty=0.4, presence_penalty=0.1,
        extra_body={"repetition_penalty": 1.5, "ignore_eos": True, "return_token_ids": True},
    ).choices[0].model_extra["token_ids"]
    assert got == _reference_greedy(model, prompt, 12, bias=bias, freq=0.4, pres=0.1, rep=1.5)
    plain = client.completions.create(model="tiny-random", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].model_extra["token_ids"]
    assert plain == _reference_greedy(model, prompt, 12, bias={}, freq=0, pres=0, rep=1.0) != got
    # top_k=1 at temperature 1 is greedy; a large frequency penalty forbids repeats under greedy
    k1 = client.completions.create(model="tiny-random", prompt=prompt, max_tokens=12, temperature=1.0, seed=7,
                                   extra_body={"top_k": 1, "ignore_eos": True}).choices[0].model_extra["token_ids"]
    assert k1 == plain
    sampled = [client.completions.create(model="tiny-random", prompt=prompt, max_tokens=12, temperature=5.0, seed=s,
                                         extra_body={"top_k": 3, "ignore_eos": True}).choices[0].model_extra["token_ids"]
               for s in range(4)]
    with torch.no_grad():  # top-3 at the first position: every sample's first token is one of them
        first = set(torch.topk(model(torch.tensor([prompt])).logits[0, -1], 3).indices.tolist())
    assert {s[0] for s in sampled} <= first
