"""``toolgym eval bfcl --categories ...``: the BFCL table (:mod:`toolgym.evaluation.bfcl`) from the ``eval`` command's
parsed options; ``toolgym/cli/eval.py`` hands over to :func:`run_bfcl_table` when ``--categories`` is given."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from toolgym.cli.common import CLIError, ExitCode, policy_connection

__all__ = ["run_bfcl_table"]


def run_bfcl_table(args: argparse.Namespace, env_id: str, policy: Any, env_kwargs: dict[str, Any]) -> int:
    """Evaluate ``policy`` on ``args.categories`` (split ``args.split``, default ``test``), print the table (or its
    JSON with ``--json``), write ``--bfcl-out``. Exit 2 for an env other than BFCL or an unknown category."""
    from toolgym.evaluation.bfcl import evaluate_bfcl, parse_categories

    if env_id != "toolgym/BFCL-v0":
        raise CLIError(f"--categories is for the BFCL env (toolgym/BFCL-v0), not {env_id}", ExitCode.USAGE)
    try:
        cats = parse_categories(args.categories)
    except ValueError as e:
        raise CLIError(str(e), ExitCode.USAGE) from None
    kw = {k: v for k, v in env_kwargs.items() if k not in ("split", "category")}
    tasks: Any = int(args.tasks) if str(args.tasks).isdigit() else args.tasks
    with policy_connection(args.policy):
        report = evaluate_bfcl(policy, cats, split=args.split or "test", tasks=tasks, num_envs=args.num_envs,
                               max_turn_tokens=args.max_new_tokens, seed=args.seed, env_kwargs=kw,
                               policy_name=args.policy, progress=not args.no_progress, out=args.bfcl_out)
    table = report.format_table()
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps({k: v for k, v in report.to_dict().items() if k != "entries"}))
    else:
        print(table)
    return ExitCode.OK
