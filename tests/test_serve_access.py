"""Who may reach `toolgym serve mcp|model|retriever`: a non-loopback bind needs a Bearer token (exit 2 without
one); with a token every request carries it; without one only loopback Host names are answered (no DNS
rebinding). Real servers in subprocesses; a 0.0.0.0 bind is reached only through 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.procs import free_port, stop
from toolgym.tools.base import ToolCall
from toolgym.tools.executor import ToolExecutor
from toolgym.tools.mcp import MCPToolset

TOKEN = "s3cret-token-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[1]


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TOOLGYM_SERVE_TOKEN"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if token is not None:
        env["TOOLGYM_SERVE_TOKEN"] = token
    return env


def _toolgym(*args: str, token: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolgym.cli", *args], env=_env(token), capture_output=True, text=True,
                          timeout=timeout)


def _start(args: list[str], port: int, token: str | None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "toolgym.cli", *args], env=_env(token), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 180
    while time.monotonic() < end and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    stop(proc)
    pytest.fail(f"server did not start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")


def _request(url: str, headers: dict[str, str], body: dict | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("server", [["mcp", "--tools", "python", "--transport", "http"], ["model"], ["retriever"]])
def test_non_loopback_bind_without_token_is_refused(server):
    r = _toolgym("serve", *server, "--host", "0.0.0.0", "--port", str(free_port()))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "refusing to serve on 0.0.0.0" in r.stderr and "TOOLGYM_SERVE_TOKEN" in r.stderr


def test_short_token_is_refused():
    r = _toolgym("serve", "retriever", "--host", "0.0.0.0", "--port", str(free_port()), token="short")
    assert r.returncode == 2 and "16 characters" in r.stderr


def test_mcp_on_all_interfaces_answers_only_the_token():
    port = free_port()
    proc = _start(["serve", "mcp", "--tools", "calculator", "--transport", "http", "--host", "0.0.0.0",
                   "--port", str(port)], port, TOKEN)
    url = f"http://127.0.0.1:{port}/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    try:
        assert _request(url, {}, init) == 401
        assert _request(url, {"Authorization": "Bearer wrong-token-0123456789"}, init) == 401
        ts = MCPToolset({"mcpServers": {"tg": {"url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}})
        try:
            tools = ts.connect()
            r = asyncio.run(ToolExecutor(tools, default_timeout_s=20, max_retries=0).run(
                ToolCall("calculator", {"expression": "6 * 7"})))
            assert r.ok and r.content == "42"
        finally:
            ts.close()
    finally:
        stop(proc)


def test_mcp_on_loopback_refuses_a_foreign_host_header():
    port = free_port()
    proc = _start(["serve", "mcp", "--tools", "calculator", "--transport", "http", "--port", str(port)], port, None)
    url = f"http://127.0.0.1:{port}/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    try:
        assert _request(url, {"Host": f"attacker.example:{port}"}, init) == 403  # a DNS-rebinding page
        assert _request(url, {}, init) == 200
    finally:
        stop(proc)


def test_retriever_on_all_interfaces_needs_the_bearer_token():
    port = free_port()
    proc = _start(["serve", "retriever", "--host", "0.0.0.0", "--port", str(port)], port, TOKEN)
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        assert _request(url, {}, {"queries": ["Japan"]}) == 401
        assert _request(url, {"Authorization": f"Bearer {TOKEN}"}, {"queries": ["Japan"]}) == 200
    finally:
        stop(proc)
