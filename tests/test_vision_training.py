"""Training on episodes with images (:mod:`trainers.vision`): masked SFT and the TRL GRPO adapter on tiny random
vision-language models (2 layers, width 16, built from configs: :mod:`tests.vision_models`), with an image in a
tool result mid-episode (and one in the task). The per-token log-probabilities the loss uses equal a plain forward
of each whole conversation (:func:`toolgym.format.vision.forward_inputs`), image tokens never carry loss, a step
changes the weights, and the mechanisms that cannot take images say so and fall back (or refuse where the result
would be silently wrong)."""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("trl", reason="training needs the [train] extra (trl)")

from tests.vision_models import processor, tiny_model  # noqa: E402
from toolgym import ToolEnv  # noqa: E402
from toolgym.format.vision import VisionInputError, episode_images, forward_inputs, vision_format  # noqa: E402
from toolgym.trajectory import Trajectory  # noqa: E402
from trainers.vision import VisionTrainingError, image_kwargs  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from tests.vision_models import pil, snap_tool  # noqa: E402

pytestmark = pytest.mark.timeout(300)


snap = snap_tool()


def make_env(family: str, prompt_image: bool = True, **kw: Any) -> ToolEnv:
    task: dict[str, Any] = {"id": "t", "prompt": "What is shown?"}
    if prompt_image:
        task["images"] = [pil(64, 48, 1)]
    return ToolEnv([task], [snap], processor=processor(family), max_episode_tokens=4096, max_turns=3, **kw)


def episode(family: str, width: int, answer: str = "a red square", prompt_image: bool = True) -> Trajectory:
    """A scripted episode: a ``snap`` call (its result holds an image), then an answer."""
    env = make_env(family, prompt_image)
    env.reset(seed=0)
    env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": width, "height": 40})])))
    *_, info = env.step(env.encode_action(f"<answer>{answer}</answer>"))
    env.close()
    return info["trajectory"]


def plain_logps(model: Any, traj: Trajectory, p: Any) -> torch.Tensor:
    """``(L - 1,)`` log-probability of each next token of the whole conversation, one plain forward."""
    fi = forward_inputs([traj], p)
    with torch.no_grad():
        lp = model(**fi).logits[0, :-1].float().log_softmax(-1)
    return lp.gather(-1, fi["input_ids"][0, 1:, None])[:, 0]


# -- masked SFT ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_masked_sft_loss_is_a_plain_forwards_and_a_step_trains(family: str) -> None:
    from trainers.sft import masked_sft, masked_sft_loss, pad_sft_batch

    p = processor(family)
    model = copy.deepcopy(tiny_model(family))
    trajs = [episode(family, 90, "a red square"), episode(family, 40, "two blue lines and a dot", False)]
    assert all(t.tool_results[0].images for t in trajs)
    vf = vision_format(p)
    ids, attn, target = pad_sft_batch(trajs)
    for i, t in enumerate(trajs):  # no image token is ever a target (loss mask 0 on every one)
        assert not target[i][ids[i] == vf.image_token_id].any()
        assert int((ids[i] == vf.image_token_id).sum()) == sum(vf.num_tokens(im) for im in episode_images(t))
    # the loss over a padded batch of both episodes is the mean negative log-probability of their policy tokens in
    # plain forwards of each whole conversation
    want = torch.cat([plain_logps(model, t, p)[target[i, 1:int(attn[i].sum())]] for i, t in enumerate(trajs)])
    extra = image_kwargs([episode_images(t) for t in trajs], ids, attn, p)
    with torch.no_grad():
        loss = masked_sft_loss(model, ids, attn, target, **extra)
        blind = masked_sft_loss(model, ids, attn, target)  # the image tokens read as text
    torch.testing.assert_close(loss, -want.mean(), rtol=0, atol=1e-5)
    assert abs(float(blind) - float(loss)) > 1e-6  # the images reach the loss
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = masked_sft(model, trajs, steps=1, lr=1e-2, batch_size=2, micro_batch_size=1, processor=p)
    assert len(losses) == 1 and np.isfinite(losses[0])
    np.testing.assert_allclose(losses[0], float(loss), rtol=1e-5)  # micro-batches of one row: the same loss
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith(("model.visual", "model.multi_modal_projector")) for k in changed)  # the image side
    assert any("language_model" in k for k in changed)


def test_masked_sft_refuses_image_tokens_it_cannot_show() -> None:
    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.sft import masked_sft, sft_dataset

    p = processor("qwen2_5_vl")
    traj = episode("qwen2_5_vl", 60)
    with pytest.raises(VisionTrainingError, match="processor="):
        masked_sft(copy.deepcopy(tiny_model("qwen2_5_vl")), [traj], steps=1)
    with pytest.raises(VisionTrainingError, match="no vision tower"):
        masked_sft(tiny_random_model(load_tokenizer()), [traj], steps=1, processor=p)
    with pytest.raises(VisionTrainingError, match="masked_sft"):  # TRL's SFTTrainer path: token ids alone
        sft_dataset([traj.to_dict()])
    cut = Trajectory.from_dict(traj.to_dict())
    first = cut.prompt_ids.index(vision_format(p).image_token_id)
    cut.prompt_ids = cut.prompt_ids[:first + 1] + cut.prompt_ids[first + 3:]
    with pytest.raises(VisionInputError, match="episode 0"):
        masked_sft(copy.deepcopy(tiny_model("qwen2_5_vl")), [cut], steps=1, processor=p)


def test_a_text_policys_episode_with_images_trains_as_text() -> None:
    """Without a processor the env shows each image as a placeholder line: plain text training, no images."""
    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.sft import masked_sft, sft_dataset

    tok = load_tokenizer()
    env = ToolEnv([{"id": "t", "prompt": "What is shown?", "images": [pil(20, 20)]}], [snap], tokenizer=tok)
    env.reset(seed=0)
    env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": 30, "height": 20})])))
    *_, info = env.step(env.encode_action("<answer>noise</answer>"))
    env.close()
    traj = info["trajectory"]
    assert traj.images and episode_images(traj) == []
    assert len(sft_dataset([traj])) == 1
    assert np.isfinite(masked_sft(tiny_random_model(tok), [traj], steps=1)[0])


# -- GRPO (the TRL adapter) ------------------------------------------------------------------------------
def _alternating(completions, **kwargs):
    """0, 1, 0, 1, ...: every group of two gets a non-zero advantage."""
    return [float(i % 2) for i in range(len(completions))]


def _grpo(tmp_path, family: str, **cfg: Any):
    from trl import GRPOConfig

    from toolgym.envs.vector import ToolVectorEnv
    from trainers.grpo.rollout_adapter import ToolgymRollout, TRLPolicy, make_dataset
    from trainers.grpo.trainer import TurnCreditGRPOTrainer

    class SnapFirst(TRLPolicy):
        """The trainer's real generation (with the images); turn 0's answer replaced by a ``snap`` call."""

        def generate(self, requests):
            out = super().generate(requests)
            for j, r in enumerate(requests):
                if r.episode is not None and r.episode.turn == 0:
                    env = r.episode.env
                    ids = env.encode_action(env.format.parser.format_calls(
                        [("snap", {"width": 40 + 30 * (r.episode.index % 2), "height": 40})]))
                    out[j] = type(out[j]).from_sampled([int(x) for x in ids], None, r.stop_ids, r.max_new_tokens)
            return out

    p = processor(family)
    tasks = [{"id": "t", "prompt": "What is shown?", "images": [pil(64, 48, 1)]}]

    def venv(num_envs: int, **kw: Any) -> ToolVectorEnv:
        return ToolVectorEnv(lambda **k: ToolEnv(tasks, [snap], max_turns=2, max_episode_tokens=4096, **k),
                             num_envs=num_envs, **kw)

    torch.manual_seed(0)
    rollout = ToolgymRollout(venv, tasks, env_kwargs={"processor": p}, max_turn_tokens=40)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=512, max_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                      seed=0, disable_tqdm=True, beta=0.0, bf16=False, learning_rate=1e-2, logging_steps=1, **cfg)
    model = copy.deepcopy(tiny_model(family)).train()
    trainer = TurnCreditGRPOTrainer(model=model, processing_class=p.tokenizer, reward_funcs=[_alternating],
                                    args=args, train_dataset=make_dataset(tasks, repeat=4), rollout_func=rollout)
    rollout.policy = SnapFirst(trainer)
    return trainer, rollout, p


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "gemma3"])
def test_grpo_log_probabilities_are_a_plain_forwards_and_a_step_trains(tmp_path, family: str, caplog) -> None:
    trainer, rollout, p = _grpo(tmp_path, family, gradient_accumulation_steps=2, num_iterations=2)
    vf = vision_format(p)
    inputs = [{"prompt": "t", "task_id": "t"}] * 4
    with caplog.at_level(logging.WARNING):
        out = trainer._generate_and_score_completions(inputs)
    trajs = rollout.last_trajectories
    assert all(len(t.tool_results) == 1 and t.tool_results[0].images for t in trajs)
    assert all(len(episode_images(t)) == 2 for t in trajs)  # the task's image and the tool result's
    assert "turn cache and the shared-prefix prefill take no images" in caplog.text
    for t in trajs:  # the real generation after the tool-result image never sampled an image token
        assert not set(t.completion_ids[t.turns[-1].action_start:t.turns[-1].action_end]) & vf.block_ids
    c_w = out["completion_ids"].size(1)

    def plain(i: int) -> torch.Tensor:
        t = trajs[i]
        return plain_logps(model_ref, t, p)[len(t.prompt_ids) - 1:]

    model_ref = trainer.model
    mask = out["completion_mask"] * out["tool_mask"]
    # image tokens never carry loss
    assert not bool((mask.bool() & (out["completion_ids"] == vf.image_token_id)).any())
    assert int((out["completion_ids"] == vf.image_token_id).sum()) > 0  # the tool result's image is in a completion
    # the scoring forward (old log-probabilities, TRL's batch_size chunks of the generation batch) ...
    for i, t in enumerate(trajs):
        n = len(t.completion_ids)
        torch.testing.assert_close(out["old_per_token_logps"][i, :n], plain(i), rtol=0, atol=1e-4)
    # ... and the loss forward over a micro-batch of rows in another order, trimmed as the loss trims it
    from trainers.grpo.trainer import trim_padding

    order = torch.tensor([2, 0, 3])
    mb = trim_padding({k: (v[order] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v) for k, v in out.items()})
    ids = torch.cat([mb["prompt_ids"], mb["completion_ids"]], dim=1)
    am = torch.cat([mb["prompt_mask"], mb["completion_mask"]], dim=1)
    trainer._loss_rows = mb["toolgym_row"]
    try:
        with torch.no_grad():
            lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, mb["completion_ids"].size(1),
                                                                  batch_size=2)
    finally:
        trainer._loss_rows = None
    for r, i in enumerate(order.tolist()):
        n = len(trajs[i].completion_ids)
        torch.testing.assert_close(lp[r, :n], plain(i), rtol=0, atol=1e-4)
    assert c_w >= max(len(t.completion_ids) for t in trajs)
    assert trainer.unshared_reasons.get("images in the episodes", 0) >= 1  # shared-prefix packing fell back
    # one optimizer step through Trainer.train: finite loss, the weights change (vision side included)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(np.isfinite(losses))
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    vision_side = ("model.visual", "model.vision_tower", "model.multi_modal_projector")  # Qwen-VL; Gemma 3
    assert any(k.startswith(vision_side) for k in changed) and any("language_model" in k for k in changed)


def test_grpo_refuses_image_episodes_on_a_model_without_a_vision_tower(tmp_path) -> None:
    from toolgym.models import tiny_random_model

    trainer, rollout, p = _grpo(tmp_path, "qwen2_5_vl")
    text_model = tiny_random_model(p.tokenizer)
    rollout.policy.trainer = trainer
    trainer.model = text_model
    with pytest.raises(VisionTrainingError, match="no vision tower"):
        trainer._generate_and_score_completions([{"prompt": "t", "task_id": "t"}] * 2)


class RecordingVLLM:
    """Stands in for TRL's ``VLLMGeneration``: records what it is sent, answers a fixed turn."""

    def __init__(self, answer: list[int]) -> None:
        self.answer = answer
        self.calls: list[tuple[list[list[int]], Any]] = []
        self.max_completion_length = 64
        self.generation_kwargs: dict[str, Any] = {}

    def sync_weights(self) -> None:
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls.append((prompts, images))
        return prompts, [list(self.answer) for _ in prompts], [[[-0.5]] * len(self.answer) for _ in prompts], None


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_grpo_vllm_generation_sends_the_images(tmp_path, mode: str) -> None:
    from toolgym.format.vision import collapse_image_runs
    from toolgym.rollout import GenerationRequest
    from trainers.grpo.generation import TRLPolicy

    trainer, _, p = _grpo(tmp_path, "qwen3_vl")
    vf = vision_format(p)
    env = make_env("qwen3_vl")
    env.reset(seed=0)
    env.step(env.encode_action(env.format.parser.format_calls([("snap", {"width": 90, "height": 40})])))
    conv = env.conversation
    stop = env.format.eot_id
    engine = RecordingVLLM([11, 12, stop])
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation = True, mode, engine
    trainer._last_loaded_step = trainer.state.global_step
    policy = TRLPolicy(trainer)
    policy.processor = p
    ids = conv.prompt_ids + conv.completion_ids
    text_only = GenerationRequest(ids[:5], 8, (stop,))
    gens = policy.generate([GenerationRequest(ids, 8, (stop,), images=list(conv.images)), text_only])
    env.close()
    assert [g.token_ids for g in gens] == [[11, 12, stop]] * 2 and gens[0].logprobs == [-0.5] * 3
    (sent, images), = engine.calls
    want = collapse_image_runs(ids, vf.image_token_id) if mode == "colocate" else ids  # vLLM expands / TRL places
    assert sent == [want, ids[:5]]
    assert images[1] is None and [np.asarray(im).tolist() for im in images[0]] == [
        np.asarray(img.to_pil().convert("RGB")).tolist() for img in conv.images]
    assert len(images[0]) == 2
