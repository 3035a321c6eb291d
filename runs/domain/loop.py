"""`run_loop`: computes a run's outcome and ends nothing.

It never transitions the run, releases a lease or writes a terminal event:
`finalize` does all three, with whatever writes the loop left pending.
"""

from __future__ import annotations

from typing import Any

from runs.domain import breaker, events
from runs.domain.context import RunContext
from runs.domain.context_engine import SynthesisReserveViolation, build_with_pressure
from runs.domain.errors import (
    BudgetExceeded,
    EmptyModelTurn,
    ModelError,
    PrincipalRevoked,
    ReplayDiverged,
    RunCancelled,
    ToolLoopDetected,
    WorkerFenced,
)
from runs.domain.events import EventType
from runs.domain.pipeline import BatchResult, RerunConflict, dispatch, open_batch, resume_batch
from runs.domain.pipeline.replay import replay_final
from runs.domain.scrub import scrub_text, scrub_turn
from runs.domain.stored_form import assistant_item
from runs.domain.values import (
    BudgetScope,
    CancelReason,
    FailureReason,
    ModelCallStatus,
    ModelTurn,
    ModelUsage,
    OutcomeKind,
    RunFailure,
    RunOutcome,
    StopReason,
    SuspensionKind,
)
from runs.domain.working_state import MAX_DENIED_BATCHES, BatchDisposition, apply_runtime_carry
from runs.domain.writes import ModelCallFinish, ModelCallInsert, UnitOfWork

MAX_STEP_FAILURES = 3


class _ModelFailure(Exception):
    def __init__(self, reason: FailureReason, error_class: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.error_class = error_class


def run_loop(ctx: RunContext) -> RunOutcome:
    """Drive steps until the run completes, fails, is cancelled, suspends or yields."""
    now = ctx.clock.now()
    ctx.progress.pending.event(
        EventType.RUN_RESUMED if ctx.resumed else EventType.RUN_STARTED,
        {"lease_epoch": ctx.run.lease_epoch, "attempts": ctx.run.attempts, "checkpoint_version": ctx.state.version},
        now,
    )
    try:
        try:
            return _loop(ctx)
        finally:
            ctx.store.settle()  # commit 2 may still be in flight: nothing leaves the loop before its answer
    except RunCancelled as exc:
        return stop_outcome(ctx, exc.cancel_reason)
    except BudgetExceeded as exc:
        error_class = "BudgetExceeded" if type(exc) is BudgetExceeded else type(exc).__name__
        return failed(ctx, exc.reason, error_class, str(exc), details=exc.details)
    except EmptyModelTurn:
        return failed(
            ctx,
            FailureReason.EMPTY_MODEL_TURN,
            "EmptyModelTurn",
            "the model returned empty turns on every attempt of the step",
        )
    except (ToolLoopDetected, PrincipalRevoked, ReplayDiverged) as exc:  # permanent: never requeued
        return failed(ctx, exc.reason, type(exc).__name__, str(exc), details=exc.details)
    except _ModelFailure as exc:
        return failed(ctx, exc.reason, exc.error_class, str(exc))
    except RerunConflict as exc:  # the approved re-run cannot run as approved
        ctx.progress.pending.invocation_updates.extend(exc.work.invocation_updates)
        ctx.progress.pending.events.extend(exc.work.events)
        return failed(ctx, FailureReason.RECONCILE_CONFLICT, exc.error_class, str(exc), details=exc.details)


def failed(ctx: RunContext, reason: FailureReason, error_class: str, message: str, **kw: Any) -> RunOutcome:
    if reason is FailureReason.DEADLINE_EXCEEDED and ctx.run.parent_id is not None:
        # A child run past its deadline (its parent's, copied) is cancelled with
        # its parent; the join reports it to the parent as a failed tool result.
        return RunOutcome(kind=OutcomeKind.CANCELLED, pending=ctx.progress.pending)
    failure = RunFailure(
        reason=reason,
        error_class=error_class,
        message=message,
        step_number=ctx.progress.current_step,
        attempt_number=ctx.progress.current_attempt,
        occurred_at=ctx.clock.now(),
        details=kw.get("details") or {},
    )
    return RunOutcome(kind=OutcomeKind.FAILED, failure=failure, pending=ctx.progress.pending)


def stop_outcome(ctx: RunContext, reason: CancelReason, late: list[dict[str, Any]] | None = None) -> RunOutcome:
    if reason is CancelReason.FENCED:
        return RunOutcome(kind=OutcomeKind.FENCED, late={"calls": late} if late else None)
    if reason is CancelReason.DEADLINE:
        return failed(ctx, FailureReason.DEADLINE_EXCEEDED, "RunDeadlineExceeded", "the run deadline has passed")
    return RunOutcome(kind=OutcomeKind.CANCELLED, pending=ctx.progress.pending)


def _loop(ctx: RunContext) -> RunOutcome:
    progress = ctx.progress
    reopened = open_batch(ctx)
    if reopened is not None:  # resume re-enters the pipeline for the open batch (it observes the token per call)
        step_number, pending = reopened
        progress.current_step = step_number
        ctx.tracer.begin_step(step_number, {"step.resumed_batch": True})
        _revalidate_principal(ctx)  # the re-entered batch runs for the principal as it is now
        if not progress.pending.is_empty():  # run.resumed lands before any watermark of the batch
            ctx.store.commit(progress.pending)
            progress.pending = UnitOfWork()
        ended = _after_batch(ctx, resume_batch(ctx, step_number, pending), next_step=None)
        if ended is not None:
            return ended
    while True:
        if ctx.draining() or ctx.clock.monotonic() - ctx.started_monotonic >= ctx.slice_seconds:
            return RunOutcome(kind=OutcomeKind.YIELDED, pending=progress.pending)
        ctx.token.raise_if_cancelled()  # observation point 1
        step_number = ctx.state.step + 1
        progress.current_step, progress.current_attempt = step_number, None
        ctx.tracer.begin_step(step_number)
        ctx.budgets.check(
            progress.usage, BudgetScope.STEP, step_number=progress.charged_step(step_number), now=ctx.clock.now()
        )
        turn = _invoke_model(ctx, step_number)
        ctx.tracer.set_step("step.tool_call_count", len(turn.tool_calls))
        ctx.token.raise_if_cancelled()  # observation point 3
        item = assistant_item(
            turn.text, [{"id": c.call_id, "name": c.name, "arguments": c.raw_arguments} for c in turn.tool_calls]
        )
        ctx.state.conversation.append(item)
        ctx.state.link(item, progress.turn_event)
        ctx.state.step = step_number
        if not turn.tool_calls:
            if ctx.replay is not None:  # a final answer where the original called a tool is a divergence
                replay_final(ctx, step_number)
            return RunOutcome(kind=OutcomeKind.COMPLETED, final_message=turn.text or "", pending=progress.pending)
        checkpoint(ctx, "model_response")
        work, progress.pending = progress.pending, UnitOfWork()
        ended = _after_batch(ctx, dispatch(ctx, step_number, turn.tool_calls, work), next_step=step_number + 1)
        if ended is not None:
            return ended


def _revalidate_principal(ctx: RunContext) -> None:
    """The principal is resolved once per execution, except at
    resumption after an approval or input (the pipeline re-enters an open
    batch), where it is revalidated before any tool of the batch runs."""
    if ctx.principals is None or ctx.run.principal is None:
        return
    why = ctx.principals.revoked(ctx.run.principal)
    if why is not None:
        raise PrincipalRevoked(why)


def _carry(ctx: RunContext, batch: BatchResult, step_number: int) -> None:
    """Phase 10: the runtime's working-state write (persisted by the next checkpoint)."""
    question = None
    if batch.suspension is not None and batch.suspension.kind is SuspensionKind.USER:
        question = str(batch.suspension.invocation_ids[0]) if batch.suspension.invocation_ids else None
    disposition = BatchDisposition(error_codes=batch.error_codes, all_denied=batch.all_denied, question_id=question)
    ctx.state.carry(apply_runtime_carry(ctx.state.working(), disposition, step_number))


def _after_batch(ctx: RunContext, batch: BatchResult, *, next_step: int | None) -> RunOutcome | None:
    """What follows a tool batch, fresh or re-entered: the outcome that ends
    this slice (a pause, an unknown outcome, a stop, repeated denials), or
    else commit 2 — the results, the `tool_batch` checkpoint and, after a
    fresh batch, the next step's request (`next_step`) — and None to go on.

    A batch of read-only calls may come back with its commit 1 still in
    flight (`batch.sent`): commit 2 is prepared meanwhile and the store
    waits for commit 1's answer before sending it; nothing leaves this
    function before that answer is in (`finally`)."""
    try:
        return _after_batch_body(ctx, batch, next_step)
    finally:
        if batch.sent is not None:
            batch.sent.wait()


def _after_batch_body(ctx: RunContext, batch: BatchResult, next_step: int | None) -> RunOutcome | None:
    progress = ctx.progress
    progress.pending = batch.work
    late = {"calls": batch.late} if batch.late else None
    if not batch.unknown and batch.stop is None:
        _carry(ctx, batch, ctx.state.step)
    if batch.suspension is not None:
        return RunOutcome(kind=OutcomeKind.SUSPENDED, suspension=batch.suspension, pending=progress.pending)
    if batch.unknown:  # an uncertain side effect: the executor hands the decision to Resume's reconcile-or-pause
        return RunOutcome(kind=OutcomeKind.UNKNOWN, pending=progress.pending, late=late)
    if batch.stop is not None:
        return stop_outcome(ctx, batch.stop, batch.late)
    denied = _count_denials(ctx, batch)
    if denied is not None:
        return denied
    checkpoint(ctx, "tool_batch")  # a full row may name commit 1's events while it is in flight (pg.Prior)
    if next_step is not None:
        _prepare_next_step(ctx, next_step)
        ctx.fault("checkpoint.before_write")
    if next_step is not None and late is None and progress.prepared_call == (next_step, 1):
        # Commit 2 goes on its way and the next step's request is built while
        # PostgreSQL runs and flushes it; the model is called only once it
        # has answered (`_attempt`: the `started` row is durable first).
        ctx.store.send(progress.pending)
        progress.pending = UnitOfWork()
        return None
    try:
        ctx.store.commit(progress.pending)  # commit 2 (after commit 1's answer): results, checkpoint, next request
    except WorkerFenced as exc:
        exc.late = late
        raise
    progress.pending = UnitOfWork()
    return None


def _count_denials(ctx: RunContext, batch: BatchResult) -> RunOutcome | None:
    """A run that keeps asking for denied calls fails `repeated_denial` (the
    count is the runtime carry's `consecutive_denials`)."""
    if ctx.state.denials >= MAX_DENIED_BATCHES:
        return failed(
            ctx,
            FailureReason.REPEATED_DENIAL,
            "RepeatedDenial",
            f"the model asked for denied calls in {ctx.state.denials} consecutive steps",
        )
    return None


def checkpoint(ctx: RunContext, trigger: str, *, force_full: bool = False) -> None:
    at = ctx.clock.now()
    row = ctx.state.next_checkpoint(trigger, at, force_full=force_full)
    ctx.progress.pending.checkpoint = row
    ctx.progress.pending.events.append(events.checkpointed(row))


def _compacted(ctx: RunContext, info: dict[str, Any]) -> None:
    """A compaction is a write: a full checkpoint the loop adopts, in its own
    transaction, with `context.compacted`."""
    checkpoint(ctx, "compaction", force_full=True)
    ctx.progress.pending.event(EventType.CONTEXT_COMPACTED, info, ctx.clock.now())
    ctx.store.commit(ctx.progress.pending)
    ctx.progress.pending = UnitOfWork()


def _start_model_call(ctx: RunContext, step_number: int, attempt: int) -> None:
    at = ctx.clock.now()
    call_id = ctx.ids.new_id()
    ctx.progress.pending.model_call_inserts.append(
        ModelCallInsert(id=call_id, step_number=step_number, attempt_number=attempt, started_at=at)
    )
    progress = ctx.progress
    progress.pending.event(
        EventType.MODEL_REQUEST_STARTED, {"step": step_number, "attempt": attempt, "model_call": str(call_id)}, at
    )
    if step_number > progress.step_count:
        # `steps` counts charged steps: a refunded orchestration-only turn stays refunded.
        charged = progress.usage.steps + step_number - progress.step_count
        progress.step_count = step_number
        progress.usage = progress.usage.model_copy(update={"steps": charged})
        progress.pending.step_count = step_number
        progress.pending.usage = progress.usage.model_dump(mode="json")
    progress.prepared_id = call_id


def _prepare_next_step(ctx: RunContext, step_number: int) -> None:
    """Write the next step's `started` row in this commit when its pre-checks
    already pass in memory, so a read-only step costs two commits."""
    if ctx.token.reason is not None or ctx.draining():
        return
    if ctx.clock.monotonic() - ctx.started_monotonic >= ctx.slice_seconds:
        return
    try:
        now = ctx.clock.now()
        charged = ctx.progress.charged_step(step_number)
        ctx.budgets.check(ctx.progress.usage, BudgetScope.STEP, step_number=charged, now=now)
        ctx.budgets.check(ctx.progress.usage, BudgetScope.ATTEMPT, step_number=step_number, now=now)
    except BudgetExceeded:
        return
    _start_model_call(ctx, step_number, 1)
    ctx.progress.prepared_call = (step_number, 1)


def _finish(
    ctx: RunContext,
    status: ModelCallStatus,
    turn: ModelTurn | None,
    prefix: str | None,
    error: dict[str, Any] | None = None,
    stream_had_output: bool = False,
    usage: ModelUsage | None = None,
) -> None:
    spent = turn.usage if turn else usage
    if ctx.progress.prepared_id is None:
        raise RuntimeError("a model call finishes only after its row was started")
    ctx.progress.pending.model_call_finishes.append(
        ModelCallFinish(
            id=ctx.progress.prepared_id,
            status=status,
            usage=spent.model_dump(mode="json") if spent else {},
            stop_reason=str(turn.stop_reason) if turn else None,
            stream_had_output=stream_had_output,
            error=error,
            prefix_sha256=prefix,
            finished_at=ctx.clock.now(),
        )
    )
    ctx.progress.pending.usage = ctx.progress.usage.model_dump(mode="json")


def _invoke_model(ctx: RunContext, step_number: int) -> ModelTurn:
    with ctx.tracer.span("model.invoke", {"step.number": step_number}):
        return _attempts(ctx, step_number)


def _attempts(ctx: RunContext, step_number: int) -> ModelTurn:
    """The attempts of one step's model call: up to `ctx.model_attempts`
    (AGENTRT_MODEL_ATTEMPTS, default MAX_STEP_FAILURES), each with its own
    model-call row. A transient error or an empty turn is tried again;
    anything else ends the step (`_ModelFailure`, a budget, a cancel)."""
    attempt = ctx.progress.next_attempt
    ctx.progress.next_attempt = 1
    step_failures = 0
    while True:
        prefix, synthesis, turn, error = _attempt(ctx, step_number, attempt)
        if error is not None:
            _record_failed_attempt(ctx, error, step_number, attempt, prefix)
            step_failures += 1
            if error.retryable and step_failures < ctx.model_attempts:
                attempt += 1
                continue
            raise _model_failure(error) from error
        assert turn is not None  # one of the two is set
        if _empty_turn(ctx, turn, step_number, attempt, prefix, synthesis):
            step_failures += 1
            if step_failures < ctx.model_attempts:
                attempt += 1
                continue
            raise EmptyModelTurn()
        _record_turn(ctx, turn, step_number, attempt, prefix)
        return turn


def _attempt(
    ctx: RunContext, step_number: int, attempt: int
) -> tuple[str, str | None, ModelTurn | None, ModelError | None]:
    """One attempt: its `started` row (committed unless the previous step
    prepared it), the request built under context pressure, the provider's
    answer. Return the request's prefix hash, the synthesis dimension, and
    either the scrubbed turn or the provider's error."""
    progress = ctx.progress
    progress.current_attempt = attempt
    ctx.budgets.check(progress.usage, BudgetScope.ATTEMPT, step_number=step_number, now=ctx.clock.now())
    if progress.prepared_call != (step_number, attempt):
        _start_model_call(ctx, step_number, attempt)
        ctx.store.commit(progress.pending)
        progress.pending = UnitOfWork()
    progress.prepared_call = None
    ctx.fault("model.before_call")
    ctx.token.raise_if_cancelled()  # observation point 2
    request, prefix, synthesis = build_with_pressure(ctx, step_number, attempt, lambda info: _compacted(ctx, info))
    ctx.tracer.set_step("step.attempt_count", attempt)
    ctx.tracer.set_step("context.prefix_sha256", prefix)
    ctx.store.settle()  # the commit with this call's `started` row has its answer before the model is called
    try:
        with ctx.tracer.span("model.attempt", {"attempt.number": attempt, "context.prefix_sha256": prefix}):
            turn = ctx.provider.complete(request, ctx.token)
    except ModelError as exc:
        return prefix, synthesis, None, exc
    turn = scrub_turn(turn)  # before anything of it is persisted: text, calls, final message, checkpoints
    ctx.fault("model.after_call")
    return prefix, synthesis, turn, None


def _record_failed_attempt(ctx: RunContext, exc: ModelError, step_number: int, attempt: int, prefix: str) -> None:
    """A failed attempt is charged ("after" means record): its tokens and cost
    go into the ledger like a completed one's, its row ends `failed` with
    `model.response.failed`. A cancel seen meanwhile, or a budget it went
    over, ends the step here."""
    progress = ctx.progress
    spent = exc.usage or ModelUsage()
    over: BudgetExceeded | None = None
    try:
        progress.usage = ctx.budgets.record_model_usage(progress.usage, spent)
    except BudgetExceeded as err:
        progress.usage, over = err.usage or progress.usage, err
    error = {"error_class": exc.error_class, "transient": exc.retryable, "message": scrub_text(str(exc))[:500]}
    _finish(ctx, ModelCallStatus.FAILED, None, prefix, error, exc.stream_had_output, usage=spent)
    progress.pending.events.append(
        events.model_response_failed(
            step=step_number,
            attempt=attempt,
            error_class=exc.error_class,
            transient=exc.retryable,
            stream_had_output=exc.stream_had_output,
            at=ctx.clock.now(),
            usage=spent.model_dump(mode="json"),
        )
    )
    if ctx.token.reason is not None:
        raise RunCancelled(ctx.token.reason) from exc
    if over is not None:
        raise over from exc


def _model_failure(exc: ModelError) -> _ModelFailure:
    """Why the step failed after its last attempt."""
    if exc.retryable:
        return _ModelFailure(
            FailureReason.DEPENDENCY_UNAVAILABLE,
            exc.error_class,
            "the model failed transiently on every attempt of the step",
        )
    # The adapter's own words (never provider text, a URL or a variable name).
    return _ModelFailure(
        FailureReason.MODEL_PERMANENT_ERROR,
        exc.error_class,
        f"the model provider refused the request: {scrub_text(str(exc))[:300]}",
    )


def _empty_turn(
    ctx: RunContext, turn: ModelTurn, step_number: int, attempt: int, prefix: str, synthesis: str | None
) -> bool:
    """Charge a turn and check it: a budget it went over, a cancel, tools
    called inside the synthesis reserve end the step; an empty turn is a
    failed attempt (recorded here, True) the step may try again."""
    progress = ctx.progress
    try:
        progress.usage = ctx.budgets.record_model_usage(progress.usage, turn.usage)
    except BudgetExceeded as exc:
        progress.usage = exc.usage or progress.usage
        _finish(ctx, ModelCallStatus.COMPLETED, turn, prefix)
        raise
    if turn.stop_reason is StopReason.CANCELLED or ctx.token.reason is not None:
        _finish(ctx, ModelCallStatus.FAILED, turn, prefix, {"error_class": "Cancelled", "transient": False})
        raise RunCancelled(ctx.token.reason or CancelReason.REQUESTED)
    looping = breaker.trip(ctx, turn.tool_calls, synthesis=synthesis) if turn.tool_calls else None
    if looping is not None:  # fails visibly, before anything of the batch is recorded
        _finish(ctx, ModelCallStatus.FAILED, turn, prefix, {"error_class": "ToolLoopDetected", "transient": False})
        raise looping
    if synthesis and turn.tool_calls:
        _finish(
            ctx,
            ModelCallStatus.FAILED,
            turn,
            prefix,
            {"error_class": "SynthesisReserveViolation", "transient": False},
        )
        raise SynthesisReserveViolation(synthesis)
    if not turn.is_empty:
        return False
    _finish(ctx, ModelCallStatus.FAILED, turn, prefix, {"error_class": "EmptyModelTurn", "transient": True})
    progress.pending.events.append(
        events.model_response_failed(
            step=step_number,
            attempt=attempt,
            error_class="EmptyModelTurn",
            transient=True,
            stream_had_output=False,
            at=ctx.clock.now(),
        )
    )
    return True


def _record_turn(ctx: RunContext, turn: ModelTurn, step_number: int, attempt: int, prefix: str) -> None:
    """A completed attempt: its row and `model.response.completed` (the turn the checkpoint rebuild reads back)."""
    _finish(ctx, ModelCallStatus.COMPLETED, turn, prefix)
    ctx.progress.turn_event = ctx.progress.pending.event(
        EventType.MODEL_RESPONSE_COMPLETED,
        {
            "step": step_number,
            "attempt": attempt,
            "text": turn.text,
            "tool_calls": [{"id": c.call_id, "name": c.name, "arguments": c.raw_arguments} for c in turn.tool_calls],
            "stop_reason": str(turn.stop_reason),
            "usage": turn.usage.model_dump(mode="json"),
            "tool_call_count_before_turn": ctx.progress.usage.tool_calls,
        },
        ctx.clock.now(),
    )


__all__ = ["run_loop", "checkpoint", "failed", "stop_outcome"]
