"""The ``toolgym`` command.

Subcommands::

    toolgym list [--json] [--import MODULE ...]              registered envs (toolgym's and users'), one line each
    toolgym eval ENV --policy oracle|embedded|tiny|URL|PATH [--split S] [--tasks all|N|FILE.jsonl] [--seed S]
                 [-k K] [--temperature T] [--max-new-tokens M] [--num-envs N] [--out FILE.jsonl] [--json]
    toolgym rollout ENV --policy embedded|tiny|URL|PATH --episodes N --out traj.jsonl
                    [--seed S] [--num-envs K] [--max-new-tokens T] [--temperature X]
                    [--schedule lockstep|continuous] [--env-kwarg KEY=VALUE ...] [--tokenizer T]
                    [--model-name NAME] [--json] [--no-progress]
    toolgym view traj.jsonl [--compare after.jsonl] --out report.html [--tokenizer embedded|none|PATH] [--limit N]
    toolgym plot curves LOG [LOG2 ...] --out curves.png [--metrics reward,success] [--smooth N]
    toolgym plot latency traj.jsonl|latencies.json ... --out latency.png
    toolgym bench vector|tools|retrieval|rollout|mcp|sandbox|judge [ARGS ...]   (ARGS go to the script)
    toolgym serve retriever|mcp|model [ARGS ...]                              (ARGS go to the server)
    toolgym registry register|attach-eval|list|promote ARGS   model registry on MLflow (trainers/tracking/registry.py)
    toolgym train NAME [--config FILE.yaml] [--FIELD VALUE ...]   an algorithm of trainers.ALGORITHMS ([train] extra)
    toolgym ui [--host 127.0.0.1] [--port 7860] [--runs runs/] [--token-file F]   web page (the [ui] extra)

Exit codes (:class:`ExitCode`), stable for scripts:

* ``0`` success;
* ``1`` runtime failure (a benchmark or the rollout failed; an unexpected error);
* ``2`` usage error: bad arguments, unknown env / benchmark / server, a bad ``--env-kwarg`` (argparse's own
  code for usage errors);
* ``3`` a file cannot be read or written: missing, unreadable or malformed input (not trajectory JSONL), a
  missing benchmark script or model path, an unwritable output; ``toolgym train`` without the ``[train]`` extra;
* ``4`` a service is unreachable (``--policy URL`` refuses connections, times out or does not resolve);
* ``130`` interrupted (Ctrl-C).

Set ``TOOLGYM_DEBUG=1`` to get the Python traceback of a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolgym.cli import plugins
from toolgym.cli.bench import BENCHMARKS, SERVERS, run_benchmark, run_server, summary_line
from toolgym.cli.bench import add_parsers as add_bench_parsers
from toolgym.cli.common import (
    CLIError,
    ExitCode,
    add_ui_arguments,
    apply_run_settings,
    check_output,
    check_reachable,
    check_report_to,
    env_construction_error,
    import_user_module,
    make_policy,
    parse_env_kwargs,
    policy_connection,
    print_error,
    print_placement,
    report_summary,
    resolve_env_id,
)
from toolgym.cli.eval import add_parser as add_eval_parser
from toolgym.cli.eval import add_run_args, require_oracle
from toolgym.cli.view import add_parsers as add_view_parsers
from toolgym.console import configure as configure_output
from toolgym.errors import OutputFileError

__all__ = [
    "BENCHMARKS",
    "SERVERS",
    "CLIError",
    "ExitCode",
    "build_parser",
    "check_reachable",
    "env_construction_error",
    "main",
    "parse_env_kwargs",
    "resolve_env_id",
    "summary_line",
]


# ---------------------------------------------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------------------------------------------


def user_envs() -> dict[str, tuple[str, str]]:
    """Envs registered with Gymnasium outside toolgym whose entry point is a :class:`ToolEnv` subclass (modules
    already imported only: nothing is imported to find them): ``id -> (entry point, first docstring line)``."""
    import gymnasium as gym

    from toolgym.envs.base import ToolEnv
    from toolgym.envs.registration import ENVS

    out: dict[str, tuple[str, str]] = {}
    for env_id, spec in gym.registry.items():
        if env_id in ENVS:
            continue
        ep = spec.entry_point
        if isinstance(ep, str):
            mod, _, attr = ep.partition(":")
            ep = getattr(sys.modules.get(mod), attr, None) if mod in sys.modules else None
        if isinstance(ep, type) and issubclass(ep, ToolEnv):
            doc = (ep.__doc__ or "").strip().splitlines()
            out[env_id] = (f"{ep.__module__}:{ep.__qualname__}", doc[0] if doc else "")
    return out


def cmd_list(args: argparse.Namespace) -> int:
    from toolgym.envs.registration import ENVS

    for mod in args.imports or []:
        try:
            import_user_module(mod)
        except CLIError as e:
            raise CLIError(f"--import {mod}: {e.message}", ExitCode.USAGE) from None
    envs = {**ENVS, **user_envs()}
    if args.json:
        print(json.dumps([{"id": k, "entry_point": ep, "description": d, "builtin": k in ENVS}
                          for k, (ep, d) in envs.items()], indent=1))
        return ExitCode.OK
    width = max(len(k) for k in envs)
    for k, (_, d) in envs.items():
        print(f"{k:<{width}}  {d}{'' if k in ENVS else '  [user]'}")
    return ExitCode.OK


# ---------------------------------------------------------------------------------------------------------------
# rollout (eval: toolgym/cli/eval.py; view, plot: toolgym/cli/view.py; bench, serve: toolgym/cli/bench.py)
# ---------------------------------------------------------------------------------------------------------------


def format_summary(summary: dict[str, Any], stats: dict[str, Any] | None = None) -> str:
    """The rollout summary as an aligned two-column table."""
    n = summary.get("episodes", 0)
    rows: list[tuple[str, str]] = [("episodes", str(n))]
    if n:
        errs = summary.get("errors") or {}
        rows += [
            ("mean reward", f"{summary['reward']:.3f}"),
            ("success", f"{summary['success']:.1%}"),
            ("mean turns", f"{summary['turns']:.2f}"),
            ("tool-call rate", f"{summary['tool_call_rate']:.1%}"),
            ("tool calls/episode", f"{summary['calls_per_episode']:.2f}"),
            ("truncated", f"{summary['truncated']:.1%}"),
            ("errors", ", ".join(f"{k}={v}" for k, v in sorted(errs.items())) or "none"),
        ]
    if stats:
        rows.append(("wall time", f"{stats.get('wall_s', 0.0):.1f} s ({stats.get('episodes_per_s', 0.0):.2f} episodes/s)"))
        rows.append(("generated tokens", str(stats.get("generated_tokens", 0))))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])


def cmd_rollout(args: argparse.Namespace) -> int:
    env_id = resolve_env_id(args.env)
    env_kwargs = parse_env_kwargs(args.env_kwarg or [])
    apply_run_settings(args, env_kwargs)  # a checkpoint's own prompt and turn budget, unless given here
    if args.episodes < 1:
        raise CLIError("--episodes must be >= 1", ExitCode.USAGE)
    if args.max_new_tokens < 1:
        raise CLIError("--max-new-tokens must be >= 1", ExitCode.USAGE)
    out = Path(args.out)
    check_report_to(args)
    from toolgym.envs.registration import make_vector_env
    from toolgym.jsonl import JSONLStream

    check_output(out)  # the file itself is replaced only once the first episode has finished

    from toolgym.rollout import RolloutDriver, summarize

    policy, tok = make_policy(args)
    if tok is not None:  # None: the oracle, which runs with the env's own tokenizer
        env_kwargs.setdefault("tokenizer", tok)
    num_envs = args.num_envs or min(args.episodes, 8)
    try:
        venv = make_vector_env(env_id, num_envs, env_kwargs)
    except Exception as e:  # noqa: BLE001 - classified into one line with its exit code
        raise env_construction_error(env_id, e) from None
    try:
        require_oracle(args.policy, env_id, venv)
        driver = RolloutDriver(venv, policy, schedule=args.schedule, max_turn_tokens=args.max_new_tokens)
        # episodes are streamed as they finish: an interrupted run keeps them
        with JSONLStream(out) as stream, policy_connection(args.policy):
            trajs = driver.run([None] * args.episodes, seeds=args.seed, progress=not args.no_progress,
                               on_episode=lambda _k, t: stream.write(t.to_dict()))
        summary = summarize(trajs)
        stats = driver.stats.to_dict()
    finally:
        venv.close()
    print_placement(args)  # after the run: a usage or input error stays the only line on stderr
    # with --json, stdout carries the JSON object alone; the human summary goes to stderr
    human = sys.stderr if args.json else sys.stdout
    print(f"{env_id}: {len(trajs)} episodes -> {out}", file=human)
    print(format_summary(summary, stats), file=human)
    if args.json:
        print(json.dumps({"env": env_id, "out": str(out), "summary": summary, "stats": stats}))
    report_summary(args, "rollout", {**summary, **stats}, artifacts=[out],
                   params={"env_id": env_id, "policy": args.policy, "episodes": args.episodes, "seed": args.seed,
                           "temperature": args.temperature, **{k: v for k, v in env_kwargs.items() if k != "tokenizer"}})
    return ExitCode.OK


# ---------------------------------------------------------------------------------------------------------------
# parser and main
# ---------------------------------------------------------------------------------------------------------------

_EPILOG = """exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 file missing/unreadable/malformed or unwritable,
4 service unreachable, 130 interrupted. TOOLGYM_DEBUG=1 prints tracebacks."""


def build_parser() -> argparse.ArgumentParser:
    """The ``toolgym`` argument parser (``bench`` / ``serve`` forward their remaining arguments)."""
    from toolgym import __version__

    p = argparse.ArgumentParser(
        prog="toolgym", description="Token-level Gymnasium environments for training LLMs to use tools.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"toolgym {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="before the command: also show the libraries' own warnings and logs and MCP servers' stderr "
                        "(TOOLGYM_VERBOSE=1 does the same)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("list", help="registered envs (toolgym's and users') with one-line descriptions")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help="import MODULE first (it registers user envs); repeatable")
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("rollout", help="run episodes with a policy, write trajectories, print a summary",
                       epilog=_EPILOG, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("env", help="env id (toolgym/Calculator-v0, Calculator-v0 or calculator)")
    s.add_argument("--policy", default="embedded",
                   help="'oracle' (the env's oracle(state)), 'embedded' (SmolLM2-135M), 'tiny' (tiny random "
                        "model), an http(s):// URL of an OpenAI-compatible server (vLLM, `toolgym serve model`), or "
                        "a model path")
    s.add_argument("--episodes", type=int, default=8)
    s.add_argument("--out", default="trajectories.jsonl", help="trajectory JSONL, streamed as episodes finish "
                   "(an existing file is replaced once the first episode is done)")
    s.add_argument("--seed", type=int, default=0, help="episode k draws its task with seed + k")
    s.add_argument("--num-envs", type=int, default=None, help="parallel episodes (None: min(episodes, 8))")
    s.add_argument("--json", action="store_true",
                   help="print the summary as one JSON object alone on stdout (the table goes to stderr)")
    add_run_args(s, temperature=1.0, what="summary")
    s.set_defaults(func=cmd_rollout)

    add_eval_parser(sub, _EPILOG)
    add_view_parsers(sub, _EPILOG)
    add_bench_parsers(sub)

    s = sub.add_parser("registry", help="model registry on MLflow: register, attach-eval, list, promote "
                       "(`toolgym registry --help`)", add_help=False)
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the registry")
    s = sub.add_parser("ui", help="the web page: tools, rewards, training jobs, runs, evaluation and registry "
                       "(docs/ui.md; the [ui] extra)")
    add_ui_arguments(s)
    s = sub.add_parser("train", help="train with an algorithm of trainers.ALGORITHMS (`toolgym train --help` lists "
                       "them)",
                       description="toolgym train NAME [--config FILE.yaml] [--FIELD VALUE ...]: see "
                                   "docs/training.md (needs the [train] extra)")
    s.add_argument("algorithm", help="a name in trainers.ALGORITHMS (`toolgym train --help` lists them)")
    s.add_argument("args", nargs=argparse.REMAINDER, help="--config FILE.yaml and field overrides")
    return p


def run_train(argv: list[str]) -> int:
    """``toolgym train ...``: hand ``argv`` to the ``train`` command of the training package (the
    ``toolgym.commands`` entry point, :mod:`toolgym.cli.plugins`); a missing ``[train]`` extra is a one-line error
    (exit 3)."""
    return int(plugins.load(plugins.COMMANDS, "train", what="`toolgym train`", code=ExitCode.INPUT)(argv))


def _dispatch(argv: list[str]) -> int:
    if argv[:1] in (["registry"], ["ui"]):  # the command (an entry point of the training package) owns its arguments
        return int(plugins.load(plugins.COMMANDS, argv[0], what=f"`toolgym {argv[0]}`")(argv[1:]))
    # bench/serve: everything after NAME belongs to the script/server (its own --help included).
    if len(argv) >= 2 and argv[0] in ("bench", "serve") and not argv[1].startswith("-"):
        table = BENCHMARKS if argv[0] == "bench" else SERVERS
        if argv[1] not in table:
            build_parser().parse_args(argv[:2])  # argparse's usage error (exit 2) listing the choices
        return run_benchmark(argv[1], argv[2:]) if argv[0] == "bench" else run_server(argv[1], argv[2:])
    if argv and argv[0] == "train":  # everything after `train` belongs to trainers.cli (its --help included)
        return run_train(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolgym`` command; returns the exit code (see :class:`ExitCode`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbosity = 0
    while argv and argv[0] in ("-v", "--verbose"):  # before the command: bench/serve/train forward the rest
        verbosity += 1
        argv = argv[1:]
    configure_output(verbosity)
    debug = os.environ.get("TOOLGYM_DEBUG", "") not in ("", "0")
    try:
        return _dispatch(argv)
    except CLIError as e:
        if debug:
            raise
        print_error(e.message)
        return int(e.code)
    except KeyboardInterrupt:
        print_error("interrupted")
        return ExitCode.INTERRUPTED
    except SystemExit as e:  # argparse (2) and --help/--version (0)
        code = e.code
        return code if isinstance(code, int) else (ExitCode.OK if code is None else ExitCode.USAGE)
    except OutputFileError as e:  # a full disk, a device behind --out: unwritable output (3), rows kept whole
        if debug:
            raise
        print_error(e.strerror or str(e))
        return ExitCode.INPUT
    except Exception as e:  # noqa: BLE001 - the command line reports, it does not crash
        if debug:
            raise
        print_error(f"{type(e).__name__}: {e}")
        return ExitCode.FAILURE


if __name__ == "__main__":
    sys.exit(main())
