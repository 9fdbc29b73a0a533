"""Background jobs of the web UI (training, evaluation): processes whose whole state lives on disk.

A job is a directory ``<runs>/ui/jobs/<id>/``:

* ``job.json`` - what to run: ``{"id", "kind", "title", "argv", "cwd", "created"}`` (``argv`` is an argument
  list, never a shell line);
* ``runner.json`` - the pids of the runner and of the command, and the runner's start time (``runner_start``,
  from ``/proc``: a pid reused by another process after the runner died is not taken for the job);
* ``log.txt`` - the command's stdout and stderr, as they come;
* ``exit.json`` - ``{"rc", "ended", "stopped"}`` once the command ended.

The UI starts a *runner* (``python -m trainers.ui.jobs JOB_DIR``, in a session of its own) that starts the command,
writes the log and the exit file, and turns a stop request (``SIGTERM`` to the runner) into ``SIGINT`` for the
command, i.e. Ctrl-C: the trainers stop cleanly with exit code 130; ``SIGKILL`` follows after
:data:`STOP_GRACE_S`. The runner does not depend on the UI process: closing the browser or restarting the UI loses
nothing, and :meth:`JobStore.list` reads every job back from disk.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["STOP_GRACE_S", "JobError", "JobStore", "parse_metrics", "redact", "run_job", "start_ticks"]

STOP_GRACE_S = 30.0
"""Seconds between the stop request (SIGINT to the command) and SIGKILL."""

_LOG_TAIL_BYTES = 16_000
_METRICS_MAX_BYTES = 32 << 20
_SECRET_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.IGNORECASE)


class JobError(ValueError):
    """A job request the UI refuses (unknown job, bad argument list); the message is shown on the page."""


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look secret (``*TOKEN*``, ``*API_KEY*``, ...), longest first
    (only values of 6+ characters, so that redaction cannot eat ordinary words)."""
    env = os.environ if env is None else env
    vals = {v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= 6}
    return sorted(vals, key=len, reverse=True)


def redact(text: str, secrets_: Sequence[str] = ()) -> str:
    """``text`` with every secret value (``secrets_`` and :func:`secret_values`) replaced by ``***``."""
    for s in [*secrets_, *secret_values()]:
        if s:
            text = text.replace(s, "***")
    return text


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def parse_metrics(log: str) -> list[dict[str, float]]:
    """The training metrics a log holds: one dict per line that is a Python/JSON dict of numbers, as the
    transformers ``Trainer`` prints every ``logging_steps`` (``{'loss': '0.1', 'reward': '0.5', ...}``). Each row
    gets ``step`` (1, 2, ...; its position) unless it has one; summary rows (``train_runtime``) are skipped."""
    rows: list[dict[str, float]] = []
    for line in log.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")) or "train_runtime" in line:
            continue
        try:
            d = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if not isinstance(d, dict):
            continue
        row = {str(k): n for k, v in d.items() if (n := _number(v)) is not None}
        if row:
            row.setdefault("step", float(len(rows) + 1))
            rows.append(row)
    return rows


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (``/proc/PID/stat``'s field 22, clock ticks since boot): with the pid it names
    one process for good, since a reused pid belongs to a process started later. ``None`` when it is gone (or a
    zombie) or ``/proc`` is not there."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    if not fields or fields[0] == "Z":  # a zombie (our own child not yet reaped) is not running
        return None
    return int(fields[19])


def _alive(pid: int, started: int | None) -> bool:
    """Whether the runner ``pid`` that recorded ``started`` (its :func:`start_ticks`) is still that process."""
    ticks = start_ticks(pid)
    if ticks is not None:
        return started is None or ticks == started
    if os.path.isdir("/proc"):
        return False
    try:  # no /proc (not Linux): the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobStore:
    """The jobs under ``<runs>/ui/jobs``.

    Args:
        runs: the UI's runs directory.
        env: environment of the commands (default: this process's, minus the UI token).
    """

    def __init__(self, runs: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> None:
        self.root = Path(runs).resolve() / "ui" / "jobs"
        self.env = dict(os.environ if env is None else env)
        self.env.pop("TOOLGYM_UI_TOKEN", None)
        self.env["PYTHONUNBUFFERED"] = "1"

    def _dir(self, job_id: str) -> Path:
        if not re.fullmatch(r"[a-z0-9-]{1,64}", job_id or ""):
            raise JobError(f"bad job id {job_id!r}")
        d = self.root / job_id
        if not (d / "job.json").is_file():
            raise JobError(f"no job {job_id!r}")
        return d

    def launch(self, kind: str, argv: Sequence[str], *, title: str = "", cwd: str | os.PathLike[str] | None = None,
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Start ``argv`` (a list of strings; the first is the program) as a background job; returns its state."""
        if not argv or not all(isinstance(a, str) for a in argv) or any("\0" in a for a in argv):
            raise JobError("a job is a non-empty list of strings")
        job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        d = self.root / job_id
        d.mkdir(parents=True, exist_ok=False)
        job = {"id": job_id, "kind": kind, "title": title or kind, "argv": list(argv),
               "cwd": str(Path(cwd or os.getcwd()).resolve()), "created": time.time(), **dict(extra or {})}
        (d / "job.json").write_text(json.dumps(job, indent=1), encoding="utf-8")
        (d / "log.txt").touch()
        subprocess.Popen([sys.executable, "-m", "trainers.ui.jobs", str(d)], cwd=job["cwd"], env=self.env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
        return self.state(job_id)

    def state(self, job_id: str, *, log: bool = False, metrics: bool = True) -> dict[str, Any]:
        """A job as the page shows it: ``status`` (``starting``/``running``/``finished``/``failed``/``stopped``/
        ``lost``: the runner died without an exit file), ``rc``, the metrics parsed from its log and, with
        ``log``, the log's last lines (secrets redacted)."""
        d = self._dir(job_id)
        job = json.loads((d / "job.json").read_text(encoding="utf-8"))
        runner = _read_json(d / "runner.json")
        ended = _read_json(d / "exit.json")
        if ended is not None:
            rc = ended.get("rc")
            status = "stopped" if ended.get("stopped") else ("finished" if rc == 0 else "failed")
        elif runner is None:
            status = "starting" if time.time() - job["created"] < 60 else "lost"
        else:
            status = "running" if _alive(int(runner["runner_pid"]), runner.get("runner_start")) else "lost"
        text = _read_tail(d / "log.txt", _METRICS_MAX_BYTES) if (log or metrics) else ""
        out = {**job, "status": status, "rc": None if ended is None else ended.get("rc"),
               "ended": None if ended is None else ended.get("ended")}
        if metrics:
            out["metrics"] = parse_metrics(text)
        out["argv"] = [redact(a) for a in job["argv"]]
        if log:
            tail = text[-_LOG_TAIL_BYTES:]
            out["log"] = redact(tail)
            if status in ("failed", "lost"):
                out["error"] = redact(last_error_lines(text))
        return out

    def list(self) -> list[dict[str, Any]]:
        """Every job, newest first (without logs)."""
        if not self.root.is_dir():
            return []
        ids = sorted((p.name for p in self.root.iterdir() if (p / "job.json").is_file()), reverse=True)
        return [self.state(i, metrics=False) for i in ids]

    def stop(self, job_id: str) -> dict[str, Any]:
        """Ask a running job to stop (SIGTERM to its runner: Ctrl-C for the command, SIGKILL after the grace)."""
        d = self._dir(job_id)
        runner = _read_json(d / "runner.json")
        if runner is None or _read_json(d / "exit.json") is not None:
            raise JobError(f"job {job_id} is not running")
        if not _alive(int(runner["runner_pid"]), runner.get("runner_start")):  # never signal a reused pid
            raise JobError(f"job {job_id} is not running (its runner ended without an exit record)")
        try:
            os.kill(int(runner["runner_pid"]), signal.SIGTERM)
        except ProcessLookupError:
            raise JobError(f"job {job_id} is not running") from None
        return self.state(job_id)


def last_error_lines(text: str, n: int = 8) -> str:
    """The lines a failed job's user needs: from the last ``Traceback`` (or the last ``error``) to the end,
    at most ``n`` lines."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("warnings.warn")]
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].startswith("Traceback") or "error" in lines[k].lower():
            return "\n".join(lines[k:][-n:] if lines[k].startswith("Traceback") else lines[max(0, k - n + 1):k + 1])
    return "\n".join(lines[-n:])


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)


def _default_sigint() -> None:
    """In the command's child process, before exec: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_job(job_dir: str | os.PathLike[str]) -> int:
    """The runner: start the job's command, wait for it, write ``exit.json``. SIGTERM = stop (see module doc)."""
    d = Path(job_dir)
    job = json.loads((d / "job.json").read_text(encoding="utf-8"))
    stopped = False
    with open(d / "log.txt", "ab", buffering=0) as log:
        try:
            # Ctrl-C must reach the command even when the UI itself was started with SIGINT ignored (`nohup`,
            # `&` from a script, some service managers): an ignored disposition is inherited across exec, and a
            # Python command started that way never turns SIGINT into KeyboardInterrupt, so a stop would always
            # end in the SIGKILL after the grace
            proc = subprocess.Popen(job["argv"], cwd=job["cwd"], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_default_sigint)
        except OSError as e:
            log.write(f"error: cannot start {job['argv'][0]}: {e}\n".encode())
            _write_json(d / "exit.json", {"rc": 127, "ended": time.time(), "stopped": False})
            return 127

        stop_at: list[float] = []

        def on_term(signum: int, frame: Any) -> None:
            nonlocal stopped
            stopped = True
            stop_at.append(time.monotonic())
            log.write(b"\n[toolgym ui] stop requested: interrupting the job\n")
            proc.send_signal(signal.SIGINT)

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        _write_json(d / "runner.json", {"runner_pid": os.getpid(), "runner_start": start_ticks(os.getpid()),
                                        "pid": proc.pid, "started": time.time()})
        rc = None
        while rc is None:
            try:
                rc = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if stop_at and time.monotonic() - stop_at[0] > STOP_GRACE_S:
                    proc.kill()
    _write_json(d / "exit.json", {"rc": rc, "ended": time.time(), "stopped": stopped})
    return 0


if __name__ == "__main__":
    sys.exit(run_job(sys.argv[1]))
