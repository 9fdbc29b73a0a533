"""From a name a user typed to a built env: :func:`resolve_env_id` (any spelling of a registered id, or
``module:Env-v0``), :func:`import_user_module` (``--import MODULE``, the way ``python -m`` finds it) and
:func:`env_construction_error` (why an env could not be built, as a one-line :class:`~toolgym.errors.CLIError`
with its exit code). ``toolgym eval``, ``toolgym rollout``, ``toolgym list`` and the web UI's tool playground share
them.
"""

from __future__ import annotations

import json
import os
import sys

from toolgym.errors import CLIError, ExitCode

__all__ = ["env_construction_error", "import_user_module", "resolve_env_id"]


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
        mod, _, env_id = name.partition(":")
        try:
            import_user_module(mod)
        except CLIError as e:
            raise CLIError(f"env {name!r}: {e.message}", ExitCode.USAGE) from None
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


def import_user_module(name: str) -> None:
    """Import ``name`` (``--import MODULE``, ``module:Env-v0``) the way ``python -m`` would find it: the current
    directory is importable (a console script such as ``toolgym`` does not put it on ``sys.path`` by itself).

    Raises:
        CLIError (usage): the module cannot be imported (the message names it and the reason).
    """
    import importlib

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(name)
    except ImportError as e:
        raise CLIError(f"cannot import module {name!r} ({e}); it is looked up on sys.path, which includes the "
                       "current directory", ExitCode.USAGE) from None
