"""Images in tasks and tool results: the checked :class:`toolgym.images.Image`, ``@tool`` functions and a real MCP
server (``tests/mcp_servers/fault_server.py``'s ``picture``) returning images, the placeholder a text-only policy
reads, ``invalid_image`` error observations for every kind of bad image, and trajectories that keep their images
through a file and into ``toolgym view``'s page. The images are real PNG/JPEG bytes made with Pillow."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image as PILImage

from toolgym import ToolEnv, tool
from toolgym.images import Image, ImageError, ImageLimits, ImageProblem, split_parts
from toolgym.runtime import run_sync
from toolgym.tools.base import ToolCall, ToolErrorKind
from toolgym.tools.executor import ToolExecutor
from toolgym.trajectory import Trajectory, TrajectoryFormatError, read_trajectories, write_trajectories

FAULT = str(Path(__file__).parent / "mcp_servers" / "fault_server.py")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.timeout(300)


def pil(w: int, h: int, seed: int = 0) -> PILImage.Image:
    """A noisy RGB image (noise: PNG cannot compress it away, so a cut file loses pixel data)."""
    rng = np.random.default_rng(seed)
    return PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def png(w: int, h: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    pil(w, h, seed).save(buf, format=fmt)
    return buf.getvalue()


# -- the Image type -------------------------------------------------------------------------------------
def test_an_image_is_checked_bytes_with_type_size_and_hash() -> None:
    data = png(7, 5)
    img = Image.from_bytes(data, "image/png")
    assert (img.mime_type, img.width, img.height, img.data) == ("image/png", 7, 5, data)
    assert img.sha256 == hashlib.sha256(data).hexdigest()
    assert img.placeholder == f"[image: image/png, {len(data)} bytes]"
    assert np.array_equal(np.asarray(img.to_pil()), np.asarray(pil(7, 5)))
    assert Image.from_bytes(png(3, 2, fmt="JPEG")).mime_type == "image/jpeg"  # type read from the bytes
    assert Image.from_pil(pil(4, 3)).to_pil().size == (4, 3)
    assert Image.from_json(img.to_json()) == img


@pytest.mark.parametrize(("data", "mime", "limits", "problem"), [
    (b"this is not a png at all", "image/png", ImageLimits(), ImageProblem.NOT_AN_IMAGE),
    (png(64, 64)[:400], "image/png", ImageLimits(), ImageProblem.CORRUPT),
    (png(4, 4), "image/x-made-up", ImageLimits(), ImageProblem.UNKNOWN_MIME_TYPE),
    (png(4, 4), "image/jpeg", ImageLimits(), ImageProblem.MIME_MISMATCH),
    (png(20, 20), "image/png", ImageLimits(max_pixels=399), ImageProblem.TOO_MANY_PIXELS),
    (png(20, 20), "image/png", ImageLimits(max_bytes=100), ImageProblem.TOO_LARGE),
    (png(4, 4, fmt="BMP"), None, ImageLimits(), ImageProblem.UNKNOWN_MIME_TYPE),
])  # fmt: skip
def test_bad_images_are_refused_with_their_problem(data: bytes, mime: str | None, limits: ImageLimits,
                                                   problem: ImageProblem) -> None:
    with pytest.raises(ImageError) as e:
        Image.from_bytes(data, mime, limits)
    assert e.value.problem is problem


def test_the_default_pixel_limit_refuses_a_small_file_with_many_pixels() -> None:
    buf = io.BytesIO()
    PILImage.new("1", (4100, 4100)).save(buf, format="PNG")  # one colour: a few kB of PNG, 16.8 M pixels
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(ImageError) as e:
        Image.from_bytes(buf.getvalue(), "image/png")
    assert e.value.problem is ImageProblem.TOO_MANY_PIXELS and "4100x4100" in e.value.message


def _recrc_broken(data: bytes, chunk: bytes) -> bytes:
    """``data`` with the CRC of its first ``chunk`` chunk flipped."""
    at = data.index(chunk) - 4
    end = at + 12 + int.from_bytes(data[at : at + 4], "big")
    return data[: end - 1] + bytes([data[end - 1] ^ 0xFF]) + data[end:]


def test_a_png_ancillary_chunk_with_a_bad_crc_is_left_out_a_critical_one_refuses_the_image() -> None:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Comment", "a colour profile or a comment")
    buf = io.BytesIO()
    pil(6, 6).save(buf, format="PNG", pnginfo=info)
    broken = _recrc_broken(buf.getvalue(), b"tEXt")  # Pillow alone refuses these bytes
    with pytest.raises(PILImage.UnidentifiedImageError):
        PILImage.open(io.BytesIO(broken))
    img = Image.from_bytes(broken, "image/png")
    assert b"tEXt" not in img.data and len(img.data) < len(broken)
    assert np.array_equal(np.asarray(img.to_pil()), np.asarray(pil(6, 6)))
    with pytest.raises(ImageError) as e:
        Image.from_bytes(_recrc_broken(png(6, 6), b"IHDR"), "image/png")
    assert e.value.problem in (ImageProblem.NOT_AN_IMAGE, ImageProblem.CORRUPT)


def test_split_parts_puts_each_image_where_its_placeholder_stands() -> None:
    a, b = Image.from_bytes(png(2, 2, 1)), Image.from_bytes(png(3, 3, 2))
    text = f"before\n{a.placeholder}\nmiddle\n{b.placeholder}"
    assert split_parts(text, [a, b]) == ["before\n", a, "\nmiddle\n", b]
    assert split_parts(text[: text.index(b.placeholder) + 5], [a, b]) == ["before\n", a, "\nmiddle\n[imag"]


# -- @tool functions returning images ---------------------------------------------------------------------
@tool
def snapshot(kind: str) -> Any:
    """Return a picture in one of several shapes.

    Args:
        kind: which shape of return value.
    """
    if kind == "pil":
        return pil(6, 4, 1)
    if kind == "bytes":
        return {"type": "image", "data": png(5, 5, 2), "mime_type": "image/png"}
    if kind == "mixed":
        return ["a caption", pil(2, 3, 3), Image.from_bytes(png(4, 1, 4)), {"type": "text", "text": "the end"}]
    if kind == "trl":
        return [{"type": "image", "image": pil(3, 3, 5)}, {"type": "text", "text": "seen"}]
    if kind == "garbage":
        return ["kept text", {"type": "image", "data": b"\x89PNG garbage", "mime_type": "image/png"}, pil(2, 2, 6)]
    if kind == "unknown_mime":
        return {"type": "image", "data": png(2, 2), "mime_type": "image/x-made-up"}
    if kind == "huge":
        return pil(50, 50)
    if kind == "three":
        return [pil(2, 2, 7), pil(2, 2, 8), pil(2, 2, 9)]
    return [1, 2]  # a plain list: text, as str() makes it


def run(ex: ToolExecutor, kind: str):
    return run_sync(ex.run(ToolCall("snapshot", {"kind": kind}, id="c")))


def test_a_tool_returns_a_pil_image_bytes_with_a_mime_type_or_a_mixed_list() -> None:
    ex = ToolExecutor([snapshot])
    r = run(ex, "pil")
    assert r.ok and len(r.images) == 1 and r.content == r.images[0].placeholder
    assert np.array_equal(np.asarray(r.images[0].to_pil()), np.asarray(pil(6, 4, 1)))
    r = run(ex, "bytes")
    assert r.ok and r.images[0].data == png(5, 5, 2) and r.content == f"[image: image/png, {len(png(5, 5, 2))} bytes]"
    r = run(ex, "mixed")
    first, second = r.images
    assert r.ok and (first.width, first.height, second.width, second.height) == (2, 3, 4, 1)
    assert r.content == f"a caption\n{first.placeholder}\n{second.placeholder}\nthe end"
    assert r.parts() == ["a caption\n", first, "\n", second, "\nthe end"]
    r = run(ex, "trl")
    assert r.ok and r.content == f"{r.images[0].placeholder}\nseen"
    r = run(ex, "plain")
    assert r.ok and r.content == "[1, 2]" and r.images == []
    assert ex.metrics.errors == {}


@pytest.mark.parametrize(("kind", "problem", "kept"), [
    ("garbage", "not_an_image", 1), ("unknown_mime", "unknown_mime_type", 0), ("huge", "too_many_pixels", 0),
])  # fmt: skip
def test_a_bad_image_is_a_classified_error_that_keeps_the_rest(kind: str, problem: str, kept: int) -> None:
    ex = ToolExecutor([snapshot], image_limits=ImageLimits(max_pixels=2000))
    r = run(ex, kind)
    assert r.error_kind is ToolErrorKind.INVALID_IMAGE and len(r.images) == kept
    first = r.content.splitlines()[0]
    assert first.startswith("Error (invalid_image): part ") and problem in first
    if kind == "garbage":  # the text and the good image are still there, after the error line
        assert r.content.splitlines()[1:] == ["kept text", r.images[0].placeholder]
    assert ex.metrics.errors == {"invalid_image": 1}


# -- an episode with a text-only policy -----------------------------------------------------------------
def call(env: ToolEnv, name: str, **args: Any) -> np.ndarray:
    return env.encode_action(env.format.parser.format_calls([(name, args)]))


def test_a_text_policy_reads_placeholders_and_the_episode_goes_on_past_bad_images() -> None:
    env = ToolEnv([{"id": "t", "prompt": "Look."}], [snapshot], max_turns=5,
                  executor_kwargs={"image_limits": ImageLimits(max_per_turn=2)})
    try:
        env.reset(seed=0)
        obs, _, term, trunc, info = env.step(call(env, "snapshot", kind="mixed"))
        text = env.tokenizer.decode(obs)
        r = env.trajectory.turns[0].results[0]
        assert f"a caption\n{r.images[0].placeholder}\n{r.images[1].placeholder}\nthe end" in text
        assert info["results"][0]["images"] == [img.ref() for img in r.images]
        obs, _, term, trunc, info = env.step(call(env, "snapshot", kind="three"))  # 3 images, 2 allowed per turn
        assert info["error_kinds"] == ["invalid_image"] and not (term or trunc) and len(obs)
        r = env.trajectory.turns[1].results[0]
        assert len(r.images) == 2 and "too_many: 1 image(s) not shown, past the limit of 2 per turn" in r.content
        _, _, term, trunc, info = env.step(call(env, "snapshot", kind="garbage"))
        assert info["error_kinds"] == ["invalid_image"] and not (term or trunc)
        _, _, term, _, info = env.step(env.encode_action("<answer>done</answer>"))
        assert term and info["drift"] == {}
        assert [len(r.images) for r in info["trajectory"].tool_results] == [2, 2, 1]
    finally:
        env.close()


def test_a_task_carries_images_before_its_prompt() -> None:
    data = png(9, 4, 3)
    tasks = [{"id": "t", "prompt": "What colour?", "images": [data, f"data:image/png;base64,{base64.b64encode(data).decode()}"]}]
    env = ToolEnv(tasks, [snapshot])
    try:
        _, info = env.reset(seed=0)
        ph = f"[image: image/png, {len(data)} bytes]"
        assert info["messages"][-1]["content"] == f"{ph}\n{ph}\nWhat colour?"
        assert f"{ph}\n{ph}\nWhat colour?" in info["prompt_text"]
        assert [img.data for img in env.trajectory.prompt_images] == [data, data]
        assert info["task"]["images"][0] == Image.from_bytes(data).ref()  # the row holds refs: JSON
        json.dumps(info["task"])
        with pytest.raises(ImageError, match=r"task 'bad': images\[0\]: not_an_image"):
            env.reset(options={"task": {"id": "bad", "prompt": "p", "images": [b"nope"]}})
    finally:
        env.close()


# -- a real MCP server returning ImageContent, and the trajectory file ---------------------------------------
def test_mcp_image_content_reaches_a_text_policy_and_the_saved_trajectory_keeps_it(tmp_path: Path) -> None:
    from toolgym.report.viewer import build_data, write_report
    from toolgym.tools.mcp import load_mcp_tools

    tools = load_mcp_tools({"mcpServers": {"fault": {"command": sys.executable, "args": [FAULT], "stderr": "devnull"}}})
    env = ToolEnv([{"id": "mcp", "prompt": "Draw.", "images": [png(3, 3, 9)]}], tools, max_turns=4)
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(call(env, "picture", width=12, height=7, count=2))
        r = env.trajectory.turns[0].results[0]
        assert r.ok and [(i.width, i.height) for i in r.images] == [(12, 7), (12, 7)]
        assert r.images[0].to_pil().getpixel((0, 0)) == (255, 0, 0)
        n = len(r.images[0].data)
        assert r.content == f"2 picture(s)\n[image: image/png, {n} bytes]\n[image: image/png, {n} bytes]"
        assert f"[image: image/png, {n} bytes]" in env.tokenizer.decode(obs)
        _, _, term, trunc, info = env.step(call(env, "picture", width=4, height=4, garbage=True))
        assert info["error_kinds"] == ["invalid_image"] and not (term or trunc)
        assert "not_an_image" in info["results"][0]["content"] and "1 picture(s)" in info["results"][0]["content"]
        *_, info = env.step(env.encode_action("<answer>ok</answer>"))
        traj = info["trajectory"]
    finally:
        env.close()

    path = write_trajectories(tmp_path / "t.jsonl", [traj])
    row = read_trajectories(path)[0]
    assert len(row["images"]) == 2  # the two identical pictures and the task image: each stored once
    back = Trajectory.from_dict(row)
    assert back == traj
    assert [i.data for i in back.tool_results[0].images] == [i.data for i in traj.tool_results[0].images]
    assert back.prompt_images[0].data == png(3, 3, 9)

    tampered = json.loads(json.dumps(row))
    sha = next(iter(tampered["images"]))
    tampered["images"][sha]["data"] = base64.b64encode(png(2, 2)).decode()
    with pytest.raises(TrajectoryFormatError, match=f"images.{sha}: the data's SHA-256"):
        Trajectory.from_dict(tampered)

    data = build_data([row])
    img = traj.tool_results[0].images[0]
    assert data["images"][img.sha256]["src"] == f"data:image/png;base64,{base64.b64encode(img.data).decode()}"
    assert data["runs"][0]["eps"][0]["turns"][0]["calls"][0]["imgs"] == [img.sha256, img.sha256]
    report = write_report(path, tmp_path / "report.html", tokenizer=None)
    if CHROMIUM is None:
        pytest.skip("headless Chromium not installed: the page's images are checked in its data only")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                          "--dump-dom", f"{report.as_uri()}#open=0"], capture_output=True, text=True, timeout=120,
                         check=False).stdout
    srcs = re.findall(r'<img class="shot" src="(data:[^"]+)"', dom)
    assert srcs.count(data["images"][img.sha256]["src"]) == 2 and len(srcs) == 3  # 2 in the result, 1 in the prompt
