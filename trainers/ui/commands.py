"""What the web UI's buttons run: the exact ``toolgym`` command lines (argument lists for
``python -m toolgym.cli``, never a shell line) for training, evaluation and the registry, the training form (a
config's own fields with their help texts), the runs of the MLflow store, and the confinement of every path to the
UI's runs directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
import subprocess
import sys
import typing
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from trainers.ui.playground import UIError, safe_name

__all__ = ["CONFIG_DIR", "RUN_STATUS", "algorithms", "compare_labels", "config_fields", "configs", "display",
           "eval_argv", "inside", "registry", "run_metrics", "runs_diff", "runs_table", "step_budget", "toolgym_argv",
           "train_argv"]

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
"""``trainers/configs/``: the shipped configurations the Train page offers."""

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def toolgym_argv(*args: str) -> list[str]:
    """``toolgym ARGS`` as an argument list run with this interpreter (``python -m toolgym.cli``)."""
    return [sys.executable, "-m", "toolgym.cli", *args]


def display(argv: Sequence[str]) -> str:
    """The command as a user would type it: ``toolgym ...`` (shell-quoted for reading, never run by a shell)."""
    args = list(argv)
    if args[1:3] == ["-m", "toolgym.cli"]:
        args = ["toolgym", *args[3:]]
    return shlex.join(args)


def inside(runs: Path, path: str, *, must_exist: bool = True, what: str = "file") -> Path:
    """``path`` (relative to ``runs``, or absolute) resolved, and refused unless it lies inside ``runs``."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise UIError(f"give a {what} path inside the runs directory")
    root = runs.resolve()
    p = Path(path.strip())
    p = (p if p.is_absolute() else root / p).resolve()
    if not p.is_relative_to(root):
        raise UIError(f"{what} {path!r} is outside the runs directory {root}")
    if must_exist and not p.exists():
        raise UIError(f"{what} {p.relative_to(root)} does not exist in the runs directory")
    return p


# ---------------------------------------------------------------------------------------------------------------
# Train
# ---------------------------------------------------------------------------------------------------------------


def algorithms() -> list[str]:
    """The algorithm names ``toolgym train`` accepts: ``trainers.ALGORITHMS`` (nothing imported)."""
    import trainers

    return list(trainers.ALGORITHMS)


def configs() -> list[dict[str, str]]:
    """The ``toolgym train`` configs of ``trainers/configs/`` with their algorithm: the file name's first word when
    it names one, else the first algorithm its header comment names (``GRPO``, ``toolgym train sft``). Launch
    files (``accelerate_*``) and configs of no algorithm (the demo's) are left out."""
    algos = algorithms()
    out = []
    for p in sorted(CONFIG_DIR.glob("*.yaml")):
        first = p.stem.split("_", 1)[0]
        algo = first if first in algos else ""
        if not algo and not p.name.startswith("accelerate_"):
            head = " ".join(ln for ln in p.read_text(encoding="utf-8").splitlines()[:8] if ln.startswith("#"))
            words = re.findall(r"[a-z_]+", head.lower())
            algo = next((w for w in words if w in algos), "")
        if algo:
            out.append({"name": p.name, "algorithm": algo})
    return out


def _config_path(name: str) -> Path:
    if name not in {c["name"] for c in configs()}:
        raise UIError(f"unknown config {name!r}; pick one of trainers/configs/")
    return CONFIG_DIR / name


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v and k == "toolgym":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _docstring_helps(cls: type) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section."""
    doc = cls.__doc__ or ""
    out: dict[str, str] = {}
    if "Attributes:" not in doc:
        return out
    key = None
    for line in doc.split("Attributes:", 1)[1].splitlines():
        m = re.match(r"\s{4,12}([A-Za-z_]\w*)(?: \(.*?\))?: (.*)", line)
        if m:
            key = m.group(1)
            out[key] = m.group(2).strip()
        elif key and line.strip():
            out[key] += " " + line.strip()
        elif not line.strip() and key:
            key = None
    return out


def _helps(cls: Any, prefix: str = "", depth: int = 0) -> dict[str, str]:
    """Dotted field name -> help text of a dataclass (``metadata["help"]``, else its docstring), nested
    dataclass fields included."""
    if not dataclasses.is_dataclass(cls) or depth > 2:
        return {}
    doc = _docstring_helps(cls)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - unresolved annotations: no nesting
        hints = {}
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        text = f.metadata.get("help") if isinstance(f.metadata, Mapping) else None
        out[prefix + f.name] = str(text or doc.get(f.name, "")).strip()
        sub = hints.get(f.name)
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            out.update(_helps(sub, f"{prefix}{f.name}.", depth + 1))
    return out


def _contract_config(algorithm: str) -> Any:
    """``trainers.ALGORITHMS[algorithm].Config`` (cheap: no torch/TRL import), or ``None`` for an unknown name."""
    import trainers

    return trainers.config_class(algorithm) if algorithm in trainers.ALGORITHMS else None


@cache
def field_helps(algorithm: str) -> dict[str, str]:
    """Help text of every config field of ``algorithm``, under the key a config file and the command line use:
    with the contract, a ``Config`` with a ``trl`` field (``metadata["trl_config"]``) has TRL's fields at the top
    and its own under ``toolgym.``; any other ``Config``'s fields are top-level."""
    out: dict[str, str] = {}
    try:
        cfg = _contract_config(algorithm)
        if cfg is not None:
            fields = dataclasses.fields(cfg)
            trl_field = next((f for f in fields if "trl_config" in f.metadata), None)
            if trl_field is not None:  # TRL's own help texts (this imports trl once, cached)
                out.update(_helps(getattr(importlib.import_module("trl"), trl_field.metadata["trl_config"])))
            prefix = "toolgym." if trl_field is not None else ""
            out.update({f"{prefix}{k}": v for k, v in _helps(cfg).items() if k != getattr(trl_field, "name", None)})
    except Exception:  # noqa: BLE001 - no help texts is not worth refusing the form
        pass
    return out


def _output_keys(algorithm: str) -> tuple[str, str | None]:
    """The config keys of an algorithm's output directory and trajectory directory (``None``: it has none)."""
    cfg = _contract_config(algorithm)
    if cfg is None:
        raise UIError(f"unknown algorithm {algorithm!r}")
    names = {f.name for f in dataclasses.fields(cfg)}
    has_trl = any("trl_config" in f.metadata for f in dataclasses.fields(cfg))
    traj = ("toolgym.trajectory_dir" if has_trl else "trajectory_dir") if "trajectory_dir" in names else None
    return "output_dir", traj


def config_fields(name: str) -> dict[str, Any]:
    """A config's fields for the form: ``{"name", "algorithm", "fields": [{"key", "value", "help"}]}``; values as
    the command line writes them (YAML flow scalars)."""
    import yaml

    path = _config_path(name)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UIError(f"cannot read {name}: {e}") from None
    algo = next((c["algorithm"] for c in configs() if c["name"] == name), "")
    from trainers.ui.form import field_kinds

    helps = field_helps(algo) if algo else {}
    kinds = field_kinds(algo) if algo else {}
    fields = [{"key": k, "value": _flow(v), "help": helps.get(k, ""), "kind": kinds.get(k, {"type": "text"})}
              for k, v in _flatten(data).items()]
    return {"name": name, "algorithm": algo, "fields": fields, "needs_gpu": gpu_need(data)}


def gpu_need(data: Mapping[str, Any]) -> str:
    """Why a config wants a GPU (``""``: it does not): ``use_cpu`` not set and bf16/fp16, vLLM or DeepSpeed on."""
    if data.get("use_cpu") is True:
        return ""
    why = [k for k in ("bf16", "fp16", "use_vllm") if data.get(k) is True]
    why += ["deepspeed"] if data.get("deepspeed") else []
    return ", ".join(why)


def has_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU (its driver's ``/proc`` entries; no torch import)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def _flow(v: Any) -> str:
    import yaml

    if v is None:
        return "null"
    if isinstance(v, str):
        return v
    return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def free_run_name(runs: Path, base: str, taken: Collection[str] = ()) -> str:
    """``base``, or ``base-2``, ``base-3``, ...: the first name whose ``<runs>/<name>`` does not exist yet and
    that is not in ``taken`` (the run names of the UI's jobs, whose directories may not be written yet)."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", base).strip(".-")[:56] or "run"
    name, k = base, 1
    while (runs / name).exists() or name in taken:
        k += 1
        name = f"{base}-{k}"
    return name


def train_argv(runs: Path, algorithm: str, config: str, overrides: Mapping[str, Any], run_name: str, *,
               fresh: bool = False) -> list[str]:
    """``toolgym train ALGO --config FILE --key value ...`` with the output (and GRPO's trajectories) under
    ``<runs>/<run_name>``, and the run named ``run_name`` in the tracker (``--run_name``, where the algorithm has
    it, unless a field sets it). Keys are dotted identifiers; values are single arguments (never split, never a
    shell). With ``fresh``, an output directory that already holds files is refused (a launch never writes over
    another run's checkpoints)."""
    if algorithm not in algorithms():
        raise UIError(f"unknown algorithm {algorithm!r}; one of {', '.join(algorithms())}")
    path = _config_path(config)
    run_name = safe_name(run_name, "run name")
    argv = toolgym_argv("train", algorithm, "--config", str(path))
    out_key, traj_key = _output_keys(algorithm)
    for key, value in overrides.items():
        key = str(key).strip()
        if not _KEY.fullmatch(key):
            raise UIError(f"bad field name {key!r}")
        if key in (out_key, traj_key, "config", "output_dir", "toolgym.trajectory_dir"):
            continue  # the UI places outputs inside the runs directory
        text = "" if value is None else str(value)
        if text.startswith("--") or "\0" in text:
            raise UIError(f"--{key}: a value may not start with '--'")
        argv += [f"--{key}", text]
    out = inside(runs, run_name, must_exist=False, what="output directory")
    if fresh and out.is_dir() and any(out.iterdir()):
        raise UIError(f"run name {run_name!r} is taken: {out} already holds a run; pick another name "
                      f"(e.g. {free_run_name(runs, run_name)!r})")
    if "run_name" not in overrides and "run_name" in field_helps(algorithm):
        argv += ["--run_name", run_name]
    argv += [f"--{out_key}", str(out)]
    if traj_key is not None:
        argv += [f"--{traj_key}", str(out / "trajectories")]
    return argv


def step_budget(argv: Sequence[str]) -> int | None:
    """The number of optimizer steps a ``toolgym train`` command will run: its last ``--max_steps``, else its
    ``--config`` file's ``max_steps``; ``None`` when neither sets a positive one (an epoch budget)."""
    args = list(argv)

    def last(name: str) -> str | None:
        found = [args[i + 1] for i in range(len(args) - 1) if args[i] == name]
        return found[-1] if found else None

    value: Any = last("--max_steps")
    if value is None and last("--config"):
        from trainers.runconfig import read_config

        try:
            value = read_config(str(last("--config"))).get("max_steps")
        except Exception:  # noqa: BLE001 - no budget shown is not worth failing the job view
            return None
    try:
        steps = int(value)
    except (TypeError, ValueError):
        return None
    return steps if steps > 0 else None


def eval_argv(runs: Path, checkpoint: str, env: str, split: str, tasks: str, name: str) -> tuple[list[str], Path]:
    """``toolgym eval ENV --policy CKPT --split S --tasks T --json --out <runs>/<name>/eval.jsonl``; returns the
    arguments and the trajectory file (the summary JSON is the log's last line)."""
    policy = checkpoint.strip()
    if policy not in ("oracle", "tiny", "embedded"):
        policy = str(inside(runs, checkpoint, what="checkpoint"))
    for label, v in (("env", env), ("split", split), ("tasks", tasks)):
        if not v or not re.fullmatch(r"[A-Za-z0-9_./:-]{1,200}", v.strip()) or v.strip().startswith("-"):
            raise UIError(f"bad {label} {v!r}")
    out = inside(runs, safe_name(name, "evaluation name"), must_exist=False) / "eval.jsonl"
    argv = toolgym_argv("eval", env.strip(), "--policy", policy, "--split", split.strip(), "--tasks", tasks.strip(),
                        "--json", "--no-progress", "--out", str(out))
    return argv, out


def play_argv(runs: Path, policy: str, env: str, split: str, seed: int) -> tuple[list[str], Path]:
    """One episode: ``toolgym eval ENV --policy P --split S --tasks 1 --seed N --num-envs 1 --out FILE``, its
    trajectory written under ``<runs>/ui/play/``; returns the arguments and the trajectory file."""
    import secrets
    import time

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise UIError(f"bad seed {seed!r}: a whole number from 0")
    argv, _ = eval_argv(runs, policy, env, split, "1", "play")
    out = runs / "ui" / "play" / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.jsonl"
    argv[argv.index("--out") + 1] = str(out)
    argv[argv.index("--tasks"):argv.index("--tasks")] = ["--seed", str(seed), "--num-envs", "1"]
    return argv, out


# ---------------------------------------------------------------------------------------------------------------
# Registry: `toolgym registry ...` run to completion (seconds), its one-line error shown as it is
# ---------------------------------------------------------------------------------------------------------------


def registry(runs: Path, action: str, fields: Mapping[str, Any], env: Mapping[str, str],
             timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``toolgym registry ACTION ...`` (register / promote / list) and return ``{"ok", "rc", "command",
    "result", "error"}``; a refused promotion is ``ok: False`` with the registry's reason."""
    if action == "register":
        argv = toolgym_argv("registry", "register", str(inside(runs, str(fields.get("checkpoint", "")),
                                                                what="checkpoint")),
                            "--name", safe_name(str(fields.get("name", "")), "model name"), "--json")
        if str(fields.get("eval", "")).strip():
            argv[-1:-1] = ["--eval", str(inside(runs, str(fields["eval"]), what="evaluation file"))]
    elif action == "promote":
        version = str(fields.get("version", "")).strip()
        if not version.isdigit():
            raise UIError(f"bad version {version!r}: a number")
        argv = toolgym_argv("registry", "promote", safe_name(str(fields.get("name", "")), "model name"), version,
                            "--json")
        reason = str(fields.get("reason", "") or "").strip()
        if fields.get("force"):
            if not reason:
                raise UIError("a forced promotion needs a reason")
            argv += ["--force", "--reason", reason]
    elif action == "list":
        argv = toolgym_argv("registry", "list", safe_name(str(fields.get("name", "")), "model name"), "--json")
    else:
        raise UIError(f"unknown registry action {action!r}")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=dict(env), check=False,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise UIError(f"`{display(argv)}` did not finish in {timeout_s:.0f} s") from None
    import json

    result = None
    lines = p.stdout.strip().splitlines()
    if p.returncode == 0 and lines:
        try:
            result = json.loads(p.stdout)
        except json.JSONDecodeError:
            try:
                result = json.loads(lines[-1])
            except json.JSONDecodeError:
                result = lines[-1]
    err = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return {"ok": p.returncode == 0, "rc": p.returncode, "command": display(argv), "result": result,
            "error": err[-1] if err and p.returncode else None}


# ---------------------------------------------------------------------------------------------------------------
# Runs: the MLflow store
# ---------------------------------------------------------------------------------------------------------------

RUN_METRICS = ("reward", "toolgym/success", "toolgym/tool_call_rate", "loss")


def _client(uri: str) -> Any:
    try:
        import mlflow
    except ImportError:
        raise UIError("the Runs page needs the [registry] extra (mlflow)") from None
    from toolgym.errors import CLIError
    from trainers.tracking import ensure_store, store_lock

    try:
        with store_lock(uri):
            ensure_store(uri)  # a store left half-created by a killed process is rebuilt (when it holds no data)
    except CLIError as e:
        raise UIError(e.message) from None
    return mlflow.MlflowClient(uri)


RUN_STATUS = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "stopped", "RUNNING": "running",
              "SCHEDULED": "scheduled"}
"""MLflow's run status -> the word the Runs page shows."""


def _shown_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k in RUN_METRICS or k.startswith("toolgym/")}


def runs_table(uri: str, limit: int = 100, ended: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Runs of every experiment of the store, newest first: id, name, experiment, status (:data:`RUN_STATUS`;
    ``ended`` overrides it by run id: a run whose UI job was stopped reads ``stopped``, though the trainer closed
    it ``FINISHED``), start, metrics, the number of parameters."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    client = _client(uri)
    try:
        exps = client.search_experiments()
        runs = client.search_runs([e.experiment_id for e in exps], max_results=limit,
                                  order_by=["attributes.start_time DESC"]) if exps else []
    except Exception as e:  # noqa: BLE001 - an unreachable/broken store is a message
        raise UIError(f"cannot read the MLflow store: {type(e).__name__}: {str(e)[:300]}") from None
    names = {e.experiment_id: e.name for e in exps}
    ended = ended or {}
    return [{"id": r.info.run_id, "name": r.info.run_name, "experiment": names.get(r.info.experiment_id, ""),
             "status": ended.get(r.info.run_id) or RUN_STATUS.get(r.info.status, r.info.status.lower()),
             "start": r.info.start_time, "metrics": _shown_metrics(r.data.metrics), "n_params": len(r.data.params),
             "tags": {k: v for k, v in r.data.tags.items() if k.startswith("toolgym.")}}
            for r in runs]


def runs_diff(uri: str, run_ids: Sequence[str]) -> dict[str, Any]:
    """Runs side by side over the union of their parameters: ``{"runs": [{"id", "name"}], "metrics": [{"key",
    "values"}], "differ": [{"key", "values"}], "same": [{"key", "value"}]}``; ``values`` in the order of
    ``run_ids``, ``None`` where a run does not have the parameter (a missing one counts as differing); keys
    sorted in each list."""
    ids = list(dict.fromkeys(run_ids))
    if not 2 <= len(ids) <= 8 or not all(re.fullmatch(r"[0-9a-f]{8,64}", i or "") for i in ids):
        raise UIError(f"compare 2 to 8 runs by id, got {list(run_ids)!r}")
    client = _client(uri)
    try:
        runs = [client.get_run(i) for i in ids]
    except Exception as e:  # noqa: BLE001
        raise UIError(f"cannot read the runs: {type(e).__name__}: {str(e)[:300]}") from None
    params = [r.data.params for r in runs]
    metrics = [_shown_metrics(r.data.metrics) for r in runs]
    differ, same = [], []
    for key in sorted(set().union(*params)):
        values = [p.get(key) for p in params]
        if len(set(values)) == 1:
            same.append({"key": key, "value": values[0]})
        else:
            differ.append({"key": key, "values": values})
    return {"runs": [{"id": r.info.run_id, "name": r.info.run_name} for r in runs],
            "metrics": [{"key": k, "values": [m.get(k) for m in metrics]} for k in sorted(set().union(*metrics))],
            "differ": differ, "same": same}


def compare_labels(runs: Path, a: Path, b: Path) -> tuple[str, str]:
    """Names that tell two compared files apart: the shortest trailing parts of their paths (relative to
    ``runs``) that differ (``eval_before.jsonl`` / ``eval_after_grpo.jsonl``, ``run-a/trajectories/eval.jsonl`` /
    ``run-b/...``); one file twice is ``A: name`` / ``B: name``."""
    root = runs.resolve()
    pa, pb = (p.relative_to(root).parts if p.is_relative_to(root) else p.parts for p in (a, b))
    if pa == pb:
        return f"A: {pa[-1]}", f"B: {pb[-1]}"
    for k in range(1, max(len(pa), len(pb)) + 1):
        la, lb = "/".join(pa[-k:]), "/".join(pb[-k:])
        if la != lb:
            return la, lb
    return "/".join(pa), "/".join(pb)


def run_metrics(uri: str, run_id: str) -> dict[str, list[list[float]]]:
    """``{metric: [[step, value], ...]}`` of one run (the curves the page overlays)."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", run_id or ""):
        raise UIError(f"bad run id {run_id!r}")
    client = _client(uri)
    try:
        run = client.get_run(run_id)
        keys = [k for k in run.data.metrics if k in RUN_METRICS or k.startswith("toolgym/")]
        return {k: [[float(m.step), float(m.value)] for m in client.get_metric_history(run_id, k)] for k in keys}
    except Exception as e:  # noqa: BLE001
        raise UIError(f"cannot read run {run_id}: {type(e).__name__}: {str(e)[:300]}") from None
