"""An MCP server of the 2025-11-25 era only, written by hand over stdio (no SDK): it answers `initialize`, lists
one side-effect tool and runs it, and refuses anything else with -32601 — `server/discover` included, as a
server older than 2026-07-28 does. Each request's method goes to `MCP_TEST_STATE/legacy.jsonl`, each effect with
its `_meta` to `effects.jsonl`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STATE = Path(os.environ.get("MCP_TEST_STATE", "."))
TOOL = {
    "name": "write",
    "description": "Record an effect.",
    "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "annotations": {"readOnlyHint": True},
}


def record(name: str, line: dict) -> None:
    with open(STATE / name, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def answer(request: dict) -> dict | None:
    method, params = request.get("method"), request.get("params") or {}
    record("legacy.jsonl", {"method": method})
    if "id" not in request:
        return None  # a notification (notifications/initialized, cancelled)
    if method == "initialize":
        result = {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "legacy", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and params.get("name") == "write":
        meta = params.get("_meta") or {}
        record("effects.jsonl", {"name": params["arguments"]["name"], "key": meta.get("io.agentrt/idempotency-key")})
        result = {"content": [{"type": "text", "text": "wrote " + params["arguments"]["name"]}]}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


for line in sys.stdin:
    if line.strip():
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
