"""`finalize`: the only place a leased run ends.

`finalize` is the only code that moves a leased run out of RUNNING or
releases its lease (five outcomes plus *yield*). Its
transition is the fenced UPDATE itself, so a worker that lost its lease
changes nothing and records one `run.fenced` event instead. `finalize_detached`
is the same writer for an execution that ran no loop (Resume deciding).
An UNKNOWN outcome (a side effect that ended `uncertain`) is committed and
handed back: the executor asks Resume to decide it.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction

from runs.clock import CLOCK
from runs.domain.context import RunContext
from runs.domain.errors import WorkerFenced
from runs.domain.events import EventType, cancel_request_fields, checkpointed
from runs.domain.values import OutcomeKind, RunOutcome, SuspensionKind
from runs.domain.writes import (
    EventWrite,
    JoinParent,
    ModelCallFinish,
    RingDoorbell,
    StartChildren,
    Transition,
    UnitOfWork,
)
from runs.models import Event, Run
from runs.runtime.children import child_ended, run_end_leaseless
from runs.runtime.faults import hook_for
from runs.runtime.queue import Claim, ring_for_queued
from runs.store.events import append_event_unfenced
from runs.store.family import lock_family
from runs.store.repository import DjangoRunStore

log = logging.getLogger("agentrt.executor")


_TERMINAL = {
    OutcomeKind.COMPLETED: ("COMPLETED", "run.completed"),
    OutcomeKind.FAILED: ("FAILED", "run.failed"),
    OutcomeKind.CANCELLED: ("CANCELLED", "run.cancelled"),
}


def finalize(ctx: RunContext | None, claim: Claim, outcome: RunOutcome, *, clock=CLOCK) -> RunOutcome:
    """Perform the outcome: one fenced transaction that writes the pending
    work, the checkpoint and the event, moves the run out of RUNNING and
    releases the lease; or, when fenced, only `run.fenced`."""
    hook_for(claim.run_id)("finalize.before_transition")
    if outcome.kind is OutcomeKind.FENCED:
        _record_fenced(claim, outcome.late, clock)
        return outcome
    if ctx is None:  # the context could not even be built: fail the run under our lease
        return _finalize_bare(claim, outcome, clock)
    work: UnitOfWork = outcome.pending or UnitOfWork()
    now = clock.now()
    if ctx.progress.prepared_call is not None and ctx.progress.prepared_id is not None:
        work.model_call_finishes.append(
            ModelCallFinish(
                id=ctx.progress.prepared_id,
                status="abandoned",
                usage={},
                stop_reason=None,
                stream_had_output=False,
                error=None,
                prefix_sha256=None,
                finished_at=now,
            )
        )
    work.usage = ctx.progress.usage.model_dump(mode="json")
    if outcome.kind is OutcomeKind.YIELDED:
        if ctx.state.saved_len < len(ctx.state.conversation):
            _checkpoint(ctx, work, "yield")
    elif outcome.kind in _TERMINAL:
        _checkpoint(ctx, work, "final" if outcome.kind is OutcomeKind.COMPLETED else "terminal")
    elif outcome.kind is OutcomeKind.SUSPENDED:
        _checkpoint(ctx, work, "suspension")
    elif outcome.kind is OutcomeKind.UNKNOWN:
        return _commit_unknown(ctx, claim, outcome, work, clock)
    reason = "drain" if ctx.draining() else "slice_end"
    work.transition = _transition(claim, outcome, work, now, reason, parent=ctx.run.parent_id)
    try:
        ctx.store.commit(work)
    except WorkerFenced:
        late = outcome.late
        if late is None and work.invocation_updates:
            late = {
                "calls": [
                    {"invocation": str(u.id), "status": u.status, "result": u.result}
                    for u in work.invocation_updates
                    if u.result is not None
                ]
            } or None
        _record_fenced(claim, late, clock)
        return RunOutcome(kind=OutcomeKind.FENCED, late=late)
    _released(claim)
    hook_for(claim.run_id)("finalize.after_transition")
    _cancel_after_the_end(claim, outcome, clock)
    return outcome


def _commit_unknown(ctx: RunContext, claim: Claim, outcome: RunOutcome, work: UnitOfWork, clock) -> RunOutcome:
    """A side-effect call ended `uncertain` (pipeline step 11): commit what the batch recorded (the uncertain
    row, the results before it) under the lease and hand the outcome back still UNKNOWN; the executor then lets
    Resume decide (`settle_unknown`), which ends this execution through `finalize_detached`."""
    try:
        ctx.store.commit(work)
    except WorkerFenced:
        _record_fenced(claim, outcome.late, clock)
        return RunOutcome(kind=OutcomeKind.FENCED, late=outcome.late)
    return outcome


_UNKNOWN = object()  # finalize_detached does not know whether the run has a parent: the join's lock reads it


def _transition(
    claim: Claim, outcome: RunOutcome, work: UnitOfWork, now, yield_reason: str, parent=_UNKNOWN
) -> Transition:
    """The run row's change of finalize's fenced UPDATE (a `Transition`), with
    the outcome's event appended to `work` and what must join the
    transaction as its intents: the doorbell, the children started, a
    child's join (which locks its parent's row ahead of its own)."""
    if outcome.kind is OutcomeKind.YIELDED:
        work.events.append(EventWrite("run.requeued", {"reason": yield_reason, "lease_epoch": claim.epoch}, now))
        transition = Transition(status="QUEUED", release_lease=True)
        work.intents.append(RingDoorbell(claim.run_id))  # the doorbell joins this transaction

    elif outcome.kind is OutcomeKind.SUSPENDED:
        assert outcome.suspension is not None  # a SUSPENDED outcome carries its suspension
        kind = outcome.suspension.kind.value
        status = "WAITING_FOR_USER" if kind == "user" else "WAITING_FOR_APPROVAL"
        payload = {
            "lease_epoch": claim.epoch,
            "kind": kind,
            "approvals": [str(a) for a in outcome.suspension.approval_ids],
            "invocations": [str(i) for i in outcome.suspension.invocation_ids],
            **outcome.suspension.details,
        }
        if outcome.suspension.question:
            payload["question"] = outcome.suspension.question
        work.events.append(
            EventWrite("run.waiting_for_user" if kind == "user" else "run.waiting_for_approval", payload, now)
        )
        transition = Transition(status=status, release_lease=True)
        if outcome.suspension.kind is SuspensionKind.CHILD_RUN:
            # the children start with the suspension, in its transaction
            work.intents.append(StartChildren(parent_id=claim.run_id, suspension=outcome.suspension, now=now))

    elif outcome.kind in _TERMINAL:
        status, event_type = _TERMINAL[outcome.kind]
        payload = {"lease_epoch": claim.epoch}
        if outcome.kind is OutcomeKind.COMPLETED:
            payload["final_message"] = outcome.final_message
        if outcome.failure is not None:
            payload["failure"] = outcome.failure.as_json()
        if outcome.result is not None:
            payload["result"] = outcome.result
        if outcome.kind is OutcomeKind.CANCELLED:  # who asked, how and why (nothing for a child past its deadline)
            payload.update(cancel_request_fields(first_cancel_request(claim.run_id)))
        transition = Transition(
            status=status,
            release_lease=True,
            final_message=outcome.final_message if outcome.kind is OutcomeKind.COMPLETED else None,
            failure=payload.get("failure"),
            result=outcome.result,
        )
        work.events.append(EventWrite(event_type, payload, now))
        if parent is not None:  # a child, or maybe one (finalize_detached): the join's lock reads its parent
            work.intents.append(JoinParent(run_id=claim.run_id, now=now))
    else:
        raise ValueError(f"finalize cannot perform outcome {outcome.kind}")
    return transition


def first_cancel_request(run_id) -> dict | None:
    """The payload of the run's first `run.cancel_requested` (the request that
    set `cancel_requested_at`), or None."""
    return (
        Event.objects.filter(run_id=run_id, type=EventType.RUN_CANCEL_REQUESTED)
        .order_by("sequence")
        .values_list("payload", flat=True)
        .first()
    )


def _cancel_after_the_end(claim: Claim, outcome: RunOutcome, clock) -> None:
    """A cancel accepted while the run was past its last observation point:
    the request committed before this transition (a later
    one finds the run ended: 409 `run_terminal`), so the run's row, read
    once the transition has committed, says for certain whether there was
    one. A run that ended COMPLETED or FAILED gets `run.cancel_too_late`
    after its end event, with the request's `by`, `via` and `reason`: it
    ended first. A run that has just started to wait ends CANCELLED at once,
    as a cancel of a waiting run does (one waiting on an unknown outcome's
    question keeps it, and ends after the decision). Never fails the
    outcome already committed."""
    if outcome.kind not in (OutcomeKind.COMPLETED, OutcomeKind.FAILED, OutcomeKind.SUSPENDED):
        return
    try:
        requested_at = Run.objects.filter(id=claim.run_id).values_list("cancel_requested_at", flat=True).first()
        if requested_at is None:
            return
        request = cancel_request_fields(first_cancel_request(claim.run_id))
        now = clock.now()
        if outcome.kind is OutcomeKind.SUSPENDED:
            with transaction.atomic(durable=True):
                with connection.cursor() as cursor:
                    parent = lock_family(cursor, claim.run_id)
                ended = run_end_leaseless(
                    run_id=claim.run_id,
                    now=now,
                    by=request.get("by") or "",
                    via=request.get("via") or "api",
                    reason=request.get("reason"),
                )
                if ended and parent is not None:
                    child_ended(run_id=claim.run_id, now=now)
            return
        status = _TERMINAL[outcome.kind][0]
        payload = {"requested_at": requested_at.isoformat(), **request, "status": status}
        append_event_unfenced(
            tenant_id=claim.tenant_id,
            session_id=claim.session_id,
            run_id=claim.run_id,
            epoch=claim.epoch,
            event=EventWrite(EventType.RUN_CANCEL_TOO_LATE, payload, now),
        )
        log.info("run %s: a cancel came after its last observation point; it ended %s first", claim.run_id, status)
    except Exception:
        log.exception("run %s: could not record the cancel that came too late", claim.run_id)


def finalize_detached(
    claim: Claim, outcome: RunOutcome, work: UnitOfWork, *, clock=CLOCK, yield_reason: str = "resume"
) -> RunOutcome:
    """`finalize` for an execution that ran no loop (Resume deciding): the
    same writer, the same fence, the same one transaction."""
    hook_for(claim.run_id)("finalize.before_transition")
    if outcome.kind is OutcomeKind.FENCED:
        _record_fenced(claim, outcome.late, clock)
        return outcome
    store = DjangoRunStore(
        run_id=claim.run_id,
        tenant_id=claim.tenant_id,
        session_id=claim.session_id,
        owner=claim.owner,
        epoch=claim.epoch,
        code_version=settings.AGENTRT_CODE_VERSION,
    )
    work.transition = _transition(claim, outcome, work, clock.now(), yield_reason)
    try:
        store.commit(work)
    except WorkerFenced:
        _record_fenced(claim, None, clock)
        return RunOutcome(kind=OutcomeKind.FENCED)
    _released(claim)
    hook_for(claim.run_id)("finalize.after_transition")
    _cancel_after_the_end(claim, outcome, clock)
    return outcome


def _released(claim: Claim) -> None:
    """The lease is released (committed): a run of the same tenant that a
    claim left queued, while this one counted against the tenant's share,
    gets its doorbell now. Never fails the outcome already committed: if
    this cannot reach the database, the reclaim sweep rings for the run."""
    try:
        ring_for_queued(tenant_id=claim.tenant_id, released=claim.run_id)
    except Exception:
        log.exception("run %s: could not ring for its tenant's queued runs", claim.run_id)


def _checkpoint(ctx: RunContext, work: UnitOfWork, trigger: str) -> None:
    """The full checkpoint finalize writes; it replaces a checkpoint the loop
    left pending in the same unit (same version, so the chain has no hole)."""
    if work.checkpoint is not None:
        ctx.state.version -= 1
        work.events = [
            e
            for e in work.events
            if not (e.type == "run.checkpointed" and e.payload.get("version") == work.checkpoint.version)
        ]
    row = ctx.state.next_checkpoint(trigger, ctx.clock.now(), force_full=True)
    work.checkpoint = row
    work.events.append(checkpointed(row))


def _finalize_bare(claim: Claim, outcome: RunOutcome, clock) -> RunOutcome:
    return finalize_detached(claim, outcome, UnitOfWork(), clock=clock)


def _record_fenced(claim: Claim, late: dict | None, clock) -> None:
    payload = {"lease_owner": claim.owner, "lease_epoch": claim.epoch}
    if late:
        payload["late"] = True
        payload.update(late)
    try:
        connection.close_if_unusable_or_obsolete()
        append_event_unfenced(
            tenant_id=claim.tenant_id,
            session_id=claim.session_id,
            run_id=claim.run_id,
            epoch=claim.epoch,
            event=EventWrite("run.fenced", payload, clock.now()),
        )
    except Exception:
        log.exception("run %s: could not record run.fenced", claim.run_id)
