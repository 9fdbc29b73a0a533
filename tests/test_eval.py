"""toolgym.evaluation and `toolgym eval`: statistics against hand-computed values, task selection (each task once,
reproducible, `all` on an infinite split fails), streaming output (an interrupted run keeps finished episodes, a
pre-existing file is not emptied early), the --json report, exit codes, user-registered envs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import tests.eval_env as eval_env  # registers EvalEcho-v0 / EvalNoOracle-v0
from toolgym.cli import main
from toolgym.evaluation import (
    TaskFileError,
    TaskSelectionError,
    evaluate,
    oracle_policy,
    paired_difference_ci,
    pass_at_k,
    select_tasks,
    wilson_interval,
)
from toolgym.rollout import Generation, GenerationRequest

REPO = Path(__file__).resolve().parent.parent
ECHO = "tests.eval_env:EvalEcho-v0"
REQUIRED = ["env_id", "split", "n_tasks", "k", "seed", "policy", "success", "success_ci95", "pass_at_k",
            "mean_at_k", "reward", "tool_call_rate", "calls_per_episode", "turns", "errors", "drift", "task_ids",
            "per_task_success", "wall_s"]


# -- statistics ---------------------------------------------------------------------------------------------------


def test_wilson_matches_hand_computed_values():
    # 8/10, z = 1.96: centre (0.8 + 1.9208/10) / 1.38416, half 1.96 * sqrt(0.016 + 0.009604) / 1.38416
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.490162, abs=1e-5) and hi == pytest.approx(0.943318, abs=1e-5)
    lo, hi = wilson_interval(0, 20)  # 0 successes: lower bound 0, upper z^2 / (n + z^2)
    assert lo == 0.0 and hi == pytest.approx(3.8416 / 23.8416, abs=1e-6)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(20 / 23.8416, abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than k wrong samples: always passes
    assert pass_at_k(20, 4, 5) == pytest.approx(1 - math.comb(16, 5) / math.comb(20, 5))
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_paired_difference_ci_is_the_paired_t_interval():
    before, after = [0, 0, 1, 1, 0], [1, 1, 1, 1, 0]
    ci = paired_difference_ci(before, after)
    # d = [1, 1, 0, 0, 0]: mean 0.4, sd sqrt(0.3), t(0.975, 4) = 2.776445
    half = 2.776445 * math.sqrt(0.3) / math.sqrt(5)
    assert ci["n"] == 5 and ci["mean"] == pytest.approx(0.4)
    assert ci["lo"] == pytest.approx(0.4 - half, abs=1e-5) and ci["hi"] == pytest.approx(0.4 + half, abs=1e-5)
    # large paired gain: the interval excludes 0; no change: a zero-width interval at 0
    big = paired_difference_ci([0] * 70 + [1] * 30, [1] * 95 + [0] * 5)
    assert big["lo"] > 0.5 and big["hi"] < 0.8
    flat = paired_difference_ci([1, 0, 1], [1, 0, 1])
    assert flat == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3}
    with pytest.raises(ValueError):
        paired_difference_ci([1, 0], [1])


# -- task selection -----------------------------------------------------------------------------------------------


def _ids(rows: Sequence[dict]) -> list[str]:
    return [r["id"] for r in rows]


def test_select_tasks_finite_split():
    rows = select_tasks(ECHO, tasks="all", split="test")
    assert _ids(rows) == [f"test-{i}" for i in range(eval_env.N_TASKS)]
    five = select_tasks(ECHO, tasks=5, seed=3, split="test")
    assert len(set(_ids(five))) == 5 and set(_ids(five)) <= set(_ids(rows))
    assert _ids(select_tasks(ECHO, tasks="5", seed=3, split="test")) == _ids(five)  # reproducible
    assert _ids(select_tasks(ECHO, tasks=5, seed=4, split="test")) != _ids(five)
    assert _ids(select_tasks(ECHO, tasks=eval_env.N_TASKS, seed=1, split="train")) != _ids(rows)  # other split
    with pytest.raises(TaskSelectionError, match="has 12 tasks"):
        select_tasks(ECHO, tasks=13, split="test")


def test_select_tasks_infinite_split():
    with pytest.raises(TaskSelectionError, match=r"infinite split.*'all' is undefined"):
        select_tasks("toolgym/Calculator-v0", tasks="all", split="test")
    a = select_tasks("toolgym/Calculator-v0", tasks=30, seed=7, split="test")
    assert len(set(_ids(a))) == 30 and all(r["split"] == "test" for r in a)
    assert _ids(select_tasks("toolgym/Calculator-v0", tasks=30, seed=7, split="test")) == _ids(a)


def test_select_tasks_file(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps({"id": f"x{i}", "prompt": "Echo w1.", "answer": "w1"}) + "\n" for i in range(3)))
    assert _ids(select_tasks(ECHO, tasks=str(f))) == ["x0", "x1", "x2"]
    f.write_text(f.read_text() + json.dumps({"id": "x1", "prompt": "p", "answer": "a"}) + "\n")
    with pytest.raises(TaskFileError, match="'x1' appears twice"):
        select_tasks(ECHO, tasks=f)
    with pytest.raises(TaskFileError, match="cannot read task file"):
        select_tasks(ECHO, tasks=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:2"):
        select_tasks(ECHO, tasks=bad)


# -- evaluate -----------------------------------------------------------------------------------------------------


def test_evaluate_runs_each_task_once_times_k(tmp_path):
    out = tmp_path / "ev.jsonl"
    rep = evaluate(ECHO, "oracle", 7, k=3, seed=5, split="test", num_envs=4, out=out)
    assert rep.n_tasks == 7 and rep.episodes == 21 and len(rep.trajectories) == 21
    assert len(set(rep.task_ids)) == 7 and rep.task_ids == _ids(select_tasks(ECHO, tasks=7, seed=5, split="test"))
    # the k samples of a task are adjacent and are that task
    assert [t.task["id"] for t in rep.trajectories] == [i for i in rep.task_ids for _ in range(3)]
    assert rep.success == 1.0 and rep.pass_at_k == 1.0 and rep.mean_at_k == 1.0 and rep.tool_call_rate == 1.0
    assert rep.per_task_success == [1.0] * 7 and rep.errors == {} and rep.drift == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 21
    assert sorted((r["eval"]["task_id"], r["eval"]["sample"]) for r in rows) == sorted(
        (i, s) for i in rep.task_ids for s in range(3))
    d = rep.to_dict()
    assert set(REQUIRED) <= set(d) and json.loads(json.dumps(d)) == d


class _FailingAfter:
    """Answers like the oracle for ``n`` policy calls, then raises (a crash mid-run)."""

    concurrent = True

    def __init__(self, n: int) -> None:
        self.inner, self.n, self.calls = oracle_policy(), n, 0

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.calls += 1
        if self.calls > self.n:
            raise RuntimeError("policy crashed")
        return await self.inner.agenerate(requests)


def test_streaming_keeps_finished_episodes_and_never_empties_early(tmp_path):
    out = tmp_path / "ev.jsonl"
    out.write_text("OLD RESULTS\n")
    # crash before any episode finished: the old file is untouched, no temp file is left behind
    with pytest.raises(RuntimeError, match="policy crashed"):
        evaluate(ECHO, _FailingAfter(1), "all", split="test", num_envs=4, out=out)
    assert out.read_text() == "OLD RESULTS\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ev.jsonl"]
    # crash after the first wave (4 episodes x 2 turns = 2 calls): exactly the finished episodes are in the file
    with pytest.raises(RuntimeError, match="policy crashed"):
        evaluate(ECHO, _FailingAfter(2), "all", split="test", num_envs=4, out=out)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["reward"] == 1.0 for r in rows)
    assert sorted(r["eval"]["task_index"] for r in rows) == [0, 1, 2, 3]


def _as_from_a_terminal() -> None:
    # a command typed in a terminal has SIGINT at its default disposition; a test run started in the background
    # (`nohup`, `&`) would otherwise hand its ignored SIGINT down, and the CLI rightly keeps ignoring it there
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "toolgym.cli", *args], cwd=REPO, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_terminal)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_cli_run_keeps_finished_episodes(tmp_path, sig):
    out = tmp_path / "ev.jsonl"
    out.write_text("OLD\n")
    proc = _cli("eval", ECHO, "--policy", "oracle", "--split", "test", "--num-envs", "1", "--out", str(out),
                "--no-progress", env={"EVAL_ECHO_DELAY_S": "0.25"})
    deadline = time.monotonic() + 300  # the interpreter start-up is slow on a loaded machine
    lines: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        text = out.read_text()
        assert text == "OLD\n" or not text.startswith("OLD")  # replaced whole, never emptied first
        lines = [x for x in text.splitlines() if x.strip()]
        if text != "OLD\n" and len(lines) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None and len(lines) >= 2, "the run ended or stalled before two episodes were written"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert 2 <= len(rows) < eval_env.N_TASKS  # every finished episode, and the run really was cut short
    assert [r["eval"]["task_index"] for r in rows] == list(range(len(rows)))  # num_envs=1: in order
    assert all(r["reward"] == 1.0 and r["completion_ids"] for r in rows)


# -- the command --------------------------------------------------------------------------------------------------


def test_cli_json_is_the_last_stdout_line(capsys, tmp_path):
    rc = main(["eval", ECHO, "--policy", "oracle", "--split", "test", "--tasks", "5", "-k", "2", "--json",
               "--no-progress", "--out", str(tmp_path / "o.jsonl")])
    cap = capsys.readouterr()
    assert rc == 0
    lines = cap.out.strip().splitlines()
    assert len(lines) == 1  # JSON alone on stdout; the table went to stderr
    d = json.loads(lines[-1])
    assert set(REQUIRED) <= set(d)
    assert d["n_tasks"] == 5 and d["k"] == 2 and d["success"] == 1.0 and d["pass_at_k"] == 1.0
    assert d["success_ci95"][1] == 1.0 and d["success_ci95"][0] == pytest.approx(wilson_interval(5, 5)[0])
    assert "pass@2" in cap.err and "Wilson" in cap.err


def test_cli_table_without_json(capsys):
    rc = main(["eval", ECHO, "--policy", "oracle", "--split", "train", "--tasks", "3", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "success" in out and "100.0%" in out and "split train" in out
    assert "pass@" not in out  # only for k > 1


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["eval", "toolgym/Calculator-v0", "--policy", "tiny", "--split", "test"], 2, "infinite split"),
        (["eval", "EvalNoOracle-v0", "--policy", "oracle"], 2, "has no oracle"),
        (["eval", ECHO, "--policy", "oracle", "--tasks", "some"], 2, "--tasks must be"),
        (["eval", ECHO, "--policy", "oracle", "--tasks", "nope.jsonl"], 3, "cannot read task file"),
        (["eval", ECHO, "--policy", "oracle", "--split", "bogus"], 2, "split must be"),
        (["eval", ECHO, "--policy", "oracle", "--env-kwarg", "no_such_arg=1"], 2, "no_such_arg"),
        (["eval", "Nope-v9", "--policy", "oracle"], 2, "unknown env"),
        (["eval", "no_such_module_x:Env-v0", "--policy", "oracle"], 2, "cannot import module"),
        (["eval", ECHO, "--policy", "oracle", "-k", "0"], 2, "-k must be"),
        (["eval", ECHO, "--policy", "/no/such/model"], 3, "no such model path"),
        (["eval", ECHO, "--policy", "http://127.0.0.1:9"], 4, "cannot reach"),
    ],
)
def test_cli_exit_codes(capsys, argv, code, needle):
    assert main([*argv, "--no-progress"]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("toolgym: error: ")
    assert "Error:" not in err[0]  # no raw exception-class prefixes


def test_cli_out_not_writable(capsys, tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    assert main(["eval", ECHO, "--policy", "oracle", "--out", str(tmp_path / "dir.jsonl")]) == 3
    assert "cannot write" in capsys.readouterr().err


def test_list_shows_user_envs(capsys):
    assert main(["list", "--import", "tests.eval_env", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["EvalEcho-v0"]["builtin"] is False and rows["toolgym/Calculator-v0"]["builtin"] is True
    assert rows["EvalEcho-v0"]["entry_point"] == "tests.eval_env:EvalEchoEnv"


def test_cli_eval_with_a_model_policy(capsys):
    """The model path end to end (tiny random model, greedy): the counts and keys hold whatever it writes."""
    rc = main(["eval", "calculator", "--policy", "tiny", "--split", "test", "--tasks", "3", "--max-new-tokens",
               "4", "--json", "--no-progress"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["n_tasks"] == 3 and d["episodes"] == 3 and d["policy"] == "tiny" and len(set(d["task_ids"])) == 3
    assert d["generated_tokens"] > 0 and 0.0 <= d["success_ci95"][0] <= d["success"] <= d["success_ci95"][1]


@pytest.mark.timeout(120)
def test_progress_shows_turns_calls_and_tokens_while_running():
    """The bar's live counters move before any episode has finished (one slow wave of 4 episodes)."""
    proc = _cli("eval", ECHO, "--policy", "oracle", "--split", "test", "--tasks", "4", "--num-envs", "4",
                env={"EVAL_ECHO_DELAY_S": "0.6"})
    _, err = proc.communicate(timeout=100)
    assert proc.returncode == 0, err
    frames = err.replace("\r", "\n").splitlines()
    early = [f for f in frames if " 0/4 " in f and "turns=" in f]  # 0 episodes done, turns already counted
    assert early and "calls=" in early[-1] and "tok_s=" in early[-1]


# -- reproducibility across --num-envs ----------------------------------------------------------------------------


def test_per_episode_seeded_sampling_does_not_depend_on_the_batch():
    import torch

    from toolgym.models import load_tokenizer, tiny_random_model
    from toolgym.rollout import EpisodeState, TransformersPolicy

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=1)
    pol = TransformersPolicy(model, tok, temperature=0.8, top_k=50, seed=5)
    prompts = [tok.encode(f"<|im_start|>user\nquestion {i}<|im_end|>\n<|im_start|>assistant\n") for i in range(4)]

    def req(i: int, turn: int = 0) -> GenerationRequest:
        return GenerationRequest(prompts[i], 10, (), EpisodeState(index=i, task={}, turn=turn))

    alone = [pol.generate([req(i)])[0] for i in range(4)]
    together = pol.generate([req(i) for i in range(4)])
    other = pol.generate([req(3), req(1)])
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.token_ids for g in other] == [alone[3].token_ids, alone[1].token_ids]
    assert pol.generate([req(0, turn=1)])[0].token_ids != alone[0].token_ids  # another turn: another stream
    reseeded = TransformersPolicy(model, tok, temperature=0.8, top_k=50, seed=6).generate([req(0)])[0]
    assert reseeded.token_ids != alone[0].token_ids
    # the logprobs are those of the distribution sampled from (temperature, then top-k), recomputed here
    g = alone[0]
    ids = torch.tensor([prompts[0] + g.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompts[0]) - 1 : -1].float() / 0.8
    kth = torch.topk(logits, 50, dim=-1).values[:, -1:]
    logp = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
    want = logp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


@pytest.mark.timeout(300)
def test_sampled_eval_is_the_same_at_any_num_envs(tmp_path):
    runs = {}
    for n in ("1", "3"):
        out = tmp_path / f"n{n}.jsonl"
        assert main(["eval", "calculator", "--policy", "tiny", "--split", "test", "--tasks", "3", "-k", "2",
                     "--temperature", "1.0", "--max-new-tokens", "8", "--num-envs", n, "--seed", "4",
                     "--out", str(out), "--no-progress"]) == 0
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        runs[n] = {(r["eval"]["task_id"], r["eval"]["sample"]): r["completion_ids"] for r in rows}
    assert len(runs["1"]) == 6 and runs["1"] == runs["3"]
    assert runs["1"][(next(iter(runs["1"]))[0], 0)] != runs["1"][(next(iter(runs["1"]))[0], 1)]  # k samples differ
