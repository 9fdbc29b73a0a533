"""A model registry on MLflow: versions with lineage and held-out scores, promotion by a paired test.

``toolgym registry`` (this module's :func:`main`)::

    toolgym registry register CHECKPOINT_DIR --name NAME [--eval EVAL.json] [--env ENV_ID] [--description TEXT]
                              [--unverified-eval]
    toolgym registry attach-eval NAME VERSION --eval EVAL.json [--unverified-eval]
    toolgym registry list NAME [--json]
    toolgym registry promote NAME VERSION [--alias champion] [--force --reason TEXT]

and ``toolgym eval/rollout --policy models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` through
:func:`resolve_model_uri`.

A version is an MLflow model version whose files are the artifacts (``model/``) of a *registration run* in the
``toolgym`` experiment; that run also holds the evaluation JSON (``eval/eval.json``) and its scores as metrics.
Version tags carry the lineage (``toolgym.training_run_id``, ``toolgym.base_model``, ``toolgym.env_id``,
``toolgym.config_hash``; read from the checkpoint's ``toolgym_run.json`` when training was tracked) and the
evaluation (``eval.env_id``, ``eval.split``, ``eval.n_tasks``, ``eval.task_set``, ``eval.success``, ...). An
evaluation is evidence only for the weights it evaluated: ``toolgym eval --json`` records their hash, which must be
the checkpoint's (:func:`trainers.tracking.evidence.check_eval_weights`; the version's ``toolgym.weights_sha256``).

Promotion compares the two versions on **the same evaluation** (same env, split and task set): per-task success
paired by task id, 95% CI of the mean difference from :func:`toolgym.evaluation.paired_difference_ci`; the alias
moves only when the whole interval is above 0. ``--force --reason`` moves it anyway and records why.

Errors are one line with the ``toolgym`` exit code: 2 unknown model / version / alias or bad arguments, 3 a
checkpoint that is not a model or a bad evaluation file, 4 an unreachable tracking server, 1 a refused
promotion. Everything is validated before anything is created; a failure part-way deletes what it created.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.errors import CLIError, ExitCode
from toolgym.weights import weights_hash
from trainers.tracking import configure_mlflow, experiment_name, quiet_logs, runs_dir, tracking_uri
from trainers.tracking.blobs import (
    MANIFEST,
    RegistryIntegrityError,
    blob_root,
    local_dir,
    manifest,
    store_files,
    verify,
)
from trainers.tracking.evidence import (
    EVAL_KEYS,
    RegistryError,
    check_eval_weights,
    eval_metrics,
    eval_tags,
    load_eval,
    validate_checkpoint,
)
from trainers.tracking.promotion import compare, decide, short_env_id
from trainers.tracking.store import check_store_writable, store_lock

__all__ = [
    "EVAL_KEYS",
    "RegistryError",
    "RegistryIntegrityError",
    "attach_eval",
    "check_eval_weights",
    "compare",
    "list_versions",
    "load_eval",
    "main",
    "promote",
    "register",
    "resolve_model_uri",
    "validate_checkpoint",
]

#: trainer state files in ``checkpoint-N`` dirs that are not part of the model
_SKIP = ("optimizer.pt", "scheduler.pt", "rng_state", "training_args.bin", "global_step")


# ---------------------------------------------------------------------------------------------------------------
# MLflow access
# ---------------------------------------------------------------------------------------------------------------


def _client(*, write: bool = False) -> Any:
    """An ``MlflowClient`` on the configured store (exit 4 when a server is unreachable; ``write``: exit 3 for a
    read-only store, before anything is tried). A fresh store's model registry is set up under the store lock."""
    uri = configure_mlflow()
    if write:
        check_store_writable(uri)
    import mlflow

    with store_lock(uri):
        client = mlflow.MlflowClient(uri)
        client.search_registered_models(max_results=1)  # the registry's tables exist before anyone races to use them
    return client


def _not_found(e: Exception) -> bool:
    return getattr(e, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE")


def _get_model(client: Any, name: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as e:
        if _not_found(e):
            raise RegistryError(f"no registered model named {name!r} (see `toolgym registry register`)",
                                ExitCode.USAGE) from None
        raise


def _get_version(client: Any, name: str, version: str | int) -> Any:
    from mlflow.exceptions import MlflowException

    _get_model(client, name)
    if not str(version).isdigit():
        raise RegistryError(f"version must be a number, got {version!r}", ExitCode.USAGE)
    try:
        return client.get_model_version(name, str(version))
    except MlflowException as e:
        if _not_found(e):
            known = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
            raise RegistryError(f"model {name!r} has no version {version} (versions: "
                                f"{', '.join(map(str, known)) or 'none'})", ExitCode.USAGE) from None
        raise


def _model_files(d: Path) -> list[Path]:
    return [p for p in sorted(d.rglob("*")) if p.is_file()
            and not any(part.startswith(_SKIP) for part in p.relative_to(d).parts)]


# ---------------------------------------------------------------------------------------------------------------
# register / attach-eval / list
# ---------------------------------------------------------------------------------------------------------------


def register(checkpoint: str | Path, name: str, eval_path: str | Path | None = None, *, env_id: str | None = None,
             description: str | None = None, unverified_eval: bool = False) -> dict[str, Any]:
    """Register ``checkpoint`` as a new version of ``name``; returns the version's row (see :func:`list_versions`).

    Validates the checkpoint and the evaluation file first (the evaluation must be of this checkpoint's weights,
    :func:`check_eval_weights`; ``unverified_eval`` accepts one that does not record them); then logs the model files (and the evaluation) to a
    registration run and creates the version. On any failure after that the run (and a model created by this
    call) is deleted, so nothing is half-registered.
    """
    if not name or any(c in name for c in "/@:'\"") or name != name.strip():
        raise RegistryError(f"bad model name {name!r} (no '/', '@', ':' or quotes)", ExitCode.USAGE)
    lineage = validate_checkpoint(checkpoint)
    if env_id:
        lineage["env_id"] = env_id
    ev = load_eval(eval_path, env_id=lineage.get("env_id")) if eval_path is not None else None
    if ev is not None and not lineage.get("env_id"):
        lineage["env_id"] = ev["env_id"]
    sha = weights_hash(Path(checkpoint).expanduser())
    verified = ev is not None and check_eval_weights(ev, eval_path, sha, f"the checkpoint {checkpoint}",
                                                     unverified=unverified_eval)
    client = _client(write=True)
    import mlflow
    from mlflow.exceptions import MlflowException

    from toolgym import __version__

    d = Path(checkpoint).expanduser().resolve()
    created_model = False
    run_id: str | None = None
    try:
        exp = client.get_experiment_by_name(experiment_name())
        run = client.create_run(exp.experiment_id, run_name=f"register {name}",
                                tags={"toolgym.kind": "register", "toolgym.version": __version__})
        run_id = run.info.run_id
        params = {f"lineage.{k}": str(v) for k, v in lineage.items() if v is not None}
        params["checkpoint"] = str(d)
        client.log_batch(run_id, params=[mlflow.entities.Param(k, v[:6000]) for k, v in params.items()])
        storage = _store_model_files(client, run, exp, d)
        tags = {"toolgym.registration_run_id": run_id, "toolgym.checkpoint": str(d),
                "toolgym.training_run_id": str(lineage.get("training_run_id") or ""),
                "toolgym.base_model": str(lineage.get("base_model") or ""),
                "toolgym.env_id": str(lineage.get("env_id") or ""),
                "toolgym.split": str(lineage.get("split") or ""),
                "toolgym.config_hash": str(lineage.get("config_hash") or ""), "toolgym.weights_sha256": sha,
                "toolgym.storage": storage}
        if ev is not None:
            _log_eval(client, run_id, ev)
            tags.update(eval_tags(ev), **{"eval.verified": str(verified).lower()})
        client.set_terminated(run_id)
        # the model (when new) and its version appear together under the store lock: another process's cleanup,
        # which also holds it, never sees a model of ours without its version
        with store_lock(tracking_uri()):
            try:
                client.get_registered_model(name)
            except MlflowException as e:
                if not _not_found(e):
                    raise
                client.create_registered_model(name, tags={"toolgym.kind": "policy"})
                created_model = True
            mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run_id,
                                             tags=tags, description=description)
    except BaseException:
        _undo_register(client, name, run_id, created_model)
        raise
    return _row(client.get_model_version(name, mv.version), _get_model(client, name))


def _store_model_files(client: Any, run: Any, exp: Any, d: Path) -> str:
    """Put the checkpoint's model files under the registration run's ``model/`` and log their manifest
    (:data:`~trainers.tracking.blobs.MANIFEST`). A local artifact store keeps them by content
    (:func:`~trainers.tracking.blobs.store_files`: each distinct file's bytes once, hard links per version); a remote
    one gets them uploaded. Returns how: ``"content-addressed"`` or ``"uploaded"``."""
    files = _model_files(d)
    art, location = local_dir(run.info.artifact_uri), local_dir(exp.artifact_location or "")
    if art is not None and location is not None:
        recorded, storage = store_files(files, d, art / "model", blob_root(location)), "content-addressed"
    else:
        for f in files:
            rel = f.relative_to(d).parent
            client.log_artifact(run.info.run_id, str(f), "model" if str(rel) == "." else f"model/{rel.as_posix()}")
        recorded, storage = manifest(files, d), "uploaded"
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / MANIFEST
        p.write_text(json.dumps(recorded, indent=1))
        client.log_artifact(run.info.run_id, str(p))
    return storage


def _undo_register(client: Any, name: str, run_id: str | None, created_model: bool) -> None:
    """Remove what one failed or interrupted :func:`register` call made, and only that, under the store lock: the
    versions whose run is ``run_id``, the model when this call created it and no version is left in it (another
    process may have registered one meanwhile), then the run. Best effort: the original error is what the user
    needs."""
    with contextlib.suppress(Exception), store_lock(tracking_uri()):
        if run_id is not None:
            for mv in client.search_model_versions(f"name='{name}'"):
                if mv.run_id == run_id:
                    client.delete_model_version(name, mv.version)
        if created_model and not client.search_model_versions(f"name='{name}'"):
            client.delete_registered_model(name)
    if run_id is not None:
        with contextlib.suppress(Exception):
            client.delete_run(run_id)


def _log_eval(client: Any, run_id: str, ev: Mapping[str, Any]) -> None:
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "eval.json"
        p.write_text(json.dumps(ev, indent=1))
        client.log_artifact(run_id, str(p), "eval")
    ts = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[mlflow.entities.Metric(k, v, ts, 0) for k, v in eval_metrics(ev).items()])


def attach_eval(name: str, version: str | int, eval_path: str | Path, *,
                unverified_eval: bool = False) -> dict[str, Any]:
    """Attach (or replace) the held-out evaluation of an existing version: the JSON goes to its registration run,
    the scores to its tags. The evaluation must be of the version's env and of its weights
    (:func:`check_eval_weights`; ``unverified_eval`` accepts one that does not record them)."""
    ev = load_eval(eval_path)  # exit 3 before touching the store
    client = _client(write=True)
    mv = _get_version(client, name, version)
    env = mv.tags.get("toolgym.env_id")
    if env and short_env_id(env) != short_env_id(ev["env_id"]):
        raise RegistryError(f"{eval_path}: an evaluation of {ev['env_id']}, but {name} v{mv.version} was trained "
                            f"on {env}", ExitCode.INPUT)
    sha = mv.tags.get("toolgym.weights_sha256") or weights_hash(resolve_model_uri(f"models:/{name}/{mv.version}"))
    verified = check_eval_weights(ev, eval_path, sha, f"{name} v{mv.version}", unverified=unverified_eval)
    run_id = mv.tags.get("toolgym.registration_run_id") or mv.run_id
    _log_eval(client, run_id, ev)
    client.set_model_version_tag(name, mv.version, "eval.verified", str(verified).lower())
    for k, v in eval_tags(ev).items():
        client.set_model_version_tag(name, mv.version, k, v)
    return _row(client.get_model_version(name, mv.version), _get_model(client, name))


def _row(mv: Any, model: Any) -> dict[str, Any]:
    t = mv.tags
    aliases = sorted(a for a, v in (model.aliases or {}).items() if str(v) == str(mv.version))
    ci = t.get("eval.success_ci95")
    num = (lambda s: float(s) if s not in (None, "") else None)  # noqa: E731
    return {
        "name": mv.name, "version": int(mv.version), "aliases": aliases, "created": mv.creation_timestamp,
        "env_id": t.get("eval.env_id") or t.get("toolgym.env_id") or None, "split": t.get("eval.split"),
        "n_tasks": int(t["eval.n_tasks"]) if t.get("eval.n_tasks") else None, "task_set": t.get("eval.task_set"),
        "success": num(t.get("eval.success")), "success_ci95": [float(x) for x in ci.split(",")] if ci else None,
        "pass_at_k": num(t.get("eval.pass_at_k")), "k": int(t["eval.k"]) if t.get("eval.k") else None,
        "training_run_id": t.get("toolgym.training_run_id") or None, "base_model": t.get("toolgym.base_model") or None,
        "config_hash": t.get("toolgym.config_hash") or None, "source": mv.source,
        "promotions": {k.split(".", 2)[2]: json.loads(v) for k, v in t.items() if k.startswith("toolgym.promoted.")},
    }


def list_versions(name: str) -> list[dict[str, Any]]:
    """Every version of ``name``, newest first, as rows: version, aliases, env_id, split, n_tasks, task_set,
    success (+ ``success_ci95``), pass_at_k, k, lineage (training run, base model, config hash), promotions."""
    client = _client()
    model = _get_model(client, name)
    versions = client.search_model_versions(f"name='{name}'")
    return sorted((_row(mv, model) for mv in versions), key=lambda r: -r["version"])


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """``list`` rows as an aligned text table."""
    head = ("version", "aliases", "env", "split", "tasks", "success", "95% CI", "pass@k", "training run")
    body = []
    for r in rows:
        ci = r["success_ci95"]
        body.append((str(r["version"]), ",".join(r["aliases"]) or "-", short_env_id(r["env_id"] or "-"), r["split"] or "-",
                     str(r["n_tasks"] or "-"), "-" if r["success"] is None else f"{r['success']:.3f}",
                     f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-",
                     "-" if r["pass_at_k"] is None else f"{r['pass_at_k']:.3f}" + (f" (k={r['k']})" if r["k"] else ""),
                     (r["training_run_id"] or "-")[:12]))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# promote
# ---------------------------------------------------------------------------------------------------------------


def _version_eval(client: Any, mv: Any) -> dict[str, Any] | None:
    if not mv.tags.get("eval.task_set"):
        return None
    import mlflow

    run_id = mv.tags.get("toolgym.registration_run_id") or mv.run_id
    with tempfile.TemporaryDirectory() as tmp:
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="eval/eval.json", dst_path=tmp,
                                                   tracking_uri=tracking_uri())
        return json.loads(Path(path).read_text())


def promote(name: str, version: str | int, alias: str = "champion", *, force: bool = False,
            reason: str | None = None) -> dict[str, Any]:
    """Move ``alias`` to ``version`` when it beats the alias's current holder on the same evaluation (see
    :func:`compare`); a version with no holder to beat needs an evaluation. ``force`` (with a ``reason``) moves it
    anyway. The decision is recorded as the version tag ``toolgym.promoted.<alias>``.

    The move is a compare-and-set: under the store's lock (:func:`trainers.tracking.store.store_lock`) the alias is moved
    only if it still names the holder the decision was made against; if another promotion moved it meanwhile, the
    decision is made again against the new holder (so two promotions at once never both win against the same old
    holder, and the alias never lands on a version that does not beat the one it replaces).

    Returns ``{"promoted": True, "from": old_version|None, "to": version, ...comparison}``.

    Raises:
        RegistryError: exit 2 (unknown model/version, ``--force`` without ``--reason``), exit 1 (refused: why),
            exit 3 (a read-only store).
    """
    if force and not (reason or "").strip():
        raise RegistryError("--force needs --reason TEXT (recorded with the promotion)", ExitCode.USAGE)
    if not alias or not alias.replace("_", "").replace("-", "").isalnum():
        raise RegistryError(f"bad alias {alias!r}", ExitCode.USAGE)
    client = _client(write=True)
    mv = _get_version(client, name, version)
    holder = (_get_model(client, name).aliases or {}).get(alias)
    for _ in range(_CAS_ATTEMPTS):
        if holder is not None and str(holder) == str(mv.version):
            return {"promoted": False, "from": int(holder), "to": int(mv.version),
                    "why": f"v{holder} already is {alias}"}  # fmt: skip
        new_ev = _version_eval(client, mv)
        old_ev = None if holder is None else _version_eval(client, client.get_model_version(name, str(holder)))
        try:
            record = decide(name, mv.version, alias, holder, new_ev, old_ev, force=force, reason=reason)
        except CLIError as e:  # refused (exit 1)
            raise RegistryError(e.message, e.code) from None
        with store_lock(tracking_uri()):
            now = (_get_model(client, name).aliases or {}).get(alias)
            if str(now) == str(holder):  # still the holder the decision was made against: set it
                client.set_registered_model_alias(name, alias, mv.version)
                client.set_model_version_tag(name, mv.version, f"toolgym.promoted.{alias}", json.dumps(record))
                return {"promoted": True, "to": int(mv.version), **record}
        holder = now  # another promotion moved it meanwhile: decide again against the new holder
    raise RegistryError(f"{name}@{alias} kept moving during {_CAS_ATTEMPTS} attempts (concurrent promotions); "
                        "try again", ExitCode.FAILURE)


_CAS_ATTEMPTS = 5


# ---------------------------------------------------------------------------------------------------------------
# models:/ URIs
# ---------------------------------------------------------------------------------------------------------------


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> ``(NAME, None, ALIAS)``; ``models:/NAME/3`` -> ``(NAME, "3", None)``."""
    body = uri.removeprefix("models:/").strip("/")
    if "@" in body:
        name, _, alias = body.partition("@")
        if name and alias and "/" not in name:
            return name, None, alias
    else:
        name, _, version = body.partition("/")
        if name and version.isdigit():
            return name, version, None
    raise RegistryError(f"bad model URI {uri!r}: use models:/NAME@ALIAS or models:/NAME/VERSION", ExitCode.USAGE)


def resolve_model_uri(uri: str, cache_dir: str | Path | None = None) -> Path:
    """The local model directory behind a ``models:/`` URI: the artifact directory itself with a local store, else
    a copy downloaded once to ``runs/registry-cache/NAME/VERSION`` (downloaded again when that copy is damaged).

    The directory is checked against the files registered (:func:`trainers.tracking.blobs.verify`: each file's
    size and SHA-256 from the version's manifest; for a version registered without one, the weights hash
    ``toolgym.weights_sha256``) before it is returned.

    Raises:
        RegistryError: exit 2 for a bad URI or an unknown model, version or alias.
        RegistryIntegrityError (exit 3): the stored files are not the ones registered (named).
    """
    from mlflow.exceptions import MlflowException

    name, version, alias = parse_model_uri(uri)
    client = _client()
    if alias is not None:
        _get_model(client, name)
        try:
            mv = client.get_model_version_by_alias(name, alias)
        except MlflowException as e:
            if _not_found(e):
                raise RegistryError(f"model {name!r} has no alias {alias!r}", ExitCode.USAGE) from None
            raise
    else:
        mv = _get_version(client, name, version)
    import mlflow

    what = f"models:/{name}/{mv.version}"
    recorded = _manifest_of(client, mv)
    src = mv.source
    local = local_dir(src)
    if local is not None:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=src))
        _check_files(local, mv, recorded, what)
        return local
    target = Path(cache_dir or runs_dir() / "registry-cache") / name / str(mv.version)
    if (target / "config.json").is_file():
        try:
            _check_files(target, mv, recorded, what)
            return target
        except RegistryIntegrityError:
            pass  # a damaged cached copy: download it again (a damaged stored one fails below)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".dl-"))
    try:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=src, dst_path=str(tmp)))
        shutil.rmtree(target, ignore_errors=True)
        got.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _check_files(target, mv, recorded, what)
    return target


def _manifest_of(client: Any, mv: Any) -> dict[str, Any] | None:
    """The version's file manifest from its registration run (``None`` for a version registered without one)."""
    run_id = mv.tags.get("toolgym.registration_run_id") or mv.run_id
    if not run_id or MANIFEST not in {a.path for a in client.list_artifacts(run_id)}:
        return None
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=MANIFEST, dst_path=tmp,
                                                   tracking_uri=tracking_uri())
        return json.loads(Path(path).read_text())


def _check_files(local: Path, mv: Any, recorded: Mapping[str, Any] | None, what: str) -> None:
    """A loadable model directory whose files are the registered ones (by manifest, else by weights hash)."""
    if recorded is not None:
        verify(local, recorded, what)
    validate_checkpoint(local)
    want = mv.tags.get("toolgym.weights_sha256")
    if recorded is None and want and (got := weights_hash(local)) != want:
        raise RegistryIntegrityError(f"{what}: the weights in {local} are not the ones registered (weights hash "
                                     f"{got[:12]}..., registered {want[:12]}...)")


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------


_UNVERIFIED_HELP = ("accept an evaluation that does not record which weights it evaluated (from an older "
                    "`toolgym eval`); tagged eval.verified=false. One of other weights or of a non-checkpoint policy "
                    "is refused regardless")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolgym registry", description="Model registry on MLflow (tracking store: "
                                "$MLFLOW_TRACKING_URI, else sqlite:///runs/mlflow.db)",
                                epilog="exit codes: 0 ok, 1 promotion refused or failure, 2 unknown model/version or "
                                "bad arguments, 3 bad checkpoint or eval file, 4 tracking server unreachable")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("register", help="a new version from a saved model directory")
    s.add_argument("checkpoint", help="model directory (config.json, weights, tokenizer)")
    s.add_argument("--name", required=True)
    s.add_argument("--eval", dest="eval_path", default=None, help="its held-out `toolgym eval --json` summary")
    s.add_argument("--env", default=None, help="env id it was trained on (default: from toolgym_run.json)")
    s.add_argument("--description", default=None)
    s.add_argument("--unverified-eval", action="store_true", help=_UNVERIFIED_HELP)
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("attach-eval", help="attach a held-out evaluation to an existing version")
    s.add_argument("name")
    s.add_argument("version")
    s.add_argument("--eval", dest="eval_path", required=True)
    s.add_argument("--unverified-eval", action="store_true", help=_UNVERIFIED_HELP)
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("list", help="versions with scores, env, split, tasks, CI and aliases")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("promote", help="move an alias to a version that beats its holder on the same evaluation")
    s.add_argument("name")
    s.add_argument("version")
    s.add_argument("--alias", default="champion")
    s.add_argument("--force", action="store_true", help="move it even when not better (needs --reason)")
    s.add_argument("--reason", default=None)
    s.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``toolgym registry ...``; returns the exit code. Raises :class:`RegistryError` (a ``CLIError``) for the
    ``toolgym`` command to print as one line."""
    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    quiet_logs()
    if a.action == "list":
        rows = list_versions(a.name)
        print(json.dumps(rows, indent=1) if a.json else format_table(rows))
        return ExitCode.OK
    if a.action == "promote":
        res = promote(a.name, a.version, a.alias, force=a.force, reason=a.reason)
        if a.json:
            print(json.dumps(res))
        elif res["promoted"]:
            tag = " (FORCED: " + str(res.get("reason")) + ")" if res.get("forced") else ""
            print(f"{a.name}@{a.alias} -> v{res['to']} (was {'v' + str(res['from']) if res['from'] else 'unset'}): "
                  f"{res['why']}{tag}")
        else:
            print(f"{a.name}@{a.alias}: unchanged, {res['why']}")
        return ExitCode.OK
    row = (register(a.checkpoint, a.name, a.eval_path, env_id=a.env, description=a.description,
                    unverified_eval=a.unverified_eval)
           if a.action == "register" else attach_eval(a.name, a.version, a.eval_path,
                                                      unverified_eval=a.unverified_eval))
    if a.json:
        print(json.dumps(row))
    else:
        score = "" if row["success"] is None else f", success {row['success']:.3f} on {row['env_id']}/{row['split']}"
        print(f"{'registered' if a.action == 'register' else 'updated'} {row['name']} v{row['version']}{score}")
    return ExitCode.OK


if __name__ == "__main__":  # `python -m trainers.tracking.registry ...` = `toolgym registry ...`
    try:
        sys.exit(main())
    except CLIError as _e:
        print(f"toolgym: error: {_e.message}", file=sys.stderr)
        sys.exit(int(_e.code))
