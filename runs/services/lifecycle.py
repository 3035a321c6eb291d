"""The lifecycle service: transitions of runs that hold no lease:
cancel of a QUEUED or waiting run, and the cancel request of a RUNNING one
(or of a run waiting on an unknown outcome's question, which stays open),
each recorded as `run.cancel_requested` when it is accepted.

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
from runs.domain.events import CANCEL_VIAS, cancel_requested
from runs.domain.scrub import scrub_text
from runs.errors import InvalidInput, RunTerminal
from runs.models import TERMINAL, Run
from runs.runtime.cancel_bell import ring
from runs.runtime.children import child_ended, children_cancel, request_cancel_open, run_end_leaseless
from runs.runtime.retry import run_retry as retry_run
from runs.store.events import record_events
from runs.store.family import lock_family, lock_parent

# The statuses a run waits in, holding no lease.
WAITING = ("WAITING_FOR_APPROVAL", "WAITING_FOR_USER")


# A cancel's `reason`: at most this many characters (the approvals' decision reason has the same bound).
CANCEL_REASON_MAX = 2000


def cancel_input(*, via: Any, reason: Any) -> str | None:
    """The request's surface and reason, checked (400 naming `reason`): the
    reason is optional text, scrubbed of secrets like every other text a
    person hands the runtime; blank is no reason."""
    if via not in CANCEL_VIAS:
        raise ValueError(f"via must be one of {', '.join(CANCEL_VIAS)}")
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > CANCEL_REASON_MAX:
        raise InvalidInput(
            f"reason must be text of at most {CANCEL_REASON_MAX} characters",
            fields={"reason": [f"must be text of at most {CANCEL_REASON_MAX} characters"]},
        )
    if "\x00" in reason:
        raise InvalidInput("reason contains a NUL character", fields={"reason": ["NUL characters are not allowed"]})
    reason = scrub_text(reason).strip()
    return reason or None


def run_cancel(*, run: Run, by: str = "", via: str = "api", reason: str | None = None) -> str:
    """Cancel a run: record the request (`run.cancel_requested`: who, `via`
    which surface — api, live, admin or cli — and the optional `reason`) in
    the transaction that accepts it, then act on it. A QUEUED or waiting run
    ends CANCELLED at once (its children with it, and — for a child — the
    join tells its parent); a RUNNING one gets `cancel_requested_at`, and the
    cancel doorbell (runs.runtime.cancel_bell) tells its worker at commit,
    which stops at its next observation point (a run past its last one ends
    as it would have, and `run.cancel_too_late` says so). A run waiting on
    an unknown outcome's question keeps it: it stays WAITING_FOR_APPROVAL
    with `cancel_requested_at` set, only confirm or reject are accepted, and
    the decision ends it CANCELLED (approvals.unknown). A finished run is 409
    `run_terminal` and nothing is recorded. Return the status the run is in
    afterwards."""
    reason = cancel_input(via=via, reason=reason)
    now = CLOCK.now()
    requested = Coalesce(F("cancel_requested_at"), Value(now, output_field=DateTimeField()))
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            # ancestor before descendant (the join's lock order), the run before its approvals (a decision's)
            parent = lock_family(cursor, run.id)
        row = Run.objects.filter(id=run.id).values("status", "tenant_id", "session_id", "lease_epoch").first()
        if row is None or row["status"] in TERMINAL:
            raise RunTerminal("the run has already ended")
        record_events(
            tenant_id=row["tenant_id"],
            session_id=row["session_id"],
            run_id=run.id,
            epoch=row["lease_epoch"],
            events=[cancel_requested(by=by, via=via, reason=reason, at=now)],
        )
        if request_cancel_open(run_id=run.id, now=now):
            return "WAITING_FOR_APPROVAL"
        if run_end_leaseless(run_id=run.id, now=now, by=by, via=via, reason=reason):
            if parent is not None:
                child_ended(run_id=run.id, now=now)
            return "CANCELLED"
        if (
            Run.objects.filter(id=run.id, status__unindexed="RUNNING").update(
                cancel_requested_at=requested, updated_at=now
            )
            == 1
        ):
            ring(run.id)
            return "RUNNING"
        raise RunTerminal("the run has already ended")  # (rolls the request back: nothing is recorded)


def run_retry(*, run: Run, by: str = "", via: str = "api") -> str:
    """Give a run that FAILED for a transient reason a new attempt of the same
    run, from its last checkpoint (runs.runtime.retry: who may, what is never
    sent again, the 409s); `via` is the surface (api, live, admin, cli).
    Return the status the run is in afterwards (QUEUED, or
    WAITING_FOR_APPROVAL when a side effect's outcome must be decided first)."""
    return retry_run(run_id=run.id, by=by, via=via)


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
