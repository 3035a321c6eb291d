"""What outlives one MCP request: tasks, questions and progress (MCP 2026-07-28).

**Tasks** (the Tasks extension, `io.modelcontextprotocol/tasks`; the SDK has
types for 2025-11-25's tasks only, so its wire messages are ours, sent on the
SDK's session): every client declares the extension (`TasksExtension`, which
claims the `resultType: "task"` result so the SDK advertises it per request);
a server may then answer a `tools/call` with a `CreateTaskResult` — a task
id, a TTL and a poll interval — and the call's result is the task's, read by
polling `tasks/get` until the task is `completed` (its `result`), `failed`
(its JSON-RPC `error`) or `cancelled`. The server creates the task durably
before it answers, so a task id is a handle that survives our process: a
side effect's is kept in the call's record (`ToolExecutionContext.record`,
committed before anything else is done with it) and a takeover polls
`tasks/get` for it (`poll`) instead of asking a person.

**Questions** (multi round-trip requests): a server that needs input first
answers `InputRequiredResult` (`inputRequests`, an opaque `requestState`);
nothing ran. The call becomes the run's question (`question_of`: each form
elicitation's message and the fields it asks for) and waits for the user's
answer; the answer (`responses`) is turned into `inputResponses` and the
request is issued again with the unchanged `requestState`. Only form-mode
elicitations can be answered (a person types the answer); a server asking
for sampling, roots or a URL visit gets no answer and the call fails
`mcp_input_unsupported` — nothing ran.

**Progress**: `notifications/progress` of a call arrive on the hub's loop;
`Progress` hands them to the waiting worker thread, which writes at most one
`tool.call.progress` event per `AGENTRT_MCP_PROGRESS_INTERVAL_MS` for the
call (the latest one wins; the last is written when the call ends).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from typing import Any, Literal

import mcp_types as types
from django.conf import settings
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict

from runs.clock import CLOCK
from runs.domain.errors import ToolFailure
from runs.domain.scrub import scrub_text

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")
MIN_POLL, MAX_POLL, DEFAULT_POLL = 0.05, 5.0, 0.5  # seconds between two `tasks/get`, whatever the server says
MAX_QUESTION = 4000


class CreateTaskResult(types.Result):
    """A `tools/call` answered with a task (the wire's `resultType: "task"`; the fields are read raw)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"


async def _never(result: CreateTaskResult, context: ClaimContext) -> types.CallToolResult:
    raise RuntimeError("agentrt reads a task's result through runs.tools.mcp.long, never the SDK's call_tool")


class TasksExtension(ClientExtension):
    """Declares the Tasks extension on every request (the SDK advertises a claim-bearing extension)."""

    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_never)]


class GetTask(types.Request[dict[str, Any], Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: dict[str, Any]


def task_handle(server: str, tool: str, raw: dict[str, Any]) -> dict[str, Any]:
    """What the call's record keeps of a `CreateTaskResult`."""
    task_id = raw.get("taskId")
    if not isinstance(task_id, str) or not task_id or len(task_id) > 500:
        raise ToolFailure("mcp_error", "the MCP server answered with a task without a usable taskId", uncertain=True)
    return {
        "kind": "mcp_task",
        "server": server,
        "tool": tool,
        "task_id": task_id,
        "status": str(raw.get("status", ""))[:20],
        "poll_interval_ms": raw.get("pollIntervalMs") if isinstance(raw.get("pollIntervalMs"), int) else None,
        "ttl_ms": raw.get("ttlMs") if isinstance(raw.get("ttlMs"), int) else None,
        "created_at": str(raw.get("createdAt", ""))[:40],
    }


def poll_interval(handle: dict[str, Any]) -> float:
    ms = handle.get("poll_interval_ms")
    seconds = DEFAULT_POLL if not isinstance(ms, int) else ms / 1000
    return min(MAX_POLL, max(MIN_POLL, seconds))


def poll(
    get: Callable[[float], dict[str, Any]],
    handle: dict[str, Any],
    seconds: float,
    *,
    stop: Callable[[], bool] = lambda: False,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any] | None:
    """`tasks/get` (`get(timeout)`, raising what the request raised) every poll interval until the task is
    terminal (returned) or `seconds` pass or `stop()` says so (None: still not terminal). `tick` runs
    between polls (the caller's heartbeat, its progress)."""
    deadline = CLOCK.monotonic() + seconds
    while True:
        left = deadline - CLOCK.monotonic()
        if left <= 0 or stop():
            return None
        task = get(min(left, 30.0))
        if task.get("status") in TERMINAL:
            return task
        tick()
        interval = poll_interval({"poll_interval_ms": task.get("pollIntervalMs", handle.get("poll_interval_ms"))})
        CLOCK.sleep(max(0.0, min(interval, deadline - CLOCK.monotonic())))


def task_result(task: dict[str, Any]) -> Any:
    """The result of a terminal task: its `CallToolResult` (a `ToolFailure` for a failed or cancelled one)."""
    status = task.get("status")
    if status == "completed":
        result = task.get("result")
        if not isinstance(result, dict):
            raise ToolFailure("mcp_error", "the MCP server's completed task has no result", uncertain=True)
        return types.CallToolResult.model_validate(result, by_name=False)
    if status == "failed":
        found = task.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        message = scrub_text(str(error.get("message") or task.get("statusMessage") or "the task failed"))[:2000]
        raise ToolFailure("mcp_task_failed", f"the MCP server's task failed: {message}")
    raise ToolFailure("mcp_task_cancelled", "the MCP server cancelled the task before it completed")


# -- questions -------------------------------------------------------------------


def _fields(schema: Any) -> dict[str, dict[str, Any]]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return {str(k): v for k, v in props.items() if isinstance(v, dict)} if isinstance(props, dict) else {}


def question_of(server: str, tool: str, raw: dict[str, Any]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(the question shown to the user, the handle kept in the call's record, the questions as data) of an
    `InputRequiredResult`; `ToolFailure("mcp_input_unsupported")` for a request no person can answer."""
    requests = raw.get("inputRequests") or {}
    state = raw.get("requestState")
    if not isinstance(requests, dict) or (state is not None and not isinstance(state, str)):
        raise ToolFailure("mcp_error", "the MCP server asked for input in a form agentrt cannot read; nothing ran")
    shown: list[dict[str, Any]] = []
    for key, request in requests.items():
        method = request.get("method") if isinstance(request, dict) else None
        params = request.get("params") if isinstance(request, dict) else None
        params = params if isinstance(params, dict) else {}
        if method != "elicitation/create" or params.get("mode", "form") != "form":
            raise ToolFailure(
                "mcp_input_unsupported",
                f"the MCP server asked for input agentrt cannot give ({str(method)[:60]}"
                f"{', mode ' + str(params.get('mode'))[:20] if method == 'elicitation/create' else ''}); only a form "
                "a person can answer is supported. Nothing ran.",
            )
        fields = _fields(params.get("requestedSchema"))
        shown.append(
            {
                "key": str(key)[:200],
                "message": scrub_text(str(params.get("message", "")))[:1000],
                "fields": {name: str(spec.get("type", "string"))[:20] for name, spec in list(fields.items())[:20]},
            }
        )
    lines = []
    for q in shown:
        wanted = ", ".join(f"{n} ({t})" for n, t in q["fields"].items())
        lines.append(q["message"] + (f" [answer: {wanted}]" if wanted else ""))
    text = "\n".join(lines) or "The MCP server needs an answer before the call can run."
    handle = {
        "kind": "mcp_input",
        "server": server,
        "tool": tool,
        "request_state": state,
        "input_requests": json.loads(json.dumps(requests)),
    }
    return f"{server}/{tool}: {text}"[:MAX_QUESTION], handle, shown


def _coerce(value: str, kind: Any) -> Any:
    if kind == "boolean":
        low = value.strip().lower()
        if low in ("yes", "true", "y", "1"):
            return True
        if low in ("no", "false", "n", "0"):
            return False
        raise ValueError("a yes or no")
    if kind == "integer":
        return int(value.strip())
    if kind == "number":
        return float(value.strip())
    return value


def responses(handle: dict[str, Any], answer: str) -> dict[str, Any]:
    """The `inputResponses` for the user's `answer` to the question of `handle` (ValueError saying what
    the answer must be). The answer is text: for a form of one field, that field's value (`yes`/`no` for a
    boolean); otherwise a JSON object of the fields — or, for several forms, of each form's key to its
    fields. `{"action": "decline"}` (or `cancel`) declines a form."""
    requests = handle.get("input_requests") if isinstance(handle, dict) else None
    if not isinstance(requests, dict) or not requests:
        raise ValueError("the question has nothing to answer")
    try:
        parsed = json.loads(answer)
    except ValueError:
        parsed = None
    out: dict[str, Any] = {}
    for key, request in requests.items():
        params = (request.get("params") if isinstance(request, dict) else None) or {}
        fields = _fields(params.get("requestedSchema"))
        given: Any = parsed
        if isinstance(parsed, dict) and len(requests) > 1:
            given = parsed.get(key)
            if given is None:
                raise ValueError(f"a JSON object with an answer for each of {sorted(requests)}")
        if isinstance(given, dict) and given.get("action") in ("decline", "cancel") and len(given) == 1:
            out[key] = {"action": given["action"]}
            continue
        if isinstance(given, dict):
            content = {k: v for k, v in given.items() if k in fields} if fields else dict(given)
        elif len(fields) == 1 and len(requests) == 1:
            name, spec = next(iter(fields.items()))
            try:
                content = {name: _coerce(answer, spec.get("type"))}
            except ValueError as exc:
                raise ValueError(f"the value of {name!r} ({spec.get('type')}): {exc}") from None
        elif not fields and len(requests) == 1:
            content = {}
        else:
            raise ValueError(f"a JSON object with the fields {sorted(fields)}")
        wanted = params.get("requestedSchema")
        schema: dict[str, Any] = wanted if isinstance(wanted, dict) else {}
        required = schema.get("required") or []
        missing = [r for r in required if r not in content]
        if missing:
            raise ValueError(f"a value for {missing}")
        out[key] = {"action": "accept", "content": content}
    return out


# -- progress -----------------------------------------------------------------------


def progress_interval() -> float:
    """Seconds between two `tool.call.progress` events of one call (AGENTRT_MCP_PROGRESS_INTERVAL_MS)."""
    return max(0, int(getattr(settings, "AGENTRT_MCP_PROGRESS_INTERVAL_MS", 500))) / 1000


class Progress:
    """A call's progress notifications, from the hub's loop to the worker thread, throttled."""

    def __init__(self, report: Callable[[dict[str, Any]], None] | None):
        self.report = report
        self.inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.interval = progress_interval()
        self.last: float | None = None
        self.pending: dict[str, Any] | None = None

    async def callback(self, progress: float, total: float | None, message: str | None) -> None:
        self.inbox.put(
            {
                "progress": progress,
                "total": total,
                "message": scrub_text(str(message))[:500] if message is not None else None,
            }
        )

    def drain(self, *, final: bool = False) -> None:
        """In the worker thread: write the latest notification if the interval has passed (or `final`)."""
        if self.report is None:
            return
        while True:
            try:
                self.pending = self.inbox.get_nowait()
            except queue.Empty:
                break
        if self.pending is None:
            return
        now = CLOCK.monotonic()
        if final or self.last is None or now - self.last >= self.interval:
            payload, self.pending, self.last = self.pending, None, now
            self.report(payload)
