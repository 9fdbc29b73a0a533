"""The Python sandbox behind the ``python`` tool: :class:`Sandbox` runs each snippet in a fresh, isolated process.

Every snippet runs in its own process, which runs exactly that one snippet and exits. The processes are forked
by a **fork server** ("zygote"): one long-lived ``python -I -S`` per :class:`Sandbox` that has imported what a
worker needs once and never runs user code itself; each fork is a copy of that pristine interpreter (a fraction of
the CPU of starting and isolating a new interpreter; ``docs/benchmarks.md``). A warm pool keeps ``pool_size`` workers
forked, isolated and limited ahead of time, waiting for code on stdin; the pool refills in the background. If
the fork server dies it is restarted on the next call (calls in flight end as ``sandbox_error``).

Each worker, before it reads any code:

* is PID 1 of a new **PID namespace** and has new **mount and network namespaces** (``unshare(2)``) when the
  host allows it: no network interfaces but a down loopback, its own ``/proc`` showing only its own processes,
  and when the worker exits or is killed every process it started dies with it. It leads its own session and
  process group, so the host can always kill it (``killpg``) and it cannot move out of that group;
* has its own **IPC namespace** (SysV shared memory, semaphores and message queues are private and vanish with it);
* gets one private, size-limited ``tmpfs`` behind the world-writable directories (``/tmp``, ``/var/tmp``,
  ``/dev/shm``, ``/run/lock``: one size bound for all), and an empty read-only ``/run`` (no view of host
  services' path-based unix sockets; abstract ones are cut off by the network namespace); its working directory
  is a fresh directory in its private ``/tmp``;
* drops root privileges to a dedicated unprivileged uid per worker (when the host runs as root), so it cannot
  write outside its tmpfs, signal host processes or exceed ``RLIMIT_NPROC`` (which root ignores);
* applies ``setrlimit``: CPU seconds, address space, processes, file size, open files, no core dumps;
* has a scrubbed environment (no host variables), closes every inherited file descriptor but its stdio, and runs
  in an interpreter started with ``-I -S`` (isolated mode).

The host enforces a wall-clock timeout and an output cap, killing the worker's process group (and so its PID
namespace) when either is exceeded. ``Sandbox(fork_server=False)`` starts a fresh interpreter per worker instead
(same isolation; the baseline of ``benchmarks/sandbox.py``). See ``docs/sandbox.md`` for what is and is not
isolated, in particular when namespaces are unavailable.

Modules: :mod:`.worker` (the fork server and worker program, run as a script: the isolation itself and the
protocol), :mod:`.forkserver` (the host side of a fork server), :mod:`.pool` (:class:`Sandbox`: warm pool,
wall clock, output cap), :mod:`.limits` (:class:`SandboxLimits`, :class:`SandboxResult`, classification),
:mod:`.host` (namespace probe, path permissions, the mounts a worker needs).
"""

from toolgym.tools.sandbox.host import namespaces_available
from toolgym.tools.sandbox.limits import SandboxLimits, SandboxResult
from toolgym.tools.sandbox.pool import Sandbox

__all__ = ["Sandbox", "SandboxLimits", "SandboxResult", "namespaces_available"]
