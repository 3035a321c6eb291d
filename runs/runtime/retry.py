"""Retry a run that failed for a transient reason: a new
attempt of the same run, from its last checkpoint.

The run keeps its id, session, events, checkpoints and tool calls; the retry
is one more execution of it, like a take-over of a run whose worker died:
one transaction leases the FAILED run again under a new epoch
(runs/store/lease.py `reopen`: its failure cleared, a fresh allowance of
lost leases, no cancel pending), marks whatever its failed execution left in
flight interrupted exactly as a take-over does, and writes `run.retried`
(who, via which surface, the failure it clears); then Resume's `decide`
ends that execution through `finalize`: back to QUEUED with its doorbell
(`run.requeued`), or — when a side effect's outcome is unknown — to the
reconciler or an `interrupted_side_effect` approval, which someone decides
before anything is sent again. The next claim continues from the newest
checkpoint, caught up with the log: every tool call with a recorded result
is answered from the record (never executed again), a model call is asked
again only for the step that failed.

Only these failures are retried — the ones another attempt can change:
`dependency_unavailable` (the model kept failing transiently),
`internal_error` (the runtime hit an unexpected error) and
`max_attempts_exceeded` (its workers kept dying). Any other reason is 409
`run_not_retryable` naming it, as is a child run (its parent's model has
already been told it failed) and a run whose deadline has passed; a run that
is not FAILED is 409 `run_not_failed`. The run counts against its tenant's
active-run quota again (429 `quota_exceeded`) and its session may hold one
active run (409 `session_busy`). Limits, usage and the deadline are the
run's: a retry is not a new budget.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from ops.fleet import reopened
from runs.clock import CLOCK
from runs.domain.events import EventType
from runs.domain.pipeline import UNKNOWN_OUTCOME
from runs.domain.writes import EventWrite
from runs.errors import ActiveRunExists, QuotaExceeded, RunNotFailed, RunNotFound
from runs.models import Run
from runs.runtime.queue import Claim, worker_identity
from runs.runtime.resume import INTERRUPTED_OBSERVATION, Takeover, decide, interrupted_events
from runs.services.retrying import retry_refusal
from runs.store import lease
from runs.store.reads import active_runs_and_quota

log = logging.getLogger("agentrt.retry")

RETRY_VIAS = ("api", "live", "admin", "cli")

# What `decide` answers, as the status the run is in once the retry returns.
_STATUS_AFTER = {
    "continue": "QUEUED",
    "waiting": "WAITING_FOR_APPROVAL",
    "completed": "COMPLETED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "fenced": "RUNNING",
}


def run_retry(*, run_id: UUID | str, by: str = "", via: str = "api") -> str:
    """Give a FAILED run a new attempt (see the module docstring); return the
    status it is in afterwards (QUEUED, or WAITING_FOR_APPROVAL when a side
    effect's outcome must be decided first)."""
    if via not in RETRY_VIAS:
        raise ValueError(f"via must be one of {', '.join(RETRY_VIAS)}")
    try:
        rid = UUID(str(run_id))
    except ValueError:
        raise RunNotFound("no such run") from None
    now = CLOCK.now()
    owner = worker_identity()
    failure: dict[str, Any] = {}
    seen_epoch = 0

    def events(taken: lease.TakenOver) -> list[EventWrite]:
        retried = EventWrite(
            EventType.RUN_RETRIED,
            {
                "by": by,
                "via": via,
                "failure": failure,
                "previous_epoch": seen_epoch,
                "lease_owner": owner,
                "lease_epoch": taken.leased.epoch,
            },
            now,
        )
        return [retried, *interrupted_events(taken, now)]

    try:
        with transaction.atomic(durable=True):
            run = Run.objects.select_for_update(no_key=True).filter(id=rid).first()
            if run is None:
                raise RunNotFound("no such run")
            refusal = retry_refusal(run, now)
            if refusal is not None:
                raise refusal
            failure, seen_epoch = dict(run.failure or {}), run.lease_epoch
            _check_quota(run.tenant_id)
            reopened(run.id)  # its figures stay counted once (ops.fleet)
            with connection.cursor() as cursor:
                taken = lease.reopen(
                    cursor,
                    run_id=rid,
                    owner=owner,
                    lease_seconds=float(settings.AGENTRT_LEASE_SECONDS),
                    now=now,
                    read_observation=INTERRUPTED_OBSERVATION,
                    unknown_outcome=UNKNOWN_OUTCOME,
                    events=events,
                )
            if taken is None:  # (the row is locked and was FAILED: not reached)
                raise RunNotFailed("the run is no longer FAILED")
    except IntegrityError:
        raise ActiveRunExists("the run's session has another active run; retry this one once it has ended") from None
    log.info("run %s: retried by %s via %s (it had failed %s)", rid, by or "-", via, failure.get("reason"))
    claim = Claim(
        run_id=rid,
        tenant_id=taken.leased.tenant_id,
        session_id=taken.leased.session_id,
        owner=owner,
        epoch=taken.leased.epoch,
    )
    interrupted = [{"invocation": call.invocation, "step": call.step} for call in taken.effects]
    outcome = decide(Takeover(claim=claim, previous_owner=None, previous_epoch=seen_epoch, interrupted=interrupted))
    return _STATUS_AFTER[outcome]


def _check_quota(tenant_id) -> None:
    """The run is active again: it counts against its tenant's quota (the
    tenant's row locked after the run's, as a parent starting its children
    takes them)."""
    active, limit = active_runs_and_quota(tenant_id)
    if limit is None:
        limit = settings.AGENTRT_MAX_ACTIVE_RUNS or None
    if limit is not None and active >= limit:
        raise QuotaExceeded(f"the tenant has {active} active runs and its quota is {limit}; wait for some to finish")
