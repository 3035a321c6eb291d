"""The control tools: `ask_user` suspends the run for its user, `delegate_run` for its child runs."""

from __future__ import annotations

from typing import Any

from runs.domain.context import RunContext
from runs.domain.pipeline.batch import (
    BatchResult,
    _append_results,
    _call_fingerprint,
    _Entry,
    _error_codes,
    _fail,
    _record_not_run,
)
from runs.domain.values import (
    ChildRunRequest,
    InvocationStatus,
    Suspension,
    SuspensionKind,
)
from runs.domain.writes import InvocationUpdate, UnitOfWork


def _ask_user(
    ctx: RunContext, entries: list[_Entry], question_entry: _Entry, results: UnitOfWork, late: list[dict[str, Any]]
) -> BatchResult:
    """The batch asked the user: the other calls are answered, the question waits."""
    if question_entry.invocation_id is None:
        raise RuntimeError("a proposed call always has a new invocation id")
    _append_results(ctx, [e for e in entries if e is not question_entry and not (e.asks_user)])
    question = str((question_entry.arguments or {}).get("question", ""))[:4000]
    results.invocation_updates.append(
        InvocationUpdate(
            id=question_entry.invocation_id,
            status=InvocationStatus.AWAITING_APPROVAL,
            suspended_kind="user",
            updated_at=ctx.clock.now(),
        )
    )
    return BatchResult(
        work=results,
        late=late,
        suspension=Suspension(
            kind=SuspensionKind.USER, invocation_ids=[question_entry.invocation_id], question=question
        ),
        error_codes=_error_codes([e for e in entries if e is not question_entry]),
    )


def _orchestration_only(ctx: RunContext, delegated: list[_Entry]) -> bool:
    """Every call of the model turn is a `delegate_run` that starts a child
    (such a turn refunds its step and model-call budget)."""
    conv = ctx.state.conversation
    turn = next((m for m in reversed(conv) if m.get("role") == "assistant"), None)
    calls = (turn or {}).get("tool_calls") or []
    ids = {e.call.call_id for e in delegated}
    return bool(calls) and all(c.get("id") in ids for c in calls)


def _delegate(
    ctx: RunContext,
    entries: list[_Entry],
    delegated: list[_Entry],
    results: UnitOfWork,
    late: list[dict[str, Any]],
    *,
    count_calls: bool,
) -> BatchResult:
    """The batch delegated: the other calls are answered, each `delegate_run`
    waits (`awaiting_approval`, `child_run`) for the child run that finalize
    starts with the suspension, in its transaction. The calls count as tool
    calls; an orchestration-only turn refunds its step and model call. Each
    child's limits are capped by an equal share of what then remains of this
    run's budget (reserved: together they never exceed it); when a share
    would be nothing the calls fail `tool.budget_exhausted` and no child starts."""
    progress = ctx.progress
    now = ctx.clock.now()
    usage = progress.usage.model_copy(update={"tool_calls": progress.usage.tool_calls + len(delegated)})
    if _orchestration_only(ctx, delegated):
        usage = usage.model_copy(
            update={"steps": max(0, usage.steps - 1), "model_calls": max(0, usage.model_calls - 1)}
        )
    caps = ctx.budgets.child_caps(usage, len(delegated))
    if caps is None:
        for entry in delegated:
            _fail(
                entry,
                "tool.budget_exhausted",
                f"too little of the run's budget remains to start {len(delegated)} child run(s) (each gets an"
                " equal share)",
            )
            _record_not_run(results, entry, now)
        _append_results(ctx, entries)
        return BatchResult(work=results, late=late)
    progress.usage = usage
    results.usage = usage.model_dump(mode="json")
    _append_results(ctx, [e for e in entries if not any(e is d for d in delegated)])
    children = []
    for entry in delegated:
        if entry.invocation_id is None:
            raise RuntimeError("a delegated call always has an invocation row")
        if count_calls:
            ctx.state.count_call(_call_fingerprint(entry.call.name, entry.arguments))
        results.invocation_updates.append(
            InvocationUpdate(
                id=entry.invocation_id,
                status=InvocationStatus.AWAITING_APPROVAL,
                suspended_kind="child_run",
                updated_at=now,
            )
        )
        arguments = entry.arguments if isinstance(entry.arguments, dict) else {}
        children.append(
            ChildRunRequest(
                run_id=ctx.ids.new_id(),
                invocation_id=entry.invocation_id,
                agent=str(arguments.get("agent", "")),
                input=str(arguments.get("input", "")),
                caps=caps,
            )
        )
    return BatchResult(
        work=results,
        late=late,
        suspension=Suspension(
            kind=SuspensionKind.CHILD_RUN,
            invocation_ids=[c.invocation_id for c in children],
            children=children,
            details={
                "children": [
                    {"run": str(c.run_id), "agent": c.agent, "invocation": str(c.invocation_id)} for c in children
                ]
            },
        ),
    )
