"""``toolgym eval``: each task of a split once (x k samples), success with a 95% Wilson interval, pass@k.

The command is a thin layer over :func:`toolgym.evaluation.evaluate`; ``toolgym/cli/main.py`` only registers the subparser
(:func:`add_parser`) and dispatches to :func:`cmd_eval`. This module imports :mod:`toolgym.cli.common`, never
:mod:`toolgym.cli`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from toolgym.cli.common import (
    CLIError,
    ExitCode,
    apply_run_settings,
    check_output,
    check_report_to,
    env_construction_error,
    make_policy,
    nonnegative_float,
    parse_env_kwargs,
    policy_connection,
    print_placement,
    report_summary,
    resolve_env_id,
)
from toolgym.placement import DEVICE_CHOICES_HELP

__all__ = ["add_parser", "add_run_args", "cmd_eval", "require_oracle"]


def add_run_args(s: argparse.ArgumentParser, *, temperature: float, what: str) -> None:
    """The generation, env and logging options ``rollout`` and ``eval`` share (``temperature``: its default;
    ``what``: what ``--report-to`` logs, for the help text)."""
    s.add_argument("--temperature", type=nonnegative_float, default=temperature,
                   help="sampling temperature (>= 0); 0 = greedy")
    s.add_argument("--max-new-tokens", type=int, default=None, help="tokens sampled per assistant turn (default: "
                   "the checkpoint's toolgym_run.json, else 128)")
    s.add_argument("--autocast", choices=["none", "bfloat16", "float16"], default=None,
                   help="local model policies: generate under torch.autocast in this dtype (default: the "
                        "checkpoint's toolgym_run.json, else none = the model's own dtype)")
    s.add_argument("--device", default="auto", help="local model policies: " + DEVICE_CHOICES_HELP)
    s.add_argument("--schedule", choices=["lockstep", "continuous"], default="lockstep", help="driver schedule")
    s.add_argument("--env-kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="env constructor argument (repeatable); VALUE is parsed as JSON when it can be")
    s.add_argument("--tokenizer", default=None, help="with a URL policy: the served model's tokenizer "
                   "(name or path; default: the embedded one)")
    s.add_argument("--model-name", default=None, help="with a URL policy: the served model name")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--report-to", action="append", default=[], metavar="BACKEND",
                   help=f"also log the {what} to mlflow, tensorboard, wandb or trackio (repeatable or "
                        f"comma-separated; mlflow: metrics + the {what} JSON + the --out trajectories as artifacts)")


def add_parser(sub: Any, epilog: str) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser(
        "eval", help="evaluate a policy: each task once (x k), success with a 95%% CI, pass@k",
        description="Run each selected task exactly once per sample and report success with a 95%% Wilson "
                    "interval, pass@k / mean@k (k > 1), reward, tool-call rate, turns, error kinds and drift.",
        epilog=epilog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument("env", help="env id (toolgym/Calculator-v0, Calculator-v0, calculator, any registered id, or "
                               "module:Env-v0 to import a module that registers it)")
    s.add_argument("--policy", default="embedded",
                   help="'oracle' (the env's oracle(state)), 'embedded' (SmolLM2-135M), 'tiny' (tiny random "
                        "model), a model directory / .gguf, or an http(s):// URL of an OpenAI-compatible server")
    s.add_argument("--split", default=None, help="env split (e.g. test); default: the env's own default")
    s.add_argument("--tasks", default="all", help="'all' (the whole finite split), N (N distinct tasks chosen "
                   "from --seed), or a .jsonl task file")
    s.add_argument("--seed", type=int, default=0, help="task-selection seed; episode i is reset with seed + i")
    s.add_argument("-k", "--samples", dest="k", type=int, default=1, help="samples per task (pass@k, mean@k)")
    s.add_argument("--num-envs", type=int, default=None,
                   help="parallel episodes (default: what the checkpoint's toolgym_run.json records the run "
                        "evaluated with, else 8)")
    s.add_argument("--out", default=None, help="stream trajectories to this JSONL file as episodes finish "
                   "(replaced only once the first episode is done; an interrupted run keeps finished episodes)")
    s.add_argument("--json", action="store_true",
                   help="print the report as one JSON object on the last stdout line (the table goes to stderr)")
    s.add_argument("--categories", default=None, help="with env bfcl: the BFCL table over these categories "
                   "(comma-separated names or groups all, single_turn, non_live, live, multi_turn; docs/bfcl.md)")
    s.add_argument("--bfcl-out", default=None, help="with --categories: write the table and every entry's BFCL "
                   "verdict to this JSON file")
    add_run_args(s, temperature=0.0, what="report")
    s.set_defaults(func=cmd_eval)
    return s


def require_oracle(policy: str, env_id: str, venv: Any) -> None:
    """With ``--policy oracle``, a usage error (exit 2) before any episode unless the env defines an oracle."""
    from toolgym.evaluation import has_oracle

    if policy == "oracle" and not has_oracle(venv):
        raise CLIError(f"{env_id} has no oracle: define `oracle(self, state) -> str` on the env class to use "
                       "--policy oracle", ExitCode.USAGE)


def cmd_eval(args: argparse.Namespace) -> int:
    from toolgym.envs.registration import make_vector_env
    from toolgym.evaluation import (
        TaskFileError,
        TaskSelectionError,
        evaluate,
    )

    env_id = resolve_env_id(args.env)
    env_kwargs = parse_env_kwargs(args.env_kwarg or [])
    settings = apply_run_settings(args, env_kwargs)  # a checkpoint's own prompt and turn budget, unless given here
    if args.num_envs is None:
        # the run's own batching too: in bfloat16 greedy near-ties can flip with the batch's composition (padding)
        recorded = (settings or {}).get("eval") or {}
        args.num_envs = int(recorded.get("num_envs") or 8)
        if recorded.get("num_envs") and recorded.get("batch_size"):
            args.max_batch_size = int(recorded["batch_size"])
    for flag, value in (("-k", args.k), ("--max-new-tokens", args.max_new_tokens), ("--num-envs", args.num_envs)):
        if value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}", ExitCode.USAGE)
    if args.k > 1 and args.temperature == 0 and args.policy != "oracle":
        print("toolgym: warning: -k > 1 with --temperature 0 (greedy) gives k identical samples", file=sys.stderr)
    tasks: Any = args.tasks
    if tasks != "all" and not str(tasks).strip().isdigit():
        if not str(tasks).endswith(".jsonl"):
            raise CLIError(f"--tasks must be 'all', a positive number or a .jsonl file, got {tasks!r}",
                           ExitCode.USAGE)
        if not Path(tasks).is_file():
            raise CLIError(f"cannot read task file {tasks}: no such file", ExitCode.INPUT)
    if args.out is not None:
        check_output(args.out)
    if args.split is not None:
        env_kwargs["split"] = args.split

    check_report_to(args)  # before any work: unknown / not installed backend (2), unreachable MLflow server (4)
    policy, tok = make_policy(args)  # one place builds every policy for rollout and eval
    name = args.policy
    if tok is not None:
        env_kwargs.setdefault("tokenizer", tok)
    if getattr(args, "categories", None):
        from toolgym.cli.bfcl import run_bfcl_table

        return run_bfcl_table(args, env_id, policy, env_kwargs)
    try:
        venv = make_vector_env(env_id, args.num_envs, env_kwargs)
    except Exception as e:  # noqa: BLE001 - classified below into one line with its exit code
        raise env_construction_error(env_id, e) from None
    try:
        require_oracle(name, env_id, venv)
        try:
            with policy_connection(args.policy):
                report = evaluate(
                    venv, policy, tasks, k=args.k, seed=args.seed, split=args.split, num_envs=args.num_envs,
                    max_turn_tokens=args.max_new_tokens, schedule=args.schedule, out=args.out,
                    progress=not args.no_progress, policy_name=name,
                )
        except TaskFileError as e:
            raise CLIError(str(e), ExitCode.INPUT) from None
        except TaskSelectionError as e:
            raise CLIError(str(e), ExitCode.USAGE) from None
    finally:
        venv.close()
    print_placement(args)  # after the run: a usage or input error stays the only line on stderr
    report.env_id = env_id
    table, data = report.format_table(), report.to_dict()
    if getattr(args, "placement", None):  # local model policies: "model on cuda:0, bfloat16"
        data["placement"] = args.placement
    # what was evaluated: a checkpoint's path and weights hash (the registry refuses this report for other weights)
    data["evaluated"] = getattr(args, "evaluated", None) or {"kind": "server"}
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(data))
    else:
        print(table)
    report_summary(args, "eval", data, documents={"eval.json": data}, artifacts=[args.out] if args.out else [],
                   params={k: data.get(k) for k in ("env_id", "split", "n_tasks", "k", "seed", "policy")}
                   | {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                      "placement": getattr(args, "placement", None)})
    return ExitCode.OK
