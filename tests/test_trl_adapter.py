"""The TRL 1.16 GRPO adapter (trainers/grpo/rollout_adapter.py) with a real GRPOTrainer on CPU.

Most tests use a tiny randomly initialised model over the embedded tokenizer. A random model never writes a tool
call, so the tests that need multi-turn episodes wrap ``trainer._generate_single_turn``: the real generation runs,
then on the first turn some rows are replaced by the oracle's tool-call tokens (fault injection of "a model that
calls the tool"); everything else (env, tools, TRL's loss masking and logging) is real.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl", reason="the adapter needs the [train] extra (trl)")

import trl

from tests.procs import torchrun_two_ranks
from toolgym.envs.calculator import generate_task
from trainers import TRL_VERSION
from trainers.grpo.rollout_adapter import ToolgymRollout, env_reward, make_dataset, prompt_key

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parent.parent
ENV = "toolgym/Calculator-v0"


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == TRL_VERSION


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(7)
    return [generate_task(rng) for _ in range(4)]


def _trainer(tasks, *, num_generations=4, batch=8, max_completion_length=96, max_turn_tokens=16, steps=1, out=None):
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from toolgym.models import load_tokenizer, tiny_random_model

    torch.manual_seed(0)
    tok = load_tokenizer()
    rollout = ToolgymRollout(ENV, tasks, max_turn_tokens=max_turn_tokens)
    args = GRPOConfig(
        output_dir=str(out or "/tmp/toolgym-test-grpo"), per_device_train_batch_size=batch,
        num_generations=num_generations, max_completion_length=max_completion_length, max_steps=steps,
        logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=tiny_random_model(tok), processing_class=tok, reward_funcs=[env_reward], args=args,
                          train_dataset=make_dataset(tasks), rollout_func=rollout)
    return trainer, rollout


def _inject_tool_calls(trainer, rows_calling, tok_env_fn):
    """Wrap the real ``_generate_single_turn``: on the first call, rows in ``rows_calling`` write the oracle's
    calculator call instead of their sampled tokens. Returns the list of recorded call sizes."""
    real = trainer._generate_single_turn
    sizes: list[int] = []

    def wrapped(prompt_ids, images, mm, n, **kw):
        ids, lps = real(prompt_ids, images, mm, n, **kw)
        if not sizes:
            ids = [tok_env_fn(i) if i in rows_calling else row for i, row in enumerate(ids)]
        sizes.append(len(prompt_ids))
        return ids, lps

    trainer._generate_single_turn = wrapped
    return sizes


def _oracle_call_ids(rollout, prompts):
    def fn(i: int) -> list[int]:
        env = rollout.venv.envs[i].unwrapped
        task = rollout.task_for(prompts[i])
        text = env.format.parser.format_calls([("calculator", {"expression": task["expression"]})])
        return [int(x) for x in env.encode_action(text)]

    return fn


def test_generate_single_turn_contract(tasks, tmp_path):
    """The private TRL method the adapter relies on: ``(prompt_ids, None, {}, 1) -> (ids, logprobs)``."""
    trainer, _ = _trainer(tasks, out=tmp_path)
    ids, lps = trainer._generate_single_turn([[1, 9690, 198], [1, 4093]], None, {}, 1)
    assert len(ids) == 2 and all(isinstance(x, int) for row in ids for x in row)
    assert all(1 <= len(row) <= trainer.max_completion_length for row in ids)
    assert lps is None  # transformers backend: no sampling logprobs (vLLM gives one flat float per token)


def test_rollout_func_rows_masks_and_trained_token_count(tasks, tmp_path):
    trainer, rollout = _trainer(tasks, out=tmp_path)
    seen: list[list] = []
    real_call = rollout.__call__

    class Spy:
        def __call__(self, prompts, tr):
            seen.append(list(prompts))
            return real_call(prompts, tr)

    trainer.rollout_func = Spy()
    batch = [{"prompt": t["id"], "task_id": t["id"]} for t in tasks[:2] for _ in range(4)]
    prompts = [b["prompt"] for b in batch]
    rollout._env(trainer, len(prompts))
    sizes = _inject_tool_calls(trainer, {0, 2, 4, 6}, _oracle_call_ids(rollout, prompts))
    out = trainer._generate_and_score_completions(batch)

    assert seen == [prompts]  # TRL hands over the repeated prompts as they are
    trajs = rollout.last_trajectories
    assert len(trajs) == len(prompts) and [t.task["id"] for t in trajs] == prompts
    assert sizes == [8, 4]  # turn 1: all 8 episodes; turn 2: the 4 that called the tool (lock-step)
    called = [t.num_tool_calls for t in trajs]
    assert called == [1, 0, 1, 0, 1, 0, 1, 0]
    # env tokens (tool responses) are excluded from the loss: TRL's token count == sum of env masks
    env_tokens = sum(len(t.loss_mask) - sum(t.loss_mask) for t in trajs)
    assert env_tokens > 4 * 10
    model_tokens = sum(sum(t.loss_mask) for t in trajs)
    assert int(out["num_items_in_batch"]) == model_tokens
    assert int((out["completion_mask"] * out["tool_mask"]).sum()) == model_tokens
    assert int(out["completion_mask"].sum()) == sum(len(t.completion_ids) for t in trajs)
    for t in trajs:
        assert len(t.completion_ids) <= trainer.max_completion_length


def test_rollout_func_output_shape(tasks, tmp_path):
    trainer, rollout = _trainer(tasks, out=tmp_path)
    prompts = [tasks[0]["id"]] * 4 + [tasks[1]["prompt"]] * 2 + [[{"role": "user", "content": tasks[2]["id"]}]] * 2
    out = rollout(prompts, trainer)
    n = len(prompts)
    for key in ("prompt_ids", "completion_ids", "env_mask", "env_reward", "env_errors", "task_id"):
        assert len(out[key]) == n, key
    assert out["task_id"] == [tasks[0]["id"]] * 4 + [tasks[1]["id"]] * 2 + [tasks[2]["id"]] * 2
    assert out["logprobs"] is None  # transformers backend
    for c, m in zip(out["completion_ids"], out["env_mask"], strict=True):
        assert len(c) == len(m) and set(m) <= {0, 1}
    with pytest.raises(KeyError, match="matches no task"):
        rollout(["no-such-task"], trainer)


def test_env_reward_passes_through_and_logs_metrics():
    logged: dict[str, float] = {}
    r = env_reward(prompts=["a", "b"], completions=["x", "y"], env_reward=[1.0, 0.25], env_outcome=[1.0, 0.0],
                   env_tool_calls=[2, 0], env_turns=[3, 1], env_truncated=[False, True],
                   env_errors=[["timeout", "timeout"], []], log_metric=logged.__setitem__)
    assert r == [1.0, 0.25]
    assert logged["toolgym/tool_call_rate"] == 0.5 and logged["toolgym/success"] == 0.5
    assert logged["toolgym/errors/timeout"] == 1.0 and logged["toolgym/errors/parse_error"] == 0.0
    assert "toolgym/groups_with_success" not in logged  # no task ids: no groups
    # two groups of 3 samples: one task solved once, one never
    env_reward(env_reward=[1.0, 0, 0, 0, 0, 0], env_outcome=[0.0, 1.0, 0.0, 0.0, 0.0, 0.0],
               task_id=["t1"] * 3 + ["t2"] * 3, log_metric=logged.__setitem__)
    assert logged["toolgym/groups_with_success"] == 0.5 and logged["toolgym/success"] == 1 / 6
    with pytest.raises(ValueError, match="env_reward"):
        env_reward(prompts=["a"], completions=["x"])
    # each reward component is averaged over the episodes whose reward has it (BFCL: irrelevance has no parse term)
    env_reward(env_reward=[1.3, 0.2, 1.0], env_reward_components=[
        {"bfcl_valid": 1.0, "bfcl_parse": 1.0}, {"bfcl_valid": 0.0, "bfcl_parse": 1.0}, {"bfcl_valid": 1.0}],
        log_metric=logged.__setitem__)
    assert logged["toolgym/reward_components/bfcl_valid"] == pytest.approx(2 / 3)
    assert logged["toolgym/reward_components/bfcl_parse"] == 1.0


def test_prompt_key_forms():
    assert prompt_key("calc-1") == "calc-1"
    assert prompt_key([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]) == "q"
    with pytest.raises(TypeError):
        prompt_key(3)


def test_grpo_train_step_logs_env_rewards(tasks, tmp_path):
    trainer, rollout = _trainer(tasks[:2], out=tmp_path)
    batch_prompts: list = []
    orig = rollout.__call__

    def call(prompts, tr):
        batch_prompts.append(list(prompts))
        rollout._env(tr, len(prompts))
        if not hasattr(tr, "_wrapped"):
            tr._wrapped = _inject_tool_calls(tr, {0, 1, 2, 3}, _oracle_call_ids(rollout, prompts))
        return orig(prompts, tr)

    trainer.rollout_func = call
    trainer.train()
    logs = trainer.state.log_history[0]
    assert "rewards/env_reward/mean" in logs and "toolgym/tool_call_rate" in logs
    # num_generations copies are adjacent
    p = batch_prompts[0]
    assert len(p) == 8 and all(p[k] == p[k - k % 4] for k in range(8))
    assert logs["toolgym/tool_call_rate"] == pytest.approx(sum(t.num_tool_calls > 0 for t in rollout.last_trajectories) / 8)
    assert logs["rewards/env_reward/mean"] == pytest.approx(np.mean([t.reward for t in rollout.last_trajectories]))


_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import numpy as np, torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from trl import GRPOConfig, GRPOTrainer
    from toolgym.models import load_tokenizer, tiny_random_model
    from toolgym.envs.calculator import generate_task
    from trainers.grpo.rollout_adapter import ToolgymRollout, env_reward, make_dataset

    rank = int(os.environ["RANK"])
    rng = np.random.default_rng(3)
    tasks = [generate_task(rng) for _ in range(4)]
    tok = load_tokenizer()
    rollout = ToolgymRollout("toolgym/Calculator-v0", tasks, max_turn_tokens=12)
    args = GRPOConfig(output_dir={out!r}, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=96, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", seed=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=tiny_random_model(tok), processing_class=tok, reward_funcs=[env_reward],
                          args=args, train_dataset=make_dataset(tasks), rollout_func=rollout)
    real = trainer._generate_single_turn
    sizes = []

    def wrapped(prompt_ids, images, mm, n, **kw):
        ids, lps = real(prompt_ids, images, mm, n, **kw)
        if rank == 0 and not sizes:  # only rank 0's episodes call the tool: they need a second turn
            envs = rollout.venv.envs
            def call(i):
                env = envs[i].unwrapped
                text = env.format.parser.format_calls([("calculator", {{"expression": env.task["expression"]}})])
                return [int(x) for x in env.encode_action(text)]
            ids = [call(i) for i in range(len(ids))]
        sizes.append(len(prompt_ids))
        return ids, lps

    trainer._generate_single_turn = wrapped
    trainer.train()
    turns = [len(t.turns) for t in rollout.last_trajectories]
    with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as fh:
        json.dump({{"sizes": sizes, "turns": turns, "world": trainer.accelerator.num_processes}}, fh)
    rollout.close()
    trainer.accelerator.end_training()  # as the entry points do: destroys the process group before the rank exits
    """
)


@pytest.mark.slow
def test_two_processes_make_matching_generate_calls(tmp_path):
    """torchrun (gloo, 2 CPU processes): rank 0's episodes take 2 turns, rank 1's take 1; both ranks must make
    the same number of generate calls with the same number of prompts (vLLM server / ZeRO-3 are collective)."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(root=str(ROOT), out=str(tmp_path)))
    r0, r1 = torchrun_two_ranks(script, tmp_path, timeout=420)
    assert r0["world"] == r1["world"] == 2
    assert max(r0["turns"]) == 2 and max(r1["turns"]) == 1  # different episode lengths per rank ...
    assert r0["sizes"] == r1["sizes"] == [4, 4]  # ... same calls: rank 1 padded its second call


@pytest.mark.slow
def test_one_grpo_step_with_the_embedded_model(tmp_path):
    """One real GRPO step with SmolLM2-135M through the adapter (transformers generation on CPU)."""
    import torch

    from toolgym.models import load_model
    from trainers.grpo import Config, build_trainer

    torch.manual_seed(0)
    model, tok = load_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "layers.0.self_attn.q_proj" in n}
    rng = np.random.default_rng(11)
    tasks = [generate_task(rng) for _ in range(2)]
    trl = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
               max_completion_length=64, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
               save_strategy="no", seed=0, learning_rate=1e-5, disable_tqdm=True)
    trainer, rollout = build_trainer(Config(max_turn_tokens=32, trl=trl), model=model, tokenizer=tok, tasks=tasks)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert "rewards/env_reward/mean" in logs and "toolgym/tool_call_rate" in logs
    assert len(rollout.last_trajectories) == 4
    assert all(sum(t.loss_mask) >= 1 for t in rollout.last_trajectories)
    changed = any(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)
    assert changed or logs.get("frac_reward_zero_std") == 1.0  # no gradient signal only if all rewards tie
