"""``toolgym view`` (HTML trajectory report) and ``toolgym plot`` (training curves, tool-latency histograms)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from toolgym.cli.common import CLIError, ExitCode, load_tokenizer_arg

__all__ = ["add_parsers", "cmd_plot", "cmd_view"]


def _tokenizer_for_view(spec: str) -> Any:
    if spec == "none":
        return None
    from toolgym.models import EmbeddedModelMissingError

    try:
        return load_tokenizer_arg(spec)  # an unknown hub id: one line, at once when offline
    except EmbeddedModelMissingError as e:
        print(f"toolgym: warning: {e}; showing the mask view from the turn texts instead", file=sys.stderr)
        return None
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot load tokenizer {spec!r}: {e}", ExitCode.INPUT) from None


def cmd_view(args: argparse.Namespace) -> int:
    from toolgym.report.viewer import TrajectoryFileError, load_trajectory_rows, write_report

    src = Path(args.trajectories)
    cut: list[str] = []

    def load(path: str | Path) -> list[dict[str, Any]]:
        try:  # a last row cut mid-write (a killed run, a full disk) is reported; the whole rows are shown
            return load_trajectory_rows(path, on_cut_tail=lambda _n, msg: cut.append(msg))
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            raise CLIError(f"cannot read {path}: {e.strerror or e}", ExitCode.INPUT) from None
        except (TrajectoryFileError, UnicodeDecodeError) as e:
            raise CLIError(str(e), ExitCode.INPUT) from None

    rows = load(src)
    other = load(args.compare) if args.compare else None
    for msg in cut:
        print(f"toolgym: warning: {msg}: skipped; the whole rows before it are shown", file=sys.stderr)
    tok = _tokenizer_for_view(args.tokenizer)
    title = args.title or f"toolgym trajectories — {src.name}" + (f" vs {Path(args.compare).name}" if other is not None else "")
    labels = (src.name, Path(args.compare).name) if other is not None else None
    if labels is not None and labels[0] == labels[1]:
        labels = (str(src), str(args.compare))
    try:
        path = write_report(rows, args.out, tokenizer=tok, title=title, limit=args.limit, compare=other, labels=labels)
    except OSError as e:
        raise CLIError(f"cannot write {args.out}: {e.strerror or e}", ExitCode.INPUT) from None
    def count(n: int) -> int:
        return n if args.limit is None else min(n, args.limit)

    if other is None:
        print(f"wrote {path} ({count(len(rows))} episodes)")
    else:
        print(f"wrote {path} ({count(len(rows)) + count(len(other))} episodes: {count(len(rows))} in {labels[0]}, "
              f"{count(len(other))} in {labels[1]})")
    return ExitCode.OK


def cmd_plot(args: argparse.Namespace) -> int:
    from toolgym.report import plots
    from toolgym.report.viewer import TrajectoryFileError

    try:
        if args.kind == "curves":
            metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
            if len(args.inputs) > 1:  # several runs overlaid, legend by run name
                path = plots.plot_runs(args.inputs, args.out, metrics=metrics, smooth=args.smooth,
                                       title=args.title or "training runs")
            else:
                path = plots.plot_training_curves(args.inputs[0], args.out, metrics=metrics, smooth=args.smooth,
                                                  title=args.title or "training")
        else:
            src: Any = args.inputs[0] if len(args.inputs) == 1 else list(args.inputs)
            path = plots.plot_latency_histogram(src, args.out, title=args.title or "tool-call latency")
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise CLIError(f"cannot read {getattr(e, 'filename', '') or args.inputs}: {e.strerror or e}",
                       ExitCode.INPUT) from None
    except (ValueError, TrajectoryFileError, UnicodeDecodeError) as e:
        raise CLIError(str(e), ExitCode.INPUT) from None
    print(f"wrote {path}")
    return ExitCode.OK


def add_parsers(sub: Any, epilog: str) -> None:
    """Add the ``view`` and ``plot`` subcommands to ``sub`` (an argparse subparsers object)."""
    s = sub.add_parser("view", help="write a self-contained HTML report of a trajectory file", epilog=epilog)
    s.add_argument("trajectories", help="trajectory JSONL (one Trajectory.to_dict() per line)")
    s.add_argument("--out", default="report.html")
    s.add_argument("--tokenizer", default="embedded",
                   help="decodes token ids for the loss-mask view: 'embedded', 'none' (use turn texts), or a path")
    s.add_argument("--limit", type=int, default=None, help="only the first N episodes (of each file)")
    s.add_argument("--compare", default=None, metavar="B.jsonl",
                   help="a second trajectory file (e.g. after training), compared with the first per task")
    s.add_argument("--title", default=None)
    s.set_defaults(func=cmd_view)

    s = sub.add_parser("plot", help="PNG plots: training curves or tool-latency histograms", epilog=epilog)
    s.add_argument("kind", choices=["curves", "latency"])
    s.add_argument("inputs", nargs="+", help="curves: training log(s) (JSONL rows, trainer_state.json, demo "
                   "metrics.json; several are overlaid, one line per run); latency: trajectory JSONL file(s) or a {tool: [seconds]} JSON file")
    s.add_argument("--out", required=True, help="PNG to write")
    s.add_argument("--metrics", default="reward,success,tool_call_rate", help="curves: comma-separated metrics")
    s.add_argument("--smooth", type=int, default=1, help="curves: moving-average window")
    s.add_argument("--title", default=None)
    s.set_defaults(func=cmd_plot)
