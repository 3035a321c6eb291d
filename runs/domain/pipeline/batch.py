"""What every step of the pipeline shares: a call's entry, a batch's result, the rows and events a
decided call is recorded with, and the kinds of unknown outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from runs.domain import events
from runs.domain.breaker import call_fingerprint
from runs.domain.context import RunContext
from runs.domain.events import EventType
from runs.domain.ports import SentCommit
from runs.domain.records import ApprovalDecision
from runs.domain.scrub import scrub_text
from runs.domain.stored_form import tool_item
from runs.domain.values import (
    CancelReason,
    InvocationOutcome,
    InvocationStatus,
    Suspension,
    SuspensionKind,
    ToolCallRequest,
    ToolSpec,
)
from runs.domain.writes import ApprovalInsert, EventWrite, InvocationInsert, InvocationUpdate, UnitOfWork

MAX_ARGUMENT_BYTES = 64 * 1024


# How deep delegation may nest: a run this many parents below the one a person
# submitted may not start children of its own (a bound on recursion, since an
# orchestration-only turn refunds its step).
MAX_DELEGATION_DEPTH = 3


@dataclass
class _Entry:
    index: int
    call: ToolCallRequest
    invocation_id: UUID | None
    key: str
    spec: ToolSpec | None = None
    arguments: Any = None
    result: Any = None  # the content the model sees
    is_error: bool = False
    authorized: bool = False
    needs_approval: bool = False
    asks_user: bool = False
    delegates: bool = False  # an authorized `delegate_run` call: it starts a child run instead of executing
    outcome: InvocationOutcome | None = None  # once executed (step 11)
    unknown: bool = False  # an uncertain side effect: nobody answers it until someone decides
    event: EventWrite | None = None  # the event that records the result (a checkpoint may name it)
    remote: dict[str, Any] | None = None  # a long operation's handle the tool recorded (an MCP task)
    asking: Any = None  # an `InputRequired`: the call waits for the user's answer before it runs

    @property
    def tool(self) -> ToolSpec:
        """The resolved spec of a call past step 2 (every call that runs has one)."""
        if self.spec is None:
            raise RuntimeError(f"call {self.call.call_id} has no resolved tool")
        return self.spec


@dataclass
class BatchResult:
    work: UnitOfWork
    stop: CancelReason | None = None
    late: list[dict[str, Any]] = field(default_factory=list)
    suspension: Suspension | None = None
    all_denied: bool = False
    unknown: list[UUID | None] = field(default_factory=list)  # invocations whose side effect ended uncertain
    error_codes: tuple[str, ...] = ()  # of the batch's failed results, in call order (the runtime carry reads it)
    # Commit 1 still in flight (read-only calls only): the caller waits for
    # it before anything leaves the loop; the store settles it before commit 2.
    sent: SentCommit | None = None


@dataclass
class _Planned:
    """A call about to run: its attempt number and what an earlier attempt left."""

    entry: _Entry
    attempt: int = 1
    effect_sent: bool = False
    prior_attempts: list[dict[str, Any]] | None = None
    approved: ApprovalDecision | None = None  # the approval it runs under: the policy is judged again as it runs


def _error_codes(entries: list[_Entry]) -> tuple[str, ...]:
    return tuple(
        str(e.result.get("error"))
        for e in entries
        if e.is_error and isinstance(e.result, dict) and e.result.get("error")
    )


def _error_result(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message}


_call_fingerprint = call_fingerprint  # the breaker's counter key (checkpoint catch-up counts with it too)


def _fail(entry: _Entry, code: str, message: str) -> None:
    entry.result = _error_result(code, message)
    entry.is_error = True


def _not_allowed(name: str) -> tuple[str, str]:
    """The failed result of a call whose tool the run's tenant no longer allows (`Tenant.allowed_tools`)."""
    return "tool_not_allowed", f"the tool {scrub_text(name)[:100]!r} is not allowed for this tenant; it was not run"


TIME_REFUSAL = "the run is inside its deadline synthesis reserve; this call was not run"


def _time_refusal(entry: _Entry) -> None:
    _fail(entry, "tool.budget_exhausted", TIME_REFUSAL)
    entry.result["dimension"] = "deadline"


def _insert_row(
    entry: _Entry, step_number: int, tool_name: str, now: datetime, status: InvocationStatus, **decided: Any
) -> InvocationInsert:
    """The invocation row of a decided call, with its status and what the decision adds."""
    if entry.invocation_id is None:
        raise RuntimeError("a proposed call always has a new invocation id")
    spec = entry.spec
    return InvocationInsert(
        id=entry.invocation_id,
        step_number=step_number,
        call_index=entry.index,
        call_id=entry.call.call_id,
        tool_name=tool_name,
        arguments=entry.arguments,
        raw_arguments=scrub_text(entry.call.raw_arguments or "")[:MAX_ARGUMENT_BYTES],
        idempotency_key=entry.key,
        status=status,
        read_only=spec.read_only if spec else True,
        side_effect=spec.side_effect if spec else "none",
        created_at=now,
        **decided,
    )


def _record_proposal(work: UnitOfWork, entry: _Entry, step_number: int, now: datetime) -> str:
    """Step 1: `tool.call.proposed` for the call into `work`; return the tool's name as recorded."""
    tool_name = scrub_text(entry.call.name)[:200]
    proposed = {
        "invocation": str(entry.invocation_id),
        "call_id": entry.call.call_id,
        "tool": tool_name,
        "arguments": entry.arguments
        if entry.arguments is not None
        else scrub_text(entry.call.raw_arguments or "")[:4096],
        "step": step_number,
    }
    work.event(EventType.TOOL_CALL_PROPOSED, proposed, now)
    return tool_name


def _approval_requested(
    approval: ApprovalInsert, invocation_id: UUID | None, kind: str, tool: str, step_number: int, at: datetime
) -> Any:
    return events.approval_requested(
        approval_id=approval.id,
        invocation_id=invocation_id,
        kind=kind,
        tool=tool,
        request_hash=approval.request_hash,
        step=step_number,
        presentation=approval.presentation,
        at=at,
    )


def _approval_suspension(entries: list[_Entry], work: UnitOfWork, *, reason: str) -> Suspension:
    return Suspension(
        kind=SuspensionKind.APPROVAL,
        invocation_ids=[e.invocation_id for e in entries if e.invocation_id is not None],
        approval_ids=[a.id for a in work.approval_inserts],
        details={"reason": reason},
    )


def _record_not_run(work: UnitOfWork, entry: _Entry, at: datetime) -> None:
    """A recorded call that will not run after all: its row failed with the result, and its event."""
    if entry.invocation_id is None:
        raise RuntimeError("a recorded call has an invocation row")
    work.invocation_updates.append(
        InvocationUpdate(
            id=entry.invocation_id,
            status=InvocationStatus.FAILED,
            result=entry.result,
            error=entry.result,
            outcome=InvocationOutcome.FAILED,
            updated_at=at,
        )
    )
    work.events.append(
        events.call_not_run(
            invocation_id=entry.invocation_id,
            call_id=entry.call.call_id,
            tool=entry.call.name,
            result=entry.result,
            at=at,
            outcome=InvocationOutcome.FAILED,
        )
    )


def _all_denied(entries: list[_Entry]) -> bool:
    denied = [e for e in entries if e.is_error and isinstance(e.result, dict) and e.result.get("error") in DENIALS]
    return bool(entries) and len(denied) == len(entries)


def _append_results(ctx: RunContext, entries: list[_Entry]) -> None:
    for entry in entries:
        item = tool_item(entry.call.call_id, entry.call.name, entry.result, entry.is_error)
        ctx.state.conversation.append(item)
        ctx.state.link(item, entry.event, entry.result)


ANSWERED = (
    InvocationStatus.COMPLETED,
    InvocationStatus.FAILED,
    InvocationStatus.CANCELLED,
    InvocationStatus.INTERRUPTED,
    InvocationStatus.UNCERTAIN,
)


DENIALS = ("denied_by_policy", "rejected_by_operator", "approval_required", "approval_expired")


class UnknownOutcome(Exception):
    """An interrupted side effect reached the loop without a decision."""


# Approval kinds whose approval is a grant to run again a call whose outcome
# is unknown; one place for the set.
RERUN_KINDS = frozenset({"interrupted_side_effect", "uncertain_side_effect", "reconcile"})


class RerunConflict(Exception):
    """An approved re-run can no longer run as approved (tool gone, arguments
    no longer valid, policy now denies): the run fails `reconcile_conflict`
    and the call's outcome stays unknown. `work` holds what to record."""

    def __init__(
        self, message: str, *, error_class: str = "ReconcileConflict", work: UnitOfWork | None = None, **details: Any
    ):
        super().__init__(message)
        self.error_class = error_class
        self.work = work or UnitOfWork()
        self.details = details


def _unknown_status(kind: str) -> InvocationStatus:
    """The status of a call whose outcome is unknown, by the approval kind it waits on."""
    return InvocationStatus.UNCERTAIN if kind == "uncertain_side_effect" else InvocationStatus.INTERRUPTED


UNKNOWN_OUTCOME = {
    "outcome": "unknown",
    "message": "the call started and the process stopped before its outcome was recorded",
}
