"""Ports of the runtime core: the loop reaches the world only through these."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from runs.domain.records import ApprovalDecision, InvocationRecord, RecordedCall
from runs.domain.values import (
    BudgetScope,
    CancelReason,
    ModelRequest,
    ModelTurn,
    ModelUsage,
    RunLimits,
    RunUsage,
    ToolSpec,
)
from runs.domain.writes import ApprovalInsert, UnitOfWork


class Clock(Protocol):
    def now(self) -> datetime:
        """Return the current wall-clock time (aware, UTC)."""

    def monotonic(self) -> float:
        """Return a monotonic reading in seconds, for intervals and self-fencing."""

    def sleep(self, seconds: float) -> None:
        """Block for `seconds`."""


class IdFactory(Protocol):
    def new_id(self) -> UUID:
        """Return a fresh unique id."""


class CancellationToken(Protocol):
    @property
    def reason(self) -> CancelReason | None:
        """Why the token was set, or None while it is clear."""

    def cancel(self, reason: CancelReason) -> None:
        """Set the token; the first reason wins and it is never cleared."""

    def raise_if_cancelled(self) -> None:
        """Raise `RunCancelled` when the token is set."""

    def wait(self, timeout: float | None = None) -> CancelReason | None:
        """Block until the token is set or `timeout` passes; return the reason."""


class ModelProvider(Protocol):
    def complete(self, request: ModelRequest, token: CancellationToken) -> ModelTurn:
        """Make one model attempt; raise `ModelError` with its classification."""


class SentCommit(Protocol):
    def wait(self) -> object:
        """Block until the database has answered the commit sent; raise what
        `RunStore.commit` would have raised (`WorkerFenced`, a database error)."""


class RunStore(Protocol):
    """The hot-path repository: one fenced transaction per call."""

    def commit(self, work: UnitOfWork) -> object:  # (what an adapter returns is its own; the loop ignores it)
        """Open a transaction, run the fenced UPDATE of the run row first, apply
        `work`, commit. Raise `WorkerFenced` (after rolling back) if the fence
        affected zero rows."""

    def send(self, work: UnitOfWork) -> SentCommit:
        """Commit `work` as `commit` does, but return once it is sent: the
        caller runs what does not need it durable (read-only tools) while the
        database executes and flushes it, then calls `wait()` before anything
        that does. Nothing else may use the store or its connection between
        the two. An adapter that cannot overlap commits here and returns a
        settled handle."""

    def settle(self) -> None:
        """Wait for the unit `send` left in flight, if any (raise what its
        commit would have). Every other call of the store does this first."""

    def invocations_for_step(self, step_number: int) -> list[InvocationRecord]:
        """Read one step's invocation rows, to re-enter an open batch."""

    def mark_effect_sent(
        self,
        invocation_id: UUID,
        attempt: int,
        event_payload: dict[str, Any],
        at: datetime,
        *,
        before: UnitOfWork | None = None,
        policy_check: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        """Commit the watermark (`effect_sent_at`, `tool.call.started`) in one
        fenced transaction; raise `WorkerFenced` on zero rows. `before`: what
        the batch's earlier calls recorded (their outcomes), written first in
        the same transaction, so a known result is durable before the next
        call is sent. `policy_check`: for an approved call, given the tenant's
        policy floor read inside the transaction, returns the decision now;
        anything but `allow`/`require_approval` raises `PolicyChanged` and
        nothing is written."""


class LeaseMonitor(Protocol):
    def may_start_effect(self) -> bool:
        """True while the last successful heartbeat is within lease − interval
        (monotonic clock): the self-fence check made right before a side effect."""


class ToolRegistry(Protocol):
    def spec(self, name: str) -> ToolSpec | None:
        """Return the spec of a registered tool, or None."""

    def validate(self, name: str, arguments: Any) -> list[str]:
        """Return the schema errors of `arguments` (empty when valid)."""

    def execute(self, name: str, arguments: Any, context: Any) -> Any:
        """Run the tool; raise `ToolFailure` for an outcome the model should see."""

    def unavailable(self, name: str) -> tuple[str, str] | None:
        """For a tool with no spec: (code, message) when it is known and cannot be used now (an MCP server's
        tool that changed since the version pinned it: `tool_changed`), else None (`unknown_tool`)."""


class PolicyEngine(Protocol):
    def evaluate(self, tool_name: str, arguments: Any) -> str:
        """Return `allow`, `deny` or `require_approval`; fail closed on error."""

    def evaluate_under(self, tool_name: str, arguments: Any, floor: dict[str, Any] | None) -> str:
        """`evaluate` with the tenant floor given (read by the caller in its
        own transaction) instead of the engine's reader."""


class BudgetLedger(Protocol):
    limits: RunLimits

    def check(self, usage: RunUsage, scope: BudgetScope, *, step_number: int, now: datetime) -> None:
        """Raise `BudgetExceeded` if the run may not go on at this scope."""

    def record_model_usage(self, usage: RunUsage, model_usage: ModelUsage) -> RunUsage:
        """Return the new totals after one attempt; raise `BudgetExceeded` if over.
        The caller commits the totals in the transaction of the model call row."""

    def fit_tool_batch(self, usage: RunUsage, requested: int) -> int:
        """Return how many calls of a batch fit the remaining tool-call budget."""

    def child_caps(self, usage: RunUsage, count: int = 1) -> dict[str, int | float] | None:
        """Each of `count` children's share of what remains of the budget; None when too little remains."""

    def record_child_usage(self, usage: RunUsage, child: RunUsage) -> RunUsage:
        """Return the totals with a child run's usage added; raise `BudgetExceeded` if over."""

    def in_time_reserve(self, now: datetime) -> bool:
        """Whether `now` is inside the run's deadline synthesis reserve (ADR-0209)."""


class PrincipalCheck(Protocol):
    """Revalidates the principal a run acts for when the run resumes after an
    approval or input (the one exception to "resolved once per
    execution")."""

    def revoked(self, principal: Any) -> str | None:
        """Why `principal` may no longer act for the run (deactivated, deleted,
        removed from the run's tenant), or None while it still may."""


class RecordedCalls(Protocol):
    """What the run a replay replays did: its calls, read a step at a time
    (the replay answers each proposal from them and executes nothing)."""

    def at_step(self, step_number: int) -> list[RecordedCall]:
        """The calls made at this step of the original's lineage, in call order (empty: none)."""


class ApprovalGate(Protocol):
    """Hash-bound approvals: builds the rows the pipeline commits
    and reads decisions back when a run re-enters an open batch."""

    def request(
        self,
        *,
        step_number: int,
        invocation_id: UUID,
        tool: ToolSpec,
        arguments: Any,
        kind: str,
        at: datetime,
        call_index: int | None = None,
    ) -> ApprovalInsert:
        """A new pending approval for one call (`call_index`: its position in
        the batch), its hash bound to what it presents."""

    def request_again(
        self,
        *,
        step_number: int,
        invocation_id: UUID,
        tool: ToolSpec,
        arguments: Any,
        previous: ApprovalDecision,
        at: datetime,
    ) -> ApprovalInsert:
        """A new approval of an invalidated re-run grant's kind, showing the current spec."""

    def current_hash(
        self,
        *,
        step_number: int,
        invocation_id: UUID,
        tool: ToolSpec,
        arguments: Any,
        kind: str,
        presentation: dict[str, Any],
    ) -> str:
        """The request hash of this call as it would be presented now."""

    def decision_for(self, invocation_id: UUID) -> ApprovalDecision | None:
        """The newest approval of the invocation, or None."""


FaultHook = Callable[[str], None]


class Span(Protocol):
    def set(self, key: str, value: Any) -> None:
        """Add an attribute to the span."""


class Tracer(Protocol):
    """Spans of the run's trace tree. `under="step"` parents a span on the current
    `run.step` rather than on whatever span is open (context.build is the
    step's child even while model.invoke is open)."""

    def span(
        self, name: str, attributes: dict[str, Any] | None = None, *, under: str | None = None
    ) -> AbstractContextManager[Span]:
        """A context manager yielding a `Span`."""

    def begin_step(self, step_number: int, attributes: dict[str, Any] | None = None) -> None:
        """Open `run.step` (closing the previous one); it stays current until the next or `end_step`."""

    def set_step(self, key: str, value: Any) -> None:
        """Add an attribute to the open `run.step`."""

    def end_step(self) -> None:
        """Close the open `run.step`, if any."""
