"""Tool-call latency of any tools: each tool called directly and through a :class:`ToolExecutor`, side by side.

The tools come from a user's ``@tool`` module, an MCP config (stdio or HTTP servers), a registered env, or the
built-in tools; the arguments are the user's (``NAME={...}`` pairs or a JSONL file of calls) or, for an env, the
calls its oracle makes on the env's own tasks. At each concurrency level (calls in flight at once) every tool gets
``calls`` calls made directly (``await tool.acall(args)``: the raw call) and ``calls`` through the executor (schema
validation, timeout, classified errors: what an env runs), and the report gives p50 / p95 / p99 latency in
milliseconds, throughput in calls per second, errors by kind, and toolgym's overhead over the raw call (the
executor's p50 minus and over the direct p50). ``toolgym bench tools`` / ``toolgym bench mcp`` print it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolgym.tools.base import Tool, ToolCall, ToolError, ToolErrorKind
from toolgym.tools.executor import ToolExecutor

__all__ = [
    "LatencyRow",
    "Stats",
    "build_parser",
    "builtin_calls",
    "format_table",
    "load_calls",
    "measure",
    "oracle_calls",
    "parse_call",
    "tools_from_module",
]


@dataclass(frozen=True)
class Stats:
    """Latency of one path at one concurrency: percentiles in milliseconds, ``calls_s`` in calls per second of
    wall time, ``errors`` counted by :class:`ToolErrorKind` value."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    calls_s: float
    errors: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, latencies_s: Sequence[float], wall_s: float, errors: Counter[str]) -> Stats:
        xs = sorted(latencies_s)
        return cls(p50_ms=percentile(xs, 0.50) * 1e3, p95_ms=percentile(xs, 0.95) * 1e3,
                   p99_ms=percentile(xs, 0.99) * 1e3, calls_s=len(xs) / max(wall_s, 1e-12), errors=dict(errors))


@dataclass(frozen=True)
class LatencyRow:
    """One tool at one concurrency: the raw call (``direct``) and the call through the executor (``executor``);
    ``overhead_ms`` = executor p50 - direct p50, ``ratio`` = executor p50 / direct p50."""

    tool: str
    concurrency: int
    calls: int
    direct: Stats
    executor: Stats

    @property
    def overhead_ms(self) -> float:
        return self.executor.p50_ms - self.direct.p50_ms

    @property
    def ratio(self) -> float:
        return self.executor.p50_ms / max(self.direct.p50_ms, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overhead_ms": self.overhead_ms, "ratio": self.ratio}


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ascending ``sorted_xs`` (0 for none)."""
    if not sorted_xs:
        return 0.0
    return float(sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))])


# -- where the tools and their arguments come from ------------------------------------------------------------------
def tools_from_module(spec: str) -> list[Tool]:
    """The :class:`Tool` objects (``@tool`` functions, tool instances) defined at the top level of a module: ``spec``
    is a ``.py`` file or an importable module name, optionally ``:NAME[,NAME]`` to pick some.

    Raises:
        ValueError: the module cannot be found or defines no tool of those names.
    """
    where, _, picked = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    path = Path(where)
    if path.suffix == ".py" or path.is_file():
        if not path.is_file():
            raise ValueError(f"no tool module {where}: no such file")
        name = f"toolgym_user_tools_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"cannot load {where} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise ValueError(f"cannot import tool module {where!r}: {e}") from None
    found = {t.name: t for t in vars(module).values() if isinstance(t, Tool)}
    if picked:
        names = [n.strip() for n in picked.split(",") if n.strip()]
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(f"{where} defines no tool named {', '.join(missing)} (it has: {', '.join(found) or 'none'})")
        found = {n: found[n] for n in names}
    if not found:
        raise ValueError(f"{where} defines no tools (decorate functions with @toolgym.tool)")
    return list(found.values())


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME={"arg": 1}`` -> ``("NAME", {"arg": 1})``. Raises ``ValueError`` on another shape."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"a call is NAME=JSON_OBJECT, got {text!r}")
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"the arguments of {name.strip()} are not JSON: {e.msg}") from None
    if not isinstance(args, dict):
        raise ValueError(f"the arguments of {name.strip()} must be a JSON object, got {type(args).__name__}")
    return name.strip(), args


def load_calls(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Calls from a JSONL file, one ``{"name": ..., "arguments": {...}}`` object a line (blank lines skipped).

    Raises:
        ValueError: a line that is not such an object (with its line number).
    """
    out: list[tuple[str, dict[str, Any]]] = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not (isinstance(row, dict) and isinstance(row.get("name"), str)
                and isinstance(row.get("arguments", {}), dict)):
            raise ValueError(f'{path}:{i}: expected {{"name": str, "arguments": object}}')
        out.append((row["name"], dict(row.get("arguments", {}))))
    return out


def builtin_calls() -> tuple[list[Tool], list[tuple[str, dict[str, Any]]]]:
    """toolgym's own calculator, BM25 search, read-only SQL and sandboxed Python with typical arguments."""
    from toolgym.data.chinook import chinook_path
    from toolgym.data.geo import default_retriever
    from toolgym.tools.calculator import calculator_tool
    from toolgym.tools.python import PythonTool
    from toolgym.tools.search import SearchTool
    from toolgym.tools.sql import SQLTool

    tools: list[Tool] = [calculator_tool(), SearchTool(default_retriever()), SQLTool(chinook_path()), PythonTool()]
    calls: list[tuple[str, dict[str, Any]]] = []
    calls += [("calculator", {"expression": f"({i} + 12345) * 6789 - {i * 7}"}) for i in range(20)]
    calls += [("search", {"query": q}) for q in ("capital of France", "population of Lima", "currency of Japan")]
    calls += [("execute_sql", {"query": q}) for q in ("SELECT COUNT(*) FROM Track",
                                                      "SELECT Name FROM Artist ORDER BY Name LIMIT 5")]
    calls += [("python", {"code": f"print(sum(range({i} * 1000)))"}) for i in range(1, 6)]
    names = {t.name for t in tools}
    return tools, [c for c in calls if c[0] in names]


def oracle_calls(env_id: str, episodes: int = 8, **env_kwargs: Any) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """A registered env's executor and the calls its oracle makes on ``episodes`` of its tasks (seeds 0..n-1).

    Returns:
        ``(env, calls)``: close the env when done (it owns its tools).
    """
    import gymnasium as gym

    from toolgym.rollout import RolloutDriver, ScriptedPolicy

    env_id = env_id if "/" in env_id else f"toolgym/{env_id}"
    driver = RolloutDriver(env_id, ScriptedPolicy(lambda s: s.env.oracle(s)), num_envs=1, max_turn_tokens=512,
                           env_kwargs=env_kwargs)
    try:
        trajs = driver.run([None] * episodes, seeds=list(range(episodes)))
    finally:
        driver.venv.close()
    calls = [(c.name, dict(c.arguments)) for t in trajs for c in t.tool_calls]
    return gym.make(env_id, **env_kwargs), calls


# -- measuring ------------------------------------------------------------------------------------------------------
def _kind(e: BaseException) -> str:
    if isinstance(e, ToolError):
        return ToolErrorKind(e.kind).value
    if isinstance(e, TimeoutError):
        return ToolErrorKind.TIMEOUT.value
    return ToolErrorKind.EXCEPTION.value


async def _direct(tool: Tool, args: Sequence[Mapping[str, Any]], n: int, conc: int, timeout_s: float,
                  start: int = 0) -> tuple[list[float], Counter[str], float]:
    sem, lat, errors = asyncio.Semaphore(conc), [], Counter[str]()

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(tool.acall(args[(start + i) % len(args)]), timeout_s)
            except Exception as e:  # a raw call's failure is counted, like the executor's classified ones
                errors[_kind(e)] += 1
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return lat, errors, time.perf_counter() - t0


async def _through(ex: ToolExecutor, name: str, args: Sequence[Mapping[str, Any]], n: int, conc: int,
                   start: int = 0) -> tuple[list[float], Counter[str], float]:
    sem, lat, errors = asyncio.Semaphore(conc), [], Counter[str]()

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            r = await ex.run(ToolCall(name, dict(args[(start + i) % len(args)])))
            lat.append(time.perf_counter() - t0)
            if not r.ok:
                errors[r.error_kind.value if r.error_kind else "exception"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return lat, errors, time.perf_counter() - t0


async def measure(tools: Sequence[Tool], calls: Sequence[tuple[str, Mapping[str, Any]]], *, n: int = 200,
                  concurrency: Sequence[int] = (1, 8, 32), timeout_s: float = 30.0,
                  executor: ToolExecutor | None = None, rounds: int = 4) -> list[LatencyRow]:
    """Time every tool that has calls: ``n`` raw calls and ``n`` calls through ``executor`` (a fresh one over
    ``tools`` when ``None``; the caller closes the tools) at each concurrency, after a warm-up of a few calls;
    the two paths alternate in ``rounds`` rounds.

    Raises:
        ValueError: a call names no tool of ``tools``, or no tool has a call.
    """
    by_name = {t.name: t for t in tools}
    unknown = sorted({name for name, _ in calls} - set(by_name))
    if unknown:
        raise ValueError(f"calls name unknown tools {', '.join(unknown)} (tools: {', '.join(by_name)})")
    args: dict[str, list[Mapping[str, Any]]] = {}
    for name, a in calls:
        args.setdefault(name, []).append(a)
    if not args:
        raise ValueError("no calls to time: give arguments (NAME=JSON, or a JSONL file of calls) for "
                         + ", ".join(f"{t.name}({', '.join(t.parameters.get('properties', {}))})" for t in tools))
    ex = executor if executor is not None else ToolExecutor(tools, max_concurrency=max(concurrency) * 2,
                                                            default_timeout_s=timeout_s, max_retries=0)
    rows: list[LatencyRow] = []
    for name, a in args.items():
        tool = by_name[name]
        await _direct(tool, a, min(n, 8), 2, timeout_s)  # warm-up: pools, sessions, JIT, caches
        for conc in concurrency:
            # the two paths alternate in rounds (A B B A ...): a machine whose speed drifts, or a cache that warms,
            # favours neither
            d_lat, e_lat, d_err, e_err, d_wall, e_wall = [], [], Counter[str](), Counter[str](), 0.0, 0.0
            sizes = [n // rounds + (1 if i < n % rounds else 0) for i in range(rounds)]
            done = 0  # both paths cycle through the same calls in the same order
            for i, m in enumerate(s for s in sizes if s):
                for path in (("direct", "executor") if i % 2 == 0 else ("executor", "direct")):
                    if path == "direct":
                        lat, err, wall = await _direct(tool, a, m, conc, timeout_s, done)
                        d_lat, d_wall = d_lat + lat, d_wall + wall
                        d_err.update(err)
                    else:
                        lat, err, wall = await _through(ex, name, a, m, conc, done)
                        e_lat, e_wall = e_lat + lat, e_wall + wall
                        e_err.update(err)
                done += m
            rows.append(LatencyRow(tool=name, concurrency=conc, calls=n, direct=Stats.of(d_lat, d_wall, d_err),
                                   executor=Stats.of(e_lat, e_wall, e_err)))
    return rows


def format_table(rows: Sequence[LatencyRow]) -> str:
    """The rows as an aligned text table (latencies in ms, throughput in calls/s, errors as ``kind:count``)."""
    head = (f"{'tool':<20} {'conc':>5} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9} {'calls/s':>9} "
            f"{'raw p50':>9} {'raw calls/s':>11} {'overhead ms':>11} {'exec/raw':>9}  errors")
    lines = [head]
    for r in rows:
        errs = ", ".join(f"{k}:{v}" for k, v in sorted(r.executor.errors.items())) or "-"
        lines.append(f"{r.tool[:20]:<20} {r.concurrency:>5} {r.executor.p50_ms:>9.3f} {r.executor.p95_ms:>9.3f} "
                     f"{r.executor.p99_ms:>9.3f} {r.executor.calls_s:>9.0f} {r.direct.p50_ms:>9.3f} "
                     f"{r.direct.calls_s:>11.0f} {r.overhead_ms:>11.3f} {r.ratio:>8.2f}x  {errs}")
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------------------------------
def build_parser(prog: str = "toolgym bench tools") -> Any:
    """The ``argparse`` parser of :func:`main`."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=(
        "examples:\n"
        "  toolgym bench tools --module my_tools.py --call 'lookup={\"key\": \"a\"}'\n"
        "  toolgym bench mcp --config mcp.json --calls-file calls.jsonl --concurrency 1,16,64\n"
        "  toolgym bench tools --env SQL-v0          # the env's tools on its oracle's calls\n"
        "  toolgym bench tools                       # toolgym's built-in tools\n"
        "exit codes: 0 ok, 1 a tool or server failed to start, 2 bad arguments, 3 unreadable input"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--module", action="append", default=[], metavar="FILE.py|MODULE[:NAMES]",
                     help="a Python file or module whose @tool functions to time (repeatable)")
    src.add_argument("--config", "--mcp", dest="mcp", metavar="MCP.json",
                     help="an MCP config (mcpServers: stdio commands or HTTP urls) whose tools to time")
    src.add_argument("--env", metavar="ID", help="a registered env whose tools to time (e.g. SQL-v0)")
    ap.add_argument("--call", action="append", default=[], metavar="NAME=JSON",
                    help="a call to time, e.g. 'calculator={\"expression\": \"2+2\"}' (repeatable; cycled)")
    ap.add_argument("--calls-file", metavar="CALLS.jsonl", help='calls, one {"name", "arguments"} object a line')
    ap.add_argument("--calls", type=int, default=200, metavar="N", help="calls per tool, path and concurrency")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated calls in flight at once")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per call (both paths)")
    ap.add_argument("--episodes", type=int, default=8, help="--env: oracle episodes whose calls are timed")
    ap.add_argument("--json", metavar="OUT.json", help="also write the rows as JSON")
    return ap


def main(argv: Sequence[str] | None = None, *, prog: str = "toolgym bench tools") -> int:
    """``toolgym bench tools`` / ``toolgym bench mcp``: time a user's tools. Returns an exit code (0 ok, 1 a tool
    could not be started, 2 bad arguments, 3 an unreadable module, config or calls file)."""
    from toolgym import runtime

    ap = build_parser(prog)
    args = ap.parse_args(list(argv or []))
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
        if not concurrency or min(concurrency) < 1 or args.calls < 1:
            raise ValueError
    except ValueError:
        ap.error("--concurrency takes positive integers (1,8,32) and --calls a positive count")
    try:
        calls = [parse_call(c) for c in args.call]
        if args.calls_file:
            calls += load_calls(args.calls_file)
    except ValueError as e:
        ap.error(str(e))
    except OSError as e:
        print(f"error: cannot read {args.calls_file}: {e.strerror or e}", file=sys.stderr)
        return 3

    closers: list[Any] = []
    try:
        if args.module:
            try:
                tools = [t for spec in args.module for t in tools_from_module(spec)]
            except (ValueError, OSError, SyntaxError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 3
        elif args.mcp:
            from toolgym.tools.mcp import MCPToolset

            try:
                toolset = MCPToolset(args.mcp, timeout_s=args.timeout)
            except (ValueError, OSError) as e:
                print(f"error: MCP config {args.mcp}: {e}", file=sys.stderr)
                return 3
            try:
                tools = list(runtime.run_sync(toolset.aconnect()))
            except Exception as e:  # noqa: BLE001 - a server that cannot start is the user's to see
                print(f"error: {e}", file=sys.stderr)
                return 1
            closers.append(toolset.aclose)
        elif args.env:
            env, env_calls = oracle_calls(args.env, args.episodes)
            closers.append(env.close)
            tools = list(env.unwrapped.executor.tools.values())
            calls = calls or env_calls
        else:
            tools, default = builtin_calls()
            calls = calls or default
            closers += [t.aclose for t in tools if hasattr(t, "aclose")]
        try:
            rows = runtime.run_sync(measure(tools, calls, n=args.calls, concurrency=concurrency,
                                            timeout_s=args.timeout))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    finally:
        for close in closers:
            result = close()
            if asyncio.iscoroutine(result):
                runtime.run_sync(result)
    print("latency per call through the executor (p50/p95/p99 ms, calls/s); raw = the tool called directly;")
    print("overhead = executor p50 - raw p50; exec/raw = executor p50 / raw p50")
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in rows], indent=2), encoding="utf-8")
        print(f"wrote {args.json}")
    ratios = {f"{r.tool}@{r.concurrency}": round(r.ratio, 3) for r in rows}
    print(json.dumps({"toolgym_bench": "tools", "units": {"ratio": "executor p50 / raw p50 latency"},
                      "ratios": ratios, "results": [r.to_dict() for r in rows]}))
    return 0
