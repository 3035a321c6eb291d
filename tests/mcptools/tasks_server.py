"""A small MCP server of our own (the SDK's `MCPServer`, mcp 2) speaking what long operations need and real
servers will not do on demand: the Tasks extension (`io.modelcontextprotocol/tasks`: a `tools/call` answered
with a task, `tasks/get`), multi round-trip input (`InputRequiredResult` with an elicitation and an opaque
`requestState`) and progress notifications.

    python tests/mcptools/tasks_server.py              # stdio
    python tests/mcptools/tasks_server.py --http PORT  # Streamable HTTP on 127.0.0.1:PORT/mcp

The SDK has no server side of the Tasks extension at this revision; this one binds `tasks/get` as an
extension method and answers `long_write` with a `CreateTaskResult` (`resultType: "task"`) from a
`tools/call` interceptor, only when the request declares the extension in its per-request capabilities.

`MCP_TEST_STATE` names a directory (shared by every process of this server):
- `calls.jsonl`: one line per `tools/call` received (tool, key, whether it carried `inputResponses`);
- `gets.jsonl`: one line per `tasks/get`;
- `tasks/<id>.json`: each task, written (fsync) before the `CreateTaskResult` is sent — a task is durably
  created before it is acknowledged, and any process of this server answers for it;
- `effects.jsonl`: one line per effect (a task that completed, a `ask_then_write` that ran);
- a file `go` lets a `working` task complete (at its next `tasks/get`); `fail_task` makes it fail instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp_types import CallToolRequestParams, RequestParams

STATE = Path(os.environ.get("MCP_TEST_STATE", "."))
TASKS = "io.modelcontextprotocol/tasks"
CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
KEY = "io.agentrt/idempotency-key"


def _line(name: str, record: dict) -> None:
    with open(STATE / name, "a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _task_path(task_id: str) -> Path:
    return STATE / "tasks" / f"{task_id}.json"


def _save(task: dict) -> None:
    path = _task_path(task["taskId"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        json.dump(task, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _wants_tasks(meta: Any) -> bool:
    capabilities = (dict(meta or {})).get(CAPABILITIES) or {}
    return TASKS in ((capabilities.get("extensions") or {}) if isinstance(capabilities, dict) else {})


class GetTaskParams(RequestParams):
    taskId: str  # noqa: N815  (the wire's name)


class TasksExtension(Extension):
    identifier = TASKS

    def methods(self):
        return [MethodBinding(method="tasks/get", params_type=GetTaskParams, handler=self.get)]

    async def get(self, ctx: ServerRequestContext, params: GetTaskParams) -> dict:
        _line("gets.jsonl", {"task": params.taskId, "pid": os.getpid()})
        path = _task_path(params.taskId)
        if not path.exists():
            raise ValueError(f"no task {params.taskId!r}")
        task = json.loads(path.read_text())
        if task["status"] == "working" and (STATE / "fail_task").exists():
            task.update(status="failed", error={"code": -32603, "message": "the job failed"}, lastUpdatedAt=_now())
            _save(task)
        elif task["status"] == "working" and (STATE / "go").exists():
            name = task["arguments"].get("name")
            _line("effects.jsonl", {"tool": "long_write", "name": name, "key": task["key"], "task": task["taskId"]})
            task.update(
                status="completed",
                lastUpdatedAt=_now(),
                result={"content": [{"type": "text", "text": f"wrote {name} (task)"}], "isError": False},
            )
            _save(task)
        shown = {k: v for k, v in task.items() if k not in ("arguments", "key")}
        return {"resultType": "complete", **shown}

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext, call_next):
        if params.name != "long_write" or not _wants_tasks(ctx.meta):
            return await call_next(ctx)
        meta = dict(ctx.meta or {})
        _line("calls.jsonl", {"tool": "long_write", "key": meta.get(KEY), "pid": os.getpid()})
        task = {
            "taskId": str(uuid.uuid4()),
            "status": "working",
            "statusMessage": "the job is queued",
            "createdAt": _now(),
            "lastUpdatedAt": _now(),
            "ttlMs": 3_600_000,
            "pollIntervalMs": 100,
            "arguments": dict(params.arguments or {}),
            "key": meta.get(KEY),
        }
        _save(task)  # durably created before the CreateTaskResult is sent
        return {"resultType": "task", **{k: v for k, v in task.items() if k not in ("arguments", "key")}}


class AskExtension(Extension):
    identifier = "io.agentrt.test/ask"

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext, call_next):
        if params.name != "ask_then_write":
            return await call_next(ctx)
        meta = dict(ctx.meta or {})
        responses = params.input_responses
        _line(
            "calls.jsonl",
            {
                "tool": "ask_then_write",
                "key": meta.get(KEY),
                "answered": responses is not None,
                "state": params.request_state,
            },
        )
        if responses is None or params.request_state != "state-1":
            return {
                "resultType": "input_required",
                "inputRequests": {
                    "colour": {
                        "method": "elicitation/create",
                        "params": {
                            "mode": "form",
                            "message": "Which colour should the branch be?",
                            "requestedSchema": {
                                "type": "object",
                                "properties": {"colour": {"type": "string", "description": "a colour"}},
                                "required": ["colour"],
                            },
                        },
                    }
                },
                "requestState": "state-1",
            }
        answer = responses.get("colour")
        content = getattr(answer, "content", None) or {}
        colour = content.get("colour")
        name = (params.arguments or {}).get("name")
        _line("effects.jsonl", {"tool": "ask_then_write", "name": name, "colour": colour, "key": meta.get(KEY)})
        text = f"wrote {name} in {colour}"
        return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": False}


# Every process of this server seals and opens `requestState` with one key (a deployment of several instances
# shares its key the same way): a question asked by one process is answered to the next.
SECURITY = RequestStateSecurity(keys=[b"agentrt-tests-request-state-key!"], ttl=3600)
server = MCPServer("tasks", extensions=[TasksExtension(), AskExtension()], request_state_security=SECURITY)


@server.tool()
def long_write(name: str, ctx: Context) -> str:
    """Start a long job that records an effect named `name` (answered with a task when the client can poll)."""
    meta = dict(ctx.request_context.meta or {})
    _line("calls.jsonl", {"tool": "long_write", "key": meta.get(KEY), "pid": os.getpid(), "inline": True})
    return f"wrote {name} (inline)"


@server.tool()
def ask_then_write(name: str) -> str:
    """Ask which colour first (an InputRequiredResult with an elicitation), then record an effect named `name`."""
    raise RuntimeError("answered by AskExtension.intercept_tool_call")


@server.tool()
async def progress_write(name: str, steps: int, ctx: Context) -> str:
    """Report `steps` progress notifications (a few milliseconds apart), then record an effect."""
    meta = dict(ctx.request_context.meta or {})
    _line("calls.jsonl", {"tool": "progress_write", "key": meta.get(KEY)})
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i} of {steps}")
        await anyio.sleep(0.01)
    _line("effects.jsonl", {"tool": "progress_write", "name": name, "key": meta.get(KEY)})
    return f"wrote {name} in {steps} steps"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    args = parser.parse_args()
    STATE.mkdir(parents=True, exist_ok=True)
    print(f"tasks server pid {os.getpid()} starting", file=sys.stderr, flush=True)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
