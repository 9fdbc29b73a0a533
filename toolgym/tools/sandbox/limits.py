"""What a snippet may use (:class:`SandboxLimits`), what it did (:class:`SandboxResult`) and how a worker's end
is classified (:func:`classify`, from the exit codes of :mod:`.worker`)."""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

from toolgym.tools.sandbox.worker import CPU_EXIT, SETUP_EXIT

__all__ = ["CPU_EXIT", "SETUP_EXIT", "CappedOutput", "SandboxLimits", "SandboxResult", "classify"]


@dataclass(frozen=True)
class SandboxLimits:
    """Per-snippet limits.

    Attributes:
        wall_s: wall-clock seconds from sending the code to the end; then the whole process group is killed.
        cpu_s: CPU seconds per process (``RLIMIT_CPU``; SIGXCPU at ``cpu_s``, SIGKILL one second later).
        memory_mb: address space per process in MiB (``RLIMIT_AS``); allocations beyond raise ``MemoryError``.
        max_procs: processes + threads of the worker's uid (``RLIMIT_NPROC``; effective only for a non-root uid).
        file_size_mb: largest file the snippet may write, MiB (``RLIMIT_FSIZE``).
        open_files: open file descriptors (``RLIMIT_NOFILE``).
        tmpfs_mb: size of the one private tmpfs behind ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``
            (namespaced mode): the total the snippet may store in memory-backed files. It is not counted in
            ``memory_mb`` (``RLIMIT_AS`` counts mappings, not tmpfs pages): a worker's worst case is
            ``memory_mb + tmpfs_mb``, released when the worker exits.
        max_output_bytes: stdout + stderr kept; beyond it the worker is killed and the output marked truncated.
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    tmpfs_mb: int = 64
    max_output_bytes: int = 8192


@dataclass
class SandboxResult:
    """What one snippet did.

    Attributes:
        status: ``ok`` (exit 0), ``error`` (nonzero exit: an exception or ``sys.exit(n)``), ``timeout`` (wall
            clock), ``cpu_limit``, ``memory_limit`` (``MemoryError``), ``output_limit`` (killed for printing too
            much), ``killed`` (ended by a signal, e.g. SIGSEGV or SIGKILL), ``sandbox_error`` (the sandbox itself
            failed to start).
        exit_code: the process exit status (``None`` when killed by a signal or by the host).
        signal: the signal name that ended it, if any.
        stdout, stderr: decoded output, at most ``max_output_bytes`` together.
        truncated: output was cut at the cap.
        wall_s: seconds from sending the code to the end.
    """

    status: str
    exit_code: int | None = None
    signal: str | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self, limits: SandboxLimits | None = None) -> str:
        """The observation the model reads: stdout, then stderr and a status line when there is anything to say."""
        lim = limits or SandboxLimits()
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(("[stderr]\n" if parts else "") + self.stderr.rstrip("\n"))
        note = {
            "ok": "",
            "error": f"[exit status {self.exit_code}]",
            "timeout": f"[killed: wall-clock limit of {lim.wall_s:g} s exceeded]",
            "cpu_limit": f"[killed: CPU time limit of {lim.cpu_s} s exceeded]",
            "memory_limit": f"[memory limit of {lim.memory_mb} MiB exceeded]",
            "output_limit": f"[killed: output exceeded {lim.max_output_bytes} bytes; output truncated]",
            "killed": f"[killed by signal {self.signal}]",
            "sandbox_error": "[sandbox error: the code could not be run]",
        }[self.status]
        if self.truncated and self.status != "output_limit":
            note = (note + " " if note else "") + "[output truncated]"
        if note:
            parts.append(note)
        if not parts:
            return "(no output; print() the values you need)"
        return "\n".join(parts)


class CappedOutput:
    """A run's stdout and stderr, kept together up to ``limit`` bytes (``SandboxLimits.max_output_bytes``).

    Args:
        limit: bytes of stdout + stderr kept.
        stdout: output already read (it counts against the limit).
    """

    def __init__(self, limit: int, stdout: bytes = b"") -> None:
        self.limit = limit
        self.stdout = bytearray(stdout)
        self.stderr = bytearray()
        self.overflow = False

    def add(self, chunk: bytes, *, stderr: bool = False) -> bool:
        """Keep ``chunk`` of stdout (or ``stderr``) up to the limit. Returns ``True`` when this chunk went past
        it (the caller kills the worker): what fits is kept, :attr:`overflow` is set and later chunks are
        dropped."""
        if self.overflow:
            return False
        buf = self.stderr if stderr else self.stdout
        room = self.limit - len(self.stdout) - len(self.stderr)
        if len(chunk) > room:
            buf += chunk[: max(room, 0)]
            self.overflow = True
            return True
        buf += chunk
        return False


def classify(wait_status: int | None, stdout: bytes | bytearray, stderr: bytes | bytearray, *, timed_out: bool, overflow: bool,
             wall_s: float) -> SandboxResult:
    """The :class:`SandboxResult` of a worker that ended with ``wait_status`` (``waitpid``'s; ``None`` when
    unknown: its fork server died), after printing ``stdout``/``stderr`` (already capped); ``timed_out``: the
    host killed it at the wall clock; ``overflow``: the host killed it for printing too much."""
    rc = None if wait_status is None else os.waitstatus_to_exitcode(wait_status)
    out_s = stdout.decode("utf-8", errors="replace")
    err_s = stderr.decode("utf-8", errors="replace")
    sig = None
    if rc is not None and rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            pass
    if timed_out:
        status = "timeout"
    elif overflow:
        status = "output_limit"
    elif rc is None:
        status = "sandbox_error"
        err_s += ("\n" if err_s and not err_s.endswith("\n") else "") + "[the sandbox fork server exited]\n"
    elif rc == 0:
        status = "ok"
    elif rc == CPU_EXIT or sig == "SIGXCPU":
        status = "cpu_limit"
    elif rc < 0:
        status = "killed"
    elif rc == 1 and "MemoryError" in err_s[-400:]:
        status = "memory_limit"
    elif rc == SETUP_EXIT and err_s.startswith("sandbox setup failed"):
        status = "sandbox_error"
    else:
        status = "error"
    return SandboxResult(status, rc if rc is not None and rc >= 0 else None, sig, out_s, err_s, overflow, wall_s)
