"""Experiment tracking on MLflow (and TensorBoard / W&B / trackio for evaluation summaries).

Where runs go:

* nothing configured: an embedded SQLite store, ``sqlite:///<cwd>/runs/mlflow.db``, artifacts under
  ``runs/mlartifacts`` (no server to start);
* ``MLFLOW_TRACKING_URI`` set: that store, typically a real ``mlflow server`` shared by a team and by several
  training nodes (probed first: an unreachable server is one clear error, not minutes of retries).

Training: :class:`ToolgymMLflowCallback` rides along with transformers' own ``MLflowCallback`` (``report_to:
mlflow``), which logs the TRL config and every logged metric per step (the ``toolgym/*`` ones come through TRL's
``log_metric``). The callback adds the toolgym config as ``toolgym.*`` params, tags the run with the env id, task
split, toolgym version, base model and config hash, writes the lineage file ``toolgym_run.json`` next to every
saved model (``toolgym registry register`` reads it) and uploads the trajectory files as artifacts at the end.

Evaluation / rollout summaries: :func:`report_summary` writes one summary to each requested backend.

Needs the ``toolgym[registry]`` extra (``mlflow``); ``tensorboard``, ``wandb`` and ``trackio`` are used where
installed. Nothing here is imported by the ``toolgym`` core at module level.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.errors import CLIError, ExitCode
from trainers.tracking.store import ensure_store, store_lock

try:  # a real TrainerCallback when transformers is there (always, with the [train] extra)
    from transformers import TrainerCallback as _CallbackBase
except ImportError:  # pragma: no cover - the tracking helpers still work for eval summaries
    _CallbackBase = object  # type: ignore[assignment,misc]

__all__ = [
    "EXPERIMENT",
    "LINEAGE_FILE",
    "REPORT_BACKENDS",
    "ReportTo",
    "ToolgymMLflowCallback",
    "TrackingError",
    "check_report_backends",
    "config_hash",
    "configure_mlflow",
    "end_active_runs",
    "ensure_store",
    "experiment_name",
    "mlflow_callbacks",
    "report_summary",
    "store_lock",
    "tracking_uri",
]

EXPERIMENT = "toolgym"
"""The MLflow experiment training and evaluation runs go to (``MLFLOW_EXPERIMENT_NAME`` overrides it)."""

LINEAGE_FILE = "toolgym_run.json"
"""Written into every saved model directory of a tracked training run: run id, tracking URI, env, split, base
model, config hash, toolgym version."""

REPORT_BACKENDS: dict[str, str] = {
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trackio": "trackio",
}
"""``--report-to`` name -> the Python package it needs."""


class TrackingError(CLIError):
    """A tracking failure with the ``toolgym`` exit code to return (2 usage, 3 input, 4 unreachable)."""


def runs_dir() -> Path:
    """``<cwd>/runs``: where the embedded store and local logs live."""
    return Path.cwd() / "runs"


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else the embedded SQLite store under ``runs/``."""
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    return f"sqlite:///{runs_dir() / 'mlflow.db'}"


def check_server(uri: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`TrackingError` (exit 4) unless an HTTP tracking server answers at ``uri``; other URIs
    (sqlite, file) pass."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as resp:  # noqa: S310
            resp.read(1)
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingError(f"cannot reach the MLflow tracking server at {uri}: {reason}",
                            ExitCode.UNREACHABLE) from None


def _require_mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise TrackingError("MLflow is not installed: pip install 'toolgym[registry]'", ExitCode.USAGE) from None
    return mlflow


def experiment_name() -> str:
    """``MLFLOW_EXPERIMENT_NAME`` when set, else :data:`EXPERIMENT`."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT


def configure_mlflow(experiment: str | None = None) -> str:
    """Point MLflow at :func:`tracking_uri` (checked reachable) and select ``experiment`` (created on first use;
    in the embedded store its artifacts go under ``runs/mlartifacts``). Returns the tracking URI."""
    mlflow = _require_mlflow()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # stdout stays for --json
    from trainers.tracking.store import (
        StoreReadOnlyError,
        check_store_writable,
        local_store_path,
    )

    uri = tracking_uri()
    check_server(uri)
    try:
        check_store_writable(uri)
        read_only: StoreReadOnlyError | None = None
    except StoreReadOnlyError as e:  # reading works (list, models:/ URIs); anything that must write says so
        read_only = e
        if not (local_store_path(uri) or Path("/")).exists():
            raise
    name = experiment or experiment_name()
    # one process at a time sets up a fresh store (schema migrations) and creates the experiment
    with store_lock(uri):
        if uri.startswith("sqlite:///") and read_only is None:
            runs_dir().mkdir(parents=True, exist_ok=True)
            ensure_store(uri)  # a fresh store appears whole or not at all; a half-created one is rebuilt
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient(uri)
        if client.get_experiment_by_name(name) is None:
            if read_only is not None:
                raise read_only
            location = (runs_dir() / "mlartifacts").as_uri() if uri.startswith("sqlite:///") else None
            try:
                client.create_experiment(name, artifact_location=location)
            except mlflow.exceptions.MlflowException:
                if client.get_experiment_by_name(name) is None:  # not a create race: a real failure
                    raise
        mlflow.set_experiment(name)
    return uri


def config_hash(config: Mapping[str, Any]) -> str:
    """A short stable hash (12 hex digits of SHA-256) of a JSON-serialisable config mapping (keys sorted;
    non-JSON values by ``str``)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    return dict(vars(obj))


class ToolgymMLflowCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """Adds toolgym's config, tags, lineage file and trajectory artifacts to the MLflow run that transformers'
    ``MLflowCallback`` opens (``report_to: mlflow``). Must come after it in the callback list (user callbacks
    do). Rank 0 only.

    Args:
        toolgym_config: the ``toolgym:`` section (a dataclass or mapping); logged as ``toolgym.<key>`` params.
        trainer_config: the TRL config (for the config hash; its fields are logged by transformers).
        env_id / split / base_model: run tags (``split`` defaults to ``env_kwargs["split"]`` or ``"train"``).
        trajectory_dir: uploaded as ``trajectories/`` artifacts when training ends.
    """

    def __init__(self, toolgym_config: Any, trainer_config: Any = None, *, env_id: str | None = None,
                 split: str | None = None, base_model: str | None = None,
                 trajectory_dir: str | os.PathLike[str] | None = None) -> None:
        from toolgym import __version__

        tg = {k: v for k, v in _as_dict(toolgym_config).items() if k != "trl"}  # trl: the trainer config
        self.toolgym_config = tg
        env_kwargs = {k: v for k, v in dict(tg.get("env_kwargs") or {}).items() if k != "tokenizer"}
        self.env_id = env_id or tg.get("env_id") or "unknown"
        self.split = split or str(env_kwargs.get("split", "train"))
        self.base_model = base_model or tg.get("model") or "embedded:SmolLM2-135M-Instruct"
        traj = trajectory_dir if trajectory_dir is not None else tg.get("trajectory_dir")
        self.trajectory_dir = Path(traj) if traj else None
        trl = {k: v for k, v in _as_dict(trainer_config).items()
               if not k.startswith("_") and k not in ("output_dir", "logging_dir", "report_to", "run_name",
                                                      "hub_token", "push_to_hub_token")}
        self.config_hash = config_hash({"toolgym": {**tg, "env_kwargs": env_kwargs}, "trl": trl})
        self.version = __version__
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    def lineage(self) -> dict[str, Any]:
        """What ``toolgym_run.json`` holds."""
        return {"training_run_id": self.run_id, "tracking_uri": self.tracking_uri, "env_id": self.env_id,
                "split": self.split, "base_model": self.base_model, "config_hash": self.config_hash,
                "toolgym_version": self.version}

    def _write_lineage(self, directory: str | os.PathLike[str]) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        try:  # the run settings toolgym eval reads (toolgym.checkpoint.write_run_settings) share the file
            kept = json.loads((d / LINEAGE_FILE).read_text())
        except (OSError, ValueError):
            kept = {}
        merged = {**(kept if isinstance(kept, dict) else {}), **self.lineage()}
        (d / LINEAGE_FILE).write_text(json.dumps(merged, indent=1) + "\n")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        import mlflow

        run = mlflow.active_run()
        if run is None:  # transformers' MLflowCallback is not active (report_to without mlflow)
            return
        self.run_id, self.tracking_uri = run.info.run_id, mlflow.get_tracking_uri()
        params: dict[str, str] = {}
        for k, v in self.toolgym_config.items():
            if k == "env_kwargs":
                v = {kk: vv for kk, vv in dict(v or {}).items() if kk != "tokenizer"}
            text = v if isinstance(v, str) else json.dumps(v, default=str)
            params[f"toolgym.{k}"] = text[:6000]
        mlflow.log_params(params)
        mlflow.set_tags({"toolgym.env_id": self.env_id, "toolgym.split": self.split,
                         "toolgym.version": self.version, "toolgym.base_model": self.base_model,
                         "toolgym.config_hash": self.config_hash, "toolgym.kind": "train"})
        self._write_lineage(args.output_dir)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run_id and state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                self._write_lineage(ckpt)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # transformers' MLflowCallback may already have ended the run: write through the client by run id.
        if not (self.run_id and state.is_world_process_zero):
            return
        import mlflow

        self._write_lineage(args.output_dir)
        if self.trajectory_dir is not None and self.trajectory_dir.is_dir() and any(self.trajectory_dir.iterdir()):
            mlflow.MlflowClient(self.tracking_uri).log_artifacts(self.run_id, str(self.trajectory_dir),
                                                                 "trajectories")


def end_active_runs(status: str) -> list[str]:
    """End this process's active MLflow runs (the training run transformers' ``MLflowCallback`` opened) with
    ``status``: ``"KILLED"`` for a run stopped by Ctrl-C or SIGTERM, ``"FAILED"`` for one that raised. Left alone,
    MLflow ends a run still open at exit as ``FINISHED``. Returns the ids of the runs ended; nothing (and no import)
    when MLflow was never imported. Best effort: a store that cannot be written is not the error to report."""
    import sys

    mlflow = sys.modules.get("mlflow")
    ended: list[str] = []
    if mlflow is None or not callable(getattr(mlflow, "active_run", None)):
        return ended
    try:
        while (run := mlflow.active_run()) is not None:
            ended.append(run.info.run_id)
            mlflow.end_run(status=status)
    except Exception:  # noqa: BLE001 - the training's own error is what the user needs
        logging.getLogger(__name__).warning("could not mark MLflow run(s) %s as %s", ended, status)
    return ended


def mlflow_callbacks(toolgym_config: Any, trainer_config: Any) -> list[Any]:
    """The callbacks a toolgym trainer adds: ``[ToolgymMLflowCallback]`` when ``trainer_config.report_to``
    includes ``mlflow`` (after pointing MLflow at :func:`tracking_uri`), else ``[]``."""
    report_to = getattr(trainer_config, "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    if "mlflow" not in report_to and "all" not in report_to:
        return []
    if importlib.util.find_spec("mlflow") is None:
        if "mlflow" not in report_to:
            return []
        raise TrackingError("report_to mlflow needs MLflow: pip install 'toolgym[registry]'", ExitCode.USAGE)
    if int(os.environ.get("RANK", "0") or 0) == 0:  # only rank 0 logs (as transformers' MLflowCallback)
        configure_mlflow()
    return [ToolgymMLflowCallback(toolgym_config, trainer_config)]


# ---------------------------------------------------------------------------------------------------------------
# evaluation / rollout summaries
# ---------------------------------------------------------------------------------------------------------------


def check_report_backends(names: Sequence[str]) -> list[str]:
    """Validate ``--report-to`` names before any work: known and installed (exit 2 otherwise); an MLflow server
    named by ``MLFLOW_TRACKING_URI`` must answer (exit 4). Returns the names, de-duplicated in order."""
    quiet_logs()
    out: list[str] = []
    for raw in names:
        for name in (n.strip().lower() for n in raw.split(",")):
            if not name or name in out or name == "none":
                continue
            if name not in REPORT_BACKENDS:
                raise TrackingError(f"--report-to {name!r}: choose from {', '.join(REPORT_BACKENDS)}",
                                    ExitCode.USAGE)
            pkg = REPORT_BACKENDS[name]
            if importlib.util.find_spec(pkg) is None:
                hint = "toolgym[registry]" if name == "mlflow" else pkg
                raise TrackingError(f"--report-to {name}: the {pkg!r} package is not installed (pip install "
                                    f"'{hint}')", ExitCode.USAGE)
            out.append(name)
    if "mlflow" in out:
        check_server(tracking_uri())
    return out


def quiet_logs() -> None:
    """Command-line use: MLflow's and alembic's INFO lines (database migrations, ...) are not for the user."""
    for noisy in ("mlflow", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _numeric(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten nested numeric values: ``{"errors": {"timeout": 2}}`` -> ``{"errors/timeout": 2.0}``."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, int | float):  # bool included
            out[key] = float(v)
        elif isinstance(v, Mapping):
            out.update(_numeric(v, key + "/"))
        elif (isinstance(v, list | tuple) and "ci" in str(k) and len(v) == 2
              and all(isinstance(x, int | float) for x in v)):  # a confidence interval
            out[f"{key}/lo"], out[f"{key}/hi"] = float(v[0]), float(v[1])
    return out


def report_summary(backends: Sequence[str], *, kind: str, run_name: str, metrics: Mapping[str, Any],
                   params: Mapping[str, Any] | None = None, artifacts: Sequence[str | os.PathLike[str]] = (),
                   documents: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Write one evaluation/rollout summary to each backend; returns ``{backend: where}`` (an MLflow run id,
    a log directory, a project name).

    Args:
        backends: names from :func:`check_report_backends`.
        kind: ``"eval"`` or ``"rollout"`` (MLflow tag ``toolgym.kind``; TensorBoard sub-directory).
        run_name: the run's display name.
        metrics: numeric summary values (nested mappings and ``[lo, hi]`` pairs are flattened); others ignored.
        params: configuration shown with the run (env id, split, policy, seed, ...).
        artifacts: files to attach (MLflow only: the trajectory file).
        documents: ``{file name: JSON-serialisable object}`` attached as JSON files (MLflow only: the report).
    """
    flat = _numeric(metrics)
    params = {k: v for k, v in dict(params or {}).items() if v is not None}
    where: dict[str, str] = {}
    for name in backends:
        if name == "mlflow":
            import mlflow

            from toolgym import __version__

            configure_mlflow()
            with mlflow.start_run(run_name=run_name) as run:
                mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
                mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in flat.items()})
                mlflow.set_tags({"toolgym.kind": kind, "toolgym.version": __version__,
                                 **({"toolgym.env_id": str(params["env_id"])} if "env_id" in params else {}),
                                 **({"toolgym.split": str(params["split"])} if "split" in params else {})})
                for path in artifacts:
                    if Path(path).is_file():
                        mlflow.log_artifact(str(path))
                for fname, obj in dict(documents or {}).items():
                    mlflow.log_dict(obj, fname)
                where[name] = run.info.run_id
        elif name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            logdir = runs_dir() / "tensorboard" / kind / re.sub(r"[^A-Za-z0-9._-]+", "_", run_name).strip("_")
            writer = SummaryWriter(log_dir=str(logdir))
            try:
                for k, v in flat.items():
                    writer.add_scalar(f"{kind}/{k}", v, 0)
                writer.add_text(f"{kind}/params", "\n".join(f"    {k}: {v}" for k, v in params.items()), 0)
            finally:
                writer.close()
            where[name] = str(logdir)
        else:  # wandb and trackio share the init/log/finish API
            mod = importlib.import_module(name)
            project = os.environ.get("WANDB_PROJECT" if name == "wandb" else "TRACKIO_PROJECT", "toolgym")
            run = mod.init(project=project, name=run_name, config=dict(params))
            mod.log(flat)
            mod.finish()
            where[name] = project
    return where


class ReportTo:
    """What the ``toolgym.report_to`` entry points (``mlflow``, ``tensorboard``, ``wandb``, ``trackio``) name: the
    ``--report-to`` backends of ``toolgym eval``/``rollout`` (``toolgym/cli/plugins.py`` states the protocol)."""

    check_report_backends = staticmethod(check_report_backends)
    report_summary = staticmethod(report_summary)
