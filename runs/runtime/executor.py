"""`execute_run` and `finalize`: the only place a leased run ends.

`finalize` is the only code that moves a leased run out of RUNNING or
releases its lease (DESIGN §4, seed 002's five outcomes plus *yield*). Its
transition is the fenced UPDATE itself, so a worker that lost its lease
changes nothing and records one `run.fenced` event instead.
"""

from __future__ import annotations

import logging
import os
import socket
from uuid import UUID

from django.conf import settings
from django.db import connection

from approvals.gate import ApprovalGate
from approvals.policy import PolicyEngine
from checkpoints.repository import checkpoint_current
from ops.instrument import instrument
from ops.logs import log_context
from ops.tracing import run_span
from runs.clock import CLOCK, IDS
from runs.domain.budgets import Ledger
from runs.domain.cancellation import Token
from runs.domain.context import AgentSpec, RunContext, RunSnapshot
from runs.domain.errors import BudgetExceeded, WorkerFenced
from runs.domain.loop import run_loop
from runs.domain.scrub import scrub_stream
from runs.domain.values import BudgetScope, FailureReason, OutcomeKind, RunFailure, RunLimits, RunOutcome, RunUsage
from runs.domain.writes import EventWrite, ModelCallFinish, UnitOfWork
from runs.models import AgentVersion, ModelCall, Run
from runs.providers import provider_for, provider_streams
from runs.runtime.faults import hook_for
from runs.runtime.queue import Claim, run_claim
from runs.runtime.supervisor import Supervisor
from runs.store.fence import Transition
from runs.store.repository import DjangoRunStore, append_event_unfenced
from runs.tools import REGISTRY

log = logging.getLogger("agentrt.executor")

_DRAINING = {"flag": False}


def worker_identity(ids=IDS) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{ids.new_id().hex[:8]}"


def request_drain() -> None:
    """Graceful stop: each executing run yields at its next step boundary."""
    _DRAINING["flag"] = True


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
    from runs.runtime.queue import db_now
    from runs.runtime.resume import RunLeased, RunNotRunning, run_resume

    row = Run.objects.filter(id=run_id).values("status", "lease_expires_at", "lease_epoch").first()
    if not row or row["status"] != "RUNNING" or (row["lease_expires_at"] and row["lease_expires_at"] >= db_now()):
        return
    try:
        run_resume(run_id=run_id, via="drive_run", seen_epoch=row["lease_epoch"])
    except (RunLeased, RunNotRunning):
        pass


def tenant_floor(tenant_id, step_of=None):
    """A reader of the tenant's policy floor. With `step_of` (the current step
    number) it is read once per step — one SELECT for a whole batch of calls,
    and a tightened floor applies from the next step; without, at every call.
    A failed read is not remembered (the engine fails closed and the next
    evaluation tries again)."""
    seen: dict = {}

    def read() -> dict:
        from runs.models import Tenant

        key = step_of() if step_of is not None else None
        if step_of is not None and seen and seen["step"] == key:
            return seen["floor"]
        floor = Tenant.objects.filter(id=tenant_id).values_list("policy_floor", flat=True).first() or {}
        if step_of is not None:
            seen.update(step=key, floor=floor)
        return floor

    return read


def _read_only_of(tool_name: str) -> bool | None:
    spec = REGISTRY.spec(tool_name)
    return None if spec is None else bool(spec.read_only)


def build_context(claim: Claim, *, token: Token, lease, clock=CLOCK, ids=IDS) -> RunContext:
    run = Run.objects.select_related("agent").get(id=claim.run_id)
    version = AgentVersion.objects.get(agent_id=run.agent_id, version=run.agent_version)
    definition = version.definition
    limits = RunLimits(**run.limits)
    state = checkpoint_current(run)
    last_attempt = (
        ModelCall.objects.filter(run_id=run.id, step_number=state.step + 1)
        .order_by("-attempt_number")
        .values_list("attempt_number", flat=True)
        .first()
    )
    snapshot = RunSnapshot(
        id=run.id,
        tenant_id=run.tenant_id,
        session_id=run.session_id,
        agent_name=run.agent.name,
        agent_version=run.agent_version,
        input=run.input,
        usage=RunUsage(**(run.usage or {})),
        step_count=run.step_count,
        deadline_at=run.deadline_at,
        attempts=run.attempts,
        lease_epoch=claim.epoch,
    )
    ctx = RunContext(
        run=snapshot,
        agent=AgentSpec(
            name=run.agent.name,
            version=run.agent_version,
            instructions=definition.get("instructions", ""),
            model=definition["model"],
            tools=list(definition.get("tools", [])),
            policy=definition.get("policy") or {},
        ),
        state=state,
        clock=clock,
        ids=ids,
        provider=provider_for(definition["model"]),
        store=DjangoRunStore(
            run_id=run.id,
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            owner=claim.owner,
            epoch=claim.epoch,
            code_version=settings.AGENTRT_CODE_VERSION,
        ),
        tools=REGISTRY,
        policy=PolicyEngine(definition.get("policy"), read_only_of=_read_only_of),
        budgets=Ledger(limits, run.deadline_at),
        token=token,
        lease=lease,
        fault=hook_for(run.id),
        slice_seconds=float(settings.AGENTRT_SLICE_SECONDS),
        draining=lambda: _DRAINING["flag"],
        started_monotonic=clock.monotonic(),
        next_attempt=(last_attempt or 0) + 1,
        resumed=state.version > 1 or run.attempts > 1,
        approvals=ApprovalGate(run=run, clock=clock, ids=ids),
    )
    ctx.policy.floor = tenant_floor(run.tenant_id, step_of=lambda: ctx.state.step)
    if provider_streams(definition["model"]):
        ctx.provider = provider_for(definition["model"], on_delta=DeltaBatcher(ctx))
    return ctx


class DeltaBatcher:
    """Text deltas of a streaming model call become `model.response.delta`
    events, batched (at most ~4 a second, or per 1 KiB), each in its own short
    fenced transaction — never a transaction held across the stream. A fenced
    flush sets the token, which aborts the stream."""

    MIN_INTERVAL = 0.25
    MAX_BUFFER = 1024

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.raw: list[str] = []  # every delta of this attempt, as received
        self.shown = ""  # the scrubbed text already written as deltas
        self.size = 0  # characters received since the last flush
        self.last = ctx.clock.monotonic()
        self.key: tuple | None = None
        self.index = 0

    def __call__(self, text: str) -> None:
        key = (self.ctx.current_step, self.ctx.current_attempt)
        if key != self.key:
            self.key, self.index, self.raw, self.shown, self.size = key, 0, [], "", 0
        self.raw.append(text)
        self.size += len(text)
        now = self.ctx.clock.monotonic()
        if self.size >= self.MAX_BUFFER or now - self.last >= self.MIN_INTERVAL:
            self.flush(now)

    def flush(self, now: float) -> None:
        if not self.size:
            return
        self.size, self.last = 0, now
        # Scrubbed over the whole attempt so far, less a tail that may be a
        # half-arrived secret (it is shown once whole, or in the final turn).
        stable = scrub_stream("".join(self.raw))
        if not stable.startswith(self.shown) or len(stable) == len(self.shown):
            return  # nothing new that is safe to show (the final turn carries the whole text)
        text, self.shown = stable[len(self.shown) :], stable
        self.index += 1
        work = UnitOfWork()
        work.event(
            "model.response.delta",
            {"step": self.key[0], "attempt": self.key[1], "index": self.index, "text": text},
            self.ctx.clock.now(),
        )
        try:
            self.ctx.store.commit(work)
        except WorkerFenced:
            from runs.domain.values import CancelReason

            self.ctx.token.cancel(CancelReason.FENCED)


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
    ):
        try:
            ctx = build_context(claim, token=token, lease=supervisor, clock=clock, ids=ids)
            watch = instrument(ctx)
            log.info("run %s: slice started (epoch %s)", claim.run_id, claim.epoch)
            supervisor.start()
            try:
                ctx.budgets.check(ctx.run.usage, BudgetScope.ADMISSION, step_number=ctx.state.step + 1, now=clock.now())
                outcome = run_loop(ctx)
            except BudgetExceeded as exc:
                outcome = _failed(ctx, exc.reason, "BudgetExceeded", str(exc))
        except WorkerFenced as exc:
            outcome = RunOutcome(kind=OutcomeKind.FENCED, late=exc.late)
        except Exception as exc:  # never swallowed: typed, recorded, the run fails visibly
            log.exception("run %s: unhandled error", claim.run_id)
            outcome = _unhandled(ctx, exc, clock, ids)
        finally:
            supervisor.stop()
        result = finalize(ctx, claim, outcome, clock=clock)
        if watch is not None:
            watch.close()
        log.info("run %s: slice ended %s", claim.run_id, result.kind.value)
        return result


def _failed(ctx: RunContext, reason: FailureReason, error_class: str, message: str) -> RunOutcome:
    failure = RunFailure(
        reason=reason,
        error_class=error_class,
        message=message,
        step_number=ctx.current_step,
        attempt_number=ctx.current_attempt,
        occurred_at=ctx.clock.now(),
    )
    return RunOutcome(kind=OutcomeKind.FAILED, failure=failure, pending=ctx.pending)


def _unhandled(ctx: RunContext | None, exc: Exception, clock, ids) -> RunOutcome:
    failure = RunFailure(
        reason=FailureReason.INTERNAL_ERROR,
        error_class=type(exc).__name__,
        message="the runtime hit an unexpected error; see the diagnostic id in the worker log",
        step_number=ctx.current_step if ctx else None,
        attempt_number=ctx.current_attempt if ctx else None,
        occurred_at=clock.now(),
        details={"diagnostic_id": str(ids.new_id())},
    )
    log.error("run failure diagnostic %s: %s", failure.details["diagnostic_id"], type(exc).__name__)
    # Writes the loop left pending are dropped: their state is unknown.
    return RunOutcome(kind=OutcomeKind.FAILED, failure=failure, pending=UnitOfWork())


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
    if ctx.prepared_call is not None and ctx.prepared_id is not None:
        work.model_call_finishes.append(
            ModelCallFinish(
                id=ctx.prepared_id,
                status="abandoned",
                usage={},
                stop_reason=None,
                stream_had_output=False,
                error=None,
                prefix_sha256=None,
                finished_at=now,
            )
        )
    work.usage = ctx.run.usage.model_dump(mode="json")
    if outcome.kind is OutcomeKind.YIELDED:
        if ctx.state.saved_len < len(ctx.state.conversation):
            _checkpoint(ctx, work, "yield")
    elif outcome.kind in _TERMINAL:
        _checkpoint(ctx, work, "final" if outcome.kind is OutcomeKind.COMPLETED else "terminal")
    elif outcome.kind is OutcomeKind.SUSPENDED:
        _checkpoint(ctx, work, "suspension")
    elif outcome.kind is OutcomeKind.UNKNOWN:
        return _settle_unknown(ctx, claim, outcome, work, clock)
    reason = "drain" if ctx.draining() else "slice_end"
    transition, after = _transition(claim, outcome, work, now, reason)
    try:
        ctx.store.commit(work, transition=transition, after=after)
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
    return outcome


_DECIDED = {
    "continue": OutcomeKind.YIELDED,
    "waiting": OutcomeKind.SUSPENDED,
    "completed": OutcomeKind.COMPLETED,
    "failed": OutcomeKind.FAILED,
    "cancelled": OutcomeKind.CANCELLED,
    "fenced": OutcomeKind.FENCED,
}


def _settle_unknown(ctx: RunContext, claim: Claim, outcome: RunOutcome, work: UnitOfWork, clock) -> RunOutcome:
    """A side-effect call ended `uncertain` (DESIGN §7 step 11): commit what
    the batch recorded (the uncertain row, the results before it) under the
    lease, then let Resume's decision — the reconciler, or a pause on an
    `uncertain_side_effect` approval — end this execution through
    `finalize_detached`, exactly as for an interrupted call (seed 000)."""
    from runs.runtime.resume import settle_unknown

    try:
        ctx.store.commit(work)
    except WorkerFenced:
        _record_fenced(claim, outcome.late, clock)
        return RunOutcome(kind=OutcomeKind.FENCED, late=outcome.late)
    return RunOutcome(kind=_DECIDED[settle_unknown(claim)])


def _transition(claim: Claim, outcome: RunOutcome, work: UnitOfWork, now, yield_reason: str):
    """The run row's change of finalize's fenced UPDATE (a `Transition`), with
    the outcome's event appended to `work`, and what must join the
    transaction."""
    after = None
    if outcome.kind is OutcomeKind.YIELDED:
        work.events.append(EventWrite("run.requeued", {"reason": yield_reason, "lease_epoch": claim.epoch}, now))
        transition = Transition(status="QUEUED", release_lease=True)
        after = lambda cursor: enqueue_drive(claim.run_id)  # noqa: E731 - joins this transaction
    elif outcome.kind is OutcomeKind.SUSPENDED:
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
    elif outcome.kind in _TERMINAL:
        status, event_type = _TERMINAL[outcome.kind]
        payload = {"lease_epoch": claim.epoch}
        if outcome.kind is OutcomeKind.COMPLETED:
            payload["final_message"] = outcome.final_message
        if outcome.failure is not None:
            payload["failure"] = outcome.failure.as_json()
        if outcome.result is not None:
            payload["result"] = outcome.result
        transition = Transition(
            status=status,
            release_lease=True,
            final_message=outcome.final_message if outcome.kind is OutcomeKind.COMPLETED else None,
            failure=payload.get("failure"),
            result=outcome.result,
        )
        work.events.append(EventWrite(event_type, payload, now))
    else:
        raise ValueError(f"finalize cannot perform outcome {outcome.kind}")
    return transition, after


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
    transition, after = _transition(claim, outcome, work, clock.now(), yield_reason)
    try:
        store.commit(work, transition=transition, after=after)
    except WorkerFenced:
        _record_fenced(claim, None, clock)
        return RunOutcome(kind=OutcomeKind.FENCED)
    return outcome


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
    work.events.append(
        EventWrite("run.checkpointed", {"version": row.version, "trigger": trigger, "full": True}, row.created_at)
    )


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


def enqueue_drive(run_id: UUID) -> None:
    """Ring the doorbell. With the ORM broker on the default database this
    joins the caller's transaction (DESIGN §5)."""
    from django_q.tasks import async_task

    async_task("runs.tasks.drive_run", str(run_id), task_name=f"drive_run {run_id}", ack_failure=True)
