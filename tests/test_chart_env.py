"""Chart-v0: procedural bar charts shown as images, a zoom tool that answers with images, the oracle that reads
the zoomed pixels, the splits, the reward, registration and ``toolgym eval``."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image as PILImage

import toolgym  # noqa: F401 - registers the envs
from toolgym.cli.main import main
from toolgym.envs.chart import SCALE, SHOWN_SIZE, ChartEnv, generate_task, read_number, render_chart
from toolgym.rollout import EpisodeState, RolloutDriver, ScriptedPolicy
from toolgym.tools.base import ToolErrorKind
from toolgym.tools.zoom import ZoomTool, zoom_factor
from toolgym.trajectory import Trajectory, read_trajectories, write_trajectories

ENV = "toolgym/Chart-v0"


@pytest.fixture(scope="module")
def env():
    e = ChartEnv(split="test")
    yield e
    e.close()


def _call(env: ChartEnv, calls: list[tuple[str, dict]]):
    return env.step(env.encode_action(env.format.parser.format_calls(calls)))


def _oracle_episode(env: ChartEnv, seed: int) -> Trajectory:
    env.reset(seed=seed)
    for turn in range(env.max_turns):
        state = EpisodeState(index=0, task=env.task, turn=turn, env=env)
        *_, terminated, truncated, info = env.step(env.encode_action(env.oracle(state)))
        if terminated or truncated:
            return info["trajectory"]
    raise AssertionError("the episode did not end")


def test_tasks_and_charts_are_deterministic_per_seed():
    a = [generate_task(np.random.default_rng(s)) for s in range(20)]
    b = [generate_task(np.random.default_rng(s)) for s in range(20)]
    assert a == b and len({t["id"] for t in a}) == 20
    assert {t["question"] for t in a} == {"sum_top2", "difference", "total", "range"}
    for t in a[:5]:
        one, two = render_chart(t["chart"]), render_chart(t["chart"])
        assert one.source.tobytes() == two.source.tobytes() and one.shown.size == SHOWN_SIZE
        assert one.source.size == (SHOWN_SIZE[0] * SCALE, SHOWN_SIZE[1] * SCALE)
    e1, e2 = ChartEnv(), ChartEnv()
    try:
        o1, i1 = e1.reset(seed=7)
        o2, i2 = e2.reset(seed=7)
        assert list(o1) == list(o2) and i1["task"] == i2["task"]
        assert e1.trajectory.prompt_images == e2.trajectory.prompt_images
    finally:
        e1.close()
        e2.close()


def test_answers_follow_from_the_values():
    for s in range(40):
        t = generate_task(np.random.default_rng(s))
        v = t["chart"]["values"]
        assert len(set(v)) == len(v) and min(np.diff(sorted(v))) >= 20 and all(100 <= x <= 999 for x in v)
        top = sorted(v, reverse=True)
        want = {"sum_top2": top[0] + top[1], "total": sum(v), "range": top[0] - top[-1],
                "difference": v[t["needed"][0]] - v[t["needed"][1]]}[t["question"]]
        assert t["answer"] == str(want) and int(t["answer"]) > 0


def test_splits_are_disjoint():
    train = {generate_task(np.random.default_rng(s), "train")["id"] for s in range(300)}
    test = {generate_task(np.random.default_rng(s), "test")["id"] for s in range(300)}
    assert len(train) > 250 and len(test) > 250 and not train & test
    e = ChartEnv(split="train")
    try:
        seen = set()
        for s in range(30):
            _, info = e.reset(seed=s)
            seen.add(info["task"]["id"])
            assert info["task"]["split"] == "train"
        assert not seen & test
    finally:
        e.close()
    with pytest.raises(ValueError, match="split"):
        ChartEnv(split="validation")


def test_labels_read_only_when_zoomed():
    """Every value label reads exactly from the zoomed source; the same region of the shown image reads nothing."""
    n = 0
    for s in range(30):
        t = generate_task(np.random.default_rng(s))
        images = render_chart(t["chart"])
        zoom = ZoomTool(images.source, scale=SCALE)
        for value, (x, y, w, h) in zip(t["chart"]["values"], t["label_boxes"], strict=True):
            f = zoom_factor(w, h, SCALE)
            assert read_number(zoom.crop(x, y, w, h, f), f) == value
            blurred = images.shown.crop((x, y, x + w, y + h)).resize((w * SCALE * f, h * SCALE * f),
                                                                    PILImage.Resampling.NEAREST)
            assert read_number(blurred, f) is None
            n += 1
    assert n >= 120
    assert read_number(PILImage.new("RGB", (40, 20), "white")) is None


def test_zoom_answers_the_charts_pixels(env):
    env.reset(seed=3)
    src = np.asarray(render_chart(env.task["chart"]).source)
    x, y, w, h = 100, 60, 40, 24
    obs, reward, terminated, truncated, info = _call(env, [("zoom", {"x": x, "y": y, "width": w, "height": h})])
    assert not (terminated or truncated) and len(obs) > 0
    (r,) = env.trajectory.turns[-1].results
    assert r.ok and len(r.images) == 1 and r.images[0].placeholder in r.content
    got = np.asarray(r.images[0].to_pil().convert("RGB"))
    f = zoom_factor(w, h, SCALE)
    assert f == 256 // (SCALE * 40) == 1 and got.shape == (h * SCALE * f, w * SCALE * f, 3)
    crop = src[y * SCALE:(y + h) * SCALE, x * SCALE:(x + w) * SCALE]
    assert np.array_equal(got, np.repeat(np.repeat(crop, f, 0), f, 1))
    # a small region is enlarged by an integer factor, every source pixel a block
    env.reset(seed=4)
    src = np.asarray(render_chart(env.task["chart"]).source)
    _call(env, [("zoom", {"x": 10, "y": 200, "width": 9, "height": 5})])
    got = np.asarray(env.trajectory.turns[-1].results[0].images[0].to_pil().convert("RGB"))
    f = 256 // (SCALE * 9)
    assert got.shape == (5 * SCALE * f, 9 * SCALE * f, 3) and max(got.shape[:2]) <= 256
    crop = src[200 * SCALE:205 * SCALE, 10 * SCALE:19 * SCALE]
    assert np.array_equal(got, np.repeat(np.repeat(crop, f, 0), f, 1))


@pytest.mark.parametrize(("args", "needle"), [
    ({"x": 315, "y": 0, "width": 10, "height": 10}, "not inside the image"),
    ({"x": -1, "y": 0, "width": 10, "height": 10}, "not inside the image"),
    ({"x": 0, "y": 235, "width": 4, "height": 6}, "not inside the image"),
    ({"x": 0, "y": 0, "width": 0, "height": 10}, "at least 1 pixel"),
    ({"x": 0, "y": 0, "width": 10, "height": -3}, "at least 1 pixel"),
    ({"x": 0, "y": 0, "width": 65, "height": 10}, "too large"),
    ({"x": 0, "y": 0, "width": 200, "height": 200}, "too large"),
    ({"x": "left", "y": 0, "width": 10, "height": 10}, "must be an integer"),
    ({"x": 1.5, "y": 0, "width": 10, "height": 10}, "must be an integer"),
    ({"x": True, "y": 0, "width": 10, "height": 10}, "must be an integer"),
    ({"x": 0, "y": 0, "width": 10}, "must be an integer"),
    ({"x": 0, "y": 0, "width": 10, "height": 10, "zoom": 3}, "unknown argument"),
])
def test_bad_zoom_arguments_are_classified_errors(env, args, needle):
    env.reset(seed=1)
    good = {"x": 0, "y": 0, "width": 8, "height": 8}
    obs, reward, terminated, truncated, _ = _call(env, [("zoom", args), ("zoom", good)])
    assert not (terminated or truncated) and len(obs) > 0  # the episode goes on
    bad, ok = env.trajectory.turns[-1].results
    assert bad.error_kind == ToolErrorKind.INVALID_ARGUMENTS and not bad.images
    assert bad.content.startswith("Error (invalid_arguments): zoom:") and needle in bad.content
    assert ok.ok and len(ok.images) == 1  # the other call of the turn is answered normally


def test_zoom_without_an_image_is_refused():
    from toolgym.runtime import run_sync
    from toolgym.tools.base import ToolCall
    from toolgym.tools.executor import ToolExecutor

    ex = ToolExecutor([ZoomTool(None, scale=SCALE)])
    r = run_sync(ex.run(ToolCall("zoom", {"x": 0, "y": 0, "width": 4, "height": 4})))
    assert r.error_kind == ToolErrorKind.EXCEPTION and "no image" in r.content
    with pytest.raises(ValueError, match="multiple of scale"):
        ZoomTool(PILImage.new("RGB", (10, 10)), scale=4)


def test_reward_is_the_exact_number(env):
    for seed, delta, want in ((0, 0, 1.0), (0, 1, 0.0), (2, -10, 0.0), (2, 0, 1.0)):
        env.reset(seed=seed)
        answer = int(env.task["answer"]) + delta
        *_, reward, terminated, _, info = env.step(env.encode_action(f"<answer>{answer}</answer>"))
        assert terminated and reward == want and info["trajectory"].outcome_reward == want


def test_oracle_reads_the_zoomed_pixels_and_scores_one():
    driver = RolloutDriver(ENV, ScriptedPolicy(lambda s: s.env.oracle(s)), max_turn_tokens=256, num_envs=4,
                           env_kwargs={"split": "test"})
    try:
        trajs = driver.run([None] * 8, seeds=list(range(8)))  # seeded draws from the test split
        pool = [generate_task(np.random.default_rng(s), "test") for s in range(100)]
        totals = [t for t in pool if t["question"] == "total" and len(t["needed"]) > 3][:4]  # two zoom turns
        assert len(totals) == 4
        trajs += driver.run(totals, seeds=list(range(4)))
    finally:
        driver.venv.close()
    assert len({t.task["id"] for t in trajs}) >= 11
    for t in trajs:
        assert t.outcome_reward == 1.0 and t.terminated and t.drift == {}
        zooms = [r for r in t.tool_results if r.call.name == "zoom"]
        assert len(zooms) == len(t.task["needed"]) and all(r.ok and len(r.images) == 1 for r in zooms)
        assert all(len(turn.calls) <= 3 for turn in t.turns)
        assert t.answer == t.tool_results[-1].content.strip()  # the calculator's result
        values = [t.task["chart"]["values"][i] for i in t.task["needed"]]
        assert t.tool_results[-1].call.arguments["expression"] == f" {t.task['operator']} ".join(map(str, values))


class _BlurryZoomChartEnv(ChartEnv):
    """Fault injection: ``zoom`` enlarges the shown (downscaled) chart instead of the source."""

    def reset(self, **kw):
        out = super().reset(**kw)
        shown = render_chart(self.task["chart"]).shown
        source = shown.resize((shown.width * SCALE, shown.height * SCALE), PILImage.Resampling.NEAREST)
        self.episode_zoom = ZoomTool(source, scale=SCALE)
        return out


def test_oracle_scores_zero_when_the_zoom_shows_no_detail():
    env = _BlurryZoomChartEnv(split="test")
    try:
        for seed in range(3):
            t = _oracle_episode(env, seed)
            assert t.outcome_reward == 0.0
            assert not any(r.call.name == "calculator" for r in t.tool_results)  # nothing was read
            assert sum(r.call.name == "zoom" for r in t.tool_results) > len(t.task["needed"])  # retried
    finally:
        env.close()


def test_gym_make_and_vector_env():
    e = gym.make(ENV, split="test")
    try:
        obs, info = e.reset(seed=0)
        assert obs.ndim == 1 and info["task"]["id"].startswith("chart-") and info["task"]["split"] == "test"
        assert info["messages"][-1]["content"].startswith("[image: image/png, ")
        (img,) = e.unwrapped.trajectory.prompt_images
        assert (img.width, img.height) == SHOWN_SIZE
        assert info["task"]["images"][0]["sha256"] == img.sha256
        assert {s["function"]["name"] for s in e.unwrapped.tool_schemas} == {"zoom", "calculator"}
    finally:
        e.close()
    v = gym.make_vec(ENV, num_envs=2)
    try:
        obs, _ = v.reset(seed=0)
        assert len(obs) == 2
    finally:
        v.close()


def test_trajectory_with_images_writes_and_reads_back_equal(tmp_path):
    env = ChartEnv(split="test")
    try:
        traj = _oracle_episode(env, 5)
    finally:
        env.close()
    assert traj.outcome_reward == 1.0
    path = write_trajectories(tmp_path / "chart.jsonl", [traj])
    (row,) = read_trajectories(path)
    shas = {traj.prompt_images[0].sha256, *(i.sha256 for r in traj.tool_results for i in r.images)}
    assert set(row["images"]) == shas and len(shas) == 1 + len(traj.task["needed"])  # each image once
    back = Trajectory.from_dict(row)
    assert back == traj
    assert [i.data for r in back.tool_results for i in r.images] == [i.data for r in traj.tool_results
                                                                       for i in r.images]
    assert back.prompt_images[0].to_pil().tobytes() == render_chart(traj.task["chart"]).shown.tobytes()


def test_toolgym_eval_runs_the_oracle(capsys, tmp_path):
    out = tmp_path / "eval.jsonl"
    rc = main(["eval", "chart", "--policy", "oracle", "--split", "test", "--tasks", "2", "--json", "--no-progress",
               "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    d = json.loads(cap.out.strip().splitlines()[-1])
    assert d["n_tasks"] == 2 and d["success"] == 1.0
    rows = read_trajectories(out)
    assert len(rows) == 2 and all(row["images"] for row in rows)
    assert main(["list"]) == 0 and ENV in capsys.readouterr().out
