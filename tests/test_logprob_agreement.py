"""The served model (real aiohttp server, reached through OpenAIPolicy) and TransformersPolicy report the same
per-token logprobs for the same prompt and tokens, in both logprobs modes, at a temperature other than 1.

Both backends sample with their own random generators, so in general they sample different tokens. Two checks
make "the same tokens" exact:

* each backend's logprobs are compared with one teacher-forced forward pass over the prompt and the tokens that
  backend sampled (raw: ``log_softmax(logits)``; processed: ``log_softmax(logits / T)`` with the top-k cut), so
  both report the one definition of each mode;
* with ``top_k=1`` both backends sample the same (argmax) tokens, and their raw logprobs are compared directly.
"""

from __future__ import annotations

import pytest
import torch

from toolgym import models
from toolgym.rollout import (
    DEFAULT_LOGPROBS_MODE,
    EpisodeState,
    GenerationRequest,
    OpenAIPolicy,
    TransformersPolicy,
)
from toolgym.serve.model import ModelServer

pytestmark = pytest.mark.timeout(300)

TEMPERATURE = 0.7
TOL = 1e-4
N_TOKENS = 8


def make_tiny():
    tok = models.load_tokenizer(None)
    # a larger init than the default makes the distributions peaked enough that raw and processed logprobs
    # differ by far more than the tolerance
    return models.tiny_random_model(tok, initializer_range=0.5), tok


def make_embedded():
    return models.load_model(None)


@pytest.fixture(scope="module", params=["tiny", pytest.param("embedded", marks=pytest.mark.slow)])
def backend(request):
    model, tok = make_tiny() if request.param == "tiny" else make_embedded()
    model.eval()
    server = ModelServer(model, tok, served_model_name=request.param, max_batch_size=4)
    url = server.start_in_thread()
    prompt = list(tok("The capital of France is", add_special_tokens=False)["input_ids"])
    yield model, tok, url, prompt
    server.stop_thread()


def reference(model, prompt: list[int], ids: list[int], mode: str, top_k: int = 0) -> list[float]:
    """Teacher-forced logprobs of ``ids`` after ``prompt`` under ``mode`` (the definition both backends follow)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ids)].float()
    if mode == "processed_logprobs":
        logits = logits / TEMPERATURE
        if top_k:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[j, t]) for j, t in enumerate(ids)]


def served_policy(url: str, mode: str, top_k: int = 0) -> OpenAIPolicy:
    extra = {"seed": 1234, "ignore_eos": True, **({"top_k": top_k} if top_k else {})}
    return OpenAIPolicy(url, temperature=TEMPERATURE, logprobs_mode=mode, extra_body=extra)


def local_policy(model, tok, mode: str, top_k: int = 0) -> TransformersPolicy:
    return TransformersPolicy(model, tok, temperature=TEMPERATURE, top_k=top_k, logprobs_mode=mode, seed=1234)


def requests(prompt: list[int], *, episode: bool) -> list[GenerationRequest]:
    ep = EpisodeState(index=0, task={}, turn=0) if episode else None
    return [GenerationRequest(list(prompt), N_TOKENS, (), ep)]


def test_the_default_is_processed_everywhere():
    import inspect

    assert DEFAULT_LOGPROBS_MODE == "processed_logprobs"
    for cls in (TransformersPolicy, OpenAIPolicy, ModelServer):
        assert inspect.signature(cls).parameters["logprobs_mode"].default == DEFAULT_LOGPROBS_MODE


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("top_k", [0, 50])
async def test_both_backends_report_the_same_definition(backend, mode, top_k):
    model, tok, url, prompt = backend
    [served] = await served_policy(url, mode, top_k).agenerate(requests(prompt, episode=False))
    assert len(served.token_ids) == N_TOKENS and served.logprobs is not None
    assert served.logprobs == pytest.approx(reference(model, prompt, served.token_ids, mode, top_k), abs=TOL)
    # TransformersPolicy: generate()'s scores/logits path (no episode) and the per-episode seeded sampler
    for episode in (False, True):
        [local] = await local_policy(model, tok, mode, top_k).agenerate(requests(prompt, episode=episode))
        assert local.logprobs is not None and len(local.logprobs) == len(local.token_ids) > 0
        ref = reference(model, prompt, local.token_ids, mode, top_k)
        assert local.logprobs == pytest.approx(ref, abs=TOL), f"episode={episode}"
    # the two modes really differ at this temperature (so the check above could fail)
    other = "raw_logprobs" if mode == "processed_logprobs" else "processed_logprobs"
    alt = reference(model, prompt, served.token_ids, other, top_k)
    assert max(abs(a - b) for a, b in zip(alt, served.logprobs, strict=True)) > 100 * TOL


async def test_same_tokens_same_raw_logprobs(backend):
    """top_k=1: both backends take the argmax, so the tokens are the same and the raw logprobs must match."""
    model, tok, url, prompt = backend
    mode = "raw_logprobs"
    [served] = await served_policy(url, mode, top_k=1).agenerate(requests(prompt, episode=False))
    for episode in (False, True):
        [local] = await local_policy(model, tok, mode, top_k=1).agenerate(requests(prompt, episode=episode))
        assert local.token_ids == served.token_ids
        assert local.logprobs == pytest.approx(served.logprobs, abs=TOL)
        assert min(served.logprobs) < -0.01  # not a trivial 0.0
    # processed with top_k=1: the one kept token has probability 1 in both
    [served_p] = await served_policy(url, "processed_logprobs", top_k=1).agenerate(requests(prompt, episode=False))
    [local_p] = await local_policy(model, tok, "processed_logprobs", top_k=1).agenerate(requests(prompt, episode=True))
    assert served_p.token_ids == local_p.token_ids == served.token_ids
    assert served_p.logprobs == pytest.approx([0.0] * N_TOKENS, abs=TOL)
    assert local_p.logprobs == pytest.approx([0.0] * N_TOKENS, abs=TOL)


def test_bad_mode_is_refused(backend):
    model, tok, _, _ = backend
    with pytest.raises(ValueError, match="logprobs_mode"):
        TransformersPolicy(model, tok, logprobs_mode="raw")
    with pytest.raises(ValueError, match="logprobs_mode"):
        OpenAIPolicy("http://127.0.0.1:1", logprobs_mode="logits")


def test_the_server_default_and_a_bad_request_field(backend):
    """``ModelServer(logprobs_mode=...)`` is the default of requests that set none; a bad value is a 400."""
    import json
    import urllib.error
    import urllib.request

    model, tok, url, prompt = backend
    raw_server = ModelServer(model, tok, served_model_name="raw", logprobs_mode="raw_logprobs")
    raw_url = raw_server.start_in_thread()
    try:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": TEMPERATURE, "logprobs": 0, "ignore_eos": True,
                "seed": 5}

        def post(base: str, payload: dict) -> tuple[int, dict]:
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, out = post(raw_url, body)
        assert status == 200, out
        [choice] = out["choices"]
        ref = reference(model, prompt, choice["token_ids"], "raw_logprobs")
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(ref, abs=TOL)
        status, err = post(url, {**body, "logprobs_mode": "logits"})
        assert status == 400 and err["error"]["param"] == "logprobs_mode"
    finally:
        raw_server.stop_thread()
