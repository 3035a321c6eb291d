"""The lifecycle service: transitions of runs that hold no lease (DESIGN §4):
cancel of a QUEUED or waiting run, and the cancel request of a RUNNING one.

Each is a guarded ORM update (the guard is the run's status and the absence
of a lease) plus its events, in one transaction."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from approvals.models import Approval
from runs.clock import CLOCK
from runs.domain.pipeline import UNKNOWN_OUTCOME
from runs.domain.writes import EventWrite
from runs.errors import RunTerminal
from runs.models import Run, ToolInvocation
from runs.store.repository import record_events

WAITING = ("WAITING_FOR_APPROVAL", "WAITING_FOR_USER")


def run_cancel(*, run: Run, by: str = "") -> str:
    """Cancel a run. A QUEUED or waiting run ends CANCELLED at once; a RUNNING
    one gets `cancel_requested_at` and its worker stops at the next
    observation point. Return the status the run is in afterwards."""
    now = CLOCK.now()
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    with transaction.atomic(durable=True):
        cancelled = Run.objects.filter(id=run.id, status__in=("QUEUED", *WAITING), lease_owner__isnull=True).update(
            status="CANCELLED", cancel_requested_at=requested, updated_at=now
        )
        if cancelled == 1:
            Approval.objects.filter(run_id=run.id, status="pending").update(status="cancelled", decided_at=now)
            # A granted re-run that never ran keeps its first attempt's record: outcome unknown (I6).
            ToolInvocation.objects.filter(
                run_id=run.id, effect_sent_at__isnull=False, result__isnull=True, status__in=("authorized", "executing")
            ).update(status="interrupted", error=UNKNOWN_OUTCOME, updated_at=now)
            record_events(
                tenant_id=run.tenant_id,
                session_id=run.session_id,
                run_id=run.id,
                epoch=run.lease_epoch,
                events=[EventWrite("run.cancelled", {"by": by, "direct": True}, now)],
            )
            return "CANCELLED"
        if Run.objects.filter(id=run.id, status="RUNNING").update(cancel_requested_at=requested, updated_at=now) == 1:
            return "RUNNING"
    raise RunTerminal("the run has already ended")


def fail_waiting(*, run_id: Any, failure: dict[str, Any], now: Any) -> bool:
    """WAITING_* -> FAILED inside the caller's transaction (a rejected
    interrupted side effect, an expired approval, a passed deadline); its
    pending approvals become cancelled. True when the transition landed."""
    failed = Run.objects.filter(id=run_id, status__in=WAITING, lease_owner__isnull=True).update(
        status="FAILED", failure=failure, updated_at=now
    )
    if failed != 1:
        return False
    Approval.objects.filter(run_id=run_id, status="pending").update(status="cancelled", decided_at=now)
    return True
