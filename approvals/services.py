"""The approval service: the one path by which the admin, the REST API and
the live pages decide an approval.

A decision is a guarded update of a *pending* approval carrying the hash the
operator was shown; it applies only to a run WAITING_FOR_APPROVAL, records
`approval.resolved` (who, when, why, through which surface) and — when it is
the batch's last decision — moves the run on in the same transaction.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.db import transaction
from django.db.models import Q

from approvals.errors import (
    ApprovalDecided,
    ApprovalExpired,
    ApprovalForbidden,
    ApprovalNotConfirmable,
    ApprovalNotFound,
    ApprovalStale,
)
from approvals.models import CONFIRMABLE_KINDS, RERUN_KINDS, UNKNOWN_OUTCOME_KINDS, Approval
from approvals.unknown import closing_failure, run_closing
from runs.clock import CLOCK
from runs.domain.values import FailureReason, RunFailure
from runs.domain.writes import EventWrite
from runs.errors import InvalidInput
from runs.models import Run, ToolInvocation
from runs.runtime.children import child_ended, run_end_leaseless
from runs.runtime.enqueue import enqueue_drive
from runs.services.lifecycle import fail_waiting, hold_run
from runs.services.scoping import as_uuid, scoped_one
from runs.store.events import record_events

SURFACES = ("admin", "api", "live", "cli")


def can_resolve(user) -> bool:
    return bool(user and user.is_authenticated and user.has_perm("approvals.resolve_approval"))


def approval_for(*, user, approval_id: Any, acting: bool = False) -> Approval:
    """The approval, if `user` may see it (with `acting`: act on it — its own tenant only, a superuser too)."""
    approval = scoped_one(
        Approval.objects.select_related("run", "invocation", "decided_by"), user, as_uuid(approval_id), acting=acting
    )
    if approval is None:
        raise ApprovalNotFound("no such approval")
    return approval


def _decision_input(*, user, approval_id: Any, request_hash: Any, reason: Any, via: str) -> Approval:
    """What every decision checks first, in this order: the surface, the
    approval in the user's acting scope (404), the permission (403), then the
    shown hash and the reason (400 naming the field)."""
    if via not in SURFACES:
        raise ValueError(f"unknown surface {via!r}")
    approval = approval_for(user=user, approval_id=approval_id, acting=True)
    if not can_resolve(user):
        raise ApprovalForbidden("you do not have permission to resolve approvals")
    if not isinstance(request_hash, str) or not request_hash:
        raise InvalidInput("request_hash is required", fields={"request_hash": ["required"]})
    if not isinstance(reason, str) or "\x00" in reason or len(reason) > 2000:
        raise InvalidInput("reason must be text of at most 2000 characters", fields={"reason": ["invalid"]})
    return approval


def approval_decide(
    *, user, approval_id: Any, approve: bool, request_hash: str, reason: str = "", via: str = "api"
) -> Approval:
    """Approve or reject one pending approval, bound to the hash that was shown.
    Approving an unknown outcome whose run cannot go on (its deadline passed,
    its budget spent, a cancel requested) is refused: only confirm or reject
    (approvals/unknown.py)."""
    approval = _decision_input(user=user, approval_id=approval_id, request_hash=request_hash, reason=reason, via=via)
    now = CLOCK.now()
    status = "approved" if approve else "rejected"
    with transaction.atomic(durable=True):
        hold_run(approval.run_id)  # the run before its approval, as a cancel locks them
        run = Run.objects.get(id=approval.run_id)
        if approve and approval.kind in UNKNOWN_OUTCOME_KINDS:
            closing = run_closing(run, now)
            if closing is not None:
                if not _decidable(approval, request_hash, now).exists():
                    _explain_refusal(approval, request_hash, now)  # decided, stale...: that answer first
                raise closing.refusal()
        decided = _decidable(approval, request_hash, now).update(
            status=status, decided_by_id=user.pk, decided_at=now, decided_via=via, reason=reason
        )
        if decided != 1:
            _explain_refusal(approval, request_hash, now)
        events = [
            EventWrite(
                "approval.resolved",
                {
                    "approval": str(approval.id),
                    "invocation": str(approval.invocation_id) if approval.invocation_id else None,
                    "kind": approval.kind,
                    "decision": status,
                    "decided_by": user.get_username(),
                    "decided_via": via,
                    "reason": reason,
                    "decided_at": now.isoformat(),
                },
                now,
            )
        ]
        if approve:
            if approval.invocation_id and approval.kind in RERUN_KINDS:
                # The grant: the same invocation runs again once, same key, attempt + 1.
                ToolInvocation.objects.filter(id=approval.invocation_id).update(
                    status="authorized", suspended_kind=None, updated_at=now
                )
        elif approval.kind in RERUN_KINDS:
            _record_rejected_unknown(approval, by=user.get_username(), now=now)
        else:
            denied = {"error": "rejected_by_operator", "message": "an operator rejected this call; it was not run"}
            ToolInvocation.objects.filter(id=approval.invocation_id).update(
                status="failed", result=denied, error=denied, suspended_kind=None, updated_at=now
            )
        _after_decision(run, approval, now, events, decision=status, by=user.get_username())
    approval.refresh_from_db()
    return approval


def approval_confirm(
    *, user, approval_id: Any, request_hash: str, took_effect: Any, reason: str = "", via: str = "api"
) -> Approval:
    """The third decision on an unknown outcome: an operator who
    knows whether an `interrupted_side_effect` / `uncertain_side_effect` call
    took effect says so. The invocation gets a result recording the
    confirmation (the model sees it), nothing is sent again, the approval is
    `confirmed` and — when it was the batch's last decision — the run goes
    back to the queue, or ends when it cannot go on (approvals/unknown.py). A `policy` or `reconcile` approval cannot be
    confirmed (409 `approval_not_confirmable`): nothing of it ran, or the
    reconciler owns the question."""
    approval = _decision_input(user=user, approval_id=approval_id, request_hash=request_hash, reason=reason, via=via)
    if not isinstance(took_effect, bool):
        raise InvalidInput(
            "took_effect must be true or false", fields={"took_effect": ["must be a boolean (true or false)"]}
        )
    if approval.kind not in CONFIRMABLE_KINDS:
        raise ApprovalNotConfirmable(f"a {approval.kind} approval cannot be confirmed: approve or reject it")
    now = CLOCK.now()
    by = user.get_username()
    with transaction.atomic(durable=True):
        hold_run(approval.run_id)  # the run before its approval, as a cancel locks them
        decided = _decidable(approval, request_hash, now).update(
            status="confirmed", decided_by_id=user.pk, decided_at=now, decided_via=via, reason=reason
        )
        if decided != 1:
            _explain_refusal(approval, request_hash, now)
        run = Run.objects.get(id=approval.run_id)
        inv = ToolInvocation.objects.get(id=approval.invocation_id)
        result = {
            "outcome": "confirmed",
            "took_effect": took_effect,
            "confirmed_by": by,
            "reason": reason,
            "message": (
                "an operator confirmed that this call took effect; it was not sent again"
                if took_effect
                else "an operator confirmed that this call did not take effect; it was not sent again"
            ),
        }
        history = [dict(a) for a in (inv.attempts or []) if isinstance(a, dict)]
        if not any(a.get("attempt") == inv.attempt for a in history):
            history.append({"attempt": inv.attempt, "outcome": "uncertain", "error": inv.error})
        history.append(
            {
                "decision": "confirmed",
                "took_effect": took_effect,
                "confirmed_by": by,
                "at": now.isoformat(),
                "approval": str(approval.id),
            }
        )
        changes = {
            "status": "completed" if took_effect else "failed",
            "outcome": "succeeded" if took_effect else "failed",
            "result": result,
            "attempts": history,
            "suspended_kind": None,
            "updated_at": now,
        }
        if took_effect:
            changes["error"] = None
        ToolInvocation.objects.filter(id=inv.id).update(**changes)
        events = [
            EventWrite(
                "approval.resolved",
                {
                    "approval": str(approval.id),
                    "invocation": str(inv.id),
                    "kind": approval.kind,
                    "decision": "confirmed",
                    "took_effect": took_effect,
                    "decided_by": by,
                    "decided_via": via,
                    "reason": reason,
                    "decided_at": now.isoformat(),
                },
                now,
            ),
            EventWrite(
                "tool.call.completed" if took_effect else "tool.call.failed",
                {
                    "invocation": str(inv.id),
                    "call_id": inv.call_id,
                    "tool": inv.tool_name,
                    "result": result,
                    "executed": False,
                    "attempt": inv.attempt,
                    "outcome": "succeeded" if took_effect else "failed",
                    "confirmed": True,
                },
                now,
            ),
        ]
        _after_decision(run, approval, now, events, decision="confirmed", by=by, took_effect=took_effect)
    approval.refresh_from_db()
    return approval


def _decidable(approval: Approval, request_hash: str, now):
    """The guard of a decision: the approval still pending, with the hash that
    was shown, not expired, on a run WAITING_FOR_APPROVAL."""
    return Approval.objects.filter(
        # an unknown outcome's approval never expires (approvals/unknown.py), whatever an older row says
        Q(expires_at__isnull=True) | Q(expires_at__gt=now) | Q(kind__in=UNKNOWN_OUTCOME_KINDS),
        id=approval.id,
        status__unindexed="pending",
        request_hash=request_hash,
        run_id__in=Run.objects.filter(id=approval.run_id, status__unindexed="WAITING_FOR_APPROVAL").values("id"),
    )


def _after_decision(
    run: Run, approval: Approval, now, events: list, *, decision: str, by: str, took_effect: bool | None = None
) -> None:
    """What follows a decision, in its transaction, with `events` (the
    decision's own first) recorded on the run. While another approval of the
    batch is pending, nothing more. Then an unknown outcome's run that cannot
    go on (approvals/unknown.py) ends: FAILED with the closing's reason, or
    CANCELLED when a cancel was requested while it waited; a batch with a
    rejected re-run fails `operator_rejected`; otherwise the run goes back to
    the queue."""
    if Approval.objects.filter(run_id=run.id, status__unindexed="pending").exists():
        _record(run, events)
        return
    closing = run_closing(run, now) if approval.kind in UNKNOWN_OUTCOME_KINDS else None
    details: dict[str, Any] = {"approval": str(approval.id), "decision": decision, "decided_by": by}
    if took_effect is not None:
        details["took_effect"] = took_effect
    if closing is not None and closing.cancelled:
        _record(run, events)  # the decision before the run.cancelled its end writes
        if run_end_leaseless(run_id=run.id, now=now, by=by, after_decision=details) and run.parent_id is not None:
            child_ended(run_id=run.id, now=now)
        return
    if closing is not None:
        failure = closing_failure(closing, now, details)
    elif Approval.objects.filter(run_id=run.id, kind__in=RERUN_KINDS, status__unindexed="rejected").exists():
        failure = RunFailure(
            reason=FailureReason.OPERATOR_REJECTED,
            error_class="OperatorRejected",
            message="an operator refused to run the interrupted call again",
            occurred_at=now,
            details={"approval": str(approval.id)},
        ).as_json()
    else:
        _requeue(run, now, events)
        _record(run, events)
        return
    if fail_waiting(run_id=run.id, failure=failure, now=now):
        events.append(EventWrite("run.failed", {"failure": failure}, now))
    _record(run, events)


def _record(run: Run, events: list) -> None:
    record_events(
        tenant_id=run.tenant_id, session_id=run.session_id, run_id=run.id, epoch=run.lease_epoch, events=events
    )


def _requeue(run: Run, now, events: list) -> None:
    """WAITING_FOR_APPROVAL -> QUEUED after the batch's last decision, and the doorbell."""
    if (
        Run.objects.filter(id=run.id, status__unindexed="WAITING_FOR_APPROVAL").update(status="QUEUED", updated_at=now)
        == 1
    ):
        events.append(EventWrite("run.requeued", {"reason": "approval"}, now))

        enqueue_drive(run.id)


def _record_rejected_unknown(approval: Approval, *, by: str, now) -> None:
    """A rejected re-run: nothing is sent again and the invocation keeps its
    outcome unknown (`uncertain`), with the rejection in its history."""
    if not approval.invocation_id:
        return
    inv = ToolInvocation.objects.filter(id=approval.invocation_id).values("attempt", "attempts", "error").first()
    if inv is None:
        return
    history = [dict(a) for a in (inv["attempts"] or []) if isinstance(a, dict)]
    if not any(a.get("attempt") == inv["attempt"] for a in history):
        history.append({"attempt": inv["attempt"], "outcome": "uncertain", "error": inv["error"]})
    history.append({"decision": "rejected", "rejected_by": by, "at": now.isoformat(), "approval": str(approval.id)})
    ToolInvocation.objects.filter(id=approval.invocation_id).update(
        outcome="uncertain", attempts=history, suspended_kind=None, updated_at=now
    )


def _explain_refusal(approval: Approval, request_hash: str, now) -> None:
    current = Approval.objects.get(id=approval.id)
    if current.status != "pending":
        raise ApprovalDecided(f"the approval was already {current.status}")
    if current.expires_at is not None and current.expires_at <= now and current.kind not in UNKNOWN_OUTCOME_KINDS:
        raise ApprovalExpired("the approval expired")
    if not hmac.compare_digest(current.request_hash, request_hash):
        raise ApprovalStale("the request changed since it was shown: the hash differs")
    raise ApprovalDecided("the run is no longer waiting for this approval")
