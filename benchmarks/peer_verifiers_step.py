"""The ``vector_step.py --scale`` workload on verifiers 0.3.1's legacy ``ToolEnv`` (a peer, side by side).

Run by ``python -m benchmarks.vector_step --scale --verifiers-python PYTHON`` with the interpreter of a separate venv that
has ``verifiers==0.3.1`` and ``tokenizers`` (never toolgym's venv: verifiers pins its own dependency versions)::

    python3 -m venv /tmp/peer-vf && /tmp/peer-vf/bin/pip install verifiers==0.3.1 tokenizers

One "vector step" of N episodes does, for every episode concurrently (``asyncio.gather``), the work toolgym's
``ToolVectorEnv.step`` does: decode the action's token ids, parse the hermes ``<tool_call>`` JSON, run the tool
through ``ToolEnv.env_response`` (every call waits 50 ms), and encode the observation (the ChatML tool turn plus
the next assistant header) with the same tokenizer. The tool runs inside ``MultiTurnEnv.get_prompt_messages``, the
env half of verifiers' own rollout loop (it concatenates the turn's messages and calls ``env_response``); the
loop's stop checks and the server-side ``/tokenize`` of the whole conversation that verifiers' token client does
are left out, so this is a floor for verifiers' cost. With ``--bridge-template`` the observation ids are made
the way verifiers' token client makes them (``OpenAIChatCompletionsTokenClient``'s TITO bridge: the chat template
rendered and tokenized for ``[dummy assistant] + tool messages`` and for ``[dummy assistant]``, the suffix kept),
here in-process with jinja2 and the Rust tokenizer instead of two HTTP ``/tokenize`` calls to vLLM. No schema validation,
no token budgets, no caps (verifiers has none of them in this path). The collector is left as a user would have
it. Prints one JSON line: per-step wall seconds, full (gen-2) collections inside timed steps, RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import time

TOOL_S = 0.05
CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


async def wait50(x: int) -> str:
    """Wait 50 ms and answer.

    Args:
        x: a number
    """
    await asyncio.sleep(TOOL_S)
    return f"done {x}"


def _rss_mb(field: str = "VmRSS:") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tokenizer-json", required=True)
    ap.add_argument("--bridge-template", default=None,
                    help="a chat template file: get the observation ids as verifiers' token client does (TITO bridge)")
    args = ap.parse_args()

    import verifiers.legacy as vf
    from datasets import Dataset
    from tokenizers import Tokenizer
    from verifiers.legacy.types import AssistantMessage, ToolCall, UserMessage

    rss0 = _rss_mb()
    tok = Tokenizer.from_file(args.tokenizer_json)
    env = vf.ToolEnv(tools=[wait50], max_turns=8, dataset=Dataset.from_list([{"question": "q", "answer": "a"}]))
    n = args.n
    bridge = None
    if args.bridge_template:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        jenv = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        jenv.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        with open(args.bridge_template) as f:
            bridge = jenv.from_string(f.read())
        oai_tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                       "parameters": t.parameters}} for t in env.tool_defs]
    actions = [
        tok.encode(f'<tool_call>\n{{"name": "wait50", "arguments": {{"x": {i}}}}}\n</tool_call><|im_end|>',
                   add_special_tokens=False).ids
        for i in range(n)
    ]

    async def one(i: int, messages: list, state: dict) -> list[int]:
        text = tok.decode(actions[i], skip_special_tokens=False)
        calls = [json.loads(m) for m in CALL_RE.findall(text)]
        msg = AssistantMessage(content="", tool_calls=[
            ToolCall(id=f"call_{k}", name=c["name"], arguments=json.dumps(c["arguments"])) for k, c in enumerate(calls)
        ])
        state["trajectory"].append({"prompt": messages, "completion": [msg]})
        prompt = await env.get_prompt_messages(state)  # the rollout loop's env half: concat + env_response
        replies = prompt[len(messages) + 1:]
        messages[:] = prompt
        assert replies and all(r.role == "tool" for r in replies), prompt
        if bridge is None:
            obs = "".join(f"<|im_start|>tool\n{r.content}<|im_end|>\n" for r in replies) + "<|im_start|>assistant\n"
            ids = tok.encode(obs, add_special_tokens=False).ids
        else:  # verifiers' TITO bridge: tokenize [dummy assistant] + env messages and [dummy assistant]; the suffix
            dummy = {"role": "assistant", "content": "", "tool_calls": [
                {"id": tc.id, "type": "function", "function": {"name": "f", "arguments": "{}"}} for tc in msg.tool_calls]}
            env_msgs = [{"role": "tool", "content": r.content, "tool_call_id": r.tool_call_id} for r in replies]
            full = tok.encode(bridge.render(messages=[dummy, *env_msgs], tools=oai_tools, add_generation_prompt=True),
                              add_special_tokens=False).ids
            base = tok.encode(bridge.render(messages=[dummy], tools=oai_tools, add_generation_prompt=False),
                              add_special_tokens=False).ids
            assert full[: len(base)] == base
            ids = full[len(base):]
        state.setdefault("ids", []).extend(ids)
        return ids

    gen2 = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 2:
            gen2[0] += 1

    async def steps() -> list[float]:
        times = []
        for r in range(args.steps + 1):  # the first step is a warm-up, not timed
            episodes = [([UserMessage(content=f"task number {i}")], {"id": i, "trajectory": []}) for i in range(n)]
            if r == 1:
                gc.callbacks.append(count)
            t0 = time.perf_counter()
            await asyncio.gather(*(one(i, m, s) for i, (m, s) in enumerate(episodes)))
            times.append(time.perf_counter() - t0)
        gc.callbacks.remove(count)
        return times

    times = asyncio.run(steps())
    print(json.dumps({"impl": "verifiers 0.3.1" + (" + bridge" if bridge else ""), "n": n, "step_s": times[1:], "gen2": gen2[0],
                      "rss_mb": _rss_mb() - rss0, "peak_rss_mb": _rss_mb("VmHWM:")}))


if __name__ == "__main__":
    main()
