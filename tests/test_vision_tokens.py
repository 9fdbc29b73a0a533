"""Images as a vision-language model's tokens (:mod:`toolgym.format.vision`, :mod:`toolgym.format.vision_conversation`)
on three families with real processors (image-only, no torchvision) over the cached Qwen3 and Gemma 3 tokenizers:
image token counts equal the processor's, loss mask 0 on every image token, the drift check against the processor's
own ids, budgets that never split an image block, ``@tool`` and MCP images shown as image tokens to a VLM and as
placeholders to a text policy, and a saved trajectory that gives its images back in order."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.vision_models import FAMILY_NAMES, processor
from toolgym import ToolEnv, tool
from toolgym.format.vision import (
    FAMILIES,
    VisionInputError,
    episode_images,
    family_of,
    forward_inputs,
    image_blocks,
    vision_format,
)
from toolgym.images import Image
from toolgym.trajectory import Trajectory, TrajectoryFormatError, read_trajectories, write_trajectories

FAULT = str(Path(__file__).parent / "mcp_servers" / "fault_server.py")
from tests.vision_models import pil  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@tool
def snap(width: int, height: int) -> list:
    """Photograph the scene.

    Args:
        width: pixels across.
        height: pixels down.
    """
    return [f"a {width}x{height} photo:", pil(width, height, width * 1000 + height), "done"]


def env_for(family: str, **kw) -> ToolEnv:
    tasks = [{"id": "t", "prompt": "What is shown?", "images": [pil(64, 48, 1)]}]
    return ToolEnv(tasks, [snap], processor=processor(family), max_episode_tokens=kw.pop("max_episode_tokens", 4096),
                   **kw)


def call(env: ToolEnv, name: str, **args) -> np.ndarray:
    return env.encode_action(env.format.parser.format_calls([(name, args)]))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_image_token_counts_equal_the_processors(family: str) -> None:
    p = processor(family)
    vf = vision_format(p)
    assert vf.family is FAMILIES[family] and family_of(p) is FAMILIES[family]
    for w, h in ((100, 60), (64, 64), (200, 90), (33, 250)):
        img = Image.from_pil(pil(w, h))
        want = p._get_num_multimodal_tokens(image_sizes=[[h, w]]).num_image_tokens[0]
        assert vf.num_tokens(img) == want, (w, h)
        # the expansion inside a rendered text gives the processor's own ids for it
        text = f"a{p.image_token}b"
        assert vf.encode(_fmt(family), text, [], [img]) == vf.processor_ids(text, [img])


def _fmt(family: str):
    env = env_for(family)
    return env.format


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_episode_with_images_in_prompt_and_tool_results_has_no_drift_and_masks_every_image_token(family: str) -> None:
    env = env_for(family)
    vf = env.vision
    assert vf is not None
    obs, _ = env.reset(seed=0)
    prompt_img = env.trajectory.prompt_images[0]
    assert int((obs == vf.image_token_id).sum()) == vf.num_tokens(prompt_img)
    obs, _, term, trunc, info = env.step(call(env, "snap", width=90, height=40))
    assert not (term or trunc)
    shot = env.trajectory.turns[0].results[0].images[0]
    assert int((obs == vf.image_token_id).sum()) == vf.num_tokens(shot) > 0
    *_, info = env.step(env.encode_action("<answer>noise</answer>"))
    traj: Trajectory = info["trajectory"]
    assert info["drift"] == {}
    ids = np.array(traj.completion_ids)
    mask = np.array(traj.loss_mask)
    blocks = image_blocks(traj.completion_ids, vf)
    assert blocks and all((mask[a:b] == 0).all() for a, b in blocks)
    assert not (mask[ids == vf.image_token_id]).any()
    # where the family puts a tool result's image
    tool_msg = next(m for m in traj.messages if m["role"] == "tool")
    if FAMILIES[family].tool_images == "tool":
        assert tool_msg["image_refs"][0]["sha256"] == shot.sha256
    else:
        after = traj.messages[traj.messages.index(tool_msg) + 1]
        assert "image_refs" not in tool_msg and after["role"] == "user"
        assert after["image_refs"][0]["sha256"] == shot.sha256
    assert [i.sha256 for i in episode_images(traj)] == [prompt_img.sha256, shot.sha256]
    env.close()


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_drift_check_reports_ids_that_differ_from_the_processors(family: str) -> None:
    env = env_for(family)
    env.reset(seed=0)
    env.step(call(env, "snap", width=90, height=40))
    conv = env.conversation
    assert conv.check_drift() == {}
    # one image token too many in the built ids: the processor's whole-conversation ids disagree
    at = conv.completion_ids.index(env.vision.image_token_id)
    conv.completion_ids.insert(at, env.vision.image_token_id)
    conv.loss_mask.insert(at, 0)
    drift = conv.check_drift()
    assert drift["index"] == len(conv.prompt_ids) + at + env.vision.num_tokens(
        env.trajectory.turns[0].results[0].images[0])
    assert drift["built_len"] == drift["expected_len"] + 1
    env.close()


def test_drift_check_covers_a_tool_result_spelling_the_image_token() -> None:
    """A tool result that spells ``<|image_pad|>`` is text: no image, and the drift check agrees."""
    @tool
    def spell(n: int) -> str:
        """Spell the image token.

        Args:
            n: how many times.
        """
        return "look " + "<|image_pad|>" * n + " here"

    env = ToolEnv([{"id": "t", "prompt": "hi", "images": [pil(40, 40)]}], [spell], processor=processor("qwen3_vl"))
    env.reset(seed=0)
    obs, *_ = env.step(call(env, "spell", n=2))
    assert env.vision.image_token_id not in obs.tolist()
    *_, info = env.step(env.encode_action("<answer>x</answer>"))
    assert info["drift"] == {}
    env.close()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_budgets_never_split_an_image_block(family: str) -> None:
    probe = env_for(family)
    probe.reset(seed=0)
    obs, *_ = probe.step(call(probe, "snap", width=90, height=40))
    full = len(probe.conversation)
    probe.close()
    # the env's token budget ends inside the observation's image block: the observation is not appended
    env = env_for(family, max_episode_tokens=full - 3)
    env.reset(seed=0)
    obs, _, term, trunc, _ = env.step(call(env, "snap", width=90, height=40))
    assert trunc and len(obs) == 0 and env.vision.image_token_id not in env.trajectory.completion_ids
    env.close()
    # a clip inside an image block moves to the block's start
    env = env_for(family)
    env.reset(seed=0)
    env.step(call(env, "snap", width=90, height=40))
    *_, info = env.step(env.encode_action("<answer>x</answer>"))
    traj = info["trajectory"]
    (a, b), = image_blocks(traj.completion_ids, env.vision)
    from toolgym.envs.vector import ToolVectorEnv
    from toolgym.rollout import RolloutDriver

    venv = ToolVectorEnv(lambda **kw: env_for(family, **kw), num_envs=1)
    driver = RolloutDriver(venv, policy=None, max_completion_tokens=(a + b) // 2)  # type: ignore[arg-type]
    driver.clip(traj)
    assert len(traj.completion_ids) == a and len(traj.loss_mask) == a
    forward_inputs([(traj.prompt_ids + traj.completion_ids, episode_images(traj)[:1])], env.vision)
    venv.close()
    env.close()


def test_forward_inputs_refuse_a_cut_image_block() -> None:
    vf = vision_format(processor("qwen2_5_vl"))
    img = Image.from_pil(pil(100, 60))
    ids = vf.encode(_fmt("qwen2_5_vl"), f"x<|vision_start|>{vf.image_token}<|vision_end|>y", [], [img])
    ok = forward_inputs([(ids, [img])], vf)
    assert ok["image_grid_thw"].tolist() == [[1, 4, 8]] and int(ok["mm_token_type_ids"].sum()) == 8
    with pytest.raises(VisionInputError, match="7 image token"):
        forward_inputs([(ids[:3] + ids[4:], [img])], vf)


def test_a_template_that_drops_tool_images_is_refused_with_the_family_named() -> None:
    """Qwen2.5-VL's template with tool images placed in the tool turn (where it renders none): a clear error."""
    from toolgym.format.vision import VisionFormat

    vf = VisionFormat(processor("qwen2_5_vl"), FAMILIES["qwen3_vl"])  # tool-turn images, wrong template
    env = ToolEnv([{"id": "t", "prompt": "hi"}], [snap], processor=vf, chat_template=FAMILIES["qwen2_5_vl"].chat_template(),
                  max_episode_tokens=4096)
    env.reset(seed=0)
    _, _, _, trunc, info = env.step(call(env, "snap", width=30, height=30))
    assert trunc and "VisionInputError" in info["error"] and "image token" in info["error"]
    env.close()


@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_mcp_image_content_reaches_a_vlm_as_image_tokens_and_a_text_policy_as_the_placeholder(
        family: str, tmp_path: Path) -> None:
    from toolgym.tools.mcp import load_mcp_tools

    tools = load_mcp_tools({"mcpServers": {"fault": {"command": sys.executable, "args": [FAULT], "stderr": "devnull"}}})
    vlm = ToolEnv([{"id": "m", "prompt": "Draw."}], tools, processor=processor(family), max_episode_tokens=4096)
    text = ToolEnv([{"id": "m", "prompt": "Draw."}], tools, tokenizer=processor(family).tokenizer,
                   chat_template=FAMILIES[family].chat_template(), parser=FAMILIES[family].parser)
    try:
        outs = []
        for env in (vlm, text):
            env.reset(seed=0)
            obs, *_ = env.step(call(env, "picture", width=40, height=30, count=2))
            outs.append(obs)
        r = vlm.trajectory.turns[0].results[0]
        n = vlm.vision.num_tokens(r.images[0])
        assert int((outs[0] == vlm.vision.image_token_id).sum()) == 2 * n
        assert vlm.vision.image_token_id not in outs[1].tolist()
        assert text.format.decode(outs[1].tolist()).count(r.images[0].placeholder) == 2
        *_, info = vlm.step(vlm.encode_action("<answer>ok</answer>"))
        assert info["drift"] == {}
        traj = info["trajectory"]
    finally:
        vlm.close()
        text.close()
    back = Trajectory.from_dict(read_trajectories(write_trajectories(tmp_path / "t.jsonl", [traj]))[0])
    assert [i.data for i in episode_images(back)] == [i.data for i in r.images]
    a, b = forward_inputs([back], processor(family)), forward_inputs([traj], processor(family))
    assert all((a[k] == b[k]).all() for k in a)


class ScreenEnv(ToolEnv):
    """An env whose answer to a turn is a user message showing a new screen (the observation turns of visual games),
    not a tool result."""

    async def env_response(self, turn):
        if turn.index >= 2:
            return None
        screen = Image.from_pil(pil(40 + 8 * turn.index, 32, 70 + turn.index))
        return [{"role": "user", "content": f"The screen after your move:\n{screen.placeholder}", "images": [screen]}]


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", None])
def test_images_of_a_user_message_the_env_answers_with_are_kept_in_the_saved_episode(
        family: str | None, tmp_path: Path) -> None:
    task = {"id": "g", "prompt": "Play.", "images": [pil(64, 48, 1)]}
    if family is None:  # a text-only policy: the placeholders are shown, the images are kept for viewing
        env = ScreenEnv([task], [snap], tokenizer=processor("qwen3_vl").tokenizer,
                        chat_template=FAMILIES["qwen3_vl"].chat_template(), parser=FAMILIES["qwen3_vl"].parser)
    else:
        env = ScreenEnv([task], [snap], processor=processor(family), max_episode_tokens=4096)
    try:
        env.reset(seed=0)
        shown = []
        for move in ("left", "up", "<answer>done</answer>"):
            obs, _, terminated, truncated, info = env.step(env.encode_action(move))
            if not (terminated or truncated):
                shown.append(env.trajectory.turns[-1].obs_images[0])
                if family is not None:
                    assert int((obs == env.vision.image_token_id).sum()) == env.vision.num_tokens(shown[-1])
                else:
                    assert shown[-1].placeholder in env.format.decode(obs.tolist())
        traj = info["trajectory"]
    finally:
        env.close()
    assert len(shown) == 2 and traj.turns[2].obs_images == []
    assert [i.sha256 for i in traj.images] == [i.sha256 for i in [traj.prompt_images[0], *shown]]
    back = Trajectory.from_dict(read_trajectories(write_trajectories(tmp_path / "g.jsonl", [traj]))[0])
    assert back.to_dict() == traj.to_dict()
    assert [[i.data for i in t.obs_images] for t in back.turns] == [[i.data for i in t.obs_images] for t in traj.turns]
    if family is not None:  # every image the model saw, in order, and the forward built from the saved row
        assert info["drift"] == {}
        assert [i.sha256 for i in episode_images(back)] == [i.sha256 for i in traj.images]
        a, b = forward_inputs([back], processor(family)), forward_inputs([traj], processor(family))
        assert all((a[k] == b[k]).all() for k in a)
    from toolgym.report.viewer import build_data  # `toolgym view` shows each turn's screen under it

    data = build_data([traj.to_dict()])
    assert [t["oimg"] for t in data["runs"][0]["eps"][0]["turns"]] == [[shown[0].sha256], [shown[1].sha256], []]
    assert all(data["images"][i.sha256]["src"].startswith("data:image/png;base64,") for i in shown)
    row = traj.to_dict()  # a turn naming an image the row does not hold is a classified error
    del row["images"][shown[1].sha256]
    with pytest.raises(TrajectoryFormatError, match=r"turns\[1\]\.images"):
        Trajectory.from_dict(row)
