"""The verl adapter on CPU, with verl 0.9.1 installed (``.venv-verl``, built by ``make verl-env``).

Collected by the main suite too, where verl is absent: then every test here is skipped with the reason, and
``tests/test_verl_adapter.py`` runs this file in ``.venv-verl`` instead.

Real parts: verl's ``AgentLoopWorker`` (driven without Ray: ``generate_sequences`` awaited in-process), verl's
config (hydra compose of ``ppo_trainer``), verl's GAE and ``compute_advantage``, a real toolgym env
(``toolgym/Calculator-v0`` with a per-turn reward) and the embedded tokenizer. The one stand-in: the generation
server (no vLLM on CPU), which returns token ids like verl's ``TokenOutput``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("verl", reason="verl is not installed here (make verl-env builds .venv-verl; "
                    "tests/test_verl_adapter.py runs these tests there)")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from toolgym.envs.calculator import CalculatorEnv  # noqa: E402
from toolgym.envs.vector import ToolVectorEnv  # noqa: E402
from toolgym.rewards import Combine, NumericMatch, ToolCallFormat  # noqa: E402
from toolgym.rollout import RolloutDriver, ScriptedPolicy  # noqa: E402
from trainers.credit import token_advantages, turn_advantages  # noqa: E402
from trainers.verl import advantage, agent_loop  # noqa: E402
from trainers.verl.launch import make_rows  # noqa: E402
from trainers.verl.rewards import turn_ends, turn_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV_ID = "toolgym-test/CalculatorTurns-v0"
PROMPT_LEN, RESPONSE_LEN = 1024, 256
CALL_OK, NO_CALL = 0.25, -0.5  # per-turn rewards: a call that ran; a turn without a call


class CalculatorTurns(CalculatorEnv):
    """Calculator-v0 with a per-turn reward as well: +0.25 for a call that ran, -0.5 for a turn without one."""

    def __init__(self, **kwargs):
        kwargs.setdefault("reward", Combine({NumericMatch("answer", exact=True): 1.0, ToolCallFormat(ok=CALL_OK, no_call=NO_CALL): 1.0}))
        super().__init__(**kwargs)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=CalculatorTurns,
                 vector_entry_point=lambda num_envs=1, **kw: ToolVectorEnv(CalculatorTurns, num_envs=num_envs, **kw))


class StandInServer:
    """verl's ``server_manager`` stand-in: ``generate`` returns a ``TokenOutput`` of token ids.

    ``mode="oracle"``: reads the context and writes what solves Calculator (a calculator call, then the number the
    tool returned in answer tags), each turn ending with the end-of-turn id. ``mode="babble"``: ``max_tokens``
    copies of one token and no end-of-turn (every turn is cut by its budget). Every sampled token gets logprob
    -0.25 - 0.001 * position, so the alignment of ``response_logprobs`` can be checked.
    """

    def __init__(self, env, mode: str = "oracle") -> None:
        self.env = env.unwrapped
        self.mode = mode
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append({"request_id": request_id, "sampling_params": dict(sampling_params), "n": len(prompt_ids)})
        await asyncio.sleep(0)
        env = self.env
        if self.mode == "babble":
            ids = [int(env.format.encode("a")[0])] * int(sampling_params["max_tokens"])
        else:
            text = env.tokenizer.decode(prompt_ids)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
            if results:
                ids = env.encode_action(f"<answer>{results[-1].strip()}</answer>").tolist()
            else:
                expr = re.findall(r"What is (.+?)\?", text)[-1]
                ids = env.encode_action(env.format.parser.format_calls([("calculator", {"expression": expr})])).tolist()
        lps = [-0.25 - 0.001 * i for i in range(len(ids))]
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": 7, "min_global_steps": 7, "max_global_steps": 7})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from toolgym.models import load_tokenizer, tiny_random_model

    d = tmp_path_factory.mktemp("tiny")
    tok = load_tokenizer(None)
    tiny_random_model(tok).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def verl_config(model_dir):
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.prompt_length={PROMPT_LEN}",
            f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
            f"data.max_prompt_length={PROMPT_LEN}",
            f"data.max_response_length={RESPONSE_LEN}",
        ])


def _batch(rows) -> DataProto:
    """The non-tensor batch verl's RLHFDataset + trainer hand the agent loop workers for ``rows``."""
    col = lambda key: np.array([r[key] for r in rows], dtype=object)  # noqa: E731
    return DataProto(non_tensor_batch={
        "raw_prompt": col("prompt"), "extra_info": col("extra_info"), "agent_name": col("agent_name"),
        "data_source": col("data_source"), "index": np.array([r["extra_info"]["index"] for r in rows]),
    }, meta_info={"global_steps": 7})


async def _reference(worker_tokenizer, seeds, turn_tokens=RESPONSE_LEN):
    """The same episodes played by toolgym's own driver with the env's oracle (what the loop must reproduce)."""
    venv = gym.make_vec(ENV_ID, num_envs=len(seeds), tokenizer=worker_tokenizer)
    policy = ScriptedPolicy(lambda state: state.env.oracle(state))
    try:
        return await RolloutDriver(venv, policy, max_turn_tokens=turn_tokens,
                                   max_completion_tokens=RESPONSE_LEN).arun([None] * len(seeds), seeds=list(seeds))
    finally:
        venv.close()


@pytest.mark.slow
async def test_worker_plays_toolgym_episodes_with_rewards_on_each_turns_last_policy_token(verl_config):
    """verl's AgentLoopWorker (no Ray) + the toolgym loop: the batch holds the env's exact tokens and mask, the
    sampled logprobs on policy tokens, and rm_scores with each turn's reward on its last policy token."""
    seeds = [3, 4]
    rows = make_rows(ENV_ID, [None, None], seeds=seeds)
    plain = AgentLoopWorker(verl_config, llm_client=None)
    ref_env = gym.make(ENV_ID, tokenizer=plain.tokenizer)
    server = StandInServer(ref_env)
    worker = agent_loop.ToolgymAgentLoopWorker(verl_config, llm_client=server)
    plain.llm_client = server
    out = await worker.generate_sequences(_batch(rows))
    out_plain = await plain.generate_sequences(_batch(rows))
    refs = await _reference(plain.tokenizer, seeds)

    b = out.batch
    assert b["responses"].shape == (2, RESPONSE_LEN) and b["prompts"].shape == (2, PROMPT_LEN)
    for i, traj in enumerate(refs):
        n, p = len(traj.completion_ids), len(traj.prompt_ids)
        assert len(traj.turns) == 2 and traj.outcome_reward == 1.0  # a call, then the right answer
        assert b["prompts"][i, -p:].tolist() == list(traj.prompt_ids)
        assert b["responses"][i, :n].tolist() == list(traj.completion_ids)
        assert b["response_mask"][i, :n].tolist() == list(traj.loss_mask)
        assert b["response_mask"][i, n:].sum() == 0
        # rewards: 0.25 (call ran) on turn 0's last policy token, -0.5 + 1.0 on turn 1's; 0 everywhere else
        want = torch.zeros(RESPONSE_LEN)
        ends = [max(j for j in range(t.action_start, t.action_end) if traj.loss_mask[j]) for t in traj.turns]
        want[ends[0]], want[ends[1]] = CALL_OK, NO_CALL + 1.0
        assert torch.allclose(b["rm_scores"][i], want)
        assert all(traj.loss_mask[j] == 1 for j in ends)
        assert b["rm_scores"][i].sum().item() == pytest.approx(traj.reward)
        # logprobs: the stand-in's, in order, on mask-1 tokens; 0 on env tokens
        lp = b["rollout_log_probs"][i, :n]
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        assert torch.all(lp[~mask] == 0) and torch.all(lp[mask] < 0)
        # verl's own worker: the same tokens, but one scalar on the last response token
        assert torch.equal(out_plain.batch["responses"][i], b["responses"][i])
        assert out_plain.batch["rm_scores"][i, n - 1].item() == pytest.approx(traj.reward)
        assert out_plain.batch["rm_scores"][i].count_nonzero() == 1
    assert "toolgym_token_rewards" not in out.non_tensor_batch
    assert list(out.non_tensor_batch["toolgym_outcome"]) == [1.0, 1.0]
    # generation: one request id per episode, the env's stop ids and the turn budget passed to the server
    ids = {c["request_id"] for c in server.calls}
    assert len(server.calls) == 8 and len(ids) == 4  # 2 workers x 2 episodes x 2 turns
    eot = ref_env.unwrapped.format.eot_id
    assert all(eot in c["sampling_params"]["stop_token_ids"] and c["sampling_params"]["max_tokens"] >= 1
               for c in server.calls)
    ref_env.close()


@pytest.mark.slow
async def test_cut_turn_reward_lands_on_a_policy_token_and_reaches_gae(verl_config):
    """A turn cut by its budget ends with a mask-0 end-of-turn token the env wrote. verl's default puts the episode
    reward there and its GAE drops it (returns all 0); the toolgym loop puts it on the last sampled token."""
    rows = make_rows(ENV_ID, [None], seeds=[5], max_turn_tokens=8)
    plain = AgentLoopWorker(verl_config, llm_client=None)
    ref_env = gym.make(ENV_ID, tokenizer=plain.tokenizer)
    plain.llm_client = StandInServer(ref_env, mode="babble")
    worker = agent_loop.ToolgymAgentLoopWorker(verl_config, llm_client=StandInServer(ref_env, mode="babble"))
    ours, theirs = await worker.generate_sequences(_batch(rows)), await plain.generate_sequences(_batch(rows))
    mask = ours.batch["response_mask"][0]
    assert mask[:9].tolist() == [1] * 8 + [0]  # 8 sampled tokens, then the env's end-of-turn (mask 0)
    assert ours.batch["responses"][0, 8].item() == ref_env.unwrapped.format.eot_id
    assert ours.batch["rm_scores"][0, 7].item() == pytest.approx(NO_CALL)  # last policy token
    assert theirs.batch["rm_scores"][0, 8].item() == pytest.approx(NO_CALL)  # verl's default: the mask-0 token
    values = torch.zeros(1, RESPONSE_LEN)
    for out, expect_zero in ((theirs, True), (ours, False)):
        _, returns = core_algos.compute_gae_advantage_return(
            out.batch["rm_scores"], values, out.batch["response_mask"], gamma=1.0, lam=1.0)
        if expect_zero:
            assert torch.all(returns[0, :8] == 0)
        else:
            assert torch.allclose(returns[0, :8], torch.full((8,), NO_CALL))
    ref_env.close()


def test_v1_output_as_dict_carries_per_token_rm_scores():
    """verl's default (v1) worker stores ``output.as_dict()``: ours writes the per-token rewards as rm_scores where
    verl's base class writes the scalar on the last token."""
    kw = dict(prompt_ids=[1, 2], response_ids=[5, 6, 7, 8, 9], response_mask=[1, 1, 0, 1, 0], reward_score=1.5,
              metrics={})
    mine = agent_loop.ToolgymAgentLoopOutput(**kw, token_rewards=[0.0, 0.5, 0.0, 1.0, 0.0]).as_dict()
    base = AgentLoopOutput(**kw).as_dict()
    assert mine["rm_scores"].tolist() == [0.0, 0.5, 0.0, 1.0, 0.0]
    assert base["rm_scores"].tolist() == [0.0, 0.0, 0.0, 0.0, 1.5]
    assert "token_rewards" not in mine and torch.equal(mine["response_mask"], base["response_mask"])


def _gae_by_hand(rewards, values, mask, gamma, lam):
    """GAE over the policy tokens only (an env token neither bootstraps nor accumulates), then returns = A + V."""
    pos = [t for t in range(len(mask)) if mask[t]]
    adv = {}
    nxt_v, last = 0.0, 0.0
    for t in reversed(pos):
        delta = rewards[t] + gamma * nxt_v - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
        nxt_v = values[t]
    return {t: adv[t] + values[t] for t in pos}


def test_gae_with_per_turn_rewards_matches_a_hand_computation():
    """verl's own GAE on rewards placed per turn: returns on each turn's tokens are the discounted rewards to go."""
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0]  # three turns, env tokens between them, then padding
    rewards = [0.0, 0.0, 0.3, 0, 0, 0.0, -0.2, 0, 0, 0, 0.0, 1.0, 0, 0]
    rng = np.random.default_rng(0)
    values = rng.normal(size=len(mask)).round(3).tolist()
    for gamma, lam in ((1.0, 1.0), (0.9, 0.8)):
        _, returns = core_algos.compute_gae_advantage_return(
            torch.tensor([rewards]), torch.tensor([values]), torch.tensor([mask]), gamma=gamma, lam=lam)
        for t, want in _gae_by_hand(rewards, values, mask, gamma, lam).items():
            assert returns[0, t].item() == pytest.approx(want, abs=1e-5)
    # gamma = lam = 1, zero values: every token of turn k returns the sum of the rewards of turns k..end
    _, returns = core_algos.compute_gae_advantage_return(
        torch.tensor([rewards]), torch.zeros(1, len(mask)), torch.tensor([mask]), gamma=1.0, lam=1.0)
    assert returns[0, [0, 1, 2, 5, 6, 10, 11]].tolist() == pytest.approx([1.1] * 3 + [0.8] * 2 + [1.0] * 2)


def test_registered_estimator_is_ours_and_matches_trainers_credit():
    """verl's registry returns the toolgym estimator, and verl's compute_advantage gives trainers.credit's numbers
    (groups with different turn counts; env tokens 0)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import compute_advantage

    assert core_algos.get_adv_estimator_fn("toolgym_turn_return") is advantage.compute_toolgym_turn_return_advantage
    masks = [[1, 1, 0, 1, 0, 1, 1], [1, 0, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0, 1]]
    turn_r = [[0.2, 0.0, 1.0], [0.5, 0.0], [1.0], [0.0, 0.2, 0.2, 0.0]]
    groups = ["a", "a", "b", "b"]
    rewards = np.zeros((4, 7), dtype=np.float32)
    for i, m in enumerate(masks):
        for (_, end), r in zip(turn_runs(m), turn_r[i], strict=True):
            rewards[i, end - 1] = r
    data = DataProto.from_dict(tensors={"token_level_rewards": torch.tensor(rewards),
                                        "response_mask": torch.tensor(masks)},
                               non_tensors={"uid": np.array(groups, dtype=object)})
    for gamma, norm in ((1.0, True), (0.8, False)):
        cfg = OmegaConf.create({"gamma": gamma, "norm_adv_by_std_in_grpo": norm})
        out = compute_advantage(data, adv_estimator="toolgym_turn_return", gamma=gamma, config=cfg)
        want = turn_advantages(turn_r, [0.0] * 4, groups, estimator="turn_return", gamma=gamma,
                               scale="group" if norm else "none")
        for i, m in enumerate(masks):
            tok = token_advantages(want[i], turn_runs(m), m)
            assert out.batch["advantages"][i].tolist() == pytest.approx(tok.tolist(), abs=1e-6)
            assert torch.all(out.batch["advantages"][i][torch.tensor(m) == 0] == 0)
        assert out.batch["advantages"].abs().sum() > 0


def test_import_verl_registers_toolgym_through_the_entry_point():
    """A fresh process: ``import verl`` alone (its plugin discovery) registers the loop and the estimator."""
    code = ("import verl; from verl.experimental.agent_loop import agent_loop as a; "
            "from verl.trainer.ppo import core_algos as c; import json; "
            "print(json.dumps(['toolgym' in vars(a)['_agent_loop_registry'], "
            "'toolgym_turn_return' in c.ADV_ESTIMATOR_REGISTRY]))")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "PYTHONPATH")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         cwd="/")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [True, True]


def test_legacy_trainer_override_selects_the_toolgym_manager_and_worker(model_dir):
    """The documented override for verl's legacy trainer composes, validates and resolves to our manager, whose
    Ray workers are ToolgymAgentLoopWorker (what ray_trainer.py / main_ppo.py do with it, without starting Ray)."""
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_class_from_fqn

    key = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=vllm",
            f"+{key}=trainers.verl.agent_loop.ToolgymAgentLoopManager"])
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).agent.agent_loop_manager_class.endswith("Manager")
    cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class"), "AgentLoopManager")
    assert cls is agent_loop.ToolgymAgentLoopManager
    manager = cls(cfg, llm_client=None)
    assert issubclass(manager.agent_loop_workers_class.__ray_metadata__.modified_class,
                      agent_loop.ToolgymAgentLoopWorker)


def test_launch_overrides_compose_with_verls_config(model_dir):
    """Every key the launch helper prints exists in verl 0.9.1's ppo_trainer config, and main_ppo's own
    validate_config accepts the result (batch sizes, critic on/off)."""
    from hydra import compose, initialize_config_module
    from verl.trainer.main_ppo import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from trainers.verl.launch import ppo_overrides

    for estimator in ("gae", "toolgym_turn_return"):
        ov = ppo_overrides(train_files="t.parquet", val_files="v.parquet", model_path=str(model_dir),
                           estimator=estimator, nnodes=2, gpus_per_node=8, rollout_n=4)
        with initialize_config_module("verl.trainer.config", version_base=None):
            cfg = compose("ppo_trainer", overrides=ov)
        assert cfg.algorithm.adv_estimator == estimator and cfg.trainer.nnodes == 2
        assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "toolgym"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Disabled critic as algorithm.adv_estimator != gae": intended
            use_critic = need_critic(cfg)
        assert use_critic == (estimator == "gae")
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=use_critic)
        if use_critic:
            assert cfg.critic.model.path == str(model_dir)


@pytest.mark.slow
async def test_parquet_rows_from_the_launch_helper_reach_the_loop_through_verls_dataset(verl_config, tmp_path):
    """make_rows -> write_parquet -> verl's RLHFDataset + collate_fn -> the worker: the row's task (given, or drawn
    from the row's seed) is the episode played."""
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from trainers.verl.launch import write_parquet

    task = {"id": "given-1", "prompt": "What is 12345 + 67890?", "expression": "12345 + 67890", "answer": "80235"}
    path = write_parquet(make_rows(ENV_ID, [task, None], seeds=[0, 9], env_kwargs={"split": "test"}),
                         tmp_path / "train.parquet")
    worker = agent_loop.ToolgymAgentLoopWorker(verl_config, llm_client=None)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=worker.tokenizer, config=verl_config.data)
    batch = DataProto.from_single_dict(collate_fn([ds[0], ds[1]]))
    ref_env = gym.make(ENV_ID, tokenizer=worker.tokenizer, split="test")
    worker.llm_client = StandInServer(ref_env)
    out = await worker.generate_sequences(batch)
    ids = list(out.non_tensor_batch["toolgym_task_id"])
    assert ids[0] == "given-1" and ids[1].startswith("calc-")
    text = worker.tokenizer.decode(out.batch["responses"][0][out.batch["response_mask"][0].bool()])
    assert "12345 + 67890" in text and "<answer>80235</answer>" in text
    assert list(out.non_tensor_batch["toolgym_outcome"]) == [1.0, 1.0]
    _, env_info = ref_env.reset(seed=9)  # the seeded row's task is the test split's task of seed 9
    assert env_info["task"]["id"] == ids[1]
    ref_env.close()


@pytest.mark.slow
async def test_v1_worker_stores_per_token_rm_scores(verl_config, monkeypatch):
    """verl's default (v1) trainer path: AgentLoopWorkerTQ._run_prompt runs the loop and writes each output to
    TransferQueue; the rm_scores it stores (what the trainer reads as token_level_scores) are the per-token ones.
    TransferQueue's service is replaced by a recorder of what verl writes (like the generation stand-in)."""
    tq_mod = pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq", reason="TransferQueue is not installed")
    puts, statuses = [], []

    async def kv_batch_put(keys, partition_id, fields=None, tags=None, **kw):
        puts.append((list(keys), fields, list(tags or [])))

    async def kv_put(key, partition_id, tag=None, **kw):
        statuses.append((key, (tag or {}).get("status")))

    monkeypatch.setattr(tq_mod.tq, "async_kv_batch_put", kv_batch_put)
    monkeypatch.setattr(tq_mod.tq, "async_kv_put", kv_put)
    cls = tq_mod.AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class behind verl's @ray.remote
    worker = cls.__new__(cls)
    AgentLoopWorker.__init__(worker, verl_config, llm_client=None)  # TQ's own __init__ only adds tq.init()
    ref_env = gym.make(ENV_ID, tokenizer=worker.tokenizer)
    worker.llm_client = StandInServer(ref_env)
    row = make_rows(ENV_ID, [None], seeds=[3])[0]
    prompt = {"raw_prompt": row["prompt"], "extra_info": row["extra_info"], "index": 0, "uid": "u1",
              "agent_name": "toolgym", "data_source": row["data_source"], "global_steps": 7}
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    await worker._run_prompt(prompt, params, trajectory={"step": 7, "sample_index": 0, "rollout_n": 0,
                                                          "validate": False})
    assert statuses[-1] == ("u1", "finished") and len(puts) == 1
    (keys, fields, tags), = puts
    assert keys == ["u1_0_0"] and tags[0]["min_global_steps"] == 7
    mask = fields["response_mask"][0].tolist()
    scores = fields["rm_scores"][0].tolist()
    ref = (await _reference(worker.tokenizer, [3]))[0]
    assert fields["responses"][0].tolist() == list(ref.completion_ids) and mask == list(ref.loss_mask)
    ends = turn_ends(mask)
    assert [scores[j] for j in ends] == pytest.approx([CALL_OK, NO_CALL + 1.0])
    assert sum(abs(x) for j, x in enumerate(scores) if j not in ends) == 0
    ref_env.close()
