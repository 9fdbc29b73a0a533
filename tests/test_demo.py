"""Pieces of ``make demo`` (trainers/demo/__init__.py, trainers/demo/compact_prompt.py): statistics, the compact prompt, checkpoints."""

from __future__ import annotations

import gymnasium as gym
import pytest

pytest.importorskip("trl", reason="the demo needs the [train] extra")

import toolgym  # noqa: F401
from toolgym.checkpoint import save_checkpoint
from toolgym.evaluation import oracle_policy
from toolgym.models import load_model, load_tokenizer, tiny_random_model
from trainers.demo.compact_prompt import COMPACT_SYSTEM_PROMPT, compact_tools_template
from trainers.sft import collect


def test_compact_prompt_is_short_and_the_oracle_still_solves_it():
    tok = load_tokenizer()
    kw = {"chat_template": compact_tools_template(), "system_prompt": COMPACT_SYSTEM_PROMPT}
    full = gym.make("toolgym/Calculator-v0", tokenizer=tok)
    compact = gym.make("toolgym/Calculator-v0", tokenizer=tok, **kw)
    n_full, n_compact = len(full.reset(seed=3)[0]), len(compact.reset(seed=3)[0])
    assert n_compact < 0.4 * n_full, (n_compact, n_full)
    text = tok.decode(compact.reset(seed=3)[0])
    assert "- calculator(expression): " in text and "<tool_call>" in text
    kept, alltr = collect("toolgym/Calculator-v0", oracle_policy(), [None] * 4, num_envs=2,
                          env_kwargs={"tokenizer": tok, **kw})
    assert len(kept) == len(alltr) == 4


def test_save_checkpoint_loads_with_load_model_and_keeps_the_template(tmp_path):
    import torch

    tok = load_tokenizer()
    model = tiny_random_model(tok, seed=1)
    path = save_checkpoint(model, tok, tmp_path / "ckpt", chat_template=compact_tools_template())
    assert tok.chat_template != compact_tools_template()  # the shared tokenizer is not mutated
    model2, tok2 = load_model(path)
    assert tok2.chat_template == compact_tools_template()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, model2(ids).logits)
    # an env built on the checkpoint's tokenizer renders the compact tool list by itself
    env = gym.make("toolgym/Calculator-v0", tokenizer=tok2, system_prompt=COMPACT_SYSTEM_PROMPT)
    assert "- calculator(expression): " in tok2.decode(env.reset(seed=0)[0])
