"""What toolgym prints on a user's terminal: its own messages and the warnings that concern the user, nothing else
unless asked (``toolgym -v ...`` or ``TOOLGYM_VERBOSE=1``).

Quiet (the default) silences what the libraries underneath print for their own developers: transformers'
deprecation notices and weight-loading bars, TRL / Accelerate / MLflow informational logging, the future- and
deprecation warnings those packages raise about their own APIs, and a stdio MCP server's log (a short tail is still
kept for error messages; the config's ``"stderr"`` key overrides). Warnings raised by the user's own code, toolgym's
own warnings and every error are left alone. Verbose keeps every library's defaults.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["LIBRARY_PACKAGES", "VERBOSE_ENV", "configure", "verbose"]

#: the environment variable that turns verbose output on (inherited by the subprocesses toolgym starts)
VERBOSE_ENV = "TOOLGYM_VERBOSE"
#: the environment variables quiet mode set in this process (verbose mode removes them again)
_QUIET_SET = "TOOLGYM_QUIET_SET"
#: packages whose own deprecation / future warnings and informational logs quiet mode hides
LIBRARY_PACKAGES = ("transformers", "trl", "accelerate", "peft", "datasets", "mlflow", "alembic", "huggingface_hub",
                    "torch", "bitsandbytes", "deepspeed", "mcp", "httpx", "uvicorn")


def verbose() -> bool:
    """Whether verbose output is on (``TOOLGYM_VERBOSE`` set to anything but ``""`` / ``"0"``)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def configure(verbosity: int | None = None) -> bool:
    """Set up the terminal output for this process; ``verbosity`` > 0 turns verbose on (and exports it to
    subprocesses), ``None`` keeps what the environment says. Returns whether the output is verbose.

    Idempotent; call it once at a command's start, before the libraries are imported where possible (their
    import-time warnings are filtered only from then on).
    """
    if verbosity is not None and verbosity > 0:
        os.environ[VERBOSE_ENV] = "1"
    if verbose():  # the library defaults again, where quiet mode set them in this process's environment
        for name in filter(None, os.environ.pop(_QUIET_SET, "").split(",")):
            os.environ.pop(name, None)
        return True
    pattern = r"(" + "|".join(LIBRARY_PACKAGES) + r")(\..*)?$"
    for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=pattern)
    for name in LIBRARY_PACKAGES:
        logging.getLogger(name).setLevel(logging.ERROR if name in ("transformers", "accelerate") else logging.WARNING)
    quiet_env = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                 "MLFLOW_LOGGING_LEVEL": "WARNING"}
    ours = set(filter(None, os.environ.get(_QUIET_SET, "").split(",")))
    for name, value in quiet_env.items():
        if name not in os.environ:  # a value the user set is theirs
            os.environ[name] = value
            ours.add(name)
    os.environ[_QUIET_SET] = ",".join(sorted(ours))
    tlog = sys.modules.get("transformers.utils.logging")
    if tlog is not None:  # imported already: the environment variables above were read, set it through its API
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    return False
