"""A hand-written stdio MCP server for fault injection: it answers ``initialize`` and then serves a ``tools/list``
reply that the official SDK server would never send (the only way to test a client against a malformed one).

``python raw_server.py plain``: lists ``good`` (answers ``tools/call`` with its ``text``) and ``garbage`` (first writes a
line that is not UTF-8, then answers with a text holding a byte that is not UTF-8: ``caf\xe9``).
``python raw_server.py bad-schema``: lists ``good``, ``bad_required`` (``inputSchema.required`` is a string:
the SDK's ``Tool`` model rejects it) and ``bad_type`` (``"type": 5``: not a valid JSON Schema); ``python raw_server.py bad-list``: ``tools/list`` answers ``{"tools": "nope"}``.
``python raw_server.py die-after N``: lists ``good`` and answers its first ``N`` calls, then exits (status 3) on
reading call ``N + 1``, its answers to the first ``N`` still unread in the pipe.
"""

from __future__ import annotations

import json
import os
import sys

GOOD = {"name": "good", "description": "Echo text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
GARBAGE = {"name": "garbage", "description": "Write bytes that are not UTF-8.",
           "inputSchema": {"type": "object", "properties": {}}}
TOOLS = {
    "plain": [GOOD, GARBAGE],
    "bad-schema": [
        GOOD,
        {"name": "bad_required", "inputSchema": {"type": "object", "properties": {}, "required": "text"}},
        {"name": "bad_type", "inputSchema": {"type": "object", "properties": {"a": {"type": 5}}}},
    ],
    "bad-list": "nope",
    "die-after": [GOOD],
}


def main() -> None:
    mode = sys.argv[1]
    answered, limit = 0, int(sys.argv[2]) if mode == "die-after" else None
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method, rid = msg.get("method"), msg["id"]
        if method == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": TOOLS[mode]}
        elif method == "tools/call" and msg["params"]["name"] == "garbage":
            out = sys.stdout.buffer
            out.write(b"\xff\xfe\x80 not utf-8 \xc3\x28\n")
            out.write(b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "caf\xe9"}]}}\n'
                      % json.dumps(rid).encode())
            out.flush()
            continue
        elif method == "tools/call" and limit is not None and answered >= limit:
            os._exit(3)
        elif method == "tools/call":
            answered += 1
            result = {"content": [{"type": "text", "text": str(msg["params"]["arguments"].get("text"))}]}
        else:
            out = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}
            print(json.dumps(out), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}), flush=True)


if __name__ == "__main__":
    main()
