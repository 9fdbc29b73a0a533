"""benchmarks/rollout.py workload A compares like with like: TRL's native ``tools=`` loop and the env see the same
prompt tokens, the env's tool-call text is a call TRL parses and dispatches, and a policy that does not call the
tool is refused instead of measured (the first version of the benchmark timed TRL native without a single tool
call: its tool had another name, so TRL's prompt differed and no call could have reached it)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("toolgym_bench_rollout", ROOT / "benchmarks" / "rollout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def setup(bench):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from toolgym.models import embedded_cache_dir, load_tokenizer

    load_tokenizer()
    tok = AutoTokenizer.from_pretrained(str(embedded_cache_dir() / "tokenizer"))  # private copy: TRL mutates it
    tok.chat_template = qwen2_5_chat_template
    tasks, vector = bench.make_env_fn(tok)
    return tok, tasks, vector


def env_prompts(vector, tasks):
    venv = vector(len(tasks))
    try:
        venv.reset(options={"tasks": tasks})
        return [list(venv.envs[i].unwrapped.trajectory.prompt_ids) for i in range(len(tasks))], venv.envs[0].unwrapped
    finally:
        venv.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_trl_and_env_prompts_are_token_identical(bench, setup, kind):
    tok, tasks, vector = setup
    fn = bench.TRL_TOOLS[kind]
    assert fn.__name__ == "wait"  # TRL dispatches by __name__: it must be the name the model writes
    ours, _ = env_prompts(vector, tasks[:3])
    for k, ids in enumerate(ours):
        trl = tok.apply_chat_template(
            conversation=[[{"role": "user", "content": bench.PROMPT.format(k=k)}]], tools=[fn],
            add_generation_prompt=True, tokenize=True, return_dict=True,
        )["input_ids"][0]
        assert list(trl) == ids, (tok.decode(list(trl)), tok.decode(ids))


def test_env_tool_call_text_is_a_call_trl_parses(bench, setup):
    from trl.chat_template_utils import add_response_schema, parse_response

    tok, tasks, vector = setup
    [prompt], env = env_prompts(vector, tasks[:1])
    add_response_schema(tok)  # what GRPOTrainer(tools=...) does for the qwen2_5 template
    ids = [int(i) for i in env.encode_action(env.format.parser.format_calls([("wait", {})]), end_turn=True)]
    parsed = parse_response(tok, ids, prefix=prompt, tools=[bench.wait])
    assert parsed.get("tool_calls") == [{"type": "function", "function": {"name": "wait", "arguments": {}}}]
    answer = parse_response(tok, [int(i) for i in env.encode_action("<answer>done</answer>")], prefix=prompt)
    assert "tool_calls" not in answer and answer["content"] == "<answer>done</answer>"


@pytest.mark.timeout(240)
def test_a_policy_that_never_calls_the_tool_is_refused(bench, setup):
    from toolgym.models import tiny_random_model

    tok, tasks, vector = setup
    model = tiny_random_model(tok, seed=0)  # untrained: writes noise, never a tool call
    with pytest.raises(bench.Invalid, match=r"executed the tool in 0% of episodes"):
        bench.workload_a(model, tok, vector, tasks, 2, 0.0)
