"""The simulators of a multi-turn BFCL episode in a worker process, so that every call has a timeout.

BFCL's simulators are plain Python, and a model chooses their arguments: ``MathAPI.power(base=7,
exponent=100000000)`` computes a number of some 85 million digits. A worker thread does not bound such a call: a big
``int`` power runs in one C call that holds the GIL, so the event loop (every other episode) stops until it returns,
and a thread cannot be stopped anyway. So each :class:`~toolgym.envs.bfcl.env.BFCLEnv` runs its episode's simulator
instances (the model's and the ground truth's) in one child process, :func:`main`, started on the first multi-turn
call and kept across episodes; the env owns it and :meth:`SimulatorWorker.close` (the env's ``close``) stops it.
The model's calls are tools (:class:`SimulatorMethod`, one per simulator method, from
:meth:`SimulatorSession.tools`) that the env's :class:`~toolgym.tools.executor.ToolExecutor` runs like any tool, in
the order written, under its timeout, metrics and error kinds; the answer is awaited on the loop (the loop watches
the pipe; no thread waits). A call that outruns the timeout is cancelled, which kills the process (nothing is left
running); the executor answers ``timeout``, and the next call starts a fresh process that replays the episode's
completed calls (the simulators are deterministic) first.

The protocol is one JSON object per line: requests on the child's stdin, replies on a copy of its stdout (what the
simulators print goes to stderr, which is discarded). Every value crossing is JSON: call arguments are JSON values
(:func:`~toolgym.envs.bfcl.simulators.check_call`), results are strings, verdicts dicts of strings and booleans.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolgym.envs.bfcl.simulators import CallRejected, check_call, keyword_form, simulator_classes
from toolgym.tools.base import Tool, ToolError, ToolErrorKind

__all__ = ["SimulatorMethod", "SimulatorSession", "SimulatorTimeout", "SimulatorWorker", "main"]


class SimulatorTimeout(TimeoutError):
    """A simulator call outran its timeout; its worker process was killed."""


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not yet delivered
        pass


async def _read_line(fd: int) -> bytes:
    """One reply line from the pipe ``fd``, read on the event loop as bytes arrive (no thread waits on it); ``b""``
    when the process closed it. A reply is the only thing the process writes, so nothing follows the line."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    buf = bytearray()

    def readable() -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        buf.extend(chunk)
        if (not chunk or b"\n" in chunk) and not done.done():
            done.set_result(bytes(buf) if chunk else b"")

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


class SimulatorWorker:
    """The parent's end of one worker process (started on demand, restarted after a kill).

    Attributes:
        starts: how many processes it has started (1 + restarts).
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # one request at a time on the pipe
        self._proc: subprocess.Popen[bytes] | None = None
        self._loaded: SimulatorSession | None = None
        self._finalizer: weakref.finalize | None = None
        self.starts = 0

    def _start(self) -> subprocess.Popen[bytes]:
        root = str(Path(__file__).resolve().parents[3])  # the directory holding this toolgym package
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        proc = subprocess.Popen([sys.executable, "-m", "toolgym.envs.bfcl.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._proc, self._loaded = proc, None
        self._finalizer = weakref.finalize(self, _kill, proc)
        self.starts += 1
        return proc

    @property
    def pid(self) -> int | None:
        """The running process's id (``None`` when none runs)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def kill(self) -> None:
        """Stop the process and reap it (a later request starts a fresh one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._proc, self._loaded, self._finalizer = None, None, None

    close = kill  #: what an owner calls when done (the process is also killed when the worker is collected or at exit)

    async def request(self, session: SimulatorSession, req: Mapping[str, Any],
                      timeout_s: float | None) -> dict[str, Any]:
        """Send ``req`` for ``session`` (loading it first, by replay, when the process holds another or none) and
        await the reply, at most ``timeout_s`` seconds (:class:`SimulatorTimeout` after killing the process;
        ``None``: until the caller's own timeout cancels it, which kills the process)."""
        async with self._lock:
            if self._loaded is not session or self._proc is None or self._proc.poll() is not None:
                n = len(session.history)
                bound = None if timeout_s is None else timeout_s * (1 + n)
                await self._ask({"op": "open", **session.spec, "replay": session.history}, bound)
                self._loaded = session
            return await self._ask(req, timeout_s)

    async def multi_turn_verdict(self, row: Mapping[str, Any], decoded: Sequence[Sequence[Sequence[str]]],
                                 timeout_s: float | None = None) -> dict[str, Any]:
        """BFCL's multi-turn verdict (:func:`~toolgym.envs.bfcl.checkers.multi_turn_verdict`) computed in the
        process, at most ``timeout_s`` seconds (``None``: until the caller's own time limit cancels it, which kills
        the process)."""
        req = {"op": "verdict", "row": dict(row), "decoded": [[list(s) for s in t] for t in decoded]}
        async with self._lock:
            return dict((await self._ask(req, timeout_s))["verdict"])

    async def _ask(self, req: Mapping[str, Any], timeout_s: float | None) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self.kill()  # reaps one that exited by itself
            proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
            async with asyncio.timeout(timeout_s):
                line = await _read_line(proc.stdout.fileno())
        except TimeoutError:
            self.kill()
            raise SimulatorTimeout(f"no answer within {timeout_s} s") from None
        except BaseException:
            self.kill()  # cancelled or a broken pipe: the process's state is unknown
            raise
        if not line:
            self.kill()
            raise RuntimeError("the BFCL simulator process exited")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"BFCL simulator process: {reply['error']}")
        return reply


class SimulatorSession:
    """One episode's simulators (the model's instances and the ground truth's), held by a :class:`SimulatorWorker`.

    Args:
        worker: the process that runs them.
        involved_classes, initial_config, long_context: the entry's (see
            :class:`~toolgym.envs.bfcl.simulators.APISession`).

    Attributes:
        methods: public method name -> class name (``{}`` until the first call opened the session).
        history: the completed operations, replayed into a fresh process after a kill.
        results: the result text of every model call that ran, in order (BFCL's response check reads them).
        fault: the worker failure (not the call's) a :class:`SimulatorMethod` met, else ``None``; the env ends the
            episode with it.
    """

    def __init__(self, worker: SimulatorWorker, involved_classes: Sequence[str], initial_config: Mapping[str, Any],
                 long_context: bool = False) -> None:
        self.worker = worker
        self.spec = {"classes": list(involved_classes), "config": dict(initial_config), "long": bool(long_context)}
        self.classes = simulator_classes(involved_classes)
        self.methods: dict[str, str] = {}
        self.history: list[list[Any]] = []
        self.results: list[str] = []
        self.fault: RuntimeError | None = None
        self._tools: dict[str, SimulatorMethod] = {}

    def keyword_form(self, text: str) -> tuple[str, dict[str, Any]]:
        """A ground-truth call string as ``(name, keyword arguments)`` (read from the classes in this process)."""
        return keyword_form(self.classes, text)

    async def open(self, timeout_s: float) -> dict[str, str]:
        """Build the instances (once) and return :attr:`methods`."""
        if not self.methods:
            self.methods = (await self.worker.request(self, {"op": "methods"}, timeout_s))["methods"]
        return self.methods

    async def tools(self, timeout_s: float) -> dict[str, SimulatorMethod]:
        """The session's methods as tools for the executor (:meth:`open` first, at most ``timeout_s`` seconds)."""
        if not self._tools:
            self._tools = {m: SimulatorMethod(self, m) for m in await self.open(timeout_s)}
        return self._tools

    async def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float | None = None) -> str:
        """Run one checked call on the model's instances; the result text BFCL's executor would give (also appended
        to :attr:`results`). ``timeout_s``: see :meth:`SimulatorWorker.request`."""
        out = (await self.worker.request(self, {"op": "call", "name": name, "args": dict(arguments)}, timeout_s))["out"]
        self.history.append(["call", name, dict(arguments)])
        self.results.append(str(out))
        return str(out)

    async def call_ground_truth(self, text: str, timeout_s: float) -> str:
        """Run one of BFCL's ground-truth call strings on the ground truth's instances."""
        out = (await self.worker.request(self, {"op": "truth", "text": text}, timeout_s))["out"]
        self.history.append(["truth", text])
        return str(out)

    async def check_turn(self, model_results: Sequence[str], truth_results: Sequence[str], turn_index: int,
                         model_called: bool, timeout_s: float) -> dict[str, Any]:
        """BFCL's checks of one finished user turn (:func:`~toolgym.envs.bfcl.checkers.turn_verdict`)."""
        req = {"op": "check", "model_results": list(model_results), "truth_results": list(truth_results),
               "turn": int(turn_index), "model_called": bool(model_called)}
        return dict((await self.worker.request(self, req, timeout_s))["verdict"])


class SimulatorMethod(Tool):
    """One simulator method of an episode as a tool the executor runs (never cached: calls change the state).

    The executor bounds it (its ``default_timeout_s``; cancelling the call kills the worker process) and records
    its metrics. :meth:`acall` checks the call (:func:`~toolgym.envs.bfcl.simulators.check_call`: identifier
    argument keys, JSON values; else ``invalid_arguments``) and returns the simulator's answer as BFCL's executor
    writes it; a method that raised answers ``Error during execution: ...``, reported as an ``exception`` result.
    """

    cacheable = False

    def __init__(self, session: SimulatorSession, name: str) -> None:
        self.session, self.name = session, name
        self.description = f"{session.methods.get(name, 'simulator')}.{name}"

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        try:
            name, args = check_call(self.name, arguments, [self.name])
        except CallRejected as e:
            raise ToolError(str(e), kind=ToolErrorKind.INVALID_ARGUMENTS) from None
        try:
            out = await self.session.call(name, args)
        except RuntimeError as e:  # the process failed, not the call: the env ends the episode (SimulatorSession.fault)
            self.session.fault = e
            raise
        if out.startswith("Error during execution"):
            raise ToolError(out)
        return out


# -- the child process -----------------------------------------------------------------------------------------------
def _serve(req: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    from toolgym.envs.bfcl.simulators import APISession

    op = req.get("op")
    if op == "verdict":  # no session: BFCL's checker builds its own instances
        from toolgym.envs.bfcl.checkers import multi_turn_verdict

        return {"verdict": multi_turn_verdict(req["row"], req["decoded"])}
    if op == "open":
        model = APISession(req["classes"], req["config"], long_context=req["long"])
        truth = APISession(req["classes"], req["config"], long_context=req["long"])
        for item in req.get("replay", []):
            if item[0] == "call":
                model.call(item[1], item[2])
            else:
                truth.call_ground_truth(item[1])
        state.update(model=model, truth=truth)
        return {"ok": True}
    model, truth = state.get("model"), state.get("truth")
    if model is None or truth is None:
        return {"error": "no session is open"}
    if op == "methods":
        return {"methods": dict(model.methods)}
    if op == "call":
        return {"out": model.call(req["name"], req["args"])}
    if op == "truth":
        return {"out": truth.call_ground_truth(req["text"])}
    if op == "check":
        from toolgym.envs.bfcl.checkers import turn_verdict

        return {"verdict": turn_verdict(model.instances, truth.instances, req["model_results"], req["truth_results"],
                                        req["turn"], req["model_called"])}
    return {"error": f"unknown request {op!r}"}


def main() -> None:
    """The worker: read requests from stdin until it closes, answer each on the protocol channel."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the simulators print never reaches the protocol channel
    sys.stdout = sys.stderr
    state: dict[str, Any] = {}
    for line in sys.stdin:
        try:
            reply = _serve(json.loads(line), state)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the episode
            reply = {"error": f"{type(e).__name__}: {e}"}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
