"""Gymnasium's env checker on every registered toolgym env (random token actions must never crash)."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import toolgym
from toolgym.envs.registration import ENVS


@pytest.fixture(scope="module")
def mcp_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcp")
    cfg = {"mcpServers": {"tg": {"command": sys.executable, "args": ["-m", "toolgym.serve.mcp", "--tools", "calculator"]}}}
    (d / "servers.json").write_text(json.dumps(cfg))
    rows = [{"id": f"m{i}", "prompt": f"What is {i} * 12345?", "answer": str(i * 12345)} for i in range(4)]
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def kwargs_for(env_id: str, mcp_files) -> dict:
    if env_id == "toolgym/MCP-v0":
        return {"mcp_config": str(mcp_files / "servers.json"), "tasks": str(mcp_files / "tasks.jsonl")}
    return {}


def test_every_registered_env_is_checked():
    assert set(ENVS) == {"toolgym/Calculator-v0", "toolgym/CalculatorChain-v0", "toolgym/Search-v0", "toolgym/SQL-v0",
                         "toolgym/Python-v0", "toolgym/Chart-v0", "toolgym/MCP-v0", "toolgym/BFCL-v0"}
    assert toolgym.__version__


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_check_env(env_id, mcp_files):
    env = gym.make(env_id, **kwargs_for(env_id, mcp_files))
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=5)
        assert obs.ndim == 1 and len(obs) > 0 and info["task"]["id"]
        # any token ids, including out-of-vocabulary ones, are handled without a crash
        u = env.unwrapped
        bad = [0, len(u.tokenizer) + 10, -1, u.format.eot_id]
        obs, r, te, tr, info = env.step(bad)
        assert isinstance(r, float) and obs.ndim == 1
        assert (len(obs) == 0) == (te or tr)  # the env's tokens to append, or none when the episode ended
        assert all(0 <= int(i) < len(u.tokenizer) for i in obs)  # the env writes only real token ids
    finally:
        env.close()
