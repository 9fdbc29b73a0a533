"""Check an MCP-v0 setup before training: start the servers, list the tools, and play the tasks with an
oracle policy (one ``calculate`` call with the task's ``expression``, then ``<answer>``), printing the reward.

    python examples/mcp/check_setup.py                                   # servers.json (needs uvx)
    python examples/mcp/check_setup.py --config examples/mcp/servers.local.json --tasks 8

A mean reward of 1.0 means the server, the task file and the reward agree; then train with
``accelerate launch --cpu -m trainers.cli grpo --config examples/mcp/grpo_mcp_cpu.yaml``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import gymnasium as gym

import toolgym  # noqa: F401 - registers toolgym/MCP-v0
from toolgym.errors import InputFileError
from toolgym.format.parsers import get_parser
from toolgym.tools.mcp import load_mcp_config

HERE = Path(__file__).parent


def missing_commands(config: str) -> list[str]:
    """The stdio server commands of ``config`` that cannot be found (not on PATH / no such file)."""
    missing = []
    for name, cfg in load_mcp_config(config).items():
        if cfg.command is None:
            continue
        cmd = os.path.expanduser(cfg.command)
        if shutil.which(cmd) is None:
            missing.append(f"{name}: {cfg.command!r}")
    return missing


def fail(message: str, code: int) -> NoReturn:
    print(f"check_setup: error: {message}", file=sys.stderr)
    sys.exit(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(HERE / "servers.json"))
    ap.add_argument("--task-file", default=str(HERE / "tasks.jsonl"))
    ap.add_argument("--tasks", type=int, default=8, help="how many tasks to play")
    a = ap.parse_args()
    try:
        missing = missing_commands(a.config)
    except (FileNotFoundError, InputFileError) as e:
        fail(str(e), 3)
    if missing:
        hint = ("`uvx` comes with uv (`pip install uv`; it downloads the server from PyPI on first use)"
                if any("'uvx'" in m for m in missing) else "install the server or fix `command` in the config")
        fail(f"server command not found ({'; '.join(missing)}): {hint}; or run a server you have installed with "
             "--config examples/mcp/servers.local.json (see docs/mcp.md)", 2)
    try:
        env = gym.make("toolgym/MCP-v0", mcp_config=a.config, tasks=a.task_file, reward="numeric@answer")
    except (FileNotFoundError, InputFileError) as e:
        fail(str(e), 3)
    except ConnectionError as e:
        fail(str(e), 4)
    u = env.unwrapped
    print("tools:", ", ".join(sorted(u.executor.tools)))
    parser = get_parser("hermes")
    rewards = []
    try:
        for task in u.tasks[: a.tasks]:
            env.reset(options={"task": task})
            call = parser.format_calls([("calculate", {"expression": task["expression"]})])
            _, _, _, _, info = env.step(u.encode_action(call))
            result = info["results"][0]["content"]
            _, reward, _, _, info = env.step(u.encode_action(f"<answer>{result}</answer>"))
            rewards.append(reward)
            print(f"{task['id']}: {task['expression']} -> {result} (gold {task['answer']}) reward {reward:.1f}")
    finally:
        env.close()
    print(f"mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)} tasks")


if __name__ == "__main__":
    main()
