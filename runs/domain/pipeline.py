"""The tool pipeline (DESIGN §7): fourteen steps for every proposed call.

Steps 1–8 decide every call of the batch in memory and are committed with the
model response (commit 1 of the step). Read-only calls then run; each
side-effect call first commits its watermark alone (step 9). Results, their
events and the conversation entries go into the next unit of work (commit 2).
Nothing a model proposes can raise out of here: every malformed call ends as
a recorded tool result.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from runs.domain.context import RunContext, canonical_json
from runs.domain.errors import ToolFailure, WorkerFenced
from runs.domain.scrub import bound, scrub, scrub_text
from runs.domain.values import CancelReason, Suspension, SuspensionKind, ToolCallRequest, ToolSpec
from runs.domain.writes import InvocationInsert, InvocationUpdate, UnitOfWork

IDENTICAL_CALL_LIMIT = 3
MAX_ARGUMENT_BYTES = 64 * 1024


_NEVER = threading.Event()  # never set: a plain bounded wait


class CancelSignal:
    """The run's cancellation as a tool sees it: true once the run is
    cancelled by an operator or its deadline passes; `wait(seconds)` blocks
    until then or the timeout and returns whether it was cancelled. A worker
    that lost its lease (`fenced`) is not a cancelled run: its running tool
    finishes and the outcome is recorded late (seed 000), so the signal stays
    clear for it."""

    __slots__ = ("_token",)

    def __init__(self, token: Any):
        self._token = token

    def is_set(self) -> bool:
        return self._token.reason not in (None, CancelReason.FENCED)

    __bool__ = is_set

    @property
    def reason(self) -> Any:
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

    run_id: Any
    step_number: int
    call_id: str
    invocation_id: Any
    idempotency_key: str
    attempt: int
    timeout_seconds: float
    token: Any
    deadline: Any = None
    principal: Any = None
    clock: Any = None

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
    invocation_id: Any
    key: str
    spec: ToolSpec | None = None
    arguments: Any = None
    result: Any = None  # the content the model sees
    is_error: bool = False
    authorized: bool = False
    needs_approval: bool = False
    asks_user: bool = False
    outcome: str | None = None  # succeeded | failed | uncertain, once executed (step 11)
    unknown: bool = False  # an uncertain side effect: nobody answers it until someone decides


@dataclass
class BatchResult:
    work: UnitOfWork
    stop: CancelReason | None = None
    late: list[dict[str, Any]] = field(default_factory=list)
    suspension: Suspension | None = None
    all_denied: bool = False
    unknown: list[Any] = field(default_factory=list)  # invocations whose side effect ended uncertain


def _error_result(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message}


def _call_fingerprint(name: str, arguments: Any) -> str:
    return hashlib.sha256(f"{name}\x1f{canonical_json(arguments)}".encode()).hexdigest()[:24]


def dispatch(ctx: RunContext, step_number: int, calls: list[ToolCallRequest], work: UnitOfWork) -> BatchResult:
    """Run a model turn's batch; commit `work` (with the decisions) first."""
    now = ctx.clock.now()
    run = ctx.run
    entries = [
        _Entry(index=i, call=c, invocation_id=ctx.ids.new_id(), key=f"{run.id}:{step_number}:{c.call_id}")
        for i, c in enumerate(calls)
    ]

    def fail(entry: _Entry, code: str, message: str) -> None:
        entry.result = _error_result(code, message)
        entry.is_error = True

    # 1–3: propose, resolve in the pinned tool set, parse the arguments.
    for entry in entries:
        call = entry.call
        raw = call.raw_arguments if isinstance(call.raw_arguments, str) else ""
        if call.name in ctx.agent.tools:
            entry.spec = ctx.tools.spec(call.name)
        if entry.spec is None:
            fail(entry, "unknown_tool", f"no tool named {scrub_text(call.name)[:100]!r} is available to this agent")
            continue
        if len(raw.encode("utf-8", "replace")) > MAX_ARGUMENT_BYTES:
            fail(entry, "invalid_arguments", "the arguments are larger than 64 KiB")
            continue
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            fail(entry, "invalid_arguments", "the arguments are not valid JSON")
            continue
        if not isinstance(parsed, dict):
            fail(entry, "invalid_arguments", "the arguments must be a JSON object")
            continue
        entry.arguments = scrub(parsed)

    # 4: fit the batch to the remaining tool-call budget.
    candidates = [e for e in entries if not e.is_error]
    fits = ctx.budgets.fit_tool_batch(run.usage, len(candidates))
    for entry in candidates[fits:]:
        fail(entry, "tool.budget_exhausted", "the run's tool-call budget is exhausted; this call was not run")

    # 5–6: identical-call guard, schema validation, policy.
    for entry in entries:
        if entry.is_error:
            continue
        fp = _call_fingerprint(entry.call.name, entry.arguments)
        if ctx.state.identical_calls.get(fp, 0) >= IDENTICAL_CALL_LIMIT:
            fail(
                entry,
                "repeated_call",
                "this exact call was already made several times in this run; it was not run again",
            )
            continue
        errors = ctx.tools.validate(entry.call.name, entry.arguments)
        if errors:
            fail(entry, "schema_invalid", "; ".join(errors)[:1000])
            continue
        try:
            decision = ctx.policy.evaluate(entry.call.name, entry.arguments)
        except Exception:  # a broken policy fails closed
            decision = "require_approval"
        if decision == "allow":
            entry.authorized = True
            entry.asks_user = entry.spec.control == "ask_user"
        elif decision == "deny":
            fail(entry, "denied_by_policy", "policy denied this call")
        elif ctx.approvals is None:
            fail(entry, "approval_required", "policy requires approval for this call; it was not run")
        else:
            entry.needs_approval = True
    suspend = [e for e in entries if e.needs_approval]

    # 7: cancellation check before authorizing (observation point 4).
    stop = ctx.token.reason
    for entry in entries:
        proposed = {
            "invocation": str(entry.invocation_id),
            "call_id": entry.call.call_id,
            "tool": scrub_text(entry.call.name)[:200],
            "arguments": entry.arguments
            if entry.arguments is not None
            else scrub_text(entry.call.raw_arguments or "")[:4096],
            "step": step_number,
        }
        work.event("tool.call.proposed", proposed, now)
        spec = entry.spec
        base = dict(
            id=entry.invocation_id,
            step_number=step_number,
            call_index=entry.index,
            call_id=entry.call.call_id,
            tool_name=scrub_text(entry.call.name)[:200],
            arguments=entry.arguments,
            raw_arguments=scrub_text(entry.call.raw_arguments or "")[:MAX_ARGUMENT_BYTES],
            idempotency_key=entry.key,
            read_only=spec.read_only if spec else True,
            side_effect=spec.side_effect if spec else "none",
            created_at=now,
        )
        if entry.is_error:
            work.invocation_inserts.append(
                InvocationInsert(status="failed", result=entry.result, error=entry.result, outcome="failed", **base)
            )
            work.event(
                "tool.call.failed",
                {
                    "invocation": str(entry.invocation_id),
                    "call_id": entry.call.call_id,
                    "tool": base["tool_name"],
                    "result": entry.result,
                    "executed": False,
                    "outcome": "failed",
                },
                now,
            )
        elif entry.needs_approval and stop is None:
            work.invocation_inserts.append(
                InvocationInsert(status="awaiting_approval", suspended_kind="policy", **base)
            )
            approval = ctx.approvals.request(
                step_number=step_number,
                invocation_id=entry.invocation_id,
                tool=spec,
                arguments=entry.arguments,
                kind="policy",
                at=now,
            )
            work.approval_inserts.append(approval)
            work.event(
                "approval.requested",
                {
                    "approval": str(approval.id),
                    "invocation": str(entry.invocation_id),
                    "kind": "policy",
                    "tool": spec.name,
                    "request_hash": approval.request_hash,
                    "step": step_number,
                    "presentation": approval.presentation,
                },
                now,
            )
        elif stop is not None:
            entry.authorized = False
            entry.result = _error_result("cancelled", "the run was cancelled before this call ran")
            entry.is_error = True
            work.invocation_inserts.append(InvocationInsert(status="cancelled", **base))
            work.event(
                "tool.run_cancelled",
                {
                    "invocation": str(entry.invocation_id),
                    "call_id": entry.call.call_id,
                    "tool": base["tool_name"],
                    "reason": str(stop),
                },
                now,
            )
        else:
            # 8: authorize.
            work.invocation_inserts.append(InvocationInsert(status="authorized", **base))
            work.event(
                "tool.call.authorized",
                {"invocation": str(entry.invocation_id), "call_id": entry.call.call_id, "tool": base["tool_name"]},
                now,
            )

    if suspend and stop is None:
        # Policy is evaluated for the whole batch first: if any call needs
        # approval, none runs yet; finalize commits all of this with the pause.
        _append_results(ctx, [e for e in entries if e.is_error])
        return BatchResult(
            work=work,
            suspension=Suspension(
                kind=SuspensionKind.APPROVAL,
                invocation_ids=[e.invocation_id for e in suspend],
                approval_ids=[a.id for a in work.approval_inserts],
                details={"reason": "policy"},
            ),
        )
    ctx.store.commit(work)  # commit 1: the model response and every decision
    if stop is not None:
        _append_results(ctx, entries)
        return BatchResult(work=UnitOfWork(), stop=stop)

    results = UnitOfWork()
    late: list[dict[str, Any]] = []
    executed = 0
    stop_after: CancelReason | None = None
    question_entry = None
    for position, entry in enumerate(entries):
        if not entry.authorized:
            continue
        if entry.asks_user:
            question_entry = question_entry or entry
            continue
        if stop_after is not None:
            _cancel(ctx, results, entry, stop_after)
            continue
        ran, stop_after = _run_one(ctx, entry, step_number, 1, results, late)
        if ran:
            executed += 1
            ctx.state.count_call(_call_fingerprint(entry.call.name, entry.arguments))
        if entry.unknown and stop_after is None:
            break  # the rest of the batch waits, still authorized, for the decision

    if executed:
        run.usage = run.usage.model_copy(update={"tool_calls": run.usage.tool_calls + executed})
        results.usage = run.usage.model_dump(mode="json")
    unknown = [e.invocation_id for e in entries if e.unknown]
    if unknown and stop_after is None:
        # Seed 000: the model sees no result for an unknown outcome; the
        # reconciler or an operator decides first (the executor hands over).
        return BatchResult(work=results, late=late, unknown=unknown)
    denied = [e for e in entries if e.is_error and isinstance(e.result, dict) and e.result.get("error") in DENIALS]
    if question_entry is not None and stop_after is None:
        _append_results(ctx, [e for e in entries if e is not question_entry and not (e.asks_user)])
        question = str((question_entry.arguments or {}).get("question", ""))[:4000]
        results.invocation_updates.append(
            InvocationUpdate(
                id=question_entry.invocation_id,
                status="awaiting_approval",
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
        )
    _append_results(ctx, entries)
    return BatchResult(
        work=results, stop=stop_after, late=late, all_denied=bool(entries) and len(denied) == len(entries)
    )


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
) -> tuple[bool, CancelReason | None]:
    """Steps 7 and 9–14 for one authorized call: the cancellation check, the
    watermark alone in its fenced transaction (side effects only), the
    self-fence, the call, and its result into `results`. Return whether the
    call ran and the cancel reason seen (before it: clean stop; after it:
    the result is kept)."""
    spec = entry.spec
    if not spec.read_only:
        ctx.fault("tool.before_watermark")
    if ctx.token.reason is not None:  # observation point 4
        _cancel(ctx, results, entry, ctx.token.reason, effect_sent=effect_sent)
        return False, ctx.token.reason
    if not spec.read_only:
        if not ctx.lease.may_start_effect():  # a stale worker writes no watermark for a call it will not make
            raise WorkerFenced("self-fence before the watermark", late={"calls": late} if late else None)
        try:
            ctx.store.mark_effect_sent(
                entry.invocation_id,
                attempt,
                {
                    "invocation": str(entry.invocation_id),
                    "call_id": entry.call.call_id,
                    "tool": spec.name,
                    "attempt": attempt,
                    "idempotency_key": entry.key,
                },
                ctx.clock.now(),
            )
        except WorkerFenced as exc:
            exc.late = {"calls": late} if late else None
            raise
        ctx.fault("tool.after_watermark")
        if not ctx.lease.may_start_effect():
            raise WorkerFenced(
                "self-fence: no successful heartbeat within lease - interval", late={"calls": late} if late else None
            )
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
                status="uncertain",
                error=entry.result,
                attempt=attempt,
                outcome="uncertain",
                attempts=history,
                updated_at=at,
            )
        )
        results.event(
            "tool.call.failed", {**payload, "result": None, "error": entry.result, "awaiting_decision": True}, at
        )
        return True, ctx.token.reason
    results.invocation_updates.append(
        InvocationUpdate(
            id=entry.invocation_id,
            status="failed" if entry.is_error else "completed",
            result=entry.result,
            error=entry.result if entry.is_error else None,
            clear_error=not entry.is_error,
            attempt=attempt,
            outcome=entry.outcome,
            attempts=history,
            updated_at=at,
        )
    )
    results.event("tool.call.failed" if entry.is_error else "tool.call.completed", payload, at)
    return True, ctx.token.reason  # observation point 5: the call has finished; its result is kept


def _attempt_history(prior: list[dict[str, Any]] | None, attempt: int, *, read_only: bool) -> list[dict[str, Any]]:
    """The per-attempt record before attempt `attempt` is added: what the row
    had, plus an `uncertain` entry for each earlier side-effect attempt whose
    watermark was set and whose outcome nobody recorded (a process died)."""
    history = [dict(a) for a in (prior or []) if isinstance(a, dict)]
    if not read_only:
        seen = {a.get("attempt") for a in history}
        for earlier in range(1, attempt):
            if earlier not in seen:
                history.append({"attempt": earlier, "outcome": "uncertain", "error": UNKNOWN_OUTCOME})
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
    cancelled call with an effect that may have happened (I6)."""
    at = ctx.clock.now()
    entry.is_error = True
    if effect_sent:
        entry.result = _error_result("interrupted", "an earlier attempt of this call started; its outcome is unknown")
        work.invocation_updates.append(
            InvocationUpdate(id=entry.invocation_id, status="interrupted", error=UNKNOWN_OUTCOME, updated_at=at)
        )
    else:
        entry.result = _error_result("cancelled", "the run was cancelled before this call ran")
        work.invocation_updates.append(InvocationUpdate(id=entry.invocation_id, status="cancelled", updated_at=at))
    work.event(
        "tool.run_cancelled",
        {
            "invocation": str(entry.invocation_id),
            "call_id": entry.call.call_id,
            "tool": entry.call.name,
            "reason": str(reason),
            **({"outcome": "unknown"} if effect_sent else {}),
        },
        at,
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
    spec = entry.spec
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
        principal=getattr(ctx.run, "principal", None),
        clock=ctx.clock,
    )
    cancelled_before = tctx.cancelled.is_set()
    try:
        value = ctx.tools.execute(spec.name, entry.arguments, tctx)
        entry.result, truncated = bound(value)
        entry.outcome = "succeeded"
    except ToolFailure as exc:
        # A failure that follows a cancellation reaching the running tool is
        # not a definite answer (seed 000: observed as unknown).
        uncertain = bool(exc.uncertain) or (not cancelled_before and tctx.cancelled.is_set())
        entry.result = {"error": exc.code, "message": scrub_text(str(exc))[:2000], "uncertain": uncertain}
        entry.is_error = True
        entry.outcome = "uncertain" if uncertain else "failed"
    except Exception as exc:  # a tool bug is a failed result, never a worker crash
        uncertain = not spec.read_only or (not cancelled_before and tctx.cancelled.is_set())
        entry.result = {
            "error": "tool_error",
            "message": f"the tool raised {type(exc).__name__}",
            "uncertain": uncertain,
        }
        entry.is_error = True
        entry.outcome = "uncertain" if uncertain else "failed"


def _append_results(ctx: RunContext, entries: list[_Entry]) -> None:
    for entry in entries:
        content = entry.result
        ctx.state.conversation.append(
            {
                "role": "tool",
                "tool_call_id": entry.call.call_id,
                "name": entry.call.name,
                "content": json.dumps(content, ensure_ascii=False) if not isinstance(content, str) else content,
                "is_error": entry.is_error,
            }
        )


ANSWERED = ("completed", "failed", "cancelled", "interrupted", "uncertain")
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


def _unknown_status(kind: str) -> str:
    """The status of a call whose outcome is unknown, by the approval kind it waits on."""
    return "uncertain" if kind == "uncertain_side_effect" else "interrupted"


def _recheck_grant(ctx: RunContext, step_number: int, entry: _Entry, row: dict, decision: dict) -> bool:
    """DESIGN §8 for a re-run grant: before the approved call runs again, the
    tool must still be registered, the recorded arguments must pass its
    schema (else `RerunConflict`), the request hash recomputed from the
    current spec must equal the approved one (else False: invalidate and ask
    again), and policy is evaluated again — a deny is a `RerunConflict`; a
    require_approval is satisfied by the grant itself."""
    now = ctx.clock.now()
    unknown = UnitOfWork()  # the grant is not used: the call stays as it was, its outcome unknown
    unknown.invocation_updates.append(
        InvocationUpdate(id=row["id"], status=_unknown_status(decision["kind"]), updated_at=now)
    )
    if entry.spec is None:
        raise RerunConflict(
            f"tool {row['tool_name']!r} is no longer registered; the approved re-run cannot run",
            work=unknown,
            invocation=str(row["id"]),
        )
    if not isinstance(entry.arguments, dict) or ctx.tools.validate(row["tool_name"], entry.arguments):
        work = UnitOfWork()
        failed = _error_result("invalid_decision", "the arguments no longer pass the tool's schema")
        work.invocation_updates.append(
            InvocationUpdate(id=row["id"], status="failed", result=failed, error=failed, updated_at=now)
        )
        work.event(
            "tool.call.failed",
            {
                "invocation": str(row["id"]),
                "call_id": row["call_id"],
                "tool": row["tool_name"],
                "result": failed,
                "executed": False,
            },
            now,
        )
        raise RerunConflict(
            "the approved call's arguments no longer pass its schema", work=work, invocation=str(row["id"])
        )
    current = ctx.approvals.current_hash(
        step_number=step_number,
        invocation_id=row["id"],
        tool=entry.spec,
        arguments=entry.arguments,
        kind=decision["kind"],
        presentation=decision["presentation"],
    )
    if current != decision["request_hash"]:
        return False
    try:
        verdict = ctx.policy.evaluate(row["tool_name"], entry.arguments)
    except Exception:  # fails closed to require_approval, which the grant is
        verdict = "require_approval"
    if verdict == "deny":
        raise RerunConflict(
            "policy now denies the approved re-run; the first attempt's outcome stays unknown",
            error_class="PolicyDenied",
            work=unknown,
            invocation=str(row["id"]),
        )
    return True


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
    rows = {r["call_id"]: r for r in ctx.store.invocations_for_step(step_number)}
    results = UnitOfWork()
    entries: list[_Entry] = []
    to_run: list[tuple[_Entry, dict]] = []
    invalidated: list[tuple[_Entry, dict]] = []
    now = ctx.clock.now()
    for index, call in enumerate(pending):
        req = ToolCallRequest(call_id=call["id"], name=call["name"], raw_arguments=call.get("arguments") or "")
        row = rows.get(call["id"])
        entry = _Entry(
            index=index, call=req, invocation_id=row["id"] if row else None, key=row["idempotency_key"] if row else ""
        )
        entries.append(entry)
        if row is None:
            entry.result = _error_result(
                "interrupted", "the process stopped before this call was recorded; it was not run"
            )
            entry.is_error = True
            continue
        status = row["status"]
        if status in ANSWERED and row["result"] is not None:
            entry.result = row["result"]
            entry.is_error = status != "completed"
            continue
        entry.spec = ctx.tools.spec(row["tool_name"])
        entry.arguments = row["arguments"]
        if status == "awaiting_approval" and row.get("suspended_kind") == "policy" and ctx.approvals is not None:
            decision = ctx.approvals.decision_for(row["id"])
            if decision is None or decision["status"] != "approved":
                raise UnknownOutcome(f"invocation {row['id']} is waiting for a decision")
            valid = entry.spec is not None and not ctx.tools.validate(row["tool_name"], entry.arguments)
            shown = (
                valid
                and ctx.approvals.current_hash(
                    step_number=step_number,
                    invocation_id=row["id"],
                    tool=entry.spec,
                    arguments=entry.arguments,
                    kind=decision["kind"],
                    presentation=decision["presentation"],
                )
                == decision["request_hash"]
            )
            if not shown:
                invalidated.append((entry, decision))
                continue
            status = "authorized"
        elif status == "authorized" and row["effect_sent_at"] is not None and ctx.approvals is not None:
            # A re-run grant (an earlier attempt started): re-check what was approved.
            decision = ctx.approvals.decision_for(row["id"])
            if decision is not None and decision["kind"] in RERUN_KINDS and decision["status"] == "approved":
                if not _recheck_grant(ctx, step_number, entry, row, decision):
                    invalidated.append((entry, decision))
                    continue
        if status != "authorized":
            raise UnknownOutcome(f"invocation {row['id']} is {status} with no recorded outcome")
        if entry.spec is None or ctx.tools.validate(row["tool_name"], entry.arguments):
            entry.result = _error_result("invalid_decision", "the tool or its schema changed; the call was not run")
            entry.is_error = True
            results.invocation_updates.append(
                InvocationUpdate(
                    id=entry.invocation_id, status="failed", result=entry.result, error=entry.result, updated_at=now
                )
            )
            results.event(
                "tool.call.failed",
                {
                    "invocation": str(entry.invocation_id),
                    "call_id": req.call_id,
                    "tool": req.name,
                    "result": entry.result,
                    "executed": False,
                },
                now,
            )
            continue
        to_run.append((entry, row))

    if invalidated:
        for entry, decision in invalidated:
            results.event(
                "approval.invalidated",
                {
                    "approval": str(decision["id"]),
                    "invocation": str(entry.invocation_id),
                    "reason": "the tool, its schema or the arguments changed since approval",
                },
                now,
            )
            results.approval_invalidations.append(decision["id"])
            if entry.spec is None or ctx.tools.validate(entry.call.name, entry.arguments):
                raise UnknownOutcome("an approved call can no longer run and cannot be asked again")
            kind = decision["kind"]
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
            results.event(
                "approval.requested",
                {
                    "approval": str(approval.id),
                    "invocation": str(entry.invocation_id),
                    "kind": kind,
                    "tool": entry.spec.name,
                    "request_hash": approval.request_hash,
                    "step": step_number,
                    "presentation": approval.presentation,
                },
                now,
            )
        return BatchResult(
            work=results,
            suspension=Suspension(
                kind=SuspensionKind.APPROVAL,
                invocation_ids=[e.invocation_id for e, _ in invalidated],
                approval_ids=[a.id for a in results.approval_inserts],
                details={"reason": "invalidated"},
            ),
        )

    late: list[dict[str, Any]] = []
    executed = 0
    stop: CancelReason | None = None
    for entry, row in to_run:
        effect_sent = row["effect_sent_at"] is not None
        if stop is not None:
            _cancel(ctx, results, entry, stop, effect_sent=effect_sent)
            continue
        ran, stop = _run_one(
            ctx,
            entry,
            step_number,
            (row["attempt"] or 0) + 1,
            results,
            late,
            effect_sent=effect_sent,
            prior_attempts=row.get("attempts"),
        )
        executed += ran
        if entry.unknown and stop is None:
            break
    if executed:
        ctx.run.usage = ctx.run.usage.model_copy(update={"tool_calls": ctx.run.usage.tool_calls + executed})
        results.usage = ctx.run.usage.model_dump(mode="json")
    unknown = [e.invocation_id for e, _ in to_run if e.unknown]
    if unknown and stop is None:
        return BatchResult(work=results, late=late, unknown=unknown)
    _append_results(ctx, entries)
    denied = [e for e in entries if e.is_error and isinstance(e.result, dict) and e.result.get("error") in DENIALS]
    return BatchResult(work=results, stop=stop, late=late, all_denied=bool(entries) and len(denied) == len(entries))
