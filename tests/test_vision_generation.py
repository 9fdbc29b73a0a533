"""Generation and the forward with images on tiny random vision-language models (2 layers, width 16, built from
configs; :mod:`tests.vision_models`): the rollout driver and :class:`~toolgym.rollout.TransformersPolicy` generate
with a tool-turn image in context, per-token log-probabilities from :func:`toolgym.format.vision.forward_inputs`
equal a plain ``processor(whole conversation)`` forward, and the vLLM policy sends one placeholder per image with
the images in order (the engine is a recording stand-in: no GPU, no vLLM here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from tests.vision_models import FAMILY_NAMES, pil, processor, snap_tool, tiny_model  # noqa: E402
from toolgym import ToolEnv
from toolgym.envs.vector import ToolVectorEnv
from toolgym.format.vision import collapse_image_runs, episode_images, forward_inputs, vision_format
from toolgym.rollout import Generation, GenerationRequest, RolloutDriver, TransformersPolicy, VLLMEnginePolicy

pytestmark = pytest.mark.timeout(300)


snap = snap_tool()


def make_env(family: str, **kw: Any) -> ToolEnv:
    tasks = [{"id": "t", "prompt": "What is shown?", "images": [pil(64, 48, 1)]}]
    return ToolEnv(tasks, [snap], processor=processor(family), max_episode_tokens=4096, max_turns=3, **kw)


class FirstTurnCalls:
    """Turn 0: a scripted ``snap`` call; later turns: the model. Records every request it is given."""

    concurrent = False

    def __init__(self, model_policy: Any) -> None:
        self.inner = model_policy
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, requests):
        self.requests += list(requests)
        out = []
        for r in requests:
            if r.episode.turn == 0:
                env = r.episode.env
                ids = env.encode_action(env.format.parser.format_calls([("snap", {"width": 90, "height": 40})]))
                out.append(Generation(ids.tolist(), [0.0] * len(ids)))
            else:
                out.append((await self.inner.agenerate([r]))[0])
        return out


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_local_policy_generates_with_a_tool_turn_image_in_context(family: str) -> None:
    p = processor(family)
    model = tiny_model(family)
    policy = FirstTurnCalls(TransformersPolicy(model, p.tokenizer, temperature=0, processor=p))
    venv = ToolVectorEnv(lambda **kw: make_env(family, **kw), num_envs=2)
    try:
        trajs = RolloutDriver(venv, policy, max_turn_tokens=32).run([None, None], seeds=0)
    finally:
        venv.close()
    vf = vision_format(p)
    later = [r for r in policy.requests if r.episode.turn == 1]
    assert len(later) == 2
    for r in later:  # the prompt's image and the tool result's, both expanded in the ids the model is given
        assert len(r.images) == 2
        assert r.prompt_ids.count(vf.image_token_id) == sum(vf.num_tokens(i) for i in r.images)
    for t in trajs:
        # random sampled text may re-tokenise otherwise (drift); the image turns before it never do
        assert len(t.turns) >= 2 and "error" not in t.drift
        assert not t.drift or t.drift["index"] >= len(t.prompt_ids) + t.turns[1].action_start
        sampled = t.completion_ids[t.turns[1].action_start:t.turns[1].action_end]
        assert sampled and not set(sampled) & vf.block_ids  # image tokens are never sampled
        assert t.logprobs is not None and len(t.logprobs) == len(t.completion_ids)
    # the model's own greedy choice after the image, recomputed by one forward over the episode
    t = trajs[0]
    n = len(t.prompt_ids) + t.turns[1].action_start
    fi = forward_inputs([(t.prompt_ids + t.completion_ids[: t.turns[1].action_start], episode_images(t))], p)
    with torch.no_grad():
        logits = model(**fi).logits[0, -1]
    logits[sorted(vf.block_ids)] = float("-inf")
    assert int(logits.argmax()) == (t.prompt_ids + t.completion_ids)[n]


def test_a_request_with_images_needs_a_processor() -> None:
    policy = TransformersPolicy(tiny_model("qwen2_5_vl"), processor("qwen2_5_vl").tokenizer, temperature=0)
    from toolgym.images import Image

    with pytest.raises(ValueError, match="processor="):
        policy.generate([GenerationRequest([1, 2, 3], 2, images=[Image.from_pil(pil(30, 30))])])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_forward_inputs_logprobs_equal_a_plain_processor_forward(family: str) -> None:
    p = processor(family)
    model = tiny_model(family)
    trajs = []
    for w in (90, 40):
        env = make_env(family)
        env.reset(seed=0)
        env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": w, "height": 40})])))
        *_, info = env.step(env.encode_action("<answer>a red square</answer>"))
        text = env.format.render(env.conversation.template_messages, env.tool_schemas)
        eot = env.format.eot_token  # the episode ends with the answer's end-of-turn token
        trajs.append((info["trajectory"], text[: text.rindex(eot) + len(eot)]))
        env.close()

    def logps(kwargs: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            lp = model(**kwargs).logits[:, :-1].float().log_softmax(-1)
        return lp.gather(-1, ids[:, 1:, None])[..., 0]

    batch = forward_inputs([t for t, _ in trajs], p)
    batch_lp = logps(batch, batch["input_ids"])
    for i, (traj, text) in enumerate(trajs):
        plain = p(text=[text], images=[img.to_pil().convert("RGB") for img in episode_images(traj)],
                  return_tensors="pt", add_special_tokens=False)
        ids = traj.prompt_ids + traj.completion_ids
        assert plain["input_ids"][0].tolist() == ids
        one = forward_inputs([traj], p)
        assert set(one) == set(plain)
        for k in plain:
            assert torch.equal(one[k].to(plain[k].dtype), plain[k]), k
        ref = logps(dict(plain), plain["input_ids"])[0]
        torch.testing.assert_close(logps(one, one["input_ids"])[0], ref, rtol=0, atol=1e-5)
        # in a padded batch of two episodes, each row's log-probabilities are its own
        n = len(ids)
        torch.testing.assert_close(batch_lp[i, : n - 1], ref, rtol=0, atol=1e-4)
        mask = torch.tensor([0] * len(traj.prompt_ids) + traj.loss_mask)
        assert int(mask[one[vision_format(p).family.type_ids_key][0].bool()].sum()) == 0


@dataclass
class _Out:
    token_ids: list[int]
    logprobs: list[dict[int, Any]] | None = None
    finish_reason: str = "stop"


@dataclass
class _Result:
    outputs: list[_Out]


@dataclass
class _Lp:
    logprob: float


@dataclass
class RecordingEngine:
    """Stands in for ``vllm.LLM``: records what it is sent, answers a fixed turn."""

    answer: list[int]
    prompts: list[Any] = field(default_factory=list)

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.prompts += list(prompts)
        return [_Result([_Out(self.answer, [{t: _Lp(-0.5)} for t in self.answer])]) for _ in prompts]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_vllm_request_carries_one_placeholder_per_image_and_the_images_in_order(family: str) -> None:
    p = processor(family)
    vf = vision_format(p)
    env = make_env(family)
    env.reset(seed=0)
    env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": 90, "height": 40})])))
    conv = env.conversation
    stop = env.format.eot_id
    engine = RecordingEngine([11, 12, stop])
    policy = VLLMEnginePolicy(engine, lambda r: {"max_tokens": r.max_new_tokens}, processor=p)
    req = GenerationRequest(conv.prompt_ids + conv.completion_ids, 8, (stop,), images=list(conv.images))
    gen, = policy.generate([req])
    assert gen.token_ids == [11, 12, stop] and gen.logprobs == [-0.5] * 3 and gen.stopped
    sent, = engine.prompts
    ids = sent["prompt_token_ids"]
    assert ids.count(vf.image_token_id) == 2  # one placeholder per image
    # each placeholder stands where the template writes it: the rendering of the same messages, unexpanded
    text = env.format.render(conv.template_messages, env.tool_schemas, add_generation_prompt=True)
    assert ids == env.format.encode(text)
    assert ids == collapse_image_runs(req.prompt_ids, vf.image_token_id)
    assert [np.asarray(im).tolist() for im in sent["multi_modal_data"]["image"]] == [
        np.asarray(i.to_pil().convert("RGB")).tolist() for i in conv.images]
    # text requests carry no multimodal data
    policy.generate([GenerationRequest([1, 2, 3], 4, (stop,))])
    assert engine.prompts[-1] == {"prompt_token_ids": [1, 2, 3]}
    env.close()


def test_a_vllm_request_with_gemma3_images_is_refused_with_a_named_error() -> None:
    """Gemma 3's expanded block keeps its wrapper and newline tokens; collapsed, vLLM would expand it again: the
    request is refused before the engine sees it, naming the family and what to use instead."""
    from toolgym.format.vision import VisionInputError, vllm_prompt

    p = processor("gemma3")
    env = make_env("gemma3")
    env.reset(seed=0)
    env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": 90, "height": 40})])))
    conv = env.conversation
    engine = RecordingEngine([1])
    policy = VLLMEnginePolicy(engine, lambda r: {"max_tokens": r.max_new_tokens}, processor=p)
    req = GenerationRequest(conv.prompt_ids + conv.completion_ids, 8, (env.format.eot_id,), images=list(conv.images))
    with pytest.raises(VisionInputError, match=r"gemma3.*TransformersPolicy"):
        policy.generate([req])
    assert engine.prompts == []
    assert vllm_prompt([1, 2, 3], [], p) == {"prompt_token_ids": [1, 2, 3]}  # text alone is fine
    env.close()
