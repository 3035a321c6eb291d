"""Steps 9–14: the authorized calls run in order — a side effect's watermark committed first (with the
results the batch's earlier calls left), the call, its classification — and their results recorded."""

from __future__ import annotations

from typing import Any

from runs.domain import events
from runs.domain.context import RunContext
from runs.domain.errors import InputRequired, PolicyChanged, ToolFailure, WorkerFenced
from runs.domain.events import EventType
from runs.domain.pipeline.batch import (
    RERUN_KINDS,
    UNKNOWN_OUTCOME,
    BatchResult,
    RerunConflict,
    _all_denied,
    _append_results,
    _call_fingerprint,
    _Entry,
    _error_codes,
    _error_result,
    _fail,
    _Planned,
    _record_not_run,
    _unknown_status,
)
from runs.domain.pipeline.context import ToolExecutionContext
from runs.domain.pipeline.control import _ask_user, _delegate
from runs.domain.ports import SentCommit
from runs.domain.records import ApprovalDecision
from runs.domain.scrub import bound, scrub_text
from runs.domain.values import (
    CancelReason,
    InvocationOutcome,
    InvocationStatus,
    Suspension,
    SuspensionKind,
    ToolSpec,
)
from runs.domain.writes import InvocationUpdate, UnitOfWork


def _run_batch(ctx: RunContext, step_number: int, entries: list[_Entry], decisions: UnitOfWork) -> BatchResult:
    """Commit 1 (`decisions`), then steps 9–14 for the authorized calls, in
    order; an `ask_user` call is not run but suspends the run once the others
    ran. When every call to run is read-only they run while commit 1 is in
    flight (running one again is harmless, so it needs nothing
    durable first); nothing is written, watermarked or decided after them
    until commit 1 is acknowledged, and if it is fenced their results are
    dropped with it."""
    results = UnitOfWork()
    late: list[dict[str, Any]] = []
    to_run = [_Planned(e) for e in entries if e.authorized and not e.asks_user and not e.delegates]
    question_entry = next((e for e in entries if e.authorized and e.asks_user), None)
    delegated = [e for e in entries if e.authorized and e.delegates]
    sent: SentCommit | None = None
    if to_run and all(_runs_apart(p.entry.tool) for p in to_run):
        sent = ctx.store.send(decisions)  # commit 1, in flight while the read-only calls run
        try:
            stop = _run_in_order(ctx, step_number, to_run, results, late, count_calls=True)
        except BaseException:
            sent.wait()
            raise
    else:
        ctx.store.commit(decisions)  # commit 1: the model response and every decision
        stop = _run_in_order(ctx, step_number, to_run, results, late, count_calls=True)
    unknown = [e.invocation_id for e in entries if e.unknown]
    if sent is not None and (unknown or question_entry is not None or delegated or any(e.asking for e in entries)):
        sent.wait()
        sent = None
    if unknown:
        # The model sees no result for an unknown outcome; the
        # reconciler or an operator decides first (the executor hands over).
        # A cancel or a deadline does not close the question: the run ends
        # once it is decided (the rest of the batch is already cancelled).
        return BatchResult(work=results, late=late, unknown=unknown)
    asked = _tool_asks(entries, results, late, stop)
    if asked is not None:
        return asked
    if question_entry is not None and stop is None:
        return _ask_user(ctx, entries, question_entry, results, late)
    if delegated:
        if stop is None:
            return _delegate(ctx, entries, delegated, results, late, count_calls=True)
        for entry in delegated:
            _cancel(ctx, results, entry, stop)
    _append_results(ctx, entries)
    return BatchResult(
        work=results,
        stop=stop,
        late=late,
        all_denied=_all_denied(entries),
        error_codes=_error_codes(entries),
        sent=sent,
    )


def _runs_apart(spec: ToolSpec) -> bool:
    """A read-only tool that runs on a thread of its own (it has a timeout):
    it may run while commit 1 is in flight on this thread's connection. One
    without a timeout runs on this thread and may use its connection."""
    return spec.read_only and spec.timeout_seconds > 0


def _run_in_order(
    ctx: RunContext,
    step_number: int,
    planned: list[_Planned],
    results: UnitOfWork,
    late: list[dict[str, Any]],
    *,
    count_calls: bool,
) -> CancelReason | None:
    """Run each call in turn; after a cancellation the rest are cancelled,
    and an uncertain side effect leaves the rest waiting, still authorized,
    for the decision. Count the calls that ran into the run's usage; return
    the cancel reason seen."""
    executed = 0
    stop: CancelReason | None = None
    for plan in planned:
        entry = plan.entry
        if stop is not None:
            _cancel(ctx, results, entry, stop, effect_sent=plan.effect_sent)
            continue
        try:
            ran, stop = _run_one(
                ctx,
                entry,
                step_number,
                plan.attempt,
                results,
                late,
                effect_sent=plan.effect_sent,
                prior_attempts=plan.prior_attempts,
                approved=plan.approved,
            )
        except PolicyChanged as exc:  # an approved call the policy in force now denies: nothing was sent
            _policy_now_denies(ctx, results, plan, exc.decision)
            continue
        if ran:
            executed += 1
            if count_calls:
                ctx.state.count_call(_call_fingerprint(entry.call.name, entry.arguments))
        if (entry.unknown or entry.asking is not None) and stop is None:
            break  # the rest of the batch waits, still authorized, for the decision (or the user's answer)
    if executed:
        progress = ctx.progress
        progress.usage = progress.usage.model_copy(update={"tool_calls": progress.usage.tool_calls + executed})
        results.usage = progress.usage.model_dump(mode="json")
    return stop


def _run_one(
    ctx: RunContext,
    entry: _Entry,
    step_number: int,
    attempt: int,
    results: UnitOfWork,
    late: list[dict[str, Any]],
    *,
    effect_sent: bool = False,
    prior_attempts: list[dict[str, Any]] | None = None,
    approved: ApprovalDecision | None = None,
) -> tuple[bool, CancelReason | None]:
    """Steps 7 and 9–14 for one authorized call: the cancellation check, the
    watermark in its fenced transaction (side effects only; with the results
    the batch's earlier calls left in `results`, and for an `approved` call
    the policy judged again in it), the self-fence, the call, and its result
    into `results`. Return whether the call ran and the cancel reason seen
    (before it: clean stop; after it: the result is kept). Raises
    `PolicyChanged` when the policy in force denies an approved call."""
    spec = entry.tool
    if not spec.read_only:
        ctx.fault("tool.before_watermark")
    if ctx.token.reason is not None:  # observation point 4
        _cancel(ctx, results, entry, ctx.token.reason, effect_sent=effect_sent)
        return False, ctx.token.reason
    if approved is not None and spec.read_only:  # a side effect's is judged in its watermark's transaction
        _judge_again(ctx.policy.evaluate(entry.tool.name, entry.arguments))
    if not spec.read_only:
        _watermark(ctx, entry, attempt, late, results, approved)
    _execute(ctx, entry, step_number, attempt, prior_attempts)
    if not spec.read_only:
        ctx.fault("tool.after_execute")
    if entry.asking is not None:  # the tool asked the user first: nothing took effect
        _record_question(ctx, entry, attempt, results, prior_attempts)
        return True, ctx.token.reason
    if not spec.read_only:
        late.append(
            {
                "invocation": str(entry.invocation_id),
                "tool": spec.name,
                "is_error": entry.is_error,
                "result": entry.result,
                "outcome": entry.outcome,
            }
        )
    _record_outcome(ctx, entry, attempt, results, prior_attempts)
    return True, ctx.token.reason  # observation point 5: the call has finished; its result is kept


def _judge_again(decision: str) -> None:
    """An approval holds only while the policy in force does not deny its
    call (a decision changed since the approval is a denial the
    model sees); a `require_approval` is the approval itself."""
    if decision not in ("allow", "require_approval"):
        raise PolicyChanged(decision)


def _policy_now_denies(ctx: RunContext, results: UnitOfWork, plan: _Planned, decision: str) -> None:
    """An approved call the policy in force denies (the tenant's floor was
    tightened since the approval): nothing is sent, the approval is
    invalidated with the reason, and the model sees `denied_by_policy`. For
    a re-run grant the first attempt's outcome stays unknown and the run
    fails `reconcile_conflict`, as when the re-check before it found the
    same (`_recheck_grant`)."""
    entry, approval = plan.entry, plan.approved
    if entry.invocation_id is None or approval is None:
        raise RuntimeError("only an approved call with a row is judged again")
    now = ctx.clock.now()
    if approval.kind in RERUN_KINDS:
        unknown = UnitOfWork(invocation_updates=list(results.invocation_updates), events=list(results.events))
        unknown.invocation_updates.append(
            InvocationUpdate(id=entry.invocation_id, status=_unknown_status(approval.kind), updated_at=now)
        )
        raise RerunConflict(
            "policy now denies the approved re-run; the first attempt's outcome stays unknown",
            error_class="PolicyDenied",
            work=unknown,
            invocation=str(entry.invocation_id),
        )
    _fail(
        entry,
        "denied_by_policy",
        f"the policy in force now says {decision!r} for this call (it changed since the approval); it was not run",
    )
    results.event(
        EventType.APPROVAL_INVALIDATED,
        {
            "approval": str(approval.id),
            "invocation": str(entry.invocation_id),
            "reason": f"the policy in force when the call was to run says {decision!r}; nothing was sent",
        },
        now,
    )
    results.approval_invalidations.append(approval.id)
    _record_not_run(results, entry, now)


def _watermark(
    ctx: RunContext,
    entry: _Entry,
    attempt: int,
    late: list[dict[str, Any]],
    results: UnitOfWork,
    approved: ApprovalDecision | None = None,
) -> None:
    """Step 9 for a side effect: the self-fence, the watermark (`effect_sent_at`,
    `tool.call.started`) committed in its fenced transaction, and the
    self-fence again right before the call. What the batch's earlier calls
    recorded goes into that same transaction (moved out of `results`): a
    known result is durable before the next call is sent, at no extra
    commit. An `approved` call's policy is judged again on the floor read
    in that transaction (`PolicyChanged`: nothing written)."""
    if entry.invocation_id is None:
        raise RuntimeError("a call that runs has an invocation row")
    if not ctx.lease.may_start_effect():  # a stale worker writes no watermark for a call it will not make
        raise WorkerFenced("self-fence before the watermark", late={"calls": late} if late else None)
    earlier = UnitOfWork(invocation_updates=results.invocation_updates, events=results.events)
    check = None
    if approved is not None:
        name, arguments = entry.tool.name, entry.arguments

        def check(floor: dict[str, Any]) -> str:
            return ctx.policy.evaluate_under(name, arguments, floor)

    try:
        ctx.store.mark_effect_sent(
            entry.invocation_id,
            attempt,
            {
                "invocation": str(entry.invocation_id),
                "call_id": entry.call.call_id,
                "tool": entry.tool.name,
                "attempt": attempt,
                "idempotency_key": entry.key,
            },
            ctx.clock.now(),
            before=earlier if not earlier.is_empty() else None,
            policy_check=check,
        )
    except WorkerFenced as exc:
        exc.late = {"calls": late} if late else None
        raise
    results.invocation_updates, results.events = [], []  # committed with the watermark
    ctx.fault("tool.after_watermark")
    if not ctx.lease.may_start_effect():
        raise WorkerFenced(
            "self-fence: no successful heartbeat within lease - interval", late={"calls": late} if late else None
        )


def _record_outcome(
    ctx: RunContext,
    entry: _Entry,
    attempt: int,
    results: UnitOfWork,
    prior_attempts: list[dict[str, Any]] | None,
) -> None:
    """Steps 12–14: the call's row (with its per-attempt history) and its
    event into `results`. An uncertain side effect is recorded, not answered."""
    if entry.invocation_id is None:
        raise RuntimeError("a call that ran has an invocation row")
    spec = entry.tool
    at = ctx.clock.now()
    history = _attempt_history(prior_attempts, attempt, read_only=spec.read_only)
    history.append(
        {
            "attempt": attempt,
            "outcome": entry.outcome,
            "at": at.isoformat(),
            **({"error": entry.result} if entry.is_error else {}),
            **({"remote": entry.remote} if entry.remote is not None else {}),
        }
    )
    payload = {
        "invocation": str(entry.invocation_id),
        "call_id": entry.call.call_id,
        "tool": spec.name,
        "result": entry.result,
        "executed": True,
        "attempt": attempt,
        "outcome": entry.outcome,
    }
    if entry.outcome == "uncertain" and not spec.read_only:
        # An unknown outcome: recorded, not answered. The row
        # keeps no result, so the model is not told anything until the
        # reconciler or an operator decides; `error` says what happened.
        entry.unknown = True
        results.invocation_updates.append(
            InvocationUpdate(
                id=entry.invocation_id,
                status=InvocationStatus.UNCERTAIN,
                error=entry.result,
                attempt=attempt,
                outcome=InvocationOutcome.UNCERTAIN,
                attempts=history,
                updated_at=at,
            )
        )
        results.event(
            EventType.TOOL_CALL_FAILED,
            {**payload, "result": None, "error": entry.result, "awaiting_decision": True},
            at,
        )
        return
    results.invocation_updates.append(
        InvocationUpdate(
            id=entry.invocation_id,
            status=InvocationStatus.FAILED if entry.is_error else InvocationStatus.COMPLETED,
            result=entry.result,
            error=entry.result if entry.is_error else None,
            clear_error=not entry.is_error,
            attempt=attempt,
            outcome=entry.outcome,
            attempts=history,
            updated_at=at,
        )
    )
    entry.event = results.event(
        EventType.TOOL_CALL_FAILED if entry.is_error else EventType.TOOL_CALL_COMPLETED, payload, at
    )


def _attempt_history(prior: list[dict[str, Any]] | None, attempt: int, *, read_only: bool) -> list[dict[str, Any]]:
    """The per-attempt record before attempt `attempt` is added: what the row
    had, plus an `uncertain` entry for each earlier side-effect attempt whose
    watermark was set and whose outcome nobody recorded (a process died)."""
    history = [dict(a) for a in (prior or []) if isinstance(a, dict)]
    if not read_only:
        seen = {a.get("attempt") for a in history}
        for earlier in range(1, attempt):
            if earlier not in seen:
                history.append({"attempt": earlier, "outcome": InvocationOutcome.UNCERTAIN, "error": UNKNOWN_OUTCOME})
        history.sort(key=lambda a: a.get("attempt") or 0)
    return history


def _cancel(
    ctx: RunContext, work: UnitOfWork, entry: _Entry, reason: CancelReason, *, effect_sent: bool = False
) -> None:
    """Cancel a call that has not run (now). A call whose earlier attempt set
    a watermark keeps its record: `interrupted`, outcome unknown — never a
    cancelled call with an effect that may have happened (I6) — and is an
    unknown outcome the batch hands over for a decision (`entry.unknown`).
    A cancelled call keeps its result, so a batch re-entered after such a
    decision reads it as answered."""
    at = ctx.clock.now()
    entry.is_error = True
    if entry.invocation_id is None:
        raise RuntimeError("a call that is cancelled has an invocation row")
    if effect_sent:
        entry.result = _error_result("interrupted", "an earlier attempt of this call started; its outcome is unknown")
        entry.unknown = True
        work.invocation_updates.append(
            InvocationUpdate(
                id=entry.invocation_id, status=InvocationStatus.INTERRUPTED, error=UNKNOWN_OUTCOME, updated_at=at
            )
        )
    else:
        entry.result = _error_result("cancelled", "the run was cancelled before this call ran")
        work.invocation_updates.append(
            InvocationUpdate(
                id=entry.invocation_id, status=InvocationStatus.CANCELLED, result=entry.result, updated_at=at
            )
        )
    work.events.append(
        events.call_cancelled(
            invocation_id=entry.invocation_id,
            call_id=entry.call.call_id,
            tool=entry.call.name,
            reason=str(reason),
            at=at,
            outcome_unknown=effect_sent,
        )
    )


def _execute(
    ctx: RunContext,
    entry: _Entry,
    step_number: int,
    attempt: int = 1,
    prior_attempts: list[dict[str, Any]] | None = None,
) -> None:
    """Steps 10–12: execute, classify, bound and scrub.

    Classification (step 11): a value is `succeeded`; a `ToolFailure` is
    `failed` (the call definitely did not take effect: refused before
    sending, connection refused, an answer that says so, bad arguments)
    unless it says `uncertain` (`OutcomeUnknown`: sent and unanswered, timed
    out, cancelled while running); a failure after the run's cancellation
    reached the running tool is `uncertain` too. Any other exception is `failed` for a read-only tool
    and `uncertain` for one with a side effect: nobody can tell whether the
    bug struck before or after the effect. An `InputRequired` is no outcome:
    the call waits for the user's answer (`entry.asking`)."""
    spec = entry.tool
    notes = _Notes(ctx, entry, attempt, prior_attempts)
    tctx = ToolExecutionContext(
        run_id=ctx.run.id,
        step_number=step_number,
        call_id=entry.call.call_id,
        invocation_id=entry.invocation_id,
        idempotency_key=entry.key,
        attempt=attempt,
        timeout_seconds=spec.timeout_seconds,
        token=ctx.token,
        deadline=ctx.run.deadline_at,
        principal=ctx.run.principal,
        clock=ctx.clock,
        record=None if spec.read_only else notes.record,
        report=notes.report,
        continued=_continued(prior_attempts, attempt),
    )
    cancelled_before = tctx.cancelled.is_set()
    try:
        value = ctx.tools.execute(spec.name, entry.arguments, tctx)
        entry.result, truncated = bound(value)
        entry.outcome = InvocationOutcome.SUCCEEDED
    except InputRequired as exc:
        entry.asking = exc
        entry.remote = exc.handle
    except WorkerFenced:
        raise  # recording a handle found the lease gone: the takeover decides the call
    except ToolFailure as exc:
        # A failure that follows a cancellation reaching the running tool is
        # not a definite answer (observed as unknown).
        uncertain = bool(exc.uncertain) or (not cancelled_before and tctx.cancelled.is_set())
        entry.result = {"error": exc.code, "message": scrub_text(str(exc))[:2000], "uncertain": uncertain}
        entry.is_error = True
        entry.outcome = InvocationOutcome.UNCERTAIN if uncertain else InvocationOutcome.FAILED
    except Exception as exc:  # a tool bug is a failed result, never a worker crash
        uncertain = not spec.read_only or (not cancelled_before and tctx.cancelled.is_set())
        entry.result = {
            "error": "tool_error",
            "message": f"the tool raised {type(exc).__name__}",
            "uncertain": uncertain,
        }
        entry.is_error = True
        entry.outcome = InvocationOutcome.UNCERTAIN if uncertain else InvocationOutcome.FAILED


class _Notes:
    """What a running call may write before it ends, each in its own short fenced transaction on this
    thread's store: the handle of a long operation (`record`: the call's attempt history gets an entry
    `{"attempt", "outcome": "pending", "remote": handle}`, committed before `record` returns, so a
    takeover finds it), and `tool.call.progress` events (`report`; a fenced one sets the token)."""

    def __init__(self, ctx: RunContext, entry: _Entry, attempt: int, prior: list[dict[str, Any]] | None):
        self.ctx, self.entry, self.attempt, self.prior = ctx, entry, attempt, prior

    def record(self, handle: dict[str, Any]) -> None:
        entry, ctx = self.entry, self.ctx
        if entry.invocation_id is None:
            raise RuntimeError("a call that runs has an invocation row")
        at = ctx.clock.now()
        history = _attempt_history(self.prior, self.attempt, read_only=entry.tool.read_only)
        history.append({"attempt": self.attempt, "outcome": "pending", "at": at.isoformat(), "remote": handle})
        work = UnitOfWork()
        work.invocation_updates.append(
            InvocationUpdate(id=entry.invocation_id, status=InvocationStatus.EXECUTING, attempts=history, updated_at=at)
        )
        work.event(EventType.TOOL_CALL_PROGRESS, {**self._about(), "remote": handle}, at)
        ctx.store.commit(work)  # WorkerFenced: nothing recorded, the caller must not go on as if it were
        entry.remote = handle
        ctx.fault("tool.after_remote_recorded")

    def _about(self) -> dict[str, Any]:
        entry = self.entry
        return {
            "invocation": str(entry.invocation_id),
            "call_id": entry.call.call_id,
            "tool": entry.tool.name,
            "attempt": self.attempt,
        }

    def report(self, payload: dict[str, Any]) -> None:
        ctx = self.ctx
        shown = {k: payload[k] for k in ("progress", "total", "message") if payload.get(k) is not None}
        work = UnitOfWork()
        work.event(EventType.TOOL_CALL_PROGRESS, {**self._about(), **shown}, ctx.clock.now())
        try:
            ctx.store.commit(work)
        except WorkerFenced:
            ctx.token.cancel(CancelReason.FENCED)


def _continued(prior: list[dict[str, Any]] | None, attempt: int) -> dict[str, Any] | None:
    """The previous attempt's question, answered (`{"remote", "answer"}`), when this attempt issues the
    call again with the user's answer."""
    for item in prior or []:
        if (
            isinstance(item, dict)
            and item.get("attempt") == attempt - 1
            and item.get("outcome") == "input_required"
            and "answer" in item
        ):
            return {"remote": item.get("remote"), "answer": item["answer"]}
    return None


def _record_question(
    ctx: RunContext, entry: _Entry, attempt: int, results: UnitOfWork, prior: list[dict[str, Any]] | None
) -> None:
    """A call whose tool asked the user first: it waits (`awaiting_approval`, `tool_input`) with the
    question's handle in this attempt's entry of its history; the answer lets it run again."""
    if entry.invocation_id is None:
        raise RuntimeError("a call that ran has an invocation row")
    at = ctx.clock.now()
    history = _attempt_history(prior, attempt, read_only=entry.tool.read_only)
    history.append(
        {"attempt": attempt, "outcome": "input_required", "at": at.isoformat(), "remote": entry.asking.handle}
    )
    results.invocation_updates.append(
        InvocationUpdate(
            id=entry.invocation_id,
            status=InvocationStatus.AWAITING_APPROVAL,
            suspended_kind=TOOL_INPUT,
            attempt=attempt,
            attempts=history,
            updated_at=at,
        )
    )


TOOL_INPUT = "tool_input"  # `suspended_kind` of a call waiting for the user's answer to its tool's question


def _tool_asks(
    entries: list[_Entry], results: UnitOfWork, late: list[dict[str, Any]], stop: CancelReason | None
) -> BatchResult | None:
    """The batch's call whose tool asked the user (at most one: the rest waited): the run waits for
    the user, the question shown. None when no tool asked, or the run is stopping (the call stays
    unanswered and took no effect)."""
    asking = next((e for e in entries if e.asking is not None), None)
    if asking is None or stop is not None or asking.invocation_id is None:
        return None
    return BatchResult(
        work=results,
        late=late,
        suspension=Suspension(
            kind=SuspensionKind.USER,
            invocation_ids=[asking.invocation_id],
            question=asking.asking.question[:4000],
            details={
                "tool_input": {
                    "invocation": str(asking.invocation_id),
                    "tool": asking.tool.name,
                    **asking.asking.details,
                }
            },
        ),
    )
