"""The lifecycle service: transitions of runs that hold no lease (DESIGN §4):
cancel of a QUEUED or waiting run, and the cancel request of a RUNNING one
(or of a run waiting on an unknown outcome's question, which stays open).

Each is a guarded ORM update (the guard is the run's status and the absence
of a lease) plus its events, in one transaction."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import DateTimeField, F, Value
from django.db.models.functions import Coalesce

from approvals.models import Approval
from runs.clock import CLOCK
from runs.errors import RunTerminal
from runs.models import Run
from runs.runtime.children import child_ended, children_cancel, request_cancel_open, run_end_leaseless
from runs.store.family import lock_family, lock_parent

# The statuses a run waits in, holding no lease.
WAITING = ("WAITING_FOR_APPROVAL", "WAITING_FOR_USER")


def run_cancel(*, run: Run, by: str = "") -> str:
    """Cancel a run. A QUEUED or waiting run ends CANCELLED at once (its
    children with it, and — for a child — the join tells its parent); a
    RUNNING one gets `cancel_requested_at` and its worker stops at the next
    observation point. A run waiting on an unknown outcome's question keeps
    it: it stays WAITING_FOR_APPROVAL with `cancel_requested_at` set, only
    confirm or reject are accepted, and the decision ends it CANCELLED
    (approvals.unknown). Return the status the run is in afterwards."""
    now = CLOCK.now()
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            # ancestor before descendant (the join's lock order), the run before its approvals (a decision's)
            parent = lock_family(cursor, run.id)
        if request_cancel_open(run_id=run.id, now=now):
            return "WAITING_FOR_APPROVAL"
        if run_end_leaseless(run_id=run.id, now=now, by=by):
            if parent is not None:
                child_ended(run_id=run.id, now=now)
            return "CANCELLED"
        if (
            Run.objects.filter(id=run.id, status__unindexed="RUNNING").update(
                cancel_requested_at=requested, updated_at=now
            )
            == 1
        ):
            return "RUNNING"
    raise RunTerminal("the run has already ended")


def hold_run(run_id: Any) -> None:
    """In the caller's transaction, lock the run's parent and then the run,
    before any of its approvals (runs.store.family.lock_family): what every
    decision, confirmation and expiry does first."""
    with connection.cursor() as cursor:
        lock_family(cursor, UUID(str(run_id)))


def fail_waiting(*, run_id: Any, failure: dict[str, Any], now: Any) -> bool:
    """WAITING_* -> FAILED inside the caller's transaction (a rejected
    interrupted side effect, an expired approval, a passed deadline); its
    pending approvals become cancelled, its children are cancelled and — for
    a child — the join tells its parent. True when the transition landed."""
    rid = UUID(str(run_id))
    with connection.cursor() as cursor:
        parent = lock_parent(cursor, rid)  # ancestor before descendant: the join's lock order
    failed = Run.objects.filter(id=rid, status__unindexed__in=WAITING, lease_owner__isnull=True).update(
        status="FAILED", failure=failure, updated_at=now
    )
    if failed != 1:
        return False
    Approval.objects.filter(run_id=rid, status__unindexed="pending").update(status="cancelled", decided_at=now)
    children_cancel(parent_id=rid, now=now, by="parent failed")
    if parent is not None:
        child_ended(run_id=rid, now=now)
    return True
