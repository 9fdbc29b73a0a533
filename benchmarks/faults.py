"""Fault probes (docs/reliability.md): what one bad tool call costs the rest of the process.

Each probe runs in its own subprocess with a deadline, so a probe that hangs (the behaviour before the fixes)
reports ``"hung"`` instead of stopping the run:

* ``big``: one env step whose tool returns ``--mb`` megabytes, against one whose tool returns a short text
  (seconds of env time, tool time excluded, and their ratio);
* ``blocking``: ``--blocked`` calls of a sync tool that sleeps past its 0.2 s timeout, then one calculator call
  (the calculator's latency; before the fixes it waited for a free thread of the shared pool);
* ``rollout``: a 64-episode scripted rollout (8 sub-envs, lock-step and continuous) in which one episode's tool
  returns a lone surrogate: trajectories returned and lines written;
* ``system_exit``: one step whose tool raises ``SystemExit`` (argparse on bad input): whether ``step`` returns.

    .venv/bin/python -m benchmarks.faults --mb 50 --blocked 12 --deadline 240

Prints one JSON line per probe. Point ``PYTHONPATH`` at another checkout to measure it the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

_PRELUDE = textwrap.dedent("""
    import asyncio, json, sys, time, tempfile, os
    from toolgym.envs.base import ToolEnv
    from toolgym.tools.function import tool
    from toolgym.tools.calculator import calculator_tool
    from toolgym.models import load_tokenizer

    def call(name, args):
        return '<tool_call>\\n{"name": "%s", "arguments": %s}\\n</tool_call>' % (name, args)
""")

_PROBES = {
    "big": textwrap.dedent("""
        @tool
        async def big(mb: int) -> str:
            '''Return megabytes of text.

            Args:
                mb: megabytes
            '''
            return "x" * 16 if mb == 0 else "lorem ipsum " * (mb * 1024 * 1024 // 12)

        env = ToolEnv([{"id": "a", "prompt": "p"}], [big], max_obs_tokens=512)
        out = {}
        for mb in (0, MB):
            env.reset(seed=0)
            t0 = time.perf_counter()
            *_, info = env.step(env.encode_action(call("big", '{"mb": %d}' % mb)))
            out[mb] = time.perf_counter() - t0 - float(info["results"][0]["latency_s"])
        print(json.dumps({"probe": "big", "mb": MB, "short_step_s": round(out[0], 4),
                          "big_step_s": round(out[MB], 4), "ratio": round(out[MB] / out[0], 1)}))
    """),
    "blocking": textwrap.dedent("""
        @tool(timeout_s=0.2)
        def stuck() -> str:
            '''Block for a minute.'''
            time.sleep(60)
            return "never"

        from toolgym.tools.executor import ToolExecutor
        from toolgym.tools.base import ToolCall
        from toolgym import runtime
        ex = ToolExecutor([stuck, calculator_tool(timeout_s=5.0)])
        async def go():
            await ex.run_many([ToolCall("stuck", {}) for _ in range(BLOCKED)])
            t0 = time.perf_counter()
            r = await ex.run(ToolCall("calculator", {"expression": "6*7"}))
            return time.perf_counter() - t0, r.error_kind.value if r.error_kind else "ok"
        dt, kind = runtime.run_sync(go())
        print(json.dumps({"probe": "blocking", "blocked_calls": BLOCKED, "calculator_s": round(dt, 4),
                          "calculator_result": kind}))
        sys.stdout.flush()
        t0 = time.perf_counter()
    """),
    "rollout": textwrap.dedent("""
        import numpy as np
        from toolgym.rollout import RolloutDriver, ScriptedPolicy
        from toolgym.envs.vector import ToolVectorEnv
        import functools

        @tool
        async def echo(text: str) -> str:
            '''Echo.

            Args:
                text: text
            '''
            return text + ("\\ud800" if text == "poison" else "")

        tok = load_tokenizer()
        out = {"probe": "rollout"}
        for schedule in ("lockstep", "continuous"):
            venv = ToolVectorEnv(functools.partial(ToolEnv, [{"id": "a", "prompt": "p"}], [echo], tokenizer=tok),
                                 8, autoreset_mode="disabled")
            def script(s):
                if s.turn == 0:
                    return call("echo", '{"text": "%s"}' % ("poison" if s.index == 5 else "ok"))
                return "<answer>done</answer>"
            path = tempfile.mktemp(suffix=".jsonl")
            try:
                trajs = RolloutDriver(venv, ScriptedPolicy(script), schedule=schedule).run([None] * 64, seeds=0,
                                                                                         trajectory_path=path)
                n = len(trajs)
            except Exception as e:
                n = type(e).__name__
            lines = sum(1 for _ in open(path)) if os.path.exists(path) else 0
            out[schedule] = {"trajectories": n, "lines_written": lines}
        print(json.dumps(out))
    """),
    "system_exit": textwrap.dedent("""
        import argparse
        @tool
        def cli(flags: str) -> str:
            '''An argparse command line.

            Args:
                flags: the flags
            '''
            p = argparse.ArgumentParser(prog="cli")
            p.add_argument("--n", type=int, required=True)
            return str(p.parse_args(flags.split()).n)

        env = ToolEnv([{"id": "a", "prompt": "p"}], [cli])
        env.reset(seed=0)
        *_, info = env.step(env.encode_action(call("cli", '{"flags": "--bogus"}')))
        print(json.dumps({"probe": "system_exit", "step_returned": True, "error_kind": info["error_kinds"][0]}))
    """),
}


def run_probe(name: str, args: argparse.Namespace) -> dict:
    code = _PRELUDE + _PROBES[name].replace("MB", str(args.mb)).replace("BLOCKED", str(args.blocked))
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=args.deadline,
                           env=os.environ.copy())  # fmt: skip
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        first = out.strip().splitlines()[:1]
        row = json.loads(first[0]) if first else {"probe": name}
        return {**row, "hung": True, "deadline_s": args.deadline}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"probe": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1], "rc": p.returncode}
    return {**json.loads(lines[-1]), "exit_s": round(time.perf_counter() - t0, 1), "rc": p.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50, help="size of the big result, MB")
    ap.add_argument("--blocked", type=int, default=12, help="blocked sync calls before the calculator call")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds before a probe counts as hung")
    ap.add_argument("--probes", default="big,blocking,rollout,system_exit")
    args = ap.parse_args()
    for name in args.probes.split(","):
        print(json.dumps(run_probe(name, args)), flush=True)


if __name__ == "__main__":
    main()
