"""`run_loop`: computes a run's outcome and ends nothing (seed 002).

It never transitions the run, releases a lease or writes a terminal event:
`finalize` does all three, with whatever writes the loop left pending.
"""

from __future__ import annotations

from runs.domain.context import RunContext
from runs.domain.context_engine import SynthesisReserveViolation, build_with_pressure
from runs.domain.errors import BudgetExceeded, EmptyModelTurn, ModelError, RunCancelled, WorkerFenced
from runs.domain.pipeline import RerunConflict, dispatch, open_batch, resume_batch
from runs.domain.scrub import scrub_text, scrub_turn
from runs.domain.values import (
    BudgetScope,
    CancelReason,
    FailureReason,
    ModelTurn,
    ModelUsage,
    OutcomeKind,
    RunFailure,
    RunOutcome,
    StopReason,
)
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
    ctx.pending.event(
        "run.resumed" if ctx.resumed else "run.started",
        {"lease_epoch": ctx.run.lease_epoch, "attempts": ctx.run.attempts, "checkpoint_version": ctx.state.version},
        now,
    )
    try:
        return _loop(ctx)
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
    except _ModelFailure as exc:
        return failed(ctx, exc.reason, exc.error_class, str(exc))
    except RerunConflict as exc:  # seed 000: the approved re-run cannot run as approved
        ctx.pending.invocation_updates.extend(exc.work.invocation_updates)
        ctx.pending.events.extend(exc.work.events)
        return failed(ctx, FailureReason.RECONCILE_CONFLICT, exc.error_class, str(exc), details=exc.details)


def failed(ctx: RunContext, reason: FailureReason, error_class: str, message: str, **kw) -> RunOutcome:
    failure = RunFailure(
        reason=reason,
        error_class=error_class,
        message=message,
        step_number=ctx.current_step,
        attempt_number=ctx.current_attempt,
        occurred_at=ctx.clock.now(),
        details=kw.get("details") or {},
    )
    return RunOutcome(kind=OutcomeKind.FAILED, failure=failure, pending=ctx.pending)


def stop_outcome(ctx: RunContext, reason: CancelReason, late=None) -> RunOutcome:
    if reason is CancelReason.FENCED:
        return RunOutcome(kind=OutcomeKind.FENCED, late={"calls": late} if late else None)
    if reason is CancelReason.DEADLINE:
        return failed(ctx, FailureReason.DEADLINE_EXCEEDED, "RunDeadlineExceeded", "the run deadline has passed")
    return RunOutcome(kind=OutcomeKind.CANCELLED, pending=ctx.pending)


def _loop(ctx: RunContext) -> RunOutcome:
    run = ctx.run
    reopened = open_batch(ctx)
    if reopened is not None:  # resume re-enters the pipeline for the open batch (it observes the token per call)
        step_number, pending = reopened
        ctx.current_step = step_number
        ctx.tracer.begin_step(step_number, {"step.resumed_batch": True})
        if not ctx.pending.is_empty():  # run.resumed lands before any watermark of the batch
            ctx.store.commit(ctx.pending)
            ctx.pending = UnitOfWork()
        batch = resume_batch(ctx, step_number, pending)
        ctx.pending = batch.work
        if batch.suspension is not None:
            return RunOutcome(kind=OutcomeKind.SUSPENDED, suspension=batch.suspension, pending=ctx.pending)
        if batch.unknown:
            return RunOutcome(
                kind=OutcomeKind.UNKNOWN, pending=ctx.pending, late={"calls": batch.late} if batch.late else None
            )
        if batch.stop is not None:
            return stop_outcome(ctx, batch.stop, batch.late)
        denied = _count_denials(ctx, batch)
        if denied is not None:
            return denied
        checkpoint(ctx, "tool_batch")
        try:
            ctx.store.commit(ctx.pending)
        except WorkerFenced as exc:
            exc.late = {"calls": batch.late} if batch.late else None
            raise
        ctx.pending = UnitOfWork()
    while True:
        if ctx.draining() or ctx.clock.monotonic() - ctx.started_monotonic >= ctx.slice_seconds:
            return RunOutcome(kind=OutcomeKind.YIELDED, pending=ctx.pending)
        ctx.token.raise_if_cancelled()  # observation point 1
        step_number = ctx.state.step + 1
        ctx.current_step, ctx.current_attempt = step_number, None
        ctx.tracer.begin_step(step_number)
        ctx.budgets.check(run.usage, BudgetScope.STEP, step_number=step_number, now=ctx.clock.now())
        turn = _invoke_model(ctx, step_number)
        ctx.tracer.set_step("step.tool_call_count", len(turn.tool_calls))
        ctx.token.raise_if_cancelled()  # observation point 3
        ctx.state.conversation.append(
            {
                "role": "assistant",
                "content": turn.text,
                "tool_calls": [
                    {"id": c.call_id, "name": c.name, "arguments": c.raw_arguments} for c in turn.tool_calls
                ],
            }
        )
        ctx.state.step = step_number
        if not turn.tool_calls:
            return RunOutcome(kind=OutcomeKind.COMPLETED, final_message=turn.text or "", pending=ctx.pending)
        checkpoint(ctx, "model_response")
        work, ctx.pending = ctx.pending, UnitOfWork()
        batch = dispatch(ctx, step_number, turn.tool_calls, work)
        ctx.pending = batch.work
        if batch.suspension is not None:
            return RunOutcome(kind=OutcomeKind.SUSPENDED, suspension=batch.suspension, pending=ctx.pending)
        if batch.unknown:  # an uncertain side effect: the executor hands the decision to Resume's reconcile-or-pause
            return RunOutcome(
                kind=OutcomeKind.UNKNOWN, pending=ctx.pending, late={"calls": batch.late} if batch.late else None
            )
        if batch.stop is not None:
            return stop_outcome(ctx, batch.stop, batch.late)
        denied = _count_denials(ctx, batch)
        if denied is not None:
            return denied
        checkpoint(ctx, "tool_batch")
        _prepare_next_step(ctx, step_number + 1)
        ctx.fault("checkpoint.before_write")
        try:
            ctx.store.commit(ctx.pending)  # commit 2: results, checkpoint, next step's request
        except WorkerFenced as exc:
            exc.late = {"calls": batch.late} if batch.late else None
            raise
        ctx.pending = UnitOfWork()


MAX_DENIED_BATCHES = 3


def _count_denials(ctx: RunContext, batch) -> RunOutcome | None:
    """A run that keeps asking for denied calls fails `repeated_denial`."""
    ctx.state.denials = ctx.state.denials + 1 if batch.all_denied else 0
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
    ctx.pending.checkpoint = row
    ctx.pending.event("run.checkpointed", {"version": row.version, "trigger": trigger, "full": row.full}, at)


def _compacted(ctx: RunContext, info: dict) -> None:
    """A compaction is a write: a full checkpoint the loop adopts, in its own
    transaction, with `context.compacted`."""
    checkpoint(ctx, "compaction", force_full=True)
    ctx.pending.event("context.compacted", info, ctx.clock.now())
    ctx.store.commit(ctx.pending)
    ctx.pending = UnitOfWork()


def _start_model_call(ctx: RunContext, step_number: int, attempt: int) -> None:
    at = ctx.clock.now()
    call_id = ctx.ids.new_id()
    ctx.pending.model_call_inserts.append(
        ModelCallInsert(id=call_id, step_number=step_number, attempt_number=attempt, started_at=at)
    )
    ctx.pending.event(
        "model.request.started", {"step": step_number, "attempt": attempt, "model_call": str(call_id)}, at
    )
    if step_number > ctx.run.step_count:
        ctx.run.step_count = step_number
        ctx.run.usage = ctx.run.usage.model_copy(update={"steps": step_number})
        ctx.pending.step_count = step_number
        ctx.pending.usage = ctx.run.usage.model_dump(mode="json")
    ctx.prepared_id = call_id


def _prepare_next_step(ctx: RunContext, step_number: int) -> None:
    """Write the next step's `started` row in this commit when its pre-checks
    already pass in memory, so a read-only step costs two commits."""
    if ctx.token.reason is not None or ctx.draining():
        return
    if ctx.clock.monotonic() - ctx.started_monotonic >= ctx.slice_seconds:
        return
    try:
        now = ctx.clock.now()
        ctx.budgets.check(ctx.run.usage, BudgetScope.STEP, step_number=step_number, now=now)
        ctx.budgets.check(ctx.run.usage, BudgetScope.ATTEMPT, step_number=step_number, now=now)
    except BudgetExceeded:
        return
    _start_model_call(ctx, step_number, 1)
    ctx.prepared_call = (step_number, 1)


def _finish(
    ctx: RunContext,
    status: str,
    turn: ModelTurn | None,
    prefix: str | None,
    error: dict | None = None,
    stream_had_output: bool = False,
    usage: ModelUsage | None = None,
) -> None:
    spent = turn.usage if turn else usage
    ctx.pending.model_call_finishes.append(
        ModelCallFinish(
            id=ctx.prepared_id,
            status=status,
            usage=spent.model_dump(mode="json") if spent else {},
            stop_reason=str(turn.stop_reason) if turn else None,
            stream_had_output=stream_had_output,
            error=error,
            prefix_sha256=prefix,
            finished_at=ctx.clock.now(),
        )
    )
    ctx.pending.usage = ctx.run.usage.model_dump(mode="json")


def _invoke_model(ctx: RunContext, step_number: int) -> ModelTurn:
    with ctx.tracer.span("model.invoke", {"step.number": step_number}):
        return _attempts(ctx, step_number)


def _attempts(ctx: RunContext, step_number: int) -> ModelTurn:
    run = ctx.run
    attempt = ctx.next_attempt
    ctx.next_attempt = 1
    step_failures = 0
    while True:
        ctx.current_attempt = attempt
        ctx.budgets.check(run.usage, BudgetScope.ATTEMPT, step_number=step_number, now=ctx.clock.now())
        if ctx.prepared_call != (step_number, attempt):
            _start_model_call(ctx, step_number, attempt)
            ctx.store.commit(ctx.pending)
            ctx.pending = UnitOfWork()
        ctx.prepared_call = None
        ctx.fault("model.before_call")
        ctx.token.raise_if_cancelled()  # observation point 2
        request, prefix, synthesis = build_with_pressure(ctx, step_number, attempt, lambda info: _compacted(ctx, info))
        ctx.tracer.set_step("step.attempt_count", attempt)
        ctx.tracer.set_step("context.prefix_sha256", prefix)
        try:
            with ctx.tracer.span("model.attempt", {"attempt.number": attempt, "context.prefix_sha256": prefix}):
                turn = ctx.provider.complete(request, ctx.token)
        except ModelError as exc:
            # Every attempt is charged ("after" means record): a failed attempt's
            # tokens and cost go into the ledger like a completed one's.
            spent = exc.usage or ModelUsage()
            over: BudgetExceeded | None = None
            try:
                run.usage = ctx.budgets.record_model_usage(run.usage, spent)
            except BudgetExceeded as err:
                run.usage, over = err.usage, err
            error = {"error_class": exc.error_class, "transient": exc.retryable, "message": scrub_text(str(exc))[:500]}
            _finish(ctx, "failed", None, prefix, error, exc.stream_had_output, usage=spent)
            ctx.pending.event(
                "model.response.failed",
                {
                    "step": step_number,
                    "attempt": attempt,
                    "error_class": exc.error_class,
                    "transient": exc.retryable,
                    "stream_had_output": exc.stream_had_output,
                    "usage": spent.model_dump(mode="json"),
                },
                ctx.clock.now(),
            )
            if ctx.token.reason is not None:
                raise RunCancelled(ctx.token.reason)
            if over is not None:
                raise over
            step_failures += 1
            if exc.retryable and step_failures < MAX_STEP_FAILURES:
                attempt += 1
                continue
            if exc.retryable:
                raise _ModelFailure(
                    FailureReason.DEPENDENCY_UNAVAILABLE,
                    exc.error_class,
                    "the model failed transiently on every attempt of the step",
                )
            # The adapter's own words (never provider text, a URL or a variable name).
            raise _ModelFailure(
                FailureReason.MODEL_PERMANENT_ERROR,
                exc.error_class,
                f"the model provider refused the request: {scrub_text(str(exc))[:300]}",
            )
        turn = scrub_turn(turn)  # before anything of it is persisted: text, calls, final message, checkpoints
        ctx.fault("model.after_call")
        try:
            run.usage = ctx.budgets.record_model_usage(run.usage, turn.usage)
        except BudgetExceeded as exc:
            run.usage = exc.usage
            _finish(ctx, "completed", turn, prefix)
            raise
        if turn.stop_reason is StopReason.CANCELLED or ctx.token.reason is not None:
            _finish(ctx, "failed", turn, prefix, {"error_class": "Cancelled", "transient": False})
            raise RunCancelled(ctx.token.reason or CancelReason.REQUESTED)
        if synthesis and turn.tool_calls:
            _finish(ctx, "failed", turn, prefix, {"error_class": "SynthesisReserveViolation", "transient": False})
            raise SynthesisReserveViolation(synthesis)
        if turn.is_empty:
            _finish(ctx, "failed", turn, prefix, {"error_class": "EmptyModelTurn", "transient": True})
            ctx.pending.event(
                "model.response.failed",
                {
                    "step": step_number,
                    "attempt": attempt,
                    "error_class": "EmptyModelTurn",
                    "transient": True,
                    "stream_had_output": False,
                },
                ctx.clock.now(),
            )
            step_failures += 1
            if step_failures < MAX_STEP_FAILURES:
                attempt += 1
                continue
            raise EmptyModelTurn()
        _finish(ctx, "completed", turn, prefix)
        ctx.pending.event(
            "model.response.completed",
            {
                "step": step_number,
                "attempt": attempt,
                "text": turn.text,
                "tool_calls": [
                    {"id": c.call_id, "name": c.name, "arguments": c.raw_arguments} for c in turn.tool_calls
                ],
                "stop_reason": str(turn.stop_reason),
                "usage": turn.usage.model_dump(mode="json"),
                "tool_call_count_before_turn": run.usage.tool_calls,
            },
            ctx.clock.now(),
        )
        return turn


__all__ = ["run_loop", "checkpoint", "failed", "stop_outcome"]
