"""``toolgym train <algorithm> [--config FILE.yaml] [--dry-run] [--field value ...]``: every algorithm of
:data:`trainers.ALGORITHMS` (``grpo``, ``sft``, ``rft``, ``dpo``, ``reward_model``) through its ``run``.

The config is read by :func:`trainers.runconfig.resolve` (YAML + ``--field value`` overrides, layout in its module
doc)::

    toolgym train grpo --config trainers/configs/grpo_calculator_cpu.yaml \\
        --max_steps 2 --learning_rate 1e-5 --toolgym.env_id toolgym/SQL-v0 --report_to tensorboard
    toolgym train rft --model runs/demo/warmstart --rounds 2 --tasks 64      # no file: the Config's defaults
    accelerate launch --cpu --num_processes 1 -m trainers.cli grpo --config FILE.yaml   # the same, under accelerate

* ``--dry-run`` prints ``{"algorithm": NAME, "config": {...}}`` (the resolved config laid out like a config file,
  so it can be saved and read back) and exits without loading a model; TRL's own checks run.
* ``--help`` after the name lists the ``Config`` fields with their help texts.
* ``model: tiny`` (GRPO/SFT) trains a tiny random model (:func:`toolgym.models.tiny_random_model`): smoke tests.

Errors are one line on stderr with an exit code (:class:`toolgym.errors.ExitCode`): ``2`` for an unknown or
misspelt key (naming the close matches), a value of the wrong type or a config TRL rejects; ``3`` for a config file
that cannot be read or a missing ``[train]`` extra (TRL/torch not installed); ``1`` for a failure during training
(``TOOLGYM_DEBUG=1`` re-raises it with its traceback); ``130`` when interrupted (Ctrl-C, SIGINT); ``143`` when
terminated (SIGTERM, e.g. ``kill PID`` or a scheduler's stop: raised as :class:`Terminated` in the main thread).

The tracked run (``report_to: mlflow``) ends with the outcome: ``KILLED`` when interrupted or terminated,
``FAILED`` when training raised, ``FINISHED`` when it completed (MLflow would otherwise close a run still open at
exit as ``FINISHED``).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python trainers/cli.py` / `accelerate launch trainers/cli.py`: the one script entry
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolgym.errors import CLIError, ConfigError, ExitCode  # noqa: E402
from trainers import ALGORITHMS  # noqa: E402
from trainers.runconfig import (  # noqa: E402
    SECTION,
    as_mapping,
    describe,
    import_train,
    parse_overrides,
    resolve,
    trl_field,
)

__all__ = ["Terminated", "default_run_name", "load", "main", "usage"]


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while training: raised in the main thread so that the run stops as it does on Ctrl-C."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While training, SIGTERM raises :class:`Terminated` (Python's default would end the process on the spot,
    with no cleanup). Only from the main thread, and only over the default disposition (a handler someone else
    installed is kept)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def on_term(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end_tracked_runs(status: str) -> None:
    """End the open MLflow run(s) of this process with ``status`` (``KILLED``/``FAILED``); nothing without MLflow."""
    if "mlflow" in sys.modules:
        from trainers.tracking import end_active_runs

        end_active_runs(status)


def usage() -> str:
    """The ``toolgym train --help`` text: every algorithm with the first line of its module docstring."""
    names = ",".join(ALGORITHMS)
    lines = [f"usage: toolgym train {{{names}}} [--config FILE.yaml|NAME] [--dry-run] [--FIELD VALUE ...]", ""]
    for name in ALGORITHMS:
        lines.append(f"  {name:<13} {_summary(name)}")
    lines += ["", "--FIELD VALUE overrides any field of the config file, e.g. --max_steps 2 --learning_rate 1e-5",
              "--toolgym.env_id toolgym/SQL-v0 --report_to tensorboard. --dry-run prints the resolved config as JSON.",
              "`toolgym train NAME --help` lists NAME's fields.",
              "exit codes: 0 ok, 1 training failed, 2 bad key or value, 3 config file unreadable or [train] extra missing,",
              "130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."]
    return "\n".join(lines)


def _summary(name: str) -> str:
    doc = (sys.modules.get(ALGORITHMS.module_name(name)) or ALGORITHMS[name]).__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _fields_help(name: str) -> str:
    cls = ALGORITHMS[name].Config
    tf = trl_field(cls)
    prefix = "toolgym." if tf else ""
    lines = [f"toolgym train {name}: {_summary(name)}", ""]
    if tf:
        lines.append(f"  top-level keys: the fields of trl.{tf[1]} (e.g. --max_steps 2 --learning_rate 1e-5)")
        lines.append("  toolgym: section:")
    for d in describe(cls):
        if tf and d["name"] == tf[0]:
            continue
        lines.append(f"  --{prefix}{d['name']} ({d['type']}, default {d['default']!r}): {d['help']}")
    return "\n".join(lines)


def default_run_name(output_dir: str | os.PathLike[str] | None, seed: Any) -> str:
    """A tracker run name of its own for a run that names none: ``<output dir name>-seed<S>-<time>-<4 hex>``.
    (Left unset, MLflow draws a "random" name from Python's ``random``, which the trainer has just seeded: every run
    with the same seed got the same name.) The suffix comes from ``os.urandom``, not the seeded generator."""
    import secrets
    import time

    base = Path(str(output_dir or "run")).name or "run"
    return f"{base}-seed{seed if seed is not None else 'none'}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _run_placement(cls: Any, config: Any, over: dict[str, Any], *, name_run: bool) -> dict[str, Any]:
    """Overrides that keep runs apart: the trajectories follow an ``--output_dir`` given here (a config's relative
    ``trajectory_dir`` under its own ``output_dir`` moves to the same place under the new one, another relative one
    to ``<output_dir>/trajectories``; an absolute one stays), and ``run_name`` gets :func:`default_run_name` when
    neither the file nor the command line sets it (``name_run``)."""
    import dataclasses

    from trainers.runconfig import read_config

    raw = dict(read_config(config) if isinstance(config, str | os.PathLike) else (config or {}))
    section = raw.get(SECTION) if isinstance(raw.get(SECTION), dict) else {}
    own = {f.name for f in dataclasses.fields(cls)}
    extra: dict[str, Any] = {}
    traj = section.get("trajectory_dir")
    key = f"{SECTION}.trajectory_dir"
    if ("trajectory_dir" in own and over.get("output_dir") not in (None, True) and key not in over
            and isinstance(traj, str) and traj and not Path(traj).is_absolute()):
        old_out, new_out = raw.get("output_dir"), Path(str(over["output_dir"]))
        try:
            rel = Path(traj).relative_to(str(old_out)) if isinstance(old_out, str) and old_out else None
        except ValueError:
            rel = None
        extra[key] = str(new_out / (rel if rel is not None else "trajectories"))
    if name_run and "run_name" not in over and not raw.get("run_name"):
        out = over.get("output_dir") or raw.get("output_dir")
        extra["run_name"] = default_run_name(out, over.get("seed", raw.get("seed", 42)))
    return extra


def load(name: str, config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
         overrides: Mapping[str, Any] | Sequence[str] = (), *, check_trl: bool = False,
         name_run: bool = False) -> Any:
    """Algorithm ``name``'s resolved ``Config`` from a config file (or mapping) and overrides (a dotted mapping, or
    ``--field value`` tokens). For an algorithm on a TRL config, trajectories follow an ``--output_dir`` given in
    the overrides, and with ``name_run`` (a run about to start) a run that names none gets
    :func:`default_run_name`.

    Raises:
        ConfigError: an unknown algorithm or key, a bad value, an unreadable file, a missing extra.
    """
    if name not in ALGORITHMS:
        close = difflib.get_close_matches(name, list(ALGORITHMS), n=1)
        raise ConfigError(f"unknown algorithm {name!r}" + (f"; did you mean {close[0]}?" if close else "")
                          + f" (choose one of {', '.join(ALGORITHMS)})")
    try:
        module = import_train(ALGORITHMS.module_name(name))
    except ModuleNotFoundError as e:
        if e.name != ALGORITHMS.module_name(name):
            raise
        raise ConfigError(f"`toolgym train {name}` needs {e.name} (not in this install)", code=3) from None
    over = overrides if isinstance(overrides, Mapping) else parse_overrides(list(overrides))
    tf = trl_field(module.Config)
    if tf is not None:  # a bare --field naming a toolgym-section field (not a TRL one): --advantage turn_return
        import dataclasses

        own = {f.name for f in dataclasses.fields(module.Config)} - {tf[0]}
        theirs = {f.name for f in dataclasses.fields(getattr(import_train("trl"), tf[1]))}
        over = {(f"{SECTION}.{k}" if k in own and k not in theirs else k): v for k, v in over.items()}
        over = {**over, **_run_placement(module.Config, config, dict(over), name_run=name_run)}
    return resolve(module.Config, config, over, check_trl=check_trl)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolgym train`` (``argv`` without the leading ``train``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return ExitCode.OK if argv else ExitCode.USAGE
    name, rest = argv[0].replace("-", "_"), argv[1:]
    try:
        if any(t in ("-h", "--help") for t in rest):
            load(name)  # an unknown name or a missing extra is an error here too
            print(_fields_help(name))
            return ExitCode.OK
        dry = "--dry-run" in rest or "--dry_run" in rest
        rest = [t for t in rest if t not in ("--dry-run", "--dry_run")]
        over = parse_overrides(rest)
        config = over.pop("config", None)
        if config is True:
            raise ConfigError("--config needs a FILE.yaml or a shipped config's name")
        cfg = load(name, config, over, check_trl=dry, name_run=not dry)
        if dry:
            print(json.dumps({"algorithm": name, "config": as_mapping(cfg)}, default=str, sort_keys=True))
            return ExitCode.OK
        with _sigterm_raises():
            result = ALGORITHMS[name].run(cfg)
        where = f", model saved to {result.model_dir}" if result.model_dir else f", outputs in {result.output_dir}"
        print(f"toolgym train {name}: done{where}")
        return ExitCode.OK
    except CLIError as e:
        _end_tracked_runs("FAILED")
        print(f"toolgym train {name}: error: {e.message}", file=sys.stderr)
        return int(e.code)
    except KeyboardInterrupt as e:
        _end_tracked_runs("KILLED")
        if isinstance(e, Terminated):
            print(f"toolgym train {name}: terminated (SIGTERM)", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"toolgym train {name}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - one line for the user; TOOLGYM_DEBUG=1 for the traceback
        _end_tracked_runs("FAILED")
        if os.environ.get("TOOLGYM_DEBUG", "") not in ("", "0"):
            raise
        print(f"toolgym train {name}: error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        return ExitCode.FAILURE


if __name__ == "__main__":  # `accelerate launch -m trainers.cli ...`: the same quiet terminal as `toolgym train`
    from toolgym.console import configure

    configure()
    sys.exit(main())
