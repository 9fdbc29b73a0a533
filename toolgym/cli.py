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
    toolgym registry register|attach-eval|list|promote ARGS   model registry on MLflow (trainers/registry.py)
    toolgym train grpo|rft|sft|dpo --config FILE.yaml [--FIELD VALUE ...]          (needs the [train] extra)

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
import enum
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "SERVERS", "CLIError", "ExitCode", "build_parser", "main", "summary_line"]


class ExitCode(enum.IntEnum):
    """Exit codes of the ``toolgym`` command."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    INPUT = 3
    UNREACHABLE = 4
    INTERRUPTED = 130


class CLIError(Exception):
    """A failure with a message for the user and the exit code to return."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


#: benchmark name -> (candidate script names under benchmarks/, what it measures)
BENCHMARKS: dict[str, tuple[tuple[str, ...], str]] = {
    "vector": (("vector_step.py",), "ToolVectorEnv step vs a sequential loop vs gymnasium AsyncVectorEnv"),
    "tools": (("tool_latency.py",), "per-call latency of each built-in tool, direct vs through the executor"),
    "retrieval": (("retrieval.py",), "BM25 retrieval: queries/s, local vs HTTP"),
    "rollout": (("rollout.py",), "rollout throughput: TRL native tool loop vs the toolgym adapter"),
    "mcp": (("mcp_latency.py",), "MCP call latency: stdio and streamable HTTP vs direct"),
    "sandbox": (("sandbox.py",), "sandboxed Python executions/s: warm pool vs fresh interpreter"),
    "judge": (("judge.py",), "LLM-judge throughput against a local model server"),
}

#: server name -> module with ``main(argv) -> int``
SERVERS: dict[str, tuple[str, str]] = {
    "retriever": ("toolgym.serve.retriever", "Search-R1 compatible /retrieve HTTP service (BM25)"),
    "mcp": ("toolgym.serve.mcp", "toolgym's tools as an MCP server (stdio or streamable HTTP)"),
    "model": ("toolgym.serve.model", "OpenAI-compatible /v1 completions server over a local transformers model"),
}


def _err(message: str) -> None:
    print(f"toolgym: error: {message}", file=sys.stderr)


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
    import importlib

    from toolgym.envs.registration import ENVS

    for mod in args.imports or []:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise CLIError(f"--import {mod}: {e}", ExitCode.USAGE) from None
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
# rollout
# ---------------------------------------------------------------------------------------------------------------


def resolve_env_id(name: str) -> str:
    """A registered env id from ``name``: a toolgym id in any spelling (``toolgym/Calculator-v0``,
    ``Calculator-v0``, ``calculator``), any id in Gymnasium's registry, or ``module:Env-v0`` (imports ``module``,
    which registers the env, as ``gym.make`` does; returned unchanged).

    Raises:
        CLIError (usage): unknown env or module (the message lists the registered ones).
    """
    import gymnasium as gym

    from toolgym.envs.registration import ENVS

    if name in ENVS:
        return name
    if ":" in name:
        import importlib

        mod, _, env_id = name.partition(":")
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise CLIError(f"env {name!r}: cannot import module {mod!r} ({e})", ExitCode.USAGE) from None
        if env_id not in gym.registry:
            raise CLIError(f"env {name!r}: module {mod!r} registers no env {env_id!r}", ExitCode.USAGE)
        return name
    if name in gym.registry:
        return name
    low = name.lower()
    for k in ENVS:
        short = k.split("/", 1)[-1]
        if low in (k.lower(), short.lower(), short.rsplit("-v", 1)[0].lower()):
            return k
    raise CLIError(f"unknown env {name!r}; registered envs: {', '.join(ENVS)} (see `toolgym list`; a user env: "
                   "module:Env-v0)", ExitCode.USAGE)


def env_construction_error(env_id: str, exc: BaseException) -> CLIError:
    """A one-line :class:`CLIError` for an env that could not be built: a missing/unreadable/malformed file
    (config, tasks) -> input (3); an unreachable service -> unreachable (4); a bad argument value or name ->
    usage (2); anything else -> failure (1). No raw exception-class prefixes."""
    import gymnasium as gym

    msg = str(exc).strip() or type(exc).__name__
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError | UnicodeDecodeError | json.JSONDecodeError):
        where = getattr(exc, "filename", None)
        detail = getattr(exc, "strerror", None) or msg
        return CLIError(f"{env_id}: cannot read {where}: {detail}" if where else f"{env_id}: {detail}", ExitCode.INPUT)
    if isinstance(exc, ConnectionError | TimeoutError):
        return CLIError(f"{env_id}: cannot reach a service: {msg}", ExitCode.UNREACHABLE)
    from toolgym.errors import InputFileError

    if isinstance(exc, InputFileError):
        return CLIError(f"{env_id}: {msg}", ExitCode.INPUT)
    if isinstance(exc, TypeError | ValueError | ImportError | gym.error.Error):
        return CLIError(f"bad env arguments for {env_id}: {msg}", ExitCode.USAGE)
    return CLIError(f"{env_id}: {msg}", ExitCode.FAILURE)


def parse_env_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["split=test", "max_turns=2"]`` -> ``{"split": "test", "max_turns": 2}``: values are JSON when they parse
    as JSON (numbers, booleans, lists, objects, quoted strings), else plain strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not key.strip().isidentifier():
            raise CLIError(f"--env-kwarg expects KEY=VALUE with KEY a Python identifier, got {item!r}", ExitCode.USAGE)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def check_reachable(url: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`CLIError` (unreachable) unless an HTTP server answers at ``url`` (any HTTP status counts)."""
    base = url.rstrip("/")
    probe = (base if base.endswith("/v1") else base + "/v1") + "/models"
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s) as resp:  # noqa: S310 (http(s) only, checked by caller)
            resp.read(1)
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CLIError(f"cannot reach the policy server at {url}: {reason}", ExitCode.UNREACHABLE) from None


def _trainers_module(name: str) -> Any:
    """Import ``trainers.<x>`` lazily (registry, tracking): the core never imports it at module level."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise CLIError(f"{name} is not available ({e}); install toolgym[train,registry] from a checkout",
                       ExitCode.USAGE) from None


def report_summary(args: argparse.Namespace, kind: str, summary: dict[str, Any], *, params: dict[str, Any],
                   artifacts: Sequence[str | Path] = (), documents: dict[str, Any] | None = None) -> None:
    """Send a rollout/eval summary to the ``--report-to`` backends (mlflow, tensorboard, wandb, trackio)."""
    backends = getattr(args, "report_to_checked", None)
    if not backends:
        return
    tracking = _trainers_module("trainers.tracking")
    policy = str(params.get("policy", ""))
    name = f"{kind} {params.get('env_id', '')} {policy if ':/' in policy else Path(policy).name}".strip()
    where = tracking.report_summary(backends, kind=kind, run_name=name, metrics=summary, params=params,
                                    artifacts=artifacts, documents=documents)
    for backend, loc in where.items():
        print(f"reported to {backend}: {loc}", file=sys.stderr)


def check_report_to(args: argparse.Namespace) -> None:
    """Validate ``--report-to`` before any work (exit 2 unknown/not installed, 4 MLflow server unreachable)."""
    if getattr(args, "report_to", None):
        args.report_to_checked = _trainers_module("trainers.tracking").check_report_backends(args.report_to)


def _make_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(policy, tokenizer)`` for ``--policy``; the tokenizer is what the env must use."""
    from toolgym.models import load_model, load_tokenizer, tiny_random_model
    from toolgym.rollout import OpenAIPolicy, TransformersPolicy

    spec: str = args.policy
    if spec.startswith("models:/"):  # the registry ([registry] extra), imported only for these URIs
        spec = str(_trainers_module("trainers.registry").resolve_model_uri(spec))
    if spec.startswith(("http://", "https://")):
        check_reachable(spec)
        tok = load_tokenizer(None if args.tokenizer in (None, "embedded") else args.tokenizer)
        policy = OpenAIPolicy(spec, model=args.model_name, temperature=args.temperature)
        return policy, tok
    if spec == "tiny":
        tok = load_tokenizer(None)
        model = tiny_random_model(tok, seed=args.seed or 0)
    elif spec == "embedded":
        model, tok = load_model()
    else:
        if "://" in spec:
            raise CLIError(f"--policy URL must be http:// or https://, got {spec!r}", ExitCode.USAGE)
        path = Path(spec).expanduser()
        if not path.exists():
            raise CLIError(
                f"--policy {spec!r}: no such model path (use 'embedded', 'tiny', an http(s):// URL of an "
                "OpenAI-compatible server, or a model directory / .gguf file)",
                ExitCode.INPUT,
            )
        model, tok = load_model(path)
    policy = TransformersPolicy(model, tok, temperature=args.temperature, seed=args.seed, return_logprobs=True)
    return policy, tok


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
    if args.episodes < 1:
        raise CLIError("--episodes must be >= 1", ExitCode.USAGE)
    if args.max_new_tokens < 1:
        raise CLIError("--max-new-tokens must be >= 1", ExitCode.USAGE)
    out = Path(args.out)
    check_report_to(args)
    from toolgym.eval import make_eval_vector_env
    from toolgym.jsonl import JSONLStream, check_writable

    try:
        check_writable(out)  # the file itself is replaced only once the first episode has finished
    except OSError as e:
        raise CLIError(f"cannot write {out}: {e.strerror or e}", ExitCode.INPUT) from None

    from toolgym.rollout import RolloutDriver, summarize

    policy, tok = _make_policy(args)
    env_kwargs.setdefault("tokenizer", tok)
    num_envs = args.num_envs or min(args.episodes, 8)
    try:
        venv = make_eval_vector_env(env_id, num_envs, env_kwargs)
    except Exception as e:  # noqa: BLE001 - classified into one line with its exit code
        raise env_construction_error(env_id, e) from None
    try:
        driver = RolloutDriver(venv, policy, schedule=args.schedule, max_turn_tokens=args.max_new_tokens)
        with JSONLStream(out) as stream:  # episodes are streamed as they finish: an interrupted run keeps them
            try:
                trajs = driver.run([None] * args.episodes, seeds=args.seed, progress=not args.no_progress,
                                   on_episode=lambda _k, t: stream.write(t.to_dict()))
            except Exception as e:
                import aiohttp

                if isinstance(e, aiohttp.ClientConnectionError | ConnectionError):
                    raise CLIError(f"lost the policy server {args.policy}: {e}", ExitCode.UNREACHABLE) from None
                raise
        summary = summarize(trajs)
        stats = driver.stats.to_dict()
    finally:
        venv.close()
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
# view / plot
# ---------------------------------------------------------------------------------------------------------------


def _tokenizer_for_view(spec: str) -> Any:
    if spec == "none":
        return None
    from toolgym.models import EmbeddedModelMissingError

    try:
        from toolgym.models import load_tokenizer

        return load_tokenizer(None if spec == "embedded" else spec)
    except EmbeddedModelMissingError as e:
        print(f"toolgym: warning: {e}; showing the mask view from the turn texts instead", file=sys.stderr)
        return None
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot load tokenizer {spec!r}: {e}", ExitCode.INPUT) from None


def cmd_view(args: argparse.Namespace) -> int:
    from toolgym.viewer import TrajectoryFileError, load_trajectory_rows, write_report

    src = Path(args.trajectories)
    try:
        rows = load_trajectory_rows(src)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise CLIError(f"cannot read {src}: {e.strerror or e}", ExitCode.INPUT) from None
    except (TrajectoryFileError, UnicodeDecodeError) as e:
        raise CLIError(str(e), ExitCode.INPUT) from None
    other = None
    if args.compare:
        try:
            other = load_trajectory_rows(args.compare)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            raise CLIError(f"cannot read {args.compare}: {e.strerror or e}", ExitCode.INPUT) from None
        except (TrajectoryFileError, UnicodeDecodeError) as e:
            raise CLIError(str(e), ExitCode.INPUT) from None
    tok = _tokenizer_for_view(args.tokenizer)
    title = args.title or f"toolgym trajectories — {src.name}" + (f" vs {Path(args.compare).name}" if other is not None else "")
    labels = (src.name, Path(args.compare).name) if other is not None else None
    if labels is not None and labels[0] == labels[1]:
        labels = (str(src), str(args.compare))
    try:
        path = write_report(rows, args.out, tokenizer=tok, title=title, limit=args.limit, compare=other, labels=labels)
    except OSError as e:
        raise CLIError(f"cannot write {args.out}: {e.strerror or e}", ExitCode.INPUT) from None
    shown = len(rows) if args.limit is None else min(len(rows), args.limit)
    print(f"wrote {path} ({shown} episodes)")
    return ExitCode.OK


def cmd_plot(args: argparse.Namespace) -> int:
    from toolgym import plots
    from toolgym.viewer import TrajectoryFileError

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


# ---------------------------------------------------------------------------------------------------------------
# bench / serve
# ---------------------------------------------------------------------------------------------------------------


def benchmarks_dir() -> Path | None:
    """The ``benchmarks/`` directory: ``$TOOLGYM_BENCHMARKS``, else next to the package (a source checkout),
    else under the current directory."""
    env = os.environ.get("TOOLGYM_BENCHMARKS")
    cands = [Path(env)] if env else []
    cands += [Path(__file__).resolve().parent.parent / "benchmarks", Path.cwd() / "benchmarks"]
    return next((c for c in cands if c.is_dir()), None)


def benchmark_script(name: str) -> Path:
    """The script behind ``toolgym bench NAME``.

    Raises:
        CLIError: unknown name (usage) or script not found (input).
    """
    if name not in BENCHMARKS:
        raise CLIError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}", ExitCode.USAGE)
    d = benchmarks_dir()
    if d is None:
        raise CLIError("no benchmarks/ directory found (run from a toolgym checkout or set TOOLGYM_BENCHMARKS)",
                       ExitCode.INPUT)
    for cand in BENCHMARKS[name][0]:
        if (d / cand).is_file():
            return d / cand
    raise CLIError(f"benchmark {name!r}: none of {', '.join(BENCHMARKS[name][0])} in {d}", ExitCode.INPUT)


_RATIO = re.compile(r"\bratio\b|\bspeed-?up\b|\b\d+(?:\.\d+)?x\b|\bx vs\b", re.IGNORECASE)
_TABLE_HEAD = re.compile(r"\bratio\b|\bvs\b|\w/\w|\bspeed-?up\b|\bx vs\b", re.IGNORECASE)


def _is_table_header(s: str) -> bool:
    return bool(_TABLE_HEAD.search(s)) and (s.startswith("|") or len(re.findall(r"\S\s{2,}\S", s)) >= 2)


def ratio_lines(lines: Sequence[str]) -> list[str]:
    """The lines of a benchmark's output that state ratios: lines naming a ratio / speed-up / ``N.Nx``, and whole
    tables (up to the next blank line) whose header has a ratio column (``ratio``, ``vs``, ``a/b``)."""
    out: list[str] = []
    in_table = False
    for line in lines:
        s = line.rstrip()
        if not s.strip():
            in_table = False
            continue
        if in_table:
            out.append(s)
        elif s.lstrip().startswith(("{", "[")):
            continue
        elif _is_table_header(s.strip()):
            in_table = True
            out.append(s)
        elif _RATIO.search(s):
            out.append(s)
    return out


def run_benchmark(name: str, extra: Sequence[str]) -> int:
    """Run ``benchmarks/<script>`` with ``extra`` args in this interpreter, stream its output, then repeat the
    lines that state ratios. Returns 0, or 1 when the script fails."""
    script = benchmark_script(name)
    repo = script.parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, str(script), *extra]
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=str(repo), bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        _err(f"benchmark {name} ({script.name}) exited with status {rc} after {wall:.0f} s")
        return ExitCode.FAILURE
    if any(a in ("-h", "--help") for a in extra):
        return ExitCode.OK  # the script printed its help; there are no results to summarise
    summary = summary_line(lines)
    if summary is not None:
        ratios = summary.get("ratios") or {}
        if ratios:
            print(f"\n== {name}: ratios ==")
            width = max(len(str(k)) for k in ratios)
            for k, v in ratios.items():
                print(f"{k:<{width}}  {v:.2f}x" if isinstance(v, int | float) else f"{k:<{width}}  {v}")
            for k, v in (summary.get("units") or {}).items():
                print(f"  ({k}: {v})")
    else:  # a script without a summary line: repeat the lines that state ratios
        ratios_text = ratio_lines(lines)
        if ratios_text:
            print(f"\n== {name}: ratios ==")
            for r in ratios_text:
                print(r)
    print(f"\n{name}: done in {wall:.0f} s ({script.name})")
    return ExitCode.OK


def summary_line(lines: Sequence[str]) -> dict[str, Any] | None:
    """The benchmark's JSON summary: the last stdout line that is a JSON object with a ``toolgym_bench`` key
    (``{"toolgym_bench": NAME, "ratios": {label: x}, "units": {...}, "results": {...}}``), or ``None``."""
    for line in reversed(lines):
        s = line.strip()
        if s.startswith("{") and '"toolgym_bench"' in s:
            try:
                obj = json.loads(s)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def run_server(name: str, extra: Sequence[str]) -> int:
    """Dispatch ``toolgym serve NAME ARGS`` to ``toolgym.serve.<name>.main(ARGS)``."""
    import importlib

    if name not in SERVERS:
        raise CLIError(f"unknown server {name!r}; choose from {', '.join(SERVERS)}", ExitCode.USAGE)
    try:
        mod = importlib.import_module(SERVERS[name][0])
    except ImportError as e:
        raise CLIError(f"server {name!r} is not available: {e}", ExitCode.FAILURE) from None
    rc = mod.main(list(extra))
    return int(rc or 0)


# ---------------------------------------------------------------------------------------------------------------
# parser and main
# ---------------------------------------------------------------------------------------------------------------

_EPILOG = """exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 file missing/unreadable/malformed or unwritable,
4 service unreachable, 130 interrupted. TOOLGYM_DEBUG=1 prints tracebacks."""


def build_parser() -> argparse.ArgumentParser:
    """The ``toolgym`` argument parser (``bench`` / ``serve`` forward their remaining arguments)."""
    from toolgym import __version__
    from toolgym.cli_eval import add_parser as add_eval_parser
    from toolgym.cli_eval import add_run_args

    p = argparse.ArgumentParser(
        prog="toolgym", description="Token-level Gymnasium environments for training LLMs to use tools.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"toolgym {__version__}")
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
                   help="'embedded' (SmolLM2-135M), 'tiny' (tiny random model), an http(s):// URL of an "
                        "OpenAI-compatible server (vLLM, `toolgym serve model`), or a model path")
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

    s = sub.add_parser("view", help="write a self-contained HTML report of a trajectory file", epilog=_EPILOG)
    s.add_argument("trajectories", help="trajectory JSONL (one Trajectory.to_dict() per line)")
    s.add_argument("--out", default="report.html")
    s.add_argument("--tokenizer", default="embedded",
                   help="decodes token ids for the loss-mask view: 'embedded', 'none' (use turn texts), or a path")
    s.add_argument("--limit", type=int, default=None, help="only the first N episodes (of each file)")
    s.add_argument("--compare", default=None, metavar="B.jsonl",
                   help="a second trajectory file (e.g. after training), compared with the first per task")
    s.add_argument("--title", default=None)
    s.set_defaults(func=cmd_view)

    s = sub.add_parser("plot", help="PNG plots: training curves or tool-latency histograms", epilog=_EPILOG)
    s.add_argument("kind", choices=["curves", "latency"])
    s.add_argument("inputs", nargs="+", help="curves: training log(s) (JSONL rows, trainer_state.json, demo "
                   "metrics.json; several are overlaid, one line per run); latency: trajectory JSONL file(s) or a {tool: [seconds]} JSON file")
    s.add_argument("--out", required=True, help="PNG to write")
    s.add_argument("--metrics", default="reward,success,tool_call_rate", help="curves: comma-separated metrics")
    s.add_argument("--smooth", type=int, default=1, help="curves: moving-average window")
    s.add_argument("--title", default=None)
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("bench", help="run a benchmark script from benchmarks/ (extra args are forwarded)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in BENCHMARKS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(BENCHMARKS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark script")

    s = sub.add_parser("serve", help="start a service (extra args are forwarded; NAME --help lists them)",
                       description="\n".join(f"  {k:<10} {v[1]}" for k, v in SERVERS.items()),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("name", choices=list(SERVERS))
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the server")

    s = sub.add_parser("registry", help="model registry on MLflow: register, attach-eval, list, promote "
                       "(`toolgym registry --help`)", add_help=False)
    s.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the registry")
    s = sub.add_parser("train", help="train with TRL: grpo, rft, sft or dpo (`toolgym train grpo --help`)",
                       description="toolgym train {grpo,rft,sft,dpo} --config FILE.yaml [--FIELD VALUE ...]: see "
                                   "docs/training.md (needs the [train] extra)")
    s.add_argument("algorithm", choices=["grpo", "rft", "sft", "dpo"])
    s.add_argument("args", nargs=argparse.REMAINDER, help="--config FILE.yaml and field overrides")
    return p


def run_train(argv: list[str]) -> int:
    """``toolgym train ...``: hand ``argv`` to ``trainers.cli.main``, imported here so the core never imports
    ``trainers`` at module level; a missing ``[train]`` extra is a one-line error (exit 3)."""
    import importlib

    try:
        trainers_cli = importlib.import_module("trainers.cli")
    except ModuleNotFoundError as e:
        raise CLIError(f"`toolgym train` needs the [train] extra (missing module {e.name!r}): "
                       "pip install 'toolgym[train]'", ExitCode.INPUT) from None
    return int(trainers_cli.main(argv))


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["registry"]:  # trainers/registry.py owns its arguments
        return int(_trainers_module("trainers.registry").main(argv[1:]))
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
    debug = os.environ.get("TOOLGYM_DEBUG", "") not in ("", "0")
    try:
        return _dispatch(argv)
    except CLIError as e:
        if debug:
            raise
        _err(e.message)
        return int(e.code)
    except KeyboardInterrupt:
        _err("interrupted")
        return ExitCode.INTERRUPTED
    except SystemExit as e:  # argparse (2) and --help/--version (0)
        code = e.code
        return code if isinstance(code, int) else (ExitCode.OK if code is None else ExitCode.USAGE)
    except Exception as e:  # noqa: BLE001 - the command line reports, it does not crash
        if debug:
            raise
        _err(f"{type(e).__name__}: {e}")
        return ExitCode.FAILURE


if __name__ == "__main__":  # `python -m toolgym.cli`: run the importable module, so that its CLIError class is
    from toolgym.cli import main as _main  # the one that trainers/ (registry, tracking) raise

    sys.exit(_main())
