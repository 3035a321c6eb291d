"""The event vocabulary (docs/events.md).

`EventType` names every event the runtime writes; a value is what lands in
`events.type` and on the wire, so a member's value never changes. Adding an
event type means: a member here, a line in the documentation's Event types page (docs/events.md), and
(when the run page should show it specially) nothing else — the page, the
sockets and the checkpoint rebuild read their lists from the groups below.
`tests/gates/test_vocabulary.py` fails on an event written with a string that
is not a member, and on a member that page does not list.

The builders are the payload contracts that more than one module writes;
each returns the `EventWrite`, so a caller cannot get a key wrong.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from runs.domain.values import RunStatus
from runs.domain.writes import CheckpointInsert, EventWrite


class EventType(StrEnum):
    RUN_CREATED = "run.created"
    RUN_CLAIMED = "run.claimed"
    RUN_STARTED = "run.started"
    RUN_RESUMED = "run.resumed"
    RUN_REQUEUED = "run.requeued"
    RUN_CHECKPOINTED = "run.checkpointed"
    MODEL_REQUEST_STARTED = "model.request.started"
    MODEL_RESPONSE_DELTA = "model.response.delta"
    MODEL_RESPONSE_COMPLETED = "model.response.completed"
    MODEL_RESPONSE_FAILED = "model.response.failed"
    TOOL_CALL_PROPOSED = "tool.call.proposed"
    TOOL_CALL_AUTHORIZED = "tool.call.authorized"
    TOOL_CALL_STARTED = "tool.call.started"
    TOOL_CALL_COMPLETED = "tool.call.completed"
    TOOL_CALL_FAILED = "tool.call.failed"
    TOOL_CALL_PROGRESS = "tool.call.progress"
    TOOL_RUN_CANCELLED = "tool.run_cancelled"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    APPROVAL_INVALIDATED = "approval.invalidated"
    RUN_WAITING_FOR_APPROVAL = "run.waiting_for_approval"
    RUN_WAITING_FOR_USER = "run.waiting_for_user"
    RUN_INPUT_RECEIVED = "run.input_received"
    LEASE_TAKEN_OVER = "lease.taken_over"
    STEP_INTERRUPTED = "step.interrupted"
    CONTEXT_COMPACTED = "context.compacted"
    RUN_FENCED = "run.fenced"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_CANCEL_TOO_LATE = "run.cancel_too_late"
    RUN_RETRIED = "run.retried"


E = EventType

# Events that change a run's status (or its pending decision): what `ws/runs/`
# streams to the runs list.
STATUS_EVENTS: tuple[EventType, ...] = (
    E.RUN_CREATED,
    E.RUN_CLAIMED,
    E.RUN_STARTED,
    E.RUN_RESUMED,
    E.RUN_REQUEUED,
    E.RUN_COMPLETED,
    E.RUN_FAILED,
    E.RUN_CANCELLED,
    E.RUN_WAITING_FOR_APPROVAL,
    E.RUN_WAITING_FOR_USER,
    E.LEASE_TAKEN_OVER,
    E.APPROVAL_RESOLVED,
)

# The run status each event leaves the run in (the run page's live badge).
STATUS_AFTER: dict[EventType, RunStatus] = {
    E.RUN_CLAIMED: RunStatus.RUNNING,
    E.RUN_STARTED: RunStatus.RUNNING,
    E.RUN_RESUMED: RunStatus.RUNNING,
    E.RUN_REQUEUED: RunStatus.QUEUED,
    E.RUN_COMPLETED: RunStatus.COMPLETED,
    E.RUN_FAILED: RunStatus.FAILED,
    E.RUN_CANCELLED: RunStatus.CANCELLED,
    E.RUN_WAITING_FOR_APPROVAL: RunStatus.WAITING_FOR_APPROVAL,
    E.RUN_WAITING_FOR_USER: RunStatus.WAITING_FOR_USER,
    E.RUN_RETRIED: RunStatus.RUNNING,
}

# A tool call's recorded answer: what the checkpoint rebuild reads back.
ANSWER_EVENTS: tuple[EventType, ...] = (E.TOOL_CALL_COMPLETED, E.TOOL_CALL_FAILED)

# How the run page colours an event in the timeline.
GOOD_EVENTS: tuple[EventType, ...] = (E.RUN_COMPLETED, E.TOOL_CALL_COMPLETED)
BAD_EVENTS: tuple[EventType, ...] = (
    E.RUN_FAILED,
    E.TOOL_CALL_FAILED,
    E.MODEL_RESPONSE_FAILED,
    E.RUN_FENCED,
    E.RUN_CANCELLED,
)
WARN_EVENTS: tuple[EventType, ...] = (
    E.RUN_CANCEL_REQUESTED,
    E.RUN_CANCEL_TOO_LATE,
    E.RUN_RETRIED,
    E.STEP_INTERRUPTED,
    E.LEASE_TAKEN_OVER,
    E.APPROVAL_REQUESTED,
    E.RUN_WAITING_FOR_APPROVAL,
    E.RUN_WAITING_FOR_USER,
)


def page_vocabulary() -> dict[str, Any]:
    """The lists the run pages' scripts use, handed over as JSON (json_script):
    every type by member name, the timeline classes and the status badge."""
    classes = {t.value: "good" for t in GOOD_EVENTS}
    classes.update({t.value: "bad" for t in BAD_EVENTS})
    classes.update({t.value: "warn" for t in WARN_EVENTS})
    return {
        "types": {t.name: t.value for t in EventType},
        "classes": classes,
        "status_after": {t.value: s.value for t, s in STATUS_AFTER.items()},
    }


# --- payload builders: the contracts written by more than one module ---------


def approval_requested(
    *,
    approval_id: UUID,
    invocation_id: UUID | None,
    kind: str,
    tool: str,
    request_hash: str,
    step: int,
    presentation: dict[str, Any],
    at: datetime,
    deadline_passed: bool | None = None,
) -> EventWrite:
    """`approval.requested`: the run page's approval card is built from it.
    An unknown outcome's approval (written by Resume) also says whether the
    run's deadline had passed when it was requested (`deadline_passed`: then
    only confirm or reject are accepted)."""
    payload: dict[str, Any] = {
        "approval": str(approval_id),
        "invocation": str(invocation_id),
        "kind": kind,
        "tool": tool,
        "request_hash": request_hash,
        "step": step,
        "presentation": presentation,
    }
    if deadline_passed is not None:
        payload["deadline_passed"] = deadline_passed
    return EventWrite(E.APPROVAL_REQUESTED, payload, at)


def checkpointed(row: CheckpointInsert) -> EventWrite:
    """`run.checkpointed` for the checkpoint row written in the same unit."""
    return EventWrite(
        E.RUN_CHECKPOINTED, {"version": row.version, "trigger": row.trigger, "full": row.full}, row.created_at
    )


def call_not_run(
    *,
    invocation_id: UUID | None,
    call_id: str,
    tool: str,
    result: Any,
    at: datetime,
    outcome: str | None = None,
) -> EventWrite:
    """`tool.call.failed` for a call that was never executed (refused, or its
    approved re-run can no longer run): `executed` is false."""
    payload: dict[str, Any] = {
        "invocation": str(invocation_id),
        "call_id": call_id,
        "tool": tool,
        "result": result,
        "executed": False,
    }
    if outcome is not None:
        payload["outcome"] = outcome
    return EventWrite(E.TOOL_CALL_FAILED, payload, at)


def call_cancelled(
    *, invocation_id: UUID | None, call_id: str, tool: str, reason: str, at: datetime, outcome_unknown: bool = False
) -> EventWrite:
    """`tool.run_cancelled` for a call that did not run because the run stopped."""
    payload: dict[str, Any] = {"invocation": str(invocation_id), "call_id": call_id, "tool": tool, "reason": reason}
    if outcome_unknown:
        payload["outcome"] = "unknown"
    return EventWrite(E.TOOL_RUN_CANCELLED, payload, at)


def model_response_failed(
    *, step: int, attempt: int, error_class: str, transient: bool, stream_had_output: bool, at: datetime, **extra: Any
) -> EventWrite:
    """`model.response.failed` for one failed attempt (`usage` when it spent any)."""
    return EventWrite(
        E.MODEL_RESPONSE_FAILED,
        {
            "step": step,
            "attempt": attempt,
            "error_class": error_class,
            "transient": transient,
            "stream_had_output": stream_had_output,
            **extra,
        },
        at,
    )


# How a cancel request arrived (`run.cancel_requested`'s `via`): a person's surface, or a parent's cascade.
CANCEL_VIAS = ("api", "live", "admin", "cli", "parent")


def cancel_requested(*, by: str, via: str, reason: str | None, at: datetime, parent: UUID | None = None) -> EventWrite:
    """`run.cancel_requested`: who asked, through which surface and why, written
    in the transaction that accepts the request (a queued or waiting run's
    `run.cancelled` follows it in the same transaction)."""
    payload: dict[str, Any] = {"by": by, "via": via, "reason": reason}
    if parent is not None:
        payload["parent"] = str(parent)
    return EventWrite(E.RUN_CANCEL_REQUESTED, payload, at)


def cancel_request_fields(payload: dict[str, Any] | None) -> dict[str, Any]:
    """The request's `by`, `via` and `reason`, as `run.cancelled` and
    `run.cancel_too_late` repeat them (nothing for a run cancelled without a
    recorded request: a child past its deadline)."""
    if not payload:
        return {}
    return {key: payload.get(key) for key in ("by", "via", "reason")}
