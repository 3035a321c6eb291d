"""Approval reaper and deadline sweep (every 5 s): a waiting run holds no
lease, so these end it through the lifecycle service, guarded by its status.

- a pending approval past `expires_at` → the approval `expired`, the run
  FAILED `approval_expired`;
- a run WAITING_FOR_USER past its input deadline → FAILED `input_deadline_exceeded`;
- any waiting run past its deadline → FAILED `deadline_exceeded`.

No timer closes an unknown outcome: a run waiting on an
unknown outcome's question (approvals.models.open_questions: an interrupted
or uncertain side effect, or the reconciler's pause of one) is neither
expired nor failed past its deadline — it waits for a person, and the
decision ends it (approvals.unknown). Both reads leave such runs out, and
each failure checks again under the run's lock.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from approvals.models import UNKNOWN_OUTCOME_KINDS, Approval, open_questions
from maintenance.locks import try_sweep_lock
from runs.clock import CLOCK
from runs.domain.values import FailureReason, RunFailure
from runs.domain.writes import EventWrite
from runs.models import Run
from runs.runtime.queue import db_now
from runs.services.lifecycle import fail_waiting, hold_run
from runs.store.events import record_events

BATCH = 200


def _fail(run: Run, reason: FailureReason, message: str, *, approval=None) -> bool:
    now = CLOCK.now()
    failure = RunFailure(
        reason=reason,
        error_class=reason.value,
        message=message,
        occurred_at=now,
        details={"approval": str(approval.id)} if approval else {},
    ).as_json()
    with transaction.atomic(durable=True):
        hold_run(run.id)  # the run before its approval, as a cancel locks them
        if open_questions(run.id).exists():
            return False  # an unknown outcome waits for a person, whatever the clock says
        events = []
        if approval is not None:
            if (
                Approval.objects.filter(id=approval.id, status__unindexed="pending").update(
                    status="expired", decided_at=now
                )
                != 1
            ):
                return False
            events.append(
                EventWrite(
                    "approval.resolved",
                    {  # the keys of every approval.resolved (README, "Payloads"): nobody decided, nobody gave a reason
                        "approval": str(approval.id),
                        "invocation": str(approval.invocation_id) if approval.invocation_id else None,
                        "kind": approval.kind,
                        "decision": "expired",
                        "decided_by": None,
                        "decided_via": "maintenance",
                        "reason": "",
                        "decided_at": now.isoformat(),
                    },
                    now,
                )
            )
        if not fail_waiting(run_id=run.id, failure=failure, now=now):
            if approval is not None:
                transaction.set_rollback(True)
            return False
        events.append(EventWrite("run.failed", {"failure": failure}, now))
        record_events(
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            run_id=run.id,
            epoch=run.lease_epoch,
            events=events,
        )
    return True


def sweep_expiry() -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.approvals"):
            return {"skipped": True}
        now = db_now()
        expired = list(
            Approval.objects.filter(status="pending", expires_at__lt=now)
            .exclude(kind__in=UNKNOWN_OUTCOME_KINDS)
            .select_related("run")[:BATCH]
        )
        overdue = list(
            Run.objects.filter(status__in=("WAITING_FOR_APPROVAL", "WAITING_FOR_USER"), deadline_at__lt=now)
            .exclude(Exists(open_questions().filter(run_id=OuterRef("id"))))
            .order_by("deadline_at")[:BATCH]
        )
        input_ttl = float(getattr(settings, "AGENTRT_INPUT_TTL_SECONDS", settings.AGENTRT_APPROVAL_TTL_SECONDS))
        stale_input = list(
            Run.objects.filter(status="WAITING_FOR_USER", updated_at__lt=now - timedelta(seconds=input_ttl))[:BATCH]
        )
    counts = {"approval_expired": 0, "deadline_exceeded": 0, "input_deadline_exceeded": 0}
    for run in overdue:
        if _fail(run, FailureReason.DEADLINE_EXCEEDED, "the run deadline passed while it was waiting"):
            counts["deadline_exceeded"] += 1
    for approval in expired:
        if _fail(
            approval.run,
            FailureReason.APPROVAL_EXPIRED,
            "the approval expired before anyone decided",
            approval=approval,
        ):
            counts["approval_expired"] += 1
    for run in stale_input:
        if _fail(run, FailureReason.INPUT_DEADLINE_EXCEEDED, "nobody answered the run's question in time"):
            counts["input_deadline_exceeded"] += 1
    return counts
