"""A takeover asks the server before it asks a person: a side-effect call whose outcome is unknown but whose
record holds an MCP task (the Tasks extension: its id was committed before anything else was done with it)
is not an unknown outcome while the server can answer for the task. `settle_tasks` polls `tasks/get` for
each such call (the lease kept alive meanwhile); a task that ended gives the call its result — the task's
`CallToolResult`, or the failed result of a task that failed or was cancelled — recorded with its event in
one fenced transaction, and the run goes on from it. A task still running when the call's time is up, or
one the server cannot answer for (unknown id, server unreachable), leaves the call unknown: the reconciler
or a person decides, as before. Nothing is sent again: only `tasks/get`."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from runs.clock import CLOCK
from runs.domain.errors import ToolFailure, WorkerFenced
from runs.domain.events import EventType
from runs.domain.scrub import bound, scrub_text
from runs.domain.values import InvocationOutcome, InvocationStatus
from runs.domain.writes import EventWrite, InvocationUpdate, UnitOfWork
from runs.models import ToolInvocation
from runs.runtime.queue import Claim, run_heartbeat
from runs.store.repository import DjangoRunStore
from runs.tools.mcp.long import poll, task_result
from runs.tools.mcp.tools import POLL_ERRORS, get_task, result_of, server_of

log = logging.getLogger("agentrt.resume")


def task_of(inv: ToolInvocation) -> dict[str, Any] | None:
    """The MCP task the call's current attempt recorded, if any."""
    for item in reversed(inv.attempts or []):
        if not isinstance(item, dict) or item.get("attempt") != inv.attempt:
            continue
        remote = item.get("remote")
        if isinstance(remote, dict) and remote.get("kind") == "mcp_task" and isinstance(remote.get("task_id"), str):
            return remote
    return None


def settle_tasks(claim: Claim, unknown: list[ToolInvocation]) -> int:
    """Resolve the unknown calls that recorded an MCP task from what `tasks/get` says; return how many."""
    work = UnitOfWork()
    fenced = [False]

    def beat() -> None:
        if not run_heartbeat(run_id=claim.run_id, owner=claim.owner, epoch=claim.epoch).alive:
            fenced[0] = True

    for inv in unknown:
        handle = task_of(inv)
        found = server_of(inv.tool_name) if handle is not None else None
        if handle is None or found is None or found[0].name != handle.get("server"):
            continue
        config, _tool = found
        try:
            task = poll(
                get_task(config, handle["task_id"]),
                handle,
                float(config.timeout_seconds),
                stop=lambda: fenced[0],
                tick=beat,
            )
        except POLL_ERRORS as exc:
            log.warning(
                "run %s: the MCP server %r could not answer for task %s (%s); the call stays unknown",
                claim.run_id,
                config.name,
                handle["task_id"],
                scrub_text(str(exc) or type(exc).__name__)[:200],
            )
            continue
        if fenced[0]:
            return 0
        if task is None:
            continue  # still running: whoever decides unknown outcomes decides this one
        _resolved(work, inv, handle, task)
    if work.is_empty():
        return 0
    store = DjangoRunStore(
        run_id=claim.run_id,
        tenant_id=claim.tenant_id,
        session_id=claim.session_id,
        owner=claim.owner,
        epoch=claim.epoch,
        code_version=settings.AGENTRT_CODE_VERSION,
    )
    try:
        store.commit(work)
    except WorkerFenced:
        return 0
    return len(work.invocation_updates)


def _resolved(work: UnitOfWork, inv: ToolInvocation, handle: dict[str, Any], task: dict[str, Any]) -> None:
    now = CLOCK.now()
    try:
        value, _ = bound(result_of(task_result(task)))
        is_error = False
    except ToolFailure as exc:
        value = {"error": exc.code, "message": scrub_text(str(exc))[:2000], "uncertain": False}
        is_error = True
    outcome = InvocationOutcome.FAILED if is_error else InvocationOutcome.SUCCEEDED
    history = [a for a in (inv.attempts or []) if isinstance(a, dict) and a.get("attempt") != inv.attempt]
    history.append(
        {
            "attempt": inv.attempt,
            "outcome": outcome,
            "at": now.isoformat(),
            "remote": {**handle, "status": task.get("status")},
            **({"error": value} if is_error else {}),
        }
    )
    history.sort(key=lambda a: a.get("attempt") or 0)
    work.invocation_updates.append(
        InvocationUpdate(
            id=inv.id,
            status=InvocationStatus.FAILED if is_error else InvocationStatus.COMPLETED,
            result=value,
            error=value if is_error else None,
            clear_error=not is_error,
            attempt=inv.attempt,
            outcome=outcome,
            attempts=history,
            updated_at=now,
        )
    )
    work.events.append(
        EventWrite(
            EventType.TOOL_CALL_FAILED if is_error else EventType.TOOL_CALL_COMPLETED,
            {
                "invocation": str(inv.id),
                "call_id": inv.call_id,
                "tool": inv.tool_name,
                "result": value,
                "executed": True,
                "attempt": inv.attempt,
                "outcome": outcome,
                "via": "tasks/get",
                "task": handle["task_id"],
            },
            now,
        )
    )
