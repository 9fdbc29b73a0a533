"""What the GPU path needs that a CPU run does not, each checked with a real TRL ``GRPOTrainer`` (tiny model, CPU) or the
shipped files: stop ids reach generation, an empty completion never reaches TRL, the reference model / colocate
model directory exists for models without a hub path, every shipped tracker is installable, the IS mode is stated
and its ratios surface as ``toolgym/*`` metrics, no loopback hosts in multi-node settings, no unverified DP claim.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("trl", reason="the adapter needs the [train] extra (trl)")

from toolgym.envs.calculator import generate_task
from toolgym.rollout import GenerationRequest
from trainers.grpo.importance_sampling_metrics import ISRatioMetrics, is_metrics
from trainers.grpo.preflight import (
    TRACKER_EXTRAS,
    check_report_to,
    check_server_hosts,
    ensure_model_dir,
    needs_model_dir,
)
from trainers.grpo.rollout_adapter import ToolgymRollout, TRLPolicy, env_reward, guard_empty_completions, make_dataset

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "trainers" / "configs").glob("*.yaml"))
ENV = "toolgym/Calculator-v0"


@pytest.fixture(scope="module")
def tasks() -> list[dict]:
    rng = np.random.default_rng(3)
    return [generate_task(rng) for _ in range(2)]


def _args(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                max_completion_length=48, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                save_strategy="no", seed=0, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


def _build(tmp_path, tasks, model=None, **kw):
    import torch

    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo import Config, build_trainer

    torch.manual_seed(0)
    tok = load_tokenizer()
    model = model if model is not None else tiny_random_model(tok)
    return build_trainer(Config(max_turn_tokens=16, trl=_args(tmp_path, **kw)), model=model, tokenizer=tok,
                         tasks=tasks)


# --- stop ids ----------------------------------------------------------------------------------------------------


def test_stop_ids_end_generation_on_the_transformers_path(tmp_path, tasks):
    """A turn ends on the env's stop ids even when they are not EOS: with every id a stop id, each generation is one
    token long (without passing them, the random model runs to the 16-token budget)."""
    trainer, _ = _build(tmp_path, tasks)
    vocab = len(trainer.processing_class)
    eos_before = list(trainer.eos_token_ids)
    policy = TRLPolicy(trainer)
    prompt = list(trainer.processing_class("What is 2+3?")["input_ids"])
    gens = policy.generate([GenerationRequest(prompt, 16, tuple(range(vocab)))] * 2)
    assert [len(g.token_ids) for g in gens] == [1, 1]
    assert all(g.finish_reason == "stop" for g in gens)
    assert trainer.eos_token_ids == eos_before  # restored after the call
    gens = TRLPolicy(trainer).generate([GenerationRequest(prompt, 16, ())])
    assert len(gens[0].token_ids) > 1  # no stop ids: it does not stop after one token


@pytest.mark.parametrize("bf16", [False, True])
def test_generation_runs_under_the_trainers_autocast(tmp_path, tasks, bf16):
    """With ``bf16=True`` the adapter generates under one bfloat16 autocast context (weights cast once per call, not
    once per decoding step); the weights stay float32. Without it, generation is float32."""
    import torch

    trainer, _ = _build(tmp_path, tasks, bf16=bf16)
    seen: list = []
    model = trainer.model
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    try:
        prompt = list(trainer.processing_class("What is 2+3?")["input_ids"])
        gens = TRLPolicy(trainer).generate([GenerationRequest(prompt, 4, ())] * 2)
    finally:
        hook.remove()
    assert len(gens) == 2 and seen
    assert set(seen) == {torch.bfloat16 if bf16 else torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_grpo_run_hands_the_model_back_with_its_own_forward(tmp_path, tasks):
    """TRL's fused LM head and Accelerate's mixed-precision wrapper patch ``forward`` onto the model instance while
    training; an in-process caller (the demo evaluates and saves the same object) gets the model's own forward."""
    import torch

    from toolgym.models import load_tokenizer, tiny_random_model
    from trainers.grpo import Config, run

    torch.manual_seed(0)
    tok = load_tokenizer()
    model = tiny_random_model(tok)
    trl = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=16,
               max_steps=1, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0,
               disable_tqdm=True, bf16=True)
    config = Config(max_turn_tokens=16, save_model=False, trl=trl)
    run(config, model=model, tokenizer=tok, tasks=tasks)
    assert "forward" not in vars(model)
    out = model(input_ids=torch.tensor([[1, 2, 3]]))
    assert out.logits.dtype == torch.float32 and out.logits.shape[1] == 3  # plain logits, no fused-head output


def test_stop_ids_reach_vllm_generation_kwargs(tmp_path, tasks):
    """vLLM path (server and colocate read ``vllm_generation.generation_kwargs``): the stop ids are set for the
    call and the trainer's own kwargs are restored after it."""
    from trainers.grpo.generation import _turn_budget

    trainer, _ = _build(tmp_path, tasks)

    class VG:  # the attributes of trl.generation.vllm_generation.VLLMGeneration the adapter sets
        max_completion_length = 48
        generation_kwargs = {"seed": 1}

    trainer.vllm_generation = VG()
    with _turn_budget(trainer, 8, [151336, 7]):
        assert trainer.vllm_generation.generation_kwargs == {"seed": 1, "stop_token_ids": [151336, 7]}
        assert trainer.vllm_generation.max_completion_length == 8
    assert trainer.vllm_generation.generation_kwargs == {"seed": 1}
    assert trainer.vllm_generation.max_completion_length == 48


# --- empty completions -------------------------------------------------------------------------------------------


def test_guard_gives_empty_rows_one_masked_token():
    rows = {"prompt_ids": [[5] * 10, [6] * 3], "completion_ids": [[], [1, 2]], "logprobs": [[], [-0.1, -0.2]],
            "env_mask": [[], [1, 1]]}
    empty = guard_empty_completions(rows, 2, context=8)
    assert empty == [True, False]
    assert rows["completion_ids"] == [[2], [1, 2]] and rows["env_mask"] == [[0], [1, 1]]
    assert rows["logprobs"] == [[0.0], [-0.1, -0.2]]
    assert len(rows["prompt_ids"][0]) == 7 and rows["prompt_ids"][1] == [6] * 3  # prompt + 1 token fit the context


def test_a_prompt_over_the_context_trains_without_crashing(tmp_path, tasks):
    """A model whose context (64) is shorter than the env's prompt (~290 tokens): every completion is clipped to
    nothing; the guard sends one masked token and TRL's step runs (it indexes ``ids[-1]``)."""
    from toolgym.models import load_tokenizer, tiny_random_model

    model = tiny_random_model(load_tokenizer(), max_position_embeddings=64)
    trainer, rollout = _build(tmp_path, tasks, model=model)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["toolgym/empty_completions"] == 1.0
    assert all(len(t.completion_ids) == 0 for t in rollout.last_trajectories)


# --- reference model / colocate model directory ------------------------------------------------------------------


def test_reference_model_for_a_model_without_a_hub_path(tmp_path, tasks):
    """beta > 0 with a model built in memory (``_name_or_path`` empty): TRL rebuilds the reference from the saved
    directory, with the policy's weights; the directory also has the tokenizer (colocated vLLM's ``LLM(model=)``)."""
    import torch
    from transformers import AutoTokenizer

    trainer, _ = _build(tmp_path, tasks, beta=0.1)
    ref, pol = trainer.ref_model, trainer.model
    assert ref is not None
    d = Path(pol.config._name_or_path)
    assert d == tmp_path / "base_model" and (d / "tokenizer_config.json").is_file()
    assert AutoTokenizer.from_pretrained(str(d)).eos_token == trainer.processing_class.eos_token
    for (n, p), (_, q) in zip(pol.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_model_dir_links_weights_only_directories(tmp_path):
    """A weights-only directory (the embedded model's cache): weights are linked, the tokenizer saved next to them;
    a complete directory is used as it is."""
    from transformers import AutoModelForCausalLM

    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    tiny_random_model(tok).save_pretrained(tmp_path / "weights_only")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "weights_only"))
    out = ensure_model_dir(model, tok, tmp_path / "run" / "base_model")
    assert out == (tmp_path / "run" / "base_model").resolve() and model.name_or_path == str(out)
    assert (out / "model.safetensors").is_symlink() and (out / "tokenizer_config.json").is_file()
    again = AutoModelForCausalLM.from_pretrained(str(out))
    assert again.config.num_hidden_layers == model.config.num_hidden_layers
    assert ensure_model_dir(again, tok, tmp_path / "elsewhere") == out  # complete: used as is
    assert not (tmp_path / "elsewhere").exists()


def test_a_cached_hub_model_resolves_to_its_snapshot_offline(tmp_path, monkeypatch):
    """An offline node: the policy was loaded from the Hugging Face cache under its hub id; TRL would call
    ``from_pretrained(hub id)`` (a download). The id resolves to the cached snapshot directory, nothing is written."""
    from huggingface_hub import constants

    from toolgym.models import load_tokenizer, tiny_random_model

    tok = load_tokenizer()
    repo = tmp_path / "hub" / "models--toolgym-test--tiny"
    snap = repo / "snapshots" / "0123abcd"
    model = tiny_random_model(tok)
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model.config._name_or_path = "toolgym-test/tiny"
    out = ensure_model_dir(model, tok, tmp_path / "run" / "base_model")
    assert out == snap and model.config._name_or_path == str(snap)
    assert not (tmp_path / "run").exists()


def test_needs_model_dir_only_when_trl_reloads(tmp_path):
    assert not needs_model_dir(_args(tmp_path, beta=0.0))
    assert needs_model_dir(_args(tmp_path, beta=0.04))


# --- trackers ------------------------------------------------------------------------------------------------------


def test_every_shipped_tracker_is_installable_by_an_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for path in [*CONFIGS, *sorted((ROOT / "examples").rglob("*.yaml"))]:
        raw = yaml.safe_load(path.read_text()) or {}
        report = raw.get("report_to") or []
        for name in [report] if isinstance(report, str) else report:
            assert name in TRACKER_EXTRAS, f"{path.name}: unknown tracker {name}"
            module, extra = TRACKER_EXTRAS[name]
            assert any(r.startswith(module) for r in extras[extra]), f"{path.name}: [{extra}] lacks {module}"


def test_a_missing_tracker_is_one_clear_error(monkeypatch):
    check_report_to(["tensorboard"])  # installed by [dev]
    check_report_to([])
    monkeypatch.setitem(TRACKER_EXTRAS, "wandb", ("toolgym_no_such_module", "wandb"))
    with pytest.raises(ImportError, match=r"pip install 'toolgym\[wandb\]'"):
        check_report_to(["wandb", "tensorboard"])


# --- importance sampling -------------------------------------------------------------------------------------------


def test_every_vllm_config_states_its_is_mode():
    for path in CONFIGS:
        raw = yaml.safe_load(path.read_text()) or {}
        if raw.get("use_vllm"):
            assert raw.get("vllm_importance_sampling_mode") in {"token_truncate", "token_mask", "sequence_truncate",
                                                                 "sequence_mask"}, path.name
            assert "vllm_importance_sampling_correction" in raw, path.name


def test_is_ratios_surface_as_toolgym_metrics():
    rec = {"sampling/importance_sampling_ratio/min": 0.0, "sampling/importance_sampling_ratio/mean": 0.8,
           "sampling/importance_sampling_ratio/max": 1.4, "sampling/sampling_logp_difference/max": 2.1, "loss": 0.1}
    out = is_metrics(rec, "sequence_mask")
    assert out["toolgym/is_ratio/min"] == 0.0 and out["toolgym/is_masked"] == 1.0
    assert out["toolgym/logp_diff/max"] == 2.1
    assert "toolgym/is_masked" not in is_metrics(rec, "token_truncate")
    assert is_metrics({"loss": 0.1}, "sequence_mask") == {}

    class State:
        log_history = [dict(rec)]

    cb, logs = ISRatioMetrics("sequence_mask"), dict(rec)
    cb.on_log(None, State, None, logs=logs)
    assert logs["toolgym/is_ratio/mean"] == 0.8 == State.log_history[-1]["toolgym/is_ratio/mean"]
    assert cb.warned


# --- multi-node and docs ---------------------------------------------------------------------------------------------


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def test_gpu_configs_have_no_loopback_hosts():
    """Hosts of GPU configs come from flags or the environment: no value may be a loopback address."""
    gpu = [p for p in CONFIGS if "cpu" not in p.name]
    assert gpu
    for path in gpu:
        for value in _strings(yaml.safe_load(path.read_text()) or {}):
            assert not re.search(r"127\.0\.0\.1|localhost|0\.0\.0\.0", value), f"{path.name}: {value}"


def test_multi_node_server_host_must_not_be_loopback(tmp_path):
    args = _args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_host="127.0.0.1", use_cpu=True)
    check_server_hosts(args, num_machines=1)
    with pytest.raises(ValueError, match="--vllm_server_host"):
        check_server_hosts(args, num_machines=2)
    args.vllm_server_host = "10.0.0.5"
    check_server_hosts(args, num_machines=2)


def test_num_machines_from_the_launcher_environment(monkeypatch):
    from trainers.grpo.preflight import num_machines

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert num_machines() == 1
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert num_machines() == 2


def test_docs_make_no_data_parallel_server_claim():
    """TRL 1.16's own help: `--data-parallel-size` above 1 errors for dense models (vLLM PR #30739). Not verified on
    hardware here, so the docs must not tell anyone to run it."""
    text = (ROOT / "docs" / "training.md").read_text()
    assert not re.search(r"--data-parallel-size\s+[2-9]", text)


def test_env_reward_logs_empty_completions():
    logged = {}
    env_reward(env_reward=[0.0, 1.0], env_empty=[True, False], log_metric=logged.__setitem__)
    assert logged["toolgym/empty_completions"] == 0.5


def test_rollout_rows_have_env_empty(tmp_path, tasks):
    trainer, rollout = _build(tmp_path, tasks)
    assert isinstance(rollout, ToolgymRollout)
    rows = rollout(make_dataset(tasks)["prompt"][:2], trainer)
    assert rows["env_empty"] == [False, False] and all(len(c) >= 1 for c in rows["completion_ids"])
