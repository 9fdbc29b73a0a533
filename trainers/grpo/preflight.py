"""Checks and preparations a GRPO run needs before ``GRPOTrainer`` is built (what a GPU run needs beyond a CPU one).

* :func:`check_report_to`: every tracker named in ``report_to`` is installed, else a clear error naming the extra
  that installs it (transformers would raise deep inside the trainer's constructor).
* :func:`ensure_model_dir`: the policy's ``config._name_or_path`` points at a local directory holding its config,
  weights **and tokenizer**. TRL 1.16 rebuilds the reference model (``beta > 0``) with
  ``from_pretrained(config._name_or_path)`` and colocated vLLM loads ``LLM(model=model.name_or_path)``: for the
  embedded GGUF model that path is a ``.gguf`` file or a weights-only cache, for a tiny test model it is empty, and
  for a hub id on an offline node it means a download. A hub id already in the local Hugging Face cache resolves
  to its snapshot directory; anything else is written once to ``target`` (weights symlinked when they already
  exist on disk, the tokenizer saved next to them).
* :func:`check_server_hosts`: a multi-node launch must not point the vLLM server at a loopback address.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["TRACKER_EXTRAS", "check_report_to", "check_server_hosts", "ensure_model_dir", "needs_model_dir",
           "num_machines"]

#: ``report_to`` name -> (import name, the toolgym extra that installs it)
TRACKER_EXTRAS: dict[str, tuple[str, str]] = {
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
    "tensorboard": ("tensorboard", "dev"),
    "mlflow": ("mlflow", "registry"),
}

_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_LOOPBACK = ("127.", "localhost", "0.0.0.0", "::1")


def _names(report_to: str | Iterable[str] | None) -> list[str]:
    if report_to is None or report_to == "none":
        return []
    if isinstance(report_to, str):
        return [report_to]
    return [str(x) for x in report_to if x != "none"]


def check_report_to(report_to: str | Iterable[str] | None) -> None:
    """Raise ``ImportError`` naming ``pip install 'toolgym[EXTRA]'`` for a tracker in ``report_to`` that is not
    installed (``"all"`` is left to transformers: it reports to whatever is installed)."""
    missing = []
    for name in _names(report_to):
        if name in TRACKER_EXTRAS:
            module, extra = TRACKER_EXTRAS[name]
            if importlib.util.find_spec(module) is None:
                missing.append(f"{name} (pip install 'toolgym[{extra}]')")
    if missing:
        raise ImportError(f"report_to names trackers that are not installed: {', '.join(missing)}")


def needs_model_dir(args: Any) -> bool:
    """Whether TRL will reload the model from its ``_name_or_path``: a reference model (``beta != 0``) or a
    colocated vLLM engine."""
    colocate = bool(getattr(args, "use_vllm", False)) and getattr(args, "vllm_mode", "") == "colocate"
    return float(getattr(args, "beta", 0.0) or 0.0) != 0.0 or colocate


def _complete(path: Path) -> bool:
    """A directory ``from_pretrained`` and ``LLM(model=...)`` can both load: config, weights, tokenizer."""
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and any(p.suffix in _WEIGHT_SUFFIXES for p in path.iterdir())
        and (path / "tokenizer_config.json").is_file()
    )


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot directory of a cached hub model (no network), or ``None``."""
    if not repo_id or os.path.exists(repo_id) or repo_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None


def _set_name(model: Any, path: Path) -> None:
    model.config._name_or_path = str(path)
    model.name_or_path = str(path)


def ensure_model_dir(model: Any, tokenizer: Any, target: str | os.PathLike[str]) -> Path:
    """Point ``model.config._name_or_path`` (and ``model.name_or_path``) at a complete local model directory and
    return it (see the module docstring). Several processes: each node's local rank 0 writes ``target`` (in a
    temporary directory renamed into place), the other ranks wait until it is complete."""
    current = str(getattr(model.config, "_name_or_path", "") or "")
    path = Path(current).expanduser() if current else None
    if path is not None and _complete(path):
        _set_name(model, path.resolve())
        return path.resolve()
    snap = _hub_snapshot(current)
    if snap is not None and _complete(snap):
        _set_name(model, snap)
        return snap
    target = Path(target).resolve()
    if not _complete(target):
        if int(os.environ.get("LOCAL_RANK", "0") or 0) == 0:  # one writer per node (or per shared filesystem)
            _write_model_dir(model, tokenizer, path, target)
        else:
            _wait_for(target)
    _set_name(model, target)
    return target


def _write_model_dir(model: Any, tokenizer: Any, source: Path | None, target: Path) -> None:
    """Build ``target`` in a temporary directory, then rename it into place (a loser of the race keeps the
    winner's). Weights are written by this process itself (``save_pretrained`` writes only on global rank 0 once
    torch.distributed is up, and each node needs its copy without a shared filesystem)."""
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        if source is not None and source.is_dir() and (source / "config.json").is_file() and any(
            p.suffix in _WEIGHT_SUFFIXES for p in source.iterdir()
        ):
            for f in source.iterdir():  # weights already on disk (the embedded model's cache): link them
                if f.is_file():
                    (tmp / f.name).symlink_to(f.resolve())
        else:
            import copy

            from safetensors.torch import save_model

            config = copy.deepcopy(model.config)
            config.architectures = [type(model).__name__]  # as save_pretrained writes it; TRL reads it
            config.save_pretrained(str(tmp))
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(str(tmp))
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})  # tied weights: once
        tokenizer.save_pretrained(str(tmp))
        tmp.rename(target)
    except OSError:
        if not _complete(target):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_for(target: Path, timeout_s: float = 1800.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not _complete(target):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{target} was not written by this node's local rank 0 within {timeout_s:.0f} s")
        time.sleep(0.5)


def num_machines() -> int:
    """Machines in this launch, from the launcher's environment (``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE``, set by
    torchrun and ``accelerate launch``); 1 outside a distributed launch."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    return max(1, -(-world // max(1, local)))


def check_server_hosts(args: Any, num_machines: int) -> None:
    """With several machines, a vLLM server host on loopback (or unset: TRL's default ``0.0.0.0``) would make every
    node look for the server on itself: raise ``ValueError`` naming the flag to set."""
    if num_machines <= 1 or not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", "") != "server":
        return
    url = getattr(args, "vllm_server_base_url", None)
    host = url.split("://", 1)[-1] if url else str(getattr(args, "vllm_server_host", "") or "")
    if not host or host.startswith(_LOOPBACK):
        raise ValueError(
            f"{num_machines} machines but the vLLM server is at {host or '(unset)'}: pass --vllm_server_host HOST "
            "(or --vllm_server_base_url http://HOST:PORT) reachable from every node"
        )
