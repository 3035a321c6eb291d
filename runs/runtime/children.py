"""Child runs and the join.

A `delegate_run` batch suspends its run in WAITING_FOR_APPROVAL with the
suspension kind `child_run`; `finalize`, in the transaction of that
transition, starts the children (`children_start`): ordinary runs of the same
tenant with `parent` set, each in a session of its own, the parent's
`deadline_at` and principal stamp copied and its limits capped by what
remains of the parent's.

The join is part of the terminal path, not a poll: the transaction that ends a
child (finalize's terminal transition, or a cancel or failure of a child
holding no lease) first locks the parent's row (`runs.store.family`), then
ends the child and calls `child_ended`, which writes the parent invocation's
result, adds the child's tokens and cost to the parent's usage (a parent can
fail on budget while it waits), and — when no sibling is still live —
requeues the parent. Ending a parent that waits cancels its children
(`children_cancel`), parent before child, so the lock order is one; a child
waiting on an unknown outcome's question keeps it open and is asked to end
after the decision, like a running child is asked to stop.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from approvals.models import Approval, open_questions
from runs.clock import IDS
from runs.domain.budgets import Ledger
from runs.domain.errors import BudgetExceeded
from runs.domain.events import EventType, cancel_requested
from runs.domain.pipeline import UNKNOWN_OUTCOME
from runs.domain.scrub import bound
from runs.domain.values import (
    TERMINAL_STATUSES,
    InvocationOutcome,
    InvocationStatus,
    RunFailure,
    RunLimits,
    RunStatus,
    RunUsage,
    Suspension,
)
from runs.domain.writes import EventWrite
from runs.models import Agent, AgentVersion, Run, Session, ToolInvocation
from runs.runtime.cancel_bell import ring
from runs.runtime.enqueue import enqueue_drive
from runs.store.events import record_events
from runs.store.reads import active_runs_and_quota

TERMINAL = [s.value for s in TERMINAL_STATUSES]
LEASELESS = (RunStatus.QUEUED.value, RunStatus.WAITING_FOR_APPROVAL.value, RunStatus.WAITING_FOR_USER.value)
WAITING_FOR_CHILDREN = RunStatus.WAITING_FOR_APPROVAL.value
CHILD_RUN = "child_run"  # the suspension kind, on the parent's waiting invocations


# -- starting children ------------------------------------------------------------------------------------


def children_start(*, parent_id: UUID, suspension: Suspension, now: datetime) -> int:
    """Create the suspension's children and ring their doorbells, inside the
    parent's finalize transaction (after its fenced transition to
    WAITING_FOR_APPROVAL, so a fenced worker starts none). Return how many
    started; a call whose agent no longer exists is answered with a failed
    result instead, one the tenant's active-run quota has no room for with
    `quota_exceeded` (the model sees it), and a parent with no child left to
    wait for is requeued."""
    parent = (
        Run.objects.filter(id=parent_id)
        .values("tenant_id", "deadline_at", "session_id", "lease_epoch", "principal_user_id", "principal_scopes")
        .get()
    )
    started = 0
    answered: list[EventWrite] = []
    # Children count against the tenant's quota like submits: its row locked as a submit locks it, then its
    # active runs counted (the waiting parent among them), in this transaction.
    active, limit = active_runs_and_quota(parent["tenant_id"])
    if limit is None:
        limit = settings.AGENTRT_MAX_ACTIVE_RUNS or None  # the setting's 0 means no limit
    for index, request in enumerate(suspension.children):
        agent = Agent.objects.filter(tenant_id=parent["tenant_id"], name=request.agent).first()
        if agent is None:
            answered += _answer(
                parent_id,
                request.invocation_id,
                _failed_result(request.agent, None, "the agent no longer exists; no child run started"),
                None,
                now,
            )
            continue
        if limit is not None and active + started >= limit:
            answered += _answer(
                parent_id,
                request.invocation_id,
                {
                    "error": "quota_exceeded",
                    "message": f"the tenant has {active + started} active runs and its quota is {limit}; no child"
                    " run started (try again when runs have finished)",
                    "agent": request.agent,
                },
                None,
                now,
            )
            continue
        version = AgentVersion.objects.get(agent=agent, version=agent.latest_version)
        limits = child_limits(version.definition.get("limits") or {}, request.caps)
        deadline = now + timedelta(seconds=limits.deadline_seconds) if limits.deadline_seconds else None
        if parent["deadline_at"] is not None and (deadline is None or parent["deadline_at"] < deadline):
            deadline = parent["deadline_at"]
        created = now + timedelta(microseconds=index)  # the children list in the order of the calls
        session = Session.objects.create(id=IDS.new_id(), tenant_id=parent["tenant_id"], agent=agent, created_at=now)
        child = Run.objects.create(
            id=request.run_id,
            tenant_id=parent["tenant_id"],
            session=session,
            agent=agent,
            agent_version=version.version,
            input=request.input,
            limits=limits.model_dump(mode="json"),
            deadline_at=deadline,
            usage={},
            parent_id=parent_id,
            parent_invocation=request.invocation_id,
            # a child acts for whom its parent acts: the stamp is copied, never widened
            principal_user_id=parent["principal_user_id"],
            principal_scopes=parent["principal_scopes"],
            created_at=created,
            updated_at=created,
        )
        record_events(
            tenant_id=child.tenant_id,
            session_id=child.session_id,
            run_id=child.id,
            epoch=0,
            events=[
                EventWrite(
                    EventType.RUN_CREATED,
                    {
                        "agent": agent.name,
                        "agent_version": child.agent_version,
                        "input": child.input[:2000],
                        "parent": str(parent_id),
                        "parent_invocation": str(request.invocation_id),
                    },
                    now,
                )
            ],
        )
        enqueue_drive(child.id)
        started += 1
    if not started:
        answered += _requeue(parent_id, now)
    if answered:
        record_events(
            tenant_id=parent["tenant_id"],
            session_id=parent["session_id"],
            run_id=parent_id,
            epoch=parent["lease_epoch"],
            events=answered,
        )
    return started


def child_limits(agent_limits: dict[str, Any], caps: dict[str, int | float]) -> RunLimits:
    """The settings' defaults, then the child agent's own limits, each no larger than its cap (what remains of
    the parent's budget)."""
    merged = {k: v for k, v in settings.AGENTRT_DEFAULT_LIMITS.items() if v is not None}
    merged.update({k: v for k, v in agent_limits.items() if v is not None})
    for key, cap in caps.items():
        own = merged.get(key)
        merged[key] = cap if own is None else min(own, cap)
    return RunLimits(**merged)


# -- the join ---------------------------------------------------------------------------------------------


def child_ended(*, run_id: UUID, now: datetime) -> None:
    """The join, in the transaction that ended run `run_id` (its row is terminal
    in this transaction, and its parent's row was locked before it: see
    `runs.store.family.lock_parent`). For a child whose parent still waits:
    the parent's invocation gets the child's answer (or `child_run_failed`),
    the parent's usage the child's tokens and cost — over the parent's limits,
    the parent fails `budget_exceeded` and its other children are cancelled —
    and, when no sibling is live any more, the parent goes back to the queue."""
    child = (
        Run.objects.filter(id=run_id)
        .values(
            "parent_id",
            "parent_invocation",
            "status",
            "usage",
            "final_message",
            "failure",
            "deadline_at",
            "agent__name",
        )
        .first()
    )
    if child is None or child["parent_id"] is None or child["status"] not in TERMINAL:
        return
    parent_id = child["parent_id"]
    parent = (
        Run.objects.filter(id=parent_id)
        .values("tenant_id", "session_id", "lease_epoch", "status", "lease_owner", "usage", "limits", "deadline_at")
        .get()
    )
    if parent["status"] != WAITING_FOR_CHILDREN or parent["lease_owner"] is not None:
        return  # the parent ended (cancelled, failed): nothing waits for this child
    events = _answer(parent_id, child["parent_invocation"], *_child_result(run_id, child, now), now)
    ledger = Ledger(RunLimits(**(parent["limits"] or {})), parent["deadline_at"])
    try:
        usage = ledger.record_child_usage(_usage(parent["usage"]), _usage(child["usage"]))
    except BudgetExceeded as exc:
        events += _fail_parent(parent_id, exc, run_id, now)
    else:
        Run.objects.filter(id=parent_id).update(usage=usage.model_dump(mode="json"), updated_at=now)
        if not Run.objects.filter(parent_id=parent_id).exclude(status__in=TERMINAL).exists():  # the last sibling
            events += _requeue(parent_id, now)
    record_events(
        tenant_id=parent["tenant_id"],
        session_id=parent["session_id"],
        run_id=parent_id,
        epoch=parent["lease_epoch"],
        events=events,
    )


def _usage(raw: Any) -> RunUsage:
    raw = raw if isinstance(raw, dict) else {}
    return RunUsage(**{k: v for k, v in raw.items() if k in RunUsage.model_fields})


def _child_result(run_id: UUID, child: dict[str, Any], now: datetime) -> tuple[dict[str, Any], str | None]:
    """What the parent's model sees for this child: its answer, or a failed result; and the answer, if any."""
    agent = child["agent__name"]
    if child["status"] == RunStatus.COMPLETED.value:
        answer, _ = bound(child["final_message"] or "")
        return {"run": str(run_id), "agent": agent, "status": child["status"], "answer": answer}, "completed"
    failure = child["failure"] if isinstance(child["failure"], dict) else {}
    if child["status"] == RunStatus.CANCELLED.value:
        late = child["deadline_at"] is not None and child["deadline_at"] <= now
        reason = "deadline_exceeded" if late else "cancelled"
        message = "the child run was cancelled" + (" (its deadline passed)" if late else "")
    else:
        reason = str(failure.get("reason") or "failed")
        message = f"the child run failed: {reason}: {failure.get('message') or ''}".rstrip(": ")
    return _failed_result(agent, run_id, message, status=child["status"], reason=reason), None


def _failed_result(
    agent: str, run_id: UUID | None, message: str, *, status: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {"error": "child_run_failed", "message": message, "agent": agent}
    if run_id is not None:
        result.update(run=str(run_id), status=status, reason=reason)
    return result


def _answer(
    parent_id: UUID, invocation_id: UUID | None, result: dict[str, Any], completed: str | None, now: datetime
) -> list[EventWrite]:
    """Answer the parent's waiting delegating invocation (`delegate_run`, or a
    tool declared `control="delegate"`; guarded: it is answered once); return
    its `tool.call.*` event."""
    if invocation_id is None:
        return []
    ok = completed is not None
    updated = ToolInvocation.objects.filter(
        id=invocation_id, run_id=parent_id, status=InvocationStatus.AWAITING_APPROVAL.value, suspended_kind=CHILD_RUN
    ).update(
        status=(InvocationStatus.COMPLETED if ok else InvocationStatus.FAILED).value,
        outcome=(InvocationOutcome.SUCCEEDED if ok else InvocationOutcome.FAILED).value,
        result=result,
        error=None if ok else result,
        suspended_kind=None,
        updated_at=now,
    )
    if updated != 1:
        return []
    call_id, tool = ToolInvocation.objects.filter(id=invocation_id).values_list("call_id", "tool_name").get()
    return [
        EventWrite(
            EventType.TOOL_CALL_COMPLETED if ok else EventType.TOOL_CALL_FAILED,
            {
                "invocation": str(invocation_id),
                "call_id": call_id,
                "tool": tool,
                "result": result,
                "executed": True,
                "outcome": (InvocationOutcome.SUCCEEDED if ok else InvocationOutcome.FAILED).value,
                "child_run": result.get("run"),
            },
            now,
        )
    ]


def _requeue(parent_id: UUID, now: datetime) -> list[EventWrite]:
    """The parent back to the queue (its children all ended) and its doorbell,
    in this transaction; guarded by its waiting status and no lease."""
    moved = Run.objects.filter(id=parent_id, status__unindexed=WAITING_FOR_CHILDREN, lease_owner__isnull=True).update(
        status=RunStatus.QUEUED.value, updated_at=now
    )
    if moved != 1:
        return []
    enqueue_drive(parent_id)
    return [EventWrite(EventType.RUN_REQUEUED, {"reason": CHILD_RUN}, now)]


def _fail_parent(parent_id: UUID, exc: BudgetExceeded, child_id: UUID, now: datetime) -> list[EventWrite]:
    """A waiting parent over budget with its children's usage fails without
    running again; its other children are cancelled."""
    failure = RunFailure(
        reason=exc.reason,
        error_class="BudgetExceeded",
        message=str(exc),
        occurred_at=now,
        details={**exc.details, "child_run": str(child_id)},
    ).as_json()
    usage = exc.usage.model_dump(mode="json") if exc.usage is not None else F("usage")
    failed = Run.objects.filter(id=parent_id, status__unindexed=WAITING_FOR_CHILDREN, lease_owner__isnull=True).update(
        status=RunStatus.FAILED.value, failure=failure, usage=usage, updated_at=now
    )
    if failed != 1:
        return []
    children_cancel(parent_id=parent_id, now=now, by="parent failed")
    return [EventWrite(EventType.RUN_FAILED, {"failure": failure}, now)]


# -- cancelling -------------------------------------------------------------------------------------------


def run_end_leaseless(
    *,
    run_id: UUID,
    now: datetime,
    by: str,
    parent: UUID | None = None,
    after_decision: dict | None = None,
    via: str | None = None,
    reason: str | None = None,
) -> bool:
    """Cancel a run that holds no lease (QUEUED or waiting), inside the
    caller's transaction, with its `run.cancelled` event: its pending
    approvals become cancelled, a granted re-run that never ran keeps its
    first attempt's record (outcome unknown, I6), and its own children are
    cancelled. True when the transition landed. A run waiting on an unknown
    outcome's question is not ended (False): no cancel closes that question
    (approvals.models.open_questions; `request_cancel_open` asks it to end
    after the decision instead). `after_decision`: the decision that ended
    such a run, for its event; `via` and `reason`: the cancel request's
    (runs.services.lifecycle.run_cancel), repeated on `run.cancelled`."""
    if connection.vendor == "postgresql":  # the run's row before its approvals, as every decision locks them
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", [run_id])
    if open_questions(run_id).exists():
        return False
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    cancelled = Run.objects.filter(id=run_id, status__unindexed__in=LEASELESS, lease_owner__isnull=True).update(
        status=RunStatus.CANCELLED.value, cancel_requested_at=requested, updated_at=now
    )
    if cancelled != 1:
        return False
    Approval.objects.filter(run_id=run_id, status__unindexed="pending").update(status="cancelled", decided_at=now)
    ToolInvocation.objects.filter(
        run_id=run_id, effect_sent_at__isnull=False, result__isnull=True, status__in=("authorized", "executing")
    ).update(status="interrupted", error=UNKNOWN_OUTCOME, updated_at=now)
    run = Run.objects.filter(id=run_id).values("tenant_id", "session_id", "lease_epoch").get()
    payload: dict[str, Any] = {"by": by, "direct": True}
    if via is not None:
        payload.update(via=via, reason=reason)
    if parent is not None:
        payload["parent"] = str(parent)
    if after_decision is not None:
        payload["after_decision"] = after_decision
    record_events(
        tenant_id=run["tenant_id"],
        session_id=run["session_id"],
        run_id=run_id,
        epoch=run["lease_epoch"],
        events=[EventWrite(EventType.RUN_CANCELLED, payload, now)],
    )
    children_cancel(parent_id=run_id, now=now, by=by)
    return True


def request_cancel_open(*, run_id: UUID, now: datetime) -> bool:
    """A cancel of a run waiting on an unknown outcome's question, inside the
    caller's transaction (the run's row locked): the question stays open, the
    run keeps waiting with `cancel_requested_at` set and ends CANCELLED right
    after the decision (approvals.unknown). True when the run is such a run."""
    if not open_questions(run_id).exists():
        return False
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    return (
        Run.objects.filter(id=run_id, status__unindexed=WAITING_FOR_CHILDREN, lease_owner__isnull=True).update(
            cancel_requested_at=requested, updated_at=now
        )
        == 1
    )


def children_cancel(*, parent_id: UUID, now: datetime, by: str) -> None:
    """Cancel every live child of `parent_id` (the parent's row is locked by
    the caller, which is ending it): a queued or waiting child ends CANCELLED
    here (and its own children with it); a running one is asked to stop, and
    its worker ends it at its next observation point. The parent's calls that
    waited for them are closed `cancelled`: nobody will answer them."""
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    live = Run.objects.filter(parent_id=parent_id).exclude(status__in=TERMINAL).order_by("id")
    for child_id, status in live.values_list("id", "status"):
        if status in LEASELESS and run_end_leaseless(run_id=child_id, now=now, by=by, parent=parent_id):
            continue
        if status == WAITING_FOR_CHILDREN and request_cancel_open(run_id=child_id, now=now):
            continue  # a child waiting on an unknown outcome keeps its question; it ends after the decision
        if Run.objects.filter(id=child_id, status__unindexed=RunStatus.RUNNING.value).update(
            cancel_requested_at=requested, updated_at=now
        ):
            # Recorded like a person's request (its worker's run.cancelled repeats it), and rung at commit.
            child = Run.objects.filter(id=child_id).values("tenant_id", "session_id", "lease_epoch").get()
            record_events(
                tenant_id=child["tenant_id"],
                session_id=child["session_id"],
                run_id=child_id,
                epoch=child["lease_epoch"],
                events=[cancel_requested(by=by, via="parent", reason=None, at=now, parent=parent_id)],
            )
            ring(child_id)
    ToolInvocation.objects.filter(
        run_id=parent_id, status=InvocationStatus.AWAITING_APPROVAL.value, suspended_kind=CHILD_RUN
    ).update(status=InvocationStatus.CANCELLED.value, suspended_kind=None, updated_at=now)
