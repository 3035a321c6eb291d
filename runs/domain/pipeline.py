"""The tool pipeline (DESIGN §7): fourteen steps for every proposed call.

Steps 1–8 decide every call of the batch in memory and are committed with the
model response (commit 1 of the step). Read-only calls then run; each
side-effect call first commits its watermark alone (step 9). Results, their
events and the conversation entries go into the next unit of work (commit 2).
Nothing a model proposes can raise out of here: every malformed call ends as
a recorded tool result.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from runs.domain import events
from runs.domain.breaker import call_fingerprint
from runs.domain.context import RunContext
from runs.domain.errors import PolicyChanged, ToolFailure, WorkerFenced
from runs.domain.events import EventType
from runs.domain.ports import CancellationToken, Clock, SentCommit
from runs.domain.records import ApprovalDecision, InvocationRecord
from runs.domain.scrub import bound, scrub, scrub_text
from runs.domain.stored_form import tool_item
from runs.domain.values import (
    ApprovalStatus,
    CancelReason,
    ChildRunRequest,
    InvocationOutcome,
    InvocationStatus,
    Suspension,
    SuspensionKind,
    ToolCallRequest,
    ToolSpec,
)
from runs.domain.writes import ApprovalInsert, EventWrite, InvocationInsert, InvocationUpdate, UnitOfWork

MAX_ARGUMENT_BYTES = 64 * 1024
# How deep delegation may nest: a run this many parents below the one a person
# submitted may not start children of its own (a bound on recursion, since an
# orchestration-only turn refunds its step).
MAX_DELEGATION_DEPTH = 3


_NEVER = threading.Event()  # never set: a plain bounded wait


class CancelSignal:
    """The run's cancellation as a tool sees it: true once the run is
    cancelled by an operator or its deadline passes; `wait(seconds)` blocks
    until then or the timeout and returns whether it was cancelled. A worker
    that lost its lease (`fenced`) is not a cancelled run: its running tool
    finishes and the outcome is recorded late (seed 000), so the signal stays
    clear for it."""

    __slots__ = ("_token",)

    def __init__(self, token: CancellationToken):
        self._token = token

    def is_set(self) -> bool:
        return self._token.reason not in (None, CancelReason.FENCED)

    __bool__ = is_set

    @property
    def reason(self) -> CancelReason | None:
        return self._token.reason if self.is_set() else None

    def wait(self, seconds: float | None = None) -> bool:
        if self._token.wait(seconds) is CancelReason.FENCED:
            _NEVER.wait(seconds)
        return self.is_set()


@dataclass
class ToolExecutionContext:
    """What a tool is given (DESIGN §7 step 10, §17): the run, the step, the
    idempotency key, the attempt, the run's `deadline` (absolute, or None),
    the `cancelled` signal and the `principal` the run acts for.
    `step_number` and `token` stay as aliases of `step` and the raw token."""

    run_id: UUID
    step_number: int
    call_id: str
    invocation_id: UUID | None
    idempotency_key: str
    attempt: int
    timeout_seconds: float
    token: CancellationToken
    deadline: datetime | None = None
    principal: Any = None
    clock: Clock | None = None

    @property
    def step(self) -> int:
        return self.step_number

    @property
    def cancelled(self) -> CancelSignal:
        return CancelSignal(self.token)

    def seconds_left(self) -> float | None:
        """Seconds until the run's deadline (never negative), or None."""
        if self.deadline is None or self.clock is None:
            return None
        return max(0.0, (self.deadline - self.clock.now()).total_seconds())

    def time_budget(self) -> float:
        """This call's timeout bounded by the run's deadline."""
        left = self.seconds_left()
        return self.timeout_seconds if left is None else min(self.timeout_seconds, left)


@dataclass
class _Entry:
    index: int
    call: ToolCallRequest
    invocation_id: UUID | None
    key: str
    spec: ToolSpec | None = None
    arguments: Any = None
    result: Any = None  # the content the model sees
    is_error: bool = False
    authorized: bool = False
    needs_approval: bool = False
    asks_user: bool = False
    delegates: bool = False  # an authorized `delegate_run` call: it starts a child run instead of executing
    outcome: InvocationOutcome | None = None  # once executed (step 11)
    unknown: bool = False  # an uncertain side effect: nobody answers it until someone decides
    event: EventWrite | None = None  # the event that records the result (a checkpoint may name it)

    @property
    def tool(self) -> ToolSpec:
        """The resolved spec of a call past step 2 (every call that runs has one)."""
        if self.spec is None:
            raise RuntimeError(f"call {self.call.call_id} has no resolved tool")
        return self.spec


@dataclass
class BatchResult:
    work: UnitOfWork
    stop: CancelReason | None = None
    late: list[dict[str, Any]] = field(default_factory=list)
    suspension: Suspension | None = None
    all_denied: bool = False
    unknown: list[UUID | None] = field(default_factory=list)  # invocations whose side effect ended uncertain
    error_codes: tuple[str, ...] = ()  # of the batch's failed results, in call order (the runtime carry reads it)
    # Commit 1 still in flight (read-only calls only): the caller waits for
    # it before anything leaves the loop; the store settles it before commit 2.
    sent: SentCommit | None = None


def _error_codes(entries: list[_Entry]) -> tuple[str, ...]:
    return tuple(
        str(e.result.get("error"))
        for e in entries
        if e.is_error and isinstance(e.result, dict) and e.result.get("error")
    )


def _error_result(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message}


_call_fingerprint = call_fingerprint  # the breaker's counter key (checkpoint catch-up counts with it too)


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


def _fail(entry: _Entry, code: str, message: str) -> None:
    entry.result = _error_result(code, message)
    entry.is_error = True


def _resolve(ctx: RunContext, entry: _Entry) -> None:
    """Steps 1–3: propose, resolve in the pinned tool set (a tool the tenant no
    longer allows fails `tool_not_allowed`: never run), parse the arguments."""
    call = entry.call
    raw = call.raw_arguments if isinstance(call.raw_arguments, str) else ""
    if call.name in ctx.agent.tools:
        entry.spec = ctx.tools.spec(call.name)
    if entry.spec is None:
        _fail(entry, "unknown_tool", f"no tool named {scrub_text(call.name)[:100]!r} is available to this agent")
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


def _not_allowed(name: str) -> tuple[str, str]:
    """The failed result of a call whose tool the run's tenant no longer allows (`Tenant.allowed_tools`)."""
    return "tool_not_allowed", f"the tool {scrub_text(name)[:100]!r} is not allowed for this tenant; it was not run"


def _fit_budget(ctx: RunContext, entries: list[_Entry]) -> None:
    """Step 4: fit the batch to the remaining tool-call budget."""
    candidates = [e for e in entries if not e.is_error]
    fits = ctx.budgets.fit_tool_batch(ctx.progress.usage, len(candidates))
    for entry in candidates[fits:]:
        _fail(entry, "tool.budget_exhausted", "the run's tool-call budget is exhausted; this call was not run")


TIME_REFUSAL = "the run is inside its deadline synthesis reserve; this call was not run"


def _time_refusal(entry: _Entry) -> None:
    _fail(entry, "tool.budget_exhausted", TIME_REFUSAL)
    entry.result["dimension"] = "deadline"


def _fit_time(ctx: RunContext, entries: list[_Entry]) -> None:
    """ADR-0209: a batch that arrives inside the deadline synthesis reserve
    gets persisted budget refusals (never run, not counted as usage), which
    leaves paired history for the tool-free answer."""
    if ctx.budgets.in_time_reserve(ctx.clock.now()):
        for entry in entries:
            if not entry.is_error:
                _time_refusal(entry)


def _exempt_from_time_reserve(ctx: RunContext, row: InvocationRecord) -> bool:
    """A waiting call whose approval was resolved before the deadline runs,
    is denied or expires as decided, whatever the reserve (ADR-0209)."""
    decision = ctx.approvals.decision_for(row.id) if ctx.approvals is not None else None
    if decision is None or decision.status != ApprovalStatus.APPROVED or decision.decided_at is None:
        return False
    return ctx.run.deadline_at is None or decision.decided_at < ctx.run.deadline_at


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
    tool_name = scrub_text(entry.call.name)[:200]
    proposed = {
        "invocation": str(entry.invocation_id),
        "call_id": entry.call.call_id,
        "tool": tool_name,
        "arguments": entry.arguments
        if entry.arguments is not None
        else scrub_text(entry.call.raw_arguments or "")[:4096],
        "step": step_number,
    }
    work.event(EventType.TOOL_CALL_PROPOSED, proposed, now)
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


def _insert_row(
    entry: _Entry, step_number: int, tool_name: str, now: datetime, status: InvocationStatus, **decided: Any
) -> InvocationInsert:
    """The invocation row of a decided call, with its status and what the decision adds."""
    if entry.invocation_id is None:
        raise RuntimeError("a proposed call always has a new invocation id")
    spec = entry.spec
    return InvocationInsert(
        id=entry.invocation_id,
        step_number=step_number,
        call_index=entry.index,
        call_id=entry.call.call_id,
        tool_name=tool_name,
        arguments=entry.arguments,
        raw_arguments=scrub_text(entry.call.raw_arguments or "")[:MAX_ARGUMENT_BYTES],
        idempotency_key=entry.key,
        status=status,
        read_only=spec.read_only if spec else True,
        side_effect=spec.side_effect if spec else "none",
        created_at=now,
        **decided,
    )


def _approval_requested(
    approval: ApprovalInsert, invocation_id: UUID | None, kind: str, tool: str, step_number: int, at: datetime
) -> Any:
    return events.approval_requested(
        approval_id=approval.id,
        invocation_id=invocation_id,
        kind=kind,
        tool=tool,
        request_hash=approval.request_hash,
        step=step_number,
        presentation=approval.presentation,
        at=at,
    )


def _approval_suspension(entries: list[_Entry], work: UnitOfWork, *, reason: str) -> Suspension:
    return Suspension(
        kind=SuspensionKind.APPROVAL,
        invocation_ids=[e.invocation_id for e in entries if e.invocation_id is not None],
        approval_ids=[a.id for a in work.approval_inserts],
        details={"reason": reason},
    )


def _run_batch(ctx: RunContext, step_number: int, entries: list[_Entry], decisions: UnitOfWork) -> BatchResult:
    """Commit 1 (`decisions`), then steps 9–14 for the authorized calls, in
    order; an `ask_user` call is not run but suspends the run once the others
    ran. When every call to run is read-only they run while commit 1 is in
    flight (DESIGN §7: running one again is harmless, so it needs nothing
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
    if sent is not None and (unknown or question_entry is not None or delegated):
        sent.wait()
        sent = None
    if unknown:
        # Seed 000: the model sees no result for an unknown outcome; the
        # reconciler or an operator decides first (the executor hands over).
        # A cancel or a deadline does not close the question: the run ends
        # once it is decided (the rest of the batch is already cancelled).
        return BatchResult(work=results, late=late, unknown=unknown)
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


@dataclass
class _Planned:
    """A call about to run: its attempt number and what an earlier attempt left."""

    entry: _Entry
    attempt: int = 1
    effect_sent: bool = False
    prior_attempts: list[dict[str, Any]] | None = None
    approved: ApprovalDecision | None = None  # the approval it runs under: the policy is judged again as it runs


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
        if entry.unknown and stop is None:
            break  # the rest of the batch waits, still authorized, for the decision
    if executed:
        progress = ctx.progress
        progress.usage = progress.usage.model_copy(update={"tool_calls": progress.usage.tool_calls + executed})
        results.usage = progress.usage.model_dump(mode="json")
    return stop


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


def _orchestration_only(ctx: RunContext, delegated: list[_Entry]) -> bool:
    """Every call of the model turn is a `delegate_run` that starts a child
    (seed 002: such a turn refunds its step and model-call budget)."""
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


def _record_not_run(work: UnitOfWork, entry: _Entry, at: datetime) -> None:
    """A recorded call that will not run after all: its row failed with the result, and its event."""
    if entry.invocation_id is None:
        raise RuntimeError("a recorded call has an invocation row")
    work.invocation_updates.append(
        InvocationUpdate(
            id=entry.invocation_id,
            status=InvocationStatus.FAILED,
            result=entry.result,
            error=entry.result,
            outcome=InvocationOutcome.FAILED,
            updated_at=at,
        )
    )
    work.events.append(
        events.call_not_run(
            invocation_id=entry.invocation_id,
            call_id=entry.call.call_id,
            tool=entry.call.name,
            result=entry.result,
            at=at,
            outcome=InvocationOutcome.FAILED,
        )
    )


def _all_denied(entries: list[_Entry]) -> bool:
    denied = [e for e in entries if e.is_error and isinstance(e.result, dict) and e.result.get("error") in DENIALS]
    return bool(entries) and len(denied) == len(entries)


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
    _execute(ctx, entry, step_number, attempt)
    if not spec.read_only:
        ctx.fault("tool.after_execute")
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
    call (seed 002: a decision changed since the approval is a denial the
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
        # An unknown outcome (seed 000): recorded, not answered. The row
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


UNKNOWN_OUTCOME = {
    "outcome": "unknown",
    "message": "the call started and the process stopped before its outcome was recorded",
}


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


def _execute(ctx: RunContext, entry: _Entry, step_number: int, attempt: int = 1) -> None:
    """Steps 10–12: execute, classify, bound and scrub.

    Classification (step 11): a value is `succeeded`; a `ToolFailure` is
    `failed` (the call definitely did not take effect: refused before
    sending, connection refused, an answer that says so, bad arguments)
    unless it says `uncertain` (`OutcomeUnknown`: sent and unanswered, timed
    out, cancelled while running); a failure after the run's cancellation
    reached the running tool is `uncertain` too. Any other exception is `failed` for a read-only tool
    and `uncertain` for one with a side effect: nobody can tell whether the
    bug struck before or after the effect."""
    spec = entry.tool
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
    )
    cancelled_before = tctx.cancelled.is_set()
    try:
        value = ctx.tools.execute(spec.name, entry.arguments, tctx)
        entry.result, truncated = bound(value)
        entry.outcome = InvocationOutcome.SUCCEEDED
    except ToolFailure as exc:
        # A failure that follows a cancellation reaching the running tool is
        # not a definite answer (seed 000: observed as unknown).
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


def _append_results(ctx: RunContext, entries: list[_Entry]) -> None:
    for entry in entries:
        item = tool_item(entry.call.call_id, entry.call.name, entry.result, entry.is_error)
        ctx.state.conversation.append(item)
        ctx.state.link(item, entry.event, entry.result)


ANSWERED = (
    InvocationStatus.COMPLETED,
    InvocationStatus.FAILED,
    InvocationStatus.CANCELLED,
    InvocationStatus.INTERRUPTED,
    InvocationStatus.UNCERTAIN,
)
DENIALS = ("denied_by_policy", "rejected_by_operator", "approval_required", "approval_expired")


class UnknownOutcome(Exception):
    """An interrupted side effect reached the loop without a decision."""


# Approval kinds whose approval is a grant to run again a call whose outcome
# is unknown (seed 000); one place for the set (issue 11).
RERUN_KINDS = frozenset({"interrupted_side_effect", "uncertain_side_effect", "reconcile"})


class RerunConflict(Exception):
    """An approved re-run can no longer run as approved (tool gone, arguments
    no longer valid, policy now denies): the run fails `reconcile_conflict`
    and the call's outcome stays unknown. `work` holds what to record."""

    def __init__(
        self, message: str, *, error_class: str = "ReconcileConflict", work: UnitOfWork | None = None, **details: Any
    ):
        super().__init__(message)
        self.error_class = error_class
        self.work = work or UnitOfWork()
        self.details = details


def _unknown_status(kind: str) -> InvocationStatus:
    """The status of a call whose outcome is unknown, by the approval kind it waits on."""
    return InvocationStatus.UNCERTAIN if kind == "uncertain_side_effect" else InvocationStatus.INTERRUPTED


def _recheck_grant(
    ctx: RunContext, step_number: int, entry: _Entry, row: InvocationRecord, decision: ApprovalDecision
) -> bool:
    """DESIGN §8 for a re-run grant: before the approved call runs again, the
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
