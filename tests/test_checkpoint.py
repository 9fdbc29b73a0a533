"""A checkpoint carries what its evaluation needs (toolgym/checkpoint.py), and greedy evaluation does not depend on
how the episodes are batched (the demo evaluates 100 episodes at once, ``toolgym eval`` 8 at a time)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

import toolgym  # noqa: F401
from toolgym.checkpoint import RUN_SETTINGS_FILE, RunSettingsError, read_run_settings, write_run_settings
from toolgym.cli import ExitCode, main
from toolgym.evaluation.tasks import draw_tasks
from toolgym.models import load_model, load_tokenizer, tiny_random_model
from toolgym.rollout import RolloutDriver, TransformersPolicy

ENV = "toolgym/Calculator-v0"
SYSTEM = "Use the calculator. Reply <answer>N</answer>."  # not the env's default system prompt


def _greedy_eval(model, tok, n, *, num_envs, max_batch_size=None, env_kwargs=None, seed=500, turn_tokens=12,
                 autocast=None):
    tasks = draw_tasks(ENV, n, seed=seed, split="test", env_kwargs={"tokenizer": tok})
    venv = gym.make_vec(ENV, num_envs=num_envs, autoreset_mode=AutoresetMode.DISABLED, split="test",
                        tokenizer=tok, **(env_kwargs or {}))
    try:
        policy = TransformersPolicy(model, tok, do_sample=False, return_logprobs=False, max_batch_size=max_batch_size,
                                    autocast=autocast)
        return RolloutDriver(venv, policy, max_turn_tokens=turn_tokens).run(tasks, seeds=seed, progress=False)
    finally:
        venv.close()


@pytest.mark.parametrize("autocast", [None, "bfloat16"])  # make demo evaluates under bfloat16 autocast
def test_greedy_evaluation_does_not_depend_on_the_micro_batch_size(autocast):
    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=3)
    # prompts of different lengths, so rows are left-padded by different amounts in every batch composition
    runs = {mbs: _greedy_eval(model, tok, 12, num_envs=12, max_batch_size=mbs, autocast=autocast)
            for mbs in (None, 5, 1)}
    runs["8 envs"] = _greedy_eval(model, tok, 12, num_envs=8, autocast=autocast)  # `toolgym eval --num-envs 8`
    lengths = {len(t.prompt_ids) for t in runs[None]}
    assert len(lengths) > 1, lengths  # padding really happens
    ref = [(list(t.prompt_ids), list(t.completion_ids)) for t in runs[None]]
    assert any(len(c) for _, c in ref)
    for key, trajs in runs.items():
        assert [(list(t.prompt_ids), list(t.completion_ids)) for t in trajs] == ref, key


def test_an_autocast_policy_generates_in_that_dtype_and_keeps_the_weights_float32():
    import torch

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=3)
    seen: list = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    try:
        _greedy_eval(model, tok, 2, num_envs=2, autocast="bfloat16")  # generation runs in a worker thread
        assert seen and set(seen) == {torch.bfloat16}
        seen.clear()
        _greedy_eval(model, tok, 2, num_envs=2)
        assert seen and set(seen) == {torch.float32}
    finally:
        hook.remove()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="autocast"):
        TransformersPolicy(model, tok, autocast="int8")


def test_run_settings_round_trip_and_bad_files(tmp_path: Path):
    assert read_run_settings(tmp_path) is None
    write_run_settings(tmp_path, env_id=ENV, env_kwargs={"system_prompt": SYSTEM}, max_turn_tokens=24,
                       eval={"split": "test", "tasks": 3, "seed": 7})
    s = read_run_settings(tmp_path)
    assert s is not None and s["env_kwargs"] == {"system_prompt": SYSTEM} and s["max_turn_tokens"] == 24
    with pytest.raises(TypeError):
        write_run_settings(tmp_path / "x", env_kwargs={"tokenizer": object()})
    (tmp_path / RUN_SETTINGS_FILE).write_text("{not json")
    with pytest.raises(RunSettingsError):
        read_run_settings(tmp_path)
    assert s["autocast"] is None  # not recorded: the model's own dtype
    write_run_settings(tmp_path, env_kwargs={}, autocast="bfloat16")
    assert read_run_settings(tmp_path)["autocast"] == "bfloat16" and "device" not in read_run_settings(tmp_path)
    write_run_settings(tmp_path, env_kwargs={}, device="model on cuda:0, float32")  # where the run's model ran
    assert read_run_settings(tmp_path)["device"] == "model on cuda:0, float32"
    with pytest.raises(ValueError, match="autocast"):
        write_run_settings(tmp_path / "y", autocast="int8")
    assert not (tmp_path / "y").exists()
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({"env_kwargs": {}, "max_turn_tokens": 0}))
    with pytest.raises(RunSettingsError):
        read_run_settings(tmp_path)
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({"env_kwargs": {}, "autocast": "int4"}))
    with pytest.raises(RunSettingsError, match="autocast"):
        read_run_settings(tmp_path)
    assert main(["eval", ENV, "--policy", str(tmp_path), "--tasks", "1"]) == ExitCode.INPUT


def test_toolgym_eval_of_a_checkpoint_reproduces_the_run_that_saved_it(tmp_path: Path, capsys):
    pytest.importorskip("trl", reason="trainers.demo.compact_prompt is part of the [train] extra")
    from toolgym.checkpoint import save_checkpoint
    from trainers.demo.compact_prompt import compact_tools_template

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=4)
    pk = {"system_prompt": SYSTEM, "chat_template": compact_tools_template()}
    ckpt = save_checkpoint(model, tok, tmp_path / "ckpt", chat_template=pk["chat_template"],
                           run_settings={"env_id": ENV, "env_kwargs": pk, "max_turn_tokens": 12,
                                         "eval": {"split": "test", "tasks": 6, "seed": 500}, "autocast": "bfloat16"})
    # the producing run's own evaluation: all 6 episodes in one batch, its prompt, 12 tokens per turn, generated
    # under bfloat16 autocast (as make demo evaluates)
    model2, tok2 = load_model(ckpt)
    run = _greedy_eval(model2, tok2, 6, num_envs=6, env_kwargs=pk, autocast="bfloat16")
    assert SYSTEM in tok.decode(run[0].prompt_ids)
    out = tmp_path / "eval.jsonl"
    rc = main(["eval", ENV, "--policy", str(ckpt), "--split", "test", "--tasks", "6", "--seed", "500",
               "--num-envs", "4", "--no-progress", "--out", str(out)])
    assert rc == 0
    assert "generation in bfloat16 autocast" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rows.sort(key=lambda r: r["eval"]["task_index"])
    assert [r["prompt_ids"] for r in rows] == [list(t.prompt_ids) for t in run]  # the checkpoint's own prompt
    assert [r["completion_ids"] for r in rows] == [list(t.completion_ids) for t in run]
    assert all(len(r["completion_ids"]) <= 12 * 4 for r in rows)
    # without the settings file the same checkpoint renders the env's default prompt: the file is what carries it
    (ckpt / RUN_SETTINGS_FILE).unlink()
    out2 = tmp_path / "eval2.jsonl"
    assert main(["eval", ENV, "--policy", str(ckpt), "--split", "test", "--tasks", "6", "--seed", "500",
                 "--no-progress", "--out", str(out2), "--max-new-tokens", "12"]) == 0
    first = json.loads(out2.read_text().splitlines()[0])
    assert first["prompt_ids"] != rows[first["eval"]["task_index"]]["prompt_ids"]


def test_toolgym_eval_takes_the_checkpoints_recorded_batching_unless_given(tmp_path: Path, monkeypatch):
    """``toolgym_run.json``'s ``eval.num_envs`` / ``eval.batch_size`` are ``toolgym eval``'s defaults (bfloat16
    greedy near-ties can flip with the batch's composition, so the run's figure needs the run's batching); an
    explicit ``--num-envs`` wins, and a checkpoint without them keeps 8 envs, one ``generate()`` per batch."""
    import toolgym.envs.registration as registration
    from toolgym.rollout import TransformersPolicy

    tok = load_tokenizer()
    ckpt = tmp_path / "ckpt"
    tiny_random_model(tok, seed=4).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    seen: dict[str, list[int]] = {"num_envs": [], "rows": []}
    real_make, real_batch = registration.make_vector_env, TransformersPolicy._generate_batch

    def make(env_id, num_envs, *a, **kw):
        seen["num_envs"].append(num_envs)
        return real_make(env_id, num_envs, *a, **kw)

    def batch(self, requests):
        seen["rows"].append(len(requests))
        return real_batch(self, requests)

    monkeypatch.setattr(registration, "make_vector_env", make)
    monkeypatch.setattr(TransformersPolicy, "_generate_batch", batch)
    base = ["eval", ENV, "--policy", str(ckpt), "--split", "test", "--tasks", "5", "--seed", "500", "--no-progress"]

    write_run_settings(ckpt, env_kwargs={}, max_turn_tokens=6, eval={"tasks": 5, "num_envs": 5, "batch_size": 2})
    assert main(base) == 0
    assert seen["num_envs"] == [5] and max(seen["rows"]) == 2 and seen["rows"][:3] == [2, 2, 1]

    seen["num_envs"].clear(), seen["rows"].clear()
    assert main([*base, "--num-envs", "4"]) == 0  # explicit: 4 envs, each turn's requests in one call
    assert seen["num_envs"] == [4] and max(seen["rows"]) > 2

    write_run_settings(ckpt, env_kwargs={}, max_turn_tokens=6, eval={"tasks": 5})
    seen["num_envs"].clear(), seen["rows"].clear()
    assert main(base) == 0
    assert seen["num_envs"] == [8] and max(seen["rows"]) == 5


def test_save_checkpoint_writes_only_on_the_main_process_and_keeps_the_shared_tokenizer(tmp_path: Path) -> None:
    """The one save path: on the main process the weights, the tokenizer (with the given template, the caller's
    tokenizer untouched) and the run settings; on another rank of a multi-process run, nothing (a bare model has
    no collective save to take part in)."""
    from toolgym.checkpoint import save_checkpoint

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=2)
    own = tok.chat_template
    assert save_checkpoint(model, tok, tmp_path / "rank1", chat_template="{{ 'x' }}", main_process=False,
                           run_settings={"env_id": ENV}) == tmp_path / "rank1"
    assert not (tmp_path / "rank1").exists()
    ckpt = save_checkpoint(model, tok, tmp_path / "rank0", chat_template="{{ 'x' }}",
                           run_settings={"env_id": ENV, "max_turn_tokens": 7})
    assert tok.chat_template == own
    model2, tok2 = load_model(ckpt)
    assert tok2.chat_template == "{{ 'x' }}" and read_run_settings(ckpt)["max_turn_tokens"] == 7
    import torch

    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True))
