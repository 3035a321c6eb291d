"""Steps 1–8: every call of a model turn decided in memory — resolved, parsed, fitted to the budget
and the deadline, validated, judged by policy — and recorded with the model response (commit 1)."""

from __future__ import annotations

import json
from datetime import datetime

from runs.domain import events
from runs.domain.context import RunContext
from runs.domain.events import EventType
from runs.domain.pipeline.batch import (
    MAX_ARGUMENT_BYTES,
    MAX_DELEGATION_DEPTH,
    BatchResult,
    _append_results,
    _approval_requested,
    _approval_suspension,
    _Entry,
    _error_codes,
    _error_result,
    _fail,
    _insert_row,
    _not_allowed,
    _record_proposal,
    _time_refusal,
)
from runs.domain.pipeline.execute import _run_batch
from runs.domain.pipeline.replay import replay_batch
from runs.domain.scrub import scrub, scrub_text
from runs.domain.values import (
    CancelReason,
    InvocationOutcome,
    InvocationStatus,
    ToolCallRequest,
)
from runs.domain.writes import UnitOfWork


def dispatch(ctx: RunContext, step_number: int, calls: list[ToolCallRequest], work: UnitOfWork) -> BatchResult:
    """Run a model turn's batch; commit `work` (with the decisions) first.

    Steps 1–8 decide every call in memory (`_resolve`, `_fit_budget`,
    `_decide`), then each decision is recorded into `work`
    (`_record_decision`). A call that needs approval pauses the whole batch;
    otherwise `work` is committed (commit 1) and the authorized calls run in
    order (`_run_batch`)."""
    now = ctx.clock.now()
    entries = [
        _Entry(index=i, call=c, invocation_id=ctx.ids.new_id(), key=f"{ctx.run.id}:{step_number}:{c.call_id}")
        for i, c in enumerate(calls)
    ]
    for entry in entries:
        _resolve(ctx, entry)
    if ctx.replay is not None:  # a replay executes nothing: every call is answered from the original's record
        return replay_batch(ctx, step_number, entries, work)
    _fit_budget(ctx, entries)
    _fit_time(ctx, entries)
    for entry in entries:
        _decide(ctx, entry)
    _one_control_kind(entries)
    suspend = [e for e in entries if e.needs_approval]
    stop = ctx.token.reason  # 7: cancellation check before authorizing (observation point 4)
    for entry in entries:
        _record_decision(ctx, work, entry, step_number, stop, now)

    if suspend and stop is None:
        # Policy is evaluated for the whole batch first: if any call needs
        # approval, none runs yet; finalize commits all of this with the pause.
        _append_results(ctx, [e for e in entries if e.is_error])
        return BatchResult(
            work=work,
            suspension=_approval_suspension(suspend, work, reason="policy"),
            error_codes=_error_codes(entries),
        )
    if stop is not None:
        ctx.store.commit(work)  # commit 1: the model response and every decision
        _append_results(ctx, entries)
        return BatchResult(work=UnitOfWork(), stop=stop)
    return _run_batch(ctx, step_number, entries, work)


def _resolve(ctx: RunContext, entry: _Entry) -> None:
    """Steps 1–3: propose, resolve in the pinned tool set (a tool the tenant no
    longer allows fails `tool_not_allowed`: never run), parse the arguments."""
    call = entry.call
    raw = call.raw_arguments if isinstance(call.raw_arguments, str) else ""
    if call.name in ctx.agent.tools:
        entry.spec = ctx.tools.spec(call.name)
    if entry.spec is None:
        # A tool the version lists that cannot be used now (an MCP tool no longer as pinned: `tool_changed`).
        why = ctx.tools.unavailable(call.name) if call.name in ctx.agent.tools else None
        _fail(
            entry,
            *(why or ("unknown_tool", f"no tool named {scrub_text(call.name)[:100]!r} is available to this agent")),
        )
        return
    if not ctx.agent.tool_allowed(call.name):
        _fail(entry, *_not_allowed(call.name))
        return
    if len(raw.encode("utf-8", "replace")) > MAX_ARGUMENT_BYTES:
        _fail(entry, "invalid_arguments", "the arguments are larger than 64 KiB")
        return
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        _fail(entry, "invalid_arguments", "the arguments are not valid JSON")
        return
    if not isinstance(parsed, dict):
        _fail(entry, "invalid_arguments", "the arguments must be a JSON object")
        return
    entry.arguments = scrub(parsed)


def _fit_budget(ctx: RunContext, entries: list[_Entry]) -> None:
    """Step 4: fit the batch to the remaining tool-call budget."""
    candidates = [e for e in entries if not e.is_error]
    fits = ctx.budgets.fit_tool_batch(ctx.progress.usage, len(candidates))
    for entry in candidates[fits:]:
        _fail(entry, "tool.budget_exhausted", "the run's tool-call budget is exhausted; this call was not run")


def _fit_time(ctx: RunContext, entries: list[_Entry]) -> None:
    """ADR-0209: a batch that arrives inside the deadline synthesis reserve
    gets persisted budget refusals (never run, not counted as usage), which
    leaves paired history for the tool-free answer."""
    if ctx.budgets.in_time_reserve(ctx.clock.now()):
        for entry in entries:
            if not entry.is_error:
                _time_refusal(entry)


def _decide(ctx: RunContext, entry: _Entry) -> None:
    """Steps 5–6: schema validation, policy. (Step 5, the identical-call
    guard, is the breaker's: it already tripped on the turn, before this
    batch was recorded, if any call of it would reach the limit.)"""
    if entry.is_error:
        return
    errors = ctx.tools.validate(entry.call.name, entry.arguments)
    if errors:
        _fail(entry, "schema_invalid", "; ".join(errors)[:1000])
        return
    refusal = _delegate_refusal(ctx, entry)
    if refusal is not None:
        _fail(entry, *refusal)
        return
    try:
        decision = ctx.policy.evaluate(entry.call.name, entry.arguments)
    except Exception:  # a broken policy fails closed
        decision = "require_approval"
    if decision == "allow":
        entry.authorized = True
        entry.asks_user = entry.tool.control == "ask_user"
        entry.delegates = entry.tool.control == "delegate"
    elif decision == "deny":
        _fail(entry, "denied_by_policy", "policy denied this call")
    elif ctx.approvals is None:
        _fail(entry, "approval_required", "policy requires approval for this call; it was not run")
    else:
        entry.needs_approval = True


def _record_decision(
    ctx: RunContext, work: UnitOfWork, entry: _Entry, step_number: int, stop: CancelReason | None, now: datetime
) -> None:
    """Steps 7–8 for one call: `tool.call.proposed`, then its row and event —
    refused, waiting for approval, cancelled before it ran, or authorized."""
    tool_name = _record_proposal(work, entry, step_number, now)
    if entry.is_error:
        work.invocation_inserts.append(
            _insert_row(
                entry,
                step_number,
                tool_name,
                now,
                InvocationStatus.FAILED,
                result=entry.result,
                error=entry.result,
                outcome=InvocationOutcome.FAILED,
            )
        )
        entry.event = events.call_not_run(
            invocation_id=entry.invocation_id,
            call_id=entry.call.call_id,
            tool=tool_name,
            result=entry.result,
            at=now,
            outcome=InvocationOutcome.FAILED,
        )
        work.events.append(entry.event)
    elif entry.needs_approval and stop is None and ctx.approvals is not None:
        insert = _insert_row(
            entry, step_number, tool_name, now, InvocationStatus.AWAITING_APPROVAL, suspended_kind="policy"
        )
        work.invocation_inserts.append(insert)
        approval = ctx.approvals.request(
            step_number=step_number,
            invocation_id=insert.id,
            tool=entry.tool,
            arguments=entry.arguments,
            kind="policy",
            at=now,
            call_index=entry.index,
        )
        work.approval_inserts.append(approval)
        work.events.append(_approval_requested(approval, insert.id, "policy", entry.tool.name, step_number, now))
    elif stop is not None:
        entry.authorized = False
        entry.result = _error_result("cancelled", "the run was cancelled before this call ran")
        entry.is_error = True
        work.invocation_inserts.append(_insert_row(entry, step_number, tool_name, now, InvocationStatus.CANCELLED))
        work.events.append(
            events.call_cancelled(
                invocation_id=entry.invocation_id, call_id=entry.call.call_id, tool=tool_name, reason=str(stop), at=now
            )
        )
    else:  # 8: authorize.
        work.invocation_inserts.append(_insert_row(entry, step_number, tool_name, now, InvocationStatus.AUTHORIZED))
        work.event(
            EventType.TOOL_CALL_AUTHORIZED,
            {"invocation": str(entry.invocation_id), "call_id": entry.call.call_id, "tool": tool_name},
            now,
        )


def _delegate_refusal(ctx: RunContext, entry: _Entry) -> tuple[str, str] | None:
    """Why a `delegate_run` call may not start its child (a failed result the
    model sees, naming the agent), or None. An agent delegates only to the
    agents its definition lists in `delegates`."""
    if entry.spec is None or entry.spec.control != "delegate" or not isinstance(entry.arguments, dict):
        return None
    name = scrub_text(str(entry.arguments.get("agent", "")))[:100]
    if name not in ctx.agent.delegates:
        allowed = ", ".join(ctx.agent.delegates) or "none"
        return (
            "delegate_not_allowed",
            f"this agent may not delegate to {name!r}; the agents it may delegate to: {allowed}",
        )
    if name in ctx.agent.delegates_missing:
        return "unknown_agent", f"no agent named {name!r} exists in this tenant"
    if ctx.run.depth >= MAX_DELEGATION_DEPTH:
        return (
            "delegation_too_deep",
            f"this run is {ctx.run.depth} delegations deep; a child run may not delegate further",
        )
    return None


def _one_control_kind(entries: list[_Entry]) -> None:
    """A run waits for one thing at a time: a batch that asks the user does
    not also start child runs (its `delegate_run` calls fail; the model may
    ask again after the answer)."""
    if not any(e.authorized and e.asks_user for e in entries):
        return
    for entry in entries:
        if entry.authorized and entry.delegates:
            entry.authorized = entry.delegates = False
            _fail(entry, "control_conflict", "delegate_run cannot be combined with ask_user in one turn; not run")
