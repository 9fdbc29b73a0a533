"""What every ``toolgym`` subcommand module shares: the exit codes, :class:`CLIError`, env-id resolution and
env-construction errors, ``--env-kwarg`` parsing, the policy built from ``--policy``, and ``--report-to``.

:mod:`toolgym.cli` and the subcommand modules (:mod:`toolgym.cli.eval`, :mod:`toolgym.cli.bench`,
:mod:`toolgym.cli.view`) import this module; it imports none of them (dependencies point one way).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from toolgym.envs.resolve import env_construction_error, import_user_module, resolve_env_id
from toolgym.errors import CLIError, ExitCode
from toolgym.serve.access import add_ui_arguments

__all__ = [
    "CLIError",
    "ExitCode",
    "add_ui_arguments",
    "apply_run_settings",
    "check_output",
    "check_reachable",
    "check_report_to",
    "env_construction_error",
    "import_user_module",
    "load_tokenizer_arg",
    "make_policy",
    "nonnegative_float",
    "parse_env_kwargs",
    "policy_connection",
    "print_error",
    "print_placement",
    "report_backends",
    "report_summary",
    "resolve_env_id",
]


def print_error(message: str) -> None:
    """One ``toolgym: error: MESSAGE`` line on stderr."""
    print(f"toolgym: error: {message}", file=sys.stderr)


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


def check_output(path: str | Path) -> None:
    """Raise :class:`CLIError` (exit 3) unless an output file can be written at ``path`` (checked before any model
    loads; the file itself is left untouched)."""
    from toolgym.errors import OutputFileError
    from toolgym.jsonl import check_writable

    try:
        check_writable(path)
    except OutputFileError as e:  # its message names the file and why (e.g. a device, not a regular file)
        raise CLIError(e.strerror or str(e), ExitCode.INPUT) from None
    except OSError as e:
        raise CLIError(f"cannot write {path}: {e.strerror or e}", ExitCode.INPUT) from None


@contextlib.contextmanager
def policy_connection(policy: str) -> Iterator[None]:
    """Turn a connection to the ``--policy`` server lost mid-run into :class:`CLIError` (exit 4); anything else
    passes through."""
    try:
        yield
    except Exception as e:
        import aiohttp

        if isinstance(e, aiohttp.ClientConnectionError | ConnectionError):
            raise CLIError(f"lost the policy server {policy}: {e}", ExitCode.UNREACHABLE) from None
        raise


def report_backends(names: Sequence[str]) -> list[tuple[Any, list[str]]]:
    """``(module, names)`` per module providing the ``--report-to`` backends ``names`` (comma lists allowed), found
    through the ``toolgym.report_to`` entry points (:mod:`toolgym.cli.plugins`).

    Raises:
        CLIError (usage): a name no installed package provides (the message lists those that are), or a backend
            whose extra is not installed.
    """
    from toolgym.cli import plugins

    known = plugins.names(plugins.REPORT_TO)
    out: dict[int, tuple[Any, list[str]]] = {}
    for raw in names:
        for name in (n.strip().lower() for n in raw.split(",")):
            if not name:
                continue
            if name not in known:
                choices = ", ".join(known) or "none installed (pip install 'toolgym[registry]')"
                raise CLIError(f"--report-to {name!r}: choose from {choices}", ExitCode.USAGE)
            module = plugins.load(plugins.REPORT_TO, name, what=f"--report-to {name}")
            out.setdefault(id(module), (module, []))[1].append(name)
    return list(out.values())


def report_summary(args: argparse.Namespace, kind: str, summary: dict[str, Any], *, params: dict[str, Any],
                   artifacts: Sequence[str | Path] = (), documents: dict[str, Any] | None = None) -> None:
    """Send a rollout/eval summary to the ``--report-to`` backends (mlflow, tensorboard, wandb, trackio)."""
    backends = getattr(args, "report_to_checked", None)
    if not backends:
        return
    policy = str(params.get("policy", ""))
    name = f"{kind} {params.get('env_id', '')} {policy if ':/' in policy else Path(policy).name}".strip()
    where: dict[str, str] = {}
    for module, names in report_backends(backends):
        where.update(module.report_summary(names, kind=kind, run_name=name, metrics=summary, params=params,
                                           artifacts=artifacts, documents=documents))
    for backend, loc in where.items():
        print(f"reported to {backend}: {loc}", file=sys.stderr)


def check_report_to(args: argparse.Namespace) -> None:
    """Validate ``--report-to`` before any work (exit 2 unknown/not installed, 4 MLflow server unreachable)."""
    if getattr(args, "report_to", None):
        args.report_to_checked = [name for module, names in report_backends(args.report_to)
                                  for name in module.check_report_backends(names)]


def nonnegative_float(text: str) -> float:
    """argparse type: a finite float >= 0 (``--temperature``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def load_tokenizer_arg(spec: str | None) -> Any:
    """The tokenizer named by ``--tokenizer`` (``None``/``embedded``: the embedded one), or :class:`CLIError`
    (exit 3) in one line when it cannot be loaded, at once when offline (no retries against an unreachable hub)."""
    from toolgym.models import TokenizerNotFoundError, load_tokenizer

    try:
        return load_tokenizer(None if spec in (None, "embedded") else spec)
    except TokenizerNotFoundError as e:
        raise CLIError(str(e), ExitCode.INPUT) from None


def make_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(policy, tokenizer)`` for ``--policy``; the tokenizer is what the env must use (``None`` for
    ``oracle``: the env's own default tokenizer)."""
    from toolgym.models import load_model, tiny_random_model
    from toolgym.placement import describe
    from toolgym.rollout import OpenAIPolicy, TransformersPolicy

    spec: str = args.policy
    args.evaluated = {"kind": spec if spec in ("oracle", "tiny", "embedded") else "server"}
    if spec == "oracle":
        from toolgym.evaluation import oracle_policy

        return oracle_policy(), None
    if ":/" in spec and not spec.startswith(("http://", "https://")):
        # a model URI such as models:/NAME/VERSION (the registry): resolved by its `toolgym.policies` entry point
        from toolgym.cli import plugins

        scheme = spec.split(":/", 1)[0]
        if scheme in plugins.names(plugins.POLICIES):
            resolve = plugins.load(plugins.POLICIES, scheme, what=f"--policy {scheme}:/...")
            spec = str(resolve(spec))
            args.evaluated = {"kind": "server", "model_uri": args.policy}
    if spec.startswith(("http://", "https://")):
        args.evaluated["url"] = spec
        check_reachable(spec)
        tok = load_tokenizer_arg(args.tokenizer)
        policy = OpenAIPolicy(spec, model=args.model_name, temperature=args.temperature)
        return policy, tok
    processor = None
    if spec == "tiny":
        tok = load_tokenizer_arg(None)
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
        args.evaluated = {**args.evaluated, **evaluated_weights(path)}
        model, tok = load_model(path)
        processor = _own_processor(path)
    model = place_model(model, getattr(args, "device", "auto"))
    args.placement = describe(model)
    autocast = getattr(args, "autocast", None)
    policy = TransformersPolicy(model, tok, temperature=args.temperature, seed=args.seed, return_logprobs=True,
                                autocast=None if autocast in (None, "none") else autocast,
                                max_batch_size=getattr(args, "max_batch_size", None), processor=processor)
    return policy, tok


def _own_processor(path: Path) -> Any:
    """A vision-language checkpoint's processor (:func:`toolgym.processors.load_processor`, the object its envs
    get from ``env_kwargs.processor``), or ``None`` for a text model or a checkpoint saved without one."""
    from toolgym.processors import ProcessorNotFoundError, is_vision_checkpoint, load_processor

    if not is_vision_checkpoint(path):
        return None
    try:
        return load_processor(path)
    except ProcessorNotFoundError:
        return None


def evaluated_weights(path: Path) -> dict[str, Any]:
    """What a model directory or ``.gguf`` policy is, for the report to record (``toolgym eval --json``'s
    ``evaluated``; the registry ties an evaluation to a checkpoint by it): ``{"kind": "checkpoint" | "gguf",
    "path", "weights_sha256"}``. A directory's weight files are checked whole first (exit 3 naming a truncated
    one, not a load error deep in transformers)."""
    from toolgym.weights import check_weights, weights_hash

    if path.is_dir():
        files = check_weights(path)
        return {"kind": "checkpoint", "path": str(path.resolve()), "weights_sha256": weights_hash(path, files)}
    return {"kind": "gguf", "path": str(path.resolve()), "weights_sha256": weights_hash(path.parent, [path])}


def place_model(model: Any, device: str | None) -> Any:
    """``model`` on ``--device`` (:func:`toolgym.placement.place`); :class:`CLIError` (usage) for a device this
    machine does not have. The commands state the placement ("model on cuda:0, bfloat16") with their results
    (:func:`print_placement`)."""
    from toolgym.placement import DeviceError, place

    try:
        model, _ = place(model, device)
    except DeviceError as e:
        raise CLIError(str(e), ExitCode.USAGE) from None
    return model


def print_placement(args: argparse.Namespace) -> None:
    """Say on stderr where a local model policy runs ("toolgym: model on cuda:0, bfloat16"); nothing for the oracle
    or a server."""
    if getattr(args, "placement", None):
        print(f"toolgym: {args.placement}", file=sys.stderr)


def apply_run_settings(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """When ``--policy`` is a model directory carrying ``toolgym_run.json`` (:mod:`toolgym.checkpoint`), use its
    env kwargs (system prompt, chat template, ...), per-turn token budget and generation autocast dtype as
    defaults, so the checkpoint is evaluated as the run that saved it evaluated it; ``--env-kwarg``,
    ``--max-new-tokens`` and ``--autocast`` given explicitly win.
    Fills ``args.max_new_tokens`` (default 128) and ``env_kwargs`` in place; returns the settings (or ``None``)."""
    from toolgym.checkpoint import RunSettingsError, read_run_settings

    settings = None
    spec = str(getattr(args, "policy", "") or "")
    if spec and "://" not in spec and spec not in ("oracle", "embedded", "tiny") and Path(spec).expanduser().is_dir():
        try:
            settings = read_run_settings(Path(spec).expanduser())
        except RunSettingsError as e:
            raise CLIError(str(e), ExitCode.INPUT) from None
    if settings is not None:
        for key, value in settings["env_kwargs"].items():
            env_kwargs.setdefault(key, value)
        if env_kwargs.get("processor") in (True, "auto"):  # the checkpoint's own processor, saved beside it
            env_kwargs["processor"] = str(Path(spec).expanduser())
        if args.max_new_tokens is None and settings.get("max_turn_tokens"):
            args.max_new_tokens = int(settings["max_turn_tokens"])
        if getattr(args, "autocast", None) is None and settings.get("autocast"):
            args.autocast = settings["autocast"]
        keys = ", ".join(sorted(settings["env_kwargs"])) or "no env kwargs"
        ac = f"; generation in {args.autocast} autocast" if getattr(args, "autocast", None) not in (None, "none") else ""
        print(f"toolgym: using the run settings of {spec} ({keys}; {args.max_new_tokens or 128} tokens per turn{ac})",
              file=sys.stderr)
    if args.max_new_tokens is None:
        args.max_new_tokens = 128
    return settings
