"""`run_drive` and `execute_run`: claim a run, run the loop under the lease, finalize.

The doorbell task (`drive_run`) claims its run or, when it finds the run
abandoned (RUNNING, lease expired), resumes it. `execute_run` builds the
run's context (runs/runtime/wiring.py), starts the supervisor (heartbeats,
cancel and deadline watch) and watches the cancel doorbell
(runs/runtime/cancel_bell.py), runs the domain loop and hands whatever it
computed to `finalize` (runs/runtime/finalize.py), the only place a leased run ends.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from ops.instrument import instrument
from ops.logs import log_context
from ops.tracing import run_span
from runs.clock import CLOCK, IDS
from runs.domain.cancellation import Token
from runs.domain.context import RunContext
from runs.domain.errors import AgentVersionMissing, BudgetExceeded, EndpointNotAllowed, WorkerFenced
from runs.domain.loop import failed, run_loop
from runs.domain.values import BudgetScope, FailureReason, OutcomeKind, RunFailure, RunOutcome
from runs.domain.writes import UnitOfWork
from runs.models import Run
from runs.runtime.cancel_bell import BELL
from runs.runtime.finalize import finalize
from runs.runtime.queue import Claim, db_now, run_claim, worker_identity
from runs.runtime.resume import RunLeased, RunNotRunning, run_resume, settle_unknown
from runs.runtime.supervisor import Supervisor
from runs.runtime.wiring import DeltaBatcher, build_context
from runs.store.cursor import keyed_plans

log = logging.getLogger("agentrt.executor")


def run_drive(*, run_id: UUID) -> RunOutcome | None:
    """The body of the `drive_run` doorbell: claim the run or exit quietly."""
    claim = run_claim(run_id=run_id, owner=worker_identity())
    if claim is None:
        _resume_if_abandoned(run_id)
        return None
    return execute_run(claim)


def _resume_if_abandoned(run_id: UUID) -> None:
    """A doorbell for a RUNNING run whose lease expired: a takeover is always
    a Resume, never a silent claim."""
    row = Run.objects.filter(id=run_id).values("status", "lease_expires_at", "lease_epoch").first()
    if not row or row["status"] != "RUNNING" or (row["lease_expires_at"] and row["lease_expires_at"] >= db_now()):
        return
    try:
        run_resume(run_id=run_id, via="drive_run", seen_epoch=row["lease_epoch"])
    except (RunLeased, RunNotRunning):
        pass


def execute_run(claim: Claim, *, clock=CLOCK, ids=IDS) -> RunOutcome:
    """Run the loop under the claimed lease, then `finalize` whatever it computed."""
    token = Token()
    supervisor = Supervisor(
        run_id=claim.run_id,
        owner=claim.owner,
        epoch=claim.epoch,
        token=token,
        clock=clock,
        lease_seconds=float(settings.AGENTRT_LEASE_SECONDS),
    )
    ctx = None
    watch = None
    with (
        log_context(run=str(claim.run_id), tenant=str(claim.tenant_id), epoch=claim.epoch, worker=claim.owner),
        run_span(claim),
        keyed_plans(),
        BELL.watching(claim.run_id, token),  # before the claim's read of the run: no request falls between
    ):
        try:
            ctx = build_context(claim, token=token, lease=supervisor, clock=clock, ids=ids)
            ctx, watch = instrument(ctx)
            DeltaBatcher.bind(ctx)
            log.info("run %s: slice started (epoch %s)", claim.run_id, claim.epoch)
            supervisor.start()
            try:
                ctx.budgets.check(
                    ctx.progress.usage, BudgetScope.ADMISSION, step_number=ctx.state.step + 1, now=clock.now()
                )
                outcome = run_loop(ctx)
            except BudgetExceeded as exc:
                outcome = _failed(ctx, exc.reason, "BudgetExceeded", str(exc))
        except WorkerFenced as exc:
            outcome = RunOutcome(kind=OutcomeKind.FENCED, late=exc.late)
        except (AgentVersionMissing, EndpointNotAllowed) as exc:  # permanent, loud, before the model is called
            log.error("run %s: %s", claim.run_id, exc)
            outcome = RunOutcome(
                kind=OutcomeKind.FAILED,
                failure=RunFailure(
                    reason=exc.reason,
                    error_class=type(exc).__name__,
                    message=str(exc),
                    occurred_at=clock.now(),
                    details=exc.details,
                ),
            )
        except Exception as exc:  # never swallowed: typed, recorded, the run fails visibly
            if _database_lost(exc):
                outcome = _lost(claim, exc)
            else:
                log.exception("run %s: unhandled error", claim.run_id)
                outcome = _unhandled(ctx, exc, clock, ids)
        finally:
            supervisor.stop()
        if outcome.kind is OutcomeKind.LOST:
            if watch is not None:
                watch.close()
            return outcome
        result = finalize(ctx, claim, outcome, clock=clock)
        if result.kind is OutcomeKind.UNKNOWN:  # committed under the lease: Resume decides, then ends it
            result = RunOutcome(kind=_DECIDED[settle_unknown(claim)])
        if watch is not None:
            watch.close()
        log.info("run %s: slice ended %s", claim.run_id, result.kind.value)
        return result


def _database_lost(exc: BaseException) -> bool:
    """Whether the slice failed because the database went away (a cut or
    closed connection, a restart, a refused statement): the chain of causes
    holds one of Django's OperationalError or InterfaceError."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (OperationalError, InterfaceError)):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _lost(claim: Claim, exc: BaseException) -> RunOutcome:
    """A lost database is a lost lease, not a failed run: whatever the slice
    was writing (a watermark with the batch's earlier results, say) never
    committed, so nothing more is written from here, not even a verdict on a
    fresh connection. The connection is closed, the heartbeats have stopped,
    and the lease lapses; the takeover's Resume finds what was in flight,
    marks it interrupted and asks."""
    log.warning(
        "run %s: lost the database in the slice (%s: %s); the lease lapses and the run is taken over",
        claim.run_id,
        type(exc).__name__,
        str(exc).splitlines()[0] if str(exc) else "",
    )
    connection.close()
    return RunOutcome(kind=OutcomeKind.LOST)


def _failed(ctx: RunContext, reason: FailureReason, error_class: str, message: str) -> RunOutcome:
    return failed(ctx, reason, error_class, message)


def _unhandled(ctx: RunContext | None, exc: Exception, clock, ids) -> RunOutcome:
    failure = RunFailure(
        reason=FailureReason.INTERNAL_ERROR,
        error_class=type(exc).__name__,
        message="the runtime hit an unexpected error; see the diagnostic id in the worker log",
        step_number=ctx.progress.current_step if ctx else None,
        attempt_number=ctx.progress.current_attempt if ctx else None,
        occurred_at=clock.now(),
        details={"diagnostic_id": str(ids.new_id())},
    )
    log.error("run failure diagnostic %s: %s", failure.details["diagnostic_id"], type(exc).__name__)
    # Writes the loop left pending are dropped: their state is unknown.
    return RunOutcome(kind=OutcomeKind.FAILED, failure=failure, pending=UnitOfWork())


_DECIDED = {
    "continue": OutcomeKind.YIELDED,
    "waiting": OutcomeKind.SUSPENDED,
    "completed": OutcomeKind.COMPLETED,
    "failed": OutcomeKind.FAILED,
    "cancelled": OutcomeKind.CANCELLED,
    "fenced": OutcomeKind.FENCED,
}
