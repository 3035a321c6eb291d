"""Re-entering an open batch (after a takeover or a decision): each recorded call answered from its
record, run again under its approval (judged again), or asked about again; never run twice."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from runs.domain import events
from runs.domain.context import RunContext
from runs.domain.events import EventType
from runs.domain.pipeline.batch import (
    ANSWERED,
    RERUN_KINDS,
    BatchResult,
    RerunConflict,
    UnknownOutcome,
    _all_denied,
    _append_results,
    _approval_requested,
    _approval_suspension,
    _Entry,
    _error_codes,
    _error_result,
    _fail,
    _not_allowed,
    _Planned,
    _record_not_run,
    _time_refusal,
    _unknown_status,
)
from runs.domain.pipeline.control import _delegate
from runs.domain.pipeline.decide import _delegate_refusal
from runs.domain.pipeline.execute import _cancel, _run_in_order, _tool_asks
from runs.domain.records import ApprovalDecision, InvocationRecord
from runs.domain.values import (
    ApprovalStatus,
    InvocationStatus,
    ToolCallRequest,
)
from runs.domain.writes import InvocationUpdate, UnitOfWork


def _exempt_from_time_reserve(ctx: RunContext, row: InvocationRecord) -> bool:
    """A waiting call whose approval was resolved before the deadline runs,
    is denied or expires as decided, whatever the reserve (ADR-0209)."""
    decision = ctx.approvals.decision_for(row.id) if ctx.approvals is not None else None
    if decision is None or decision.status != ApprovalStatus.APPROVED or decision.decided_at is None:
        return False
    return ctx.run.deadline_at is None or decision.decided_at < ctx.run.deadline_at


def _recheck_grant(
    ctx: RunContext, step_number: int, entry: _Entry, row: InvocationRecord, decision: ApprovalDecision
) -> bool:
    """A re-run grant: before the approved call runs again, the
    tool must still be registered, the recorded arguments must pass its
    schema (else `RerunConflict`), the request hash recomputed from the
    current spec must equal the approved one (else False: invalidate and ask
    again), and policy is evaluated again — a deny is a `RerunConflict`; a
    require_approval is satisfied by the grant itself."""
    now = ctx.clock.now()
    unknown = UnitOfWork()  # the grant is not used: the call stays as it was, its outcome unknown
    unknown.invocation_updates.append(
        InvocationUpdate(id=row.id, status=_unknown_status(decision.kind), updated_at=now)
    )
    if entry.spec is None:
        raise RerunConflict(
            f"tool {row.tool_name!r} is no longer registered; the approved re-run cannot run",
            work=unknown,
            invocation=str(row.id),
        )
    if not ctx.agent.tool_allowed(row.tool_name):
        raise RerunConflict(
            f"tool {row.tool_name!r} is no longer allowed for this tenant; the approved re-run cannot run",
            error_class="ToolNotAllowed",
            work=unknown,
            invocation=str(row.id),
        )
    if not isinstance(entry.arguments, dict) or ctx.tools.validate(row.tool_name, entry.arguments):
        work = UnitOfWork()
        failed = _error_result("invalid_decision", "the arguments no longer pass the tool's schema")
        work.invocation_updates.append(
            InvocationUpdate(id=row.id, status=InvocationStatus.FAILED, result=failed, error=failed, updated_at=now)
        )
        work.events.append(
            events.call_not_run(invocation_id=row.id, call_id=row.call_id, tool=row.tool_name, result=failed, at=now)
        )
        raise RerunConflict(
            "the approved call's arguments no longer pass its schema", work=work, invocation=str(row.id)
        )
    if not _as_approved(ctx, step_number, entry, row, decision):
        return False
    try:
        verdict = ctx.policy.evaluate(row.tool_name, entry.arguments)
    except Exception:  # fails closed to require_approval, which the grant is
        verdict = "require_approval"
    if verdict == "deny":
        raise RerunConflict(
            "policy now denies the approved re-run; the first attempt's outcome stays unknown",
            error_class="PolicyDenied",
            work=unknown,
            invocation=str(row.id),
        )
    return True


def _as_approved(
    ctx: RunContext, step_number: int, entry: _Entry, row: InvocationRecord, decision: ApprovalDecision
) -> bool:
    """The request hash of the call as it would be shown now equals the approved one."""
    if ctx.approvals is None or entry.spec is None:
        return False
    current = ctx.approvals.current_hash(
        step_number=step_number,
        invocation_id=row.id,
        tool=entry.spec,
        arguments=entry.arguments,
        kind=decision.kind,
        presentation=decision.presentation,
    )
    return current == decision.request_hash


def open_batch(ctx: RunContext) -> tuple[int, list[dict[str, Any]]] | None:
    """The last model turn's calls that the conversation has no answer for."""
    conv = ctx.state.conversation
    for i in range(len(conv) - 1, -1, -1):
        msg = conv[i]
        if msg.get("role") == "assistant":
            calls = msg.get("tool_calls") or []
            answered = {m.get("tool_call_id") for m in conv[i + 1 :] if m.get("role") == "tool"}
            pending = [c for c in calls if c.get("id") not in answered]
            return (ctx.state.step, pending) if pending else None
    return None


def resume_batch(ctx: RunContext, step_number: int, pending: list[dict[str, Any]]) -> BatchResult:
    """Re-enter the pipeline at step 6 for an open batch, after a takeover or
    a decision.

    Answered rows give their recorded result (no second `tool.call.proposed`,
    no second effect). An approved call is revalidated (tool registered,
    arguments valid, the hash of what was shown unchanged) — otherwise
    `approval.invalidated` and a new approval, and nothing of the batch runs.
    An `authorized` call runs once — a side effect under a new watermark with
    its attempt incremented. An interrupted side effect with no recorded
    outcome never runs here."""
    rows = {r.call_id: r for r in ctx.store.invocations_for_step(step_number)}
    results = UnitOfWork()
    entries: list[_Entry] = []
    to_run: list[_Planned] = []
    delegated: list[_Entry] = []
    invalidated: list[tuple[_Entry, ApprovalDecision]] = []
    now = ctx.clock.now()
    for index, call in enumerate(pending):
        row = rows.get(call["id"])
        entry = _reentry(index, call, row)
        entries.append(entry)
        if row is None:
            _fail(entry, "interrupted", "the process stopped before this call was recorded; it was not run")
            continue
        verdict, decision = _triage(ctx, step_number, entry, row, results, now)
        if verdict == "invalidated" and decision is not None:
            invalidated.append((entry, decision))
        elif verdict == "delegate":
            delegated.append(entry)
        elif verdict == "run" and ctx.budgets.in_time_reserve(now) and not _exempt_from_time_reserve(ctx, row):
            _time_refusal(entry)  # recovery rechecks the clock before resuming a saved batch
            results.invocation_updates.append(
                InvocationUpdate(
                    id=row.id, status=InvocationStatus.FAILED, result=entry.result, error=entry.result, updated_at=now
                )
            )
            results.events.append(
                events.call_not_run(
                    invocation_id=row.id, call_id=entry.call.call_id, tool=entry.call.name, result=entry.result, at=now
                )
            )
        elif verdict == "run":
            to_run.append(
                _Planned(
                    entry,
                    attempt=(row.attempt or 0) + 1,
                    effect_sent=row.effect_sent_at is not None,
                    prior_attempts=row.attempts,
                    approved=decision,
                )
            )

    if invalidated:
        return _ask_again(ctx, step_number, invalidated, results, now)
    late: list[dict[str, Any]] = []
    stop = _run_in_order(ctx, step_number, to_run, results, late, count_calls=False)
    unknown = [p.entry.invocation_id for p in to_run if p.entry.unknown]
    if unknown:  # decided first, even when the run is ending (`_run_batch`)
        return BatchResult(work=results, late=late, unknown=unknown)
    asked = _tool_asks(entries, results, late, stop)  # a call issued again whose tool asks again
    if asked is not None:
        return asked
    if delegated:  # approved, or their suspension was never committed (the worker died first)
        if stop is None:
            return _delegate(ctx, entries, delegated, results, late, count_calls=False)
        for entry in delegated:
            _cancel(ctx, results, entry, stop)
    _append_results(ctx, entries)
    return BatchResult(
        work=results, stop=stop, late=late, all_denied=_all_denied(entries), error_codes=_error_codes(entries)
    )


def _reentry(index: int, call: dict[str, Any], row: InvocationRecord | None) -> _Entry:
    """An entry for a call of the open batch, bound to its row when it has one."""
    req = ToolCallRequest(call_id=call["id"], name=call["name"], raw_arguments=call.get("arguments") or "")
    return _Entry(index=index, call=req, invocation_id=row.id if row else None, key=row.idempotency_key if row else "")


def _triage(
    ctx: RunContext, step_number: int, entry: _Entry, row: InvocationRecord, results: UnitOfWork, now: datetime
) -> tuple[Literal["answered", "invalidated", "run", "delegate"], ApprovalDecision | None]:
    """What to do with one recorded call of the open batch: its recorded
    answer, an approval that no longer holds (invalidated, with the decision),
    or run it (with the approval it runs under, if any: the policy in force
    is judged again as it runs). Raises `UnknownOutcome` for a call nobody
    has decided yet."""
    status = row.status
    approved: ApprovalDecision | None = None
    if status in ANSWERED and row.result is not None:
        entry.result = row.result
        entry.is_error = status != InvocationStatus.COMPLETED
        return "answered", None
    entry.spec = ctx.tools.spec(row.tool_name)
    entry.arguments = row.arguments
    if status == InvocationStatus.AWAITING_APPROVAL and row.suspended_kind == "policy" and ctx.approvals is not None:
        decision = ctx.approvals.decision_for(row.id)
        if decision is None or decision.status != ApprovalStatus.APPROVED:
            raise UnknownOutcome(f"invocation {row.id} is waiting for a decision")
        gone = ctx.tools.unavailable(row.tool_name) if entry.spec is None else None
        if gone is not None:  # the tool is no longer what was approved (an MCP tool changed since its pin)
            _not_as_approved(results, entry, decision, gone, now)
            return "answered", None
        valid = entry.spec is not None and not ctx.tools.validate(row.tool_name, entry.arguments)
        if not (valid and _as_approved(ctx, step_number, entry, row, decision)):
            return "invalidated", decision
        status, approved = InvocationStatus.AUTHORIZED, decision
    elif status == InvocationStatus.AUTHORIZED and row.effect_sent_at is not None and ctx.approvals is not None:
        # A re-run grant (an earlier attempt started): re-check what was approved.
        decision = ctx.approvals.decision_for(row.id)
        if decision is not None and decision.kind in RERUN_KINDS and decision.status == ApprovalStatus.APPROVED:
            if not _recheck_grant(ctx, step_number, entry, row, decision):
                return "invalidated", decision
            approved = decision
    if status != InvocationStatus.AUTHORIZED:
        raise UnknownOutcome(f"invocation {row.id} is {status} with no recorded outcome")
    if entry.spec is None or ctx.tools.validate(row.tool_name, entry.arguments):
        _fail(entry, "invalid_decision", "the tool or its schema changed; the call was not run")
        results.invocation_updates.append(
            InvocationUpdate(
                id=row.id, status=InvocationStatus.FAILED, result=entry.result, error=entry.result, updated_at=now
            )
        )
        results.events.append(
            events.call_not_run(
                invocation_id=row.id, call_id=entry.call.call_id, tool=entry.call.name, result=entry.result, at=now
            )
        )
        return "answered", None
    if not ctx.agent.tool_allowed(row.tool_name):  # the tenant's allow-list narrowed while the call waited
        _fail(entry, *_not_allowed(row.tool_name))
        _record_not_run(results, entry, now)
        return "answered", None
    if entry.spec.control == "delegate":
        refusal = _delegate_refusal(ctx, entry)
        if refusal is not None:
            _fail(entry, *refusal)
            _record_not_run(results, entry, now)
            return "answered", None
        entry.authorized = entry.delegates = True
        return "delegate", None
    return "run", approved


def _not_as_approved(
    results: UnitOfWork, entry: _Entry, decision: ApprovalDecision, why: tuple[str, str], now: datetime
) -> None:
    """An approved call whose tool can no longer run as approved (`ToolRegistry.unavailable`): the approval is
    invalidated with the reason, nothing is sent, and the model sees the failure (`tool_changed`)."""
    results.event(
        EventType.APPROVAL_INVALIDATED,
        {"approval": str(decision.id), "invocation": str(entry.invocation_id), "reason": why[1]},
        now,
    )
    results.approval_invalidations.append(decision.id)
    _fail(entry, *why)
    _record_not_run(results, entry, now)


def _ask_again(
    ctx: RunContext,
    step_number: int,
    invalidated: list[tuple[_Entry, ApprovalDecision]],
    results: UnitOfWork,
    now: datetime,
) -> BatchResult:
    """Approvals that no longer hold: each is invalidated and asked again (a
    re-run grant as its own kind, showing the current spec); nothing of the
    batch runs."""
    for entry, decision in invalidated:
        results.event(
            EventType.APPROVAL_INVALIDATED,
            {
                "approval": str(decision.id),
                "invocation": str(entry.invocation_id),
                "reason": "the tool, its schema or the arguments changed since approval",
            },
            now,
        )
        results.approval_invalidations.append(decision.id)
        if (
            entry.spec is None
            or entry.invocation_id is None
            or ctx.approvals is None
            or ctx.tools.validate(entry.call.name, entry.arguments)
        ):
            raise UnknownOutcome("an approved call can no longer run and cannot be asked again")
        kind = decision.kind
        if kind in RERUN_KINDS:  # a new approval of the same kind, showing the current spec
            approval = ctx.approvals.request_again(
                step_number=step_number,
                invocation_id=entry.invocation_id,
                tool=entry.spec,
                arguments=entry.arguments,
                previous=decision,
                at=now,
            )
            results.invocation_updates.append(
                InvocationUpdate(
                    id=entry.invocation_id, status=_unknown_status(kind), suspended_kind=kind, updated_at=now
                )
            )
        else:
            approval = ctx.approvals.request(
                step_number=step_number,
                invocation_id=entry.invocation_id,
                tool=entry.spec,
                arguments=entry.arguments,
                kind="policy",
                at=now,
            )
        results.approval_inserts.append(approval)
        results.events.append(
            _approval_requested(approval, entry.invocation_id, kind, entry.spec.name, step_number, now)
        )
    return BatchResult(
        work=results,
        suspension=_approval_suspension([e for e, _ in invalidated], results, reason="invalidated"),
    )
