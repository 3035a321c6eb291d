"""Value objects of the runtime core. No Django imports here."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runs.domain.limits import BY_NAME


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunStatus(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    WAITING_FOR_USER = "WAITING_FOR_USER"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
WAITING_STATUSES = (RunStatus.WAITING_FOR_APPROVAL, RunStatus.WAITING_FOR_USER)
LIVE_STATUSES = (RunStatus.RUNNING, RunStatus.WAITING_FOR_APPROVAL, RunStatus.WAITING_FOR_USER)


class InvocationStatus(StrEnum):
    """`tool_invocations.status`: the model's `STATUSES` choices derive from it."""

    PROPOSED = "proposed"
    AUTHORIZED = "authorized"
    EXECUTING = "executing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    AWAITING_APPROVAL = "awaiting_approval"
    UNCERTAIN = "uncertain"


class InvocationOutcome(StrEnum):
    """How a call's last attempt ended (pipeline step 11): `tool_invocations.outcome`."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNCERTAIN = "uncertain"


class ApprovalStatus(StrEnum):
    """`approvals.status`."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"
    CANCELLED = "cancelled"
    CONFIRMED = "confirmed"


class ModelCallStatus(StrEnum):
    """`model_calls.status`: one row per model attempt."""

    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"


def choices(enum: type[StrEnum]) -> list[tuple[str, str]]:
    """Django `choices` for a vocabulary enum: each value as its own label."""
    return [(member.value, member.value) for member in enum]


class FailureReason(StrEnum):
    MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MAX_STEPS_EXCEEDED = "max_steps_exceeded"
    TOOL_LOOP_DETECTED = "tool_loop_detected"
    REPEATED_DENIAL = "repeated_denial"
    APPROVAL_EXPIRED = "approval_expired"
    INPUT_DEADLINE_EXCEEDED = "input_deadline_exceeded"
    CONTEXT_OVERFLOW = "context_overflow"
    MODEL_PERMANENT_ERROR = "model_permanent_error"
    EMPTY_MODEL_TURN = "empty_model_turn"
    AUTHORIZATION_ERROR = "authorization_error"
    CHILD_RUN_FAILED = "child_run_failed"
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    INTERNAL_ERROR = "internal_error"
    RECONCILE_CONFLICT = "reconcile_conflict"
    OPERATOR_REJECTED = "operator_rejected"
    PRINCIPAL_REVOKED = "principal_revoked"  # the submitter lost access while the run waited
    AGENT_VERSION_MISSING = "agent_version_missing"  # the pinned version is gone; never falls back
    ENDPOINT_NOT_ALLOWED = "endpoint_not_allowed"  # the tenant no longer allows the agent's model endpoint
    REPLAY_DIVERGED = "replay_diverged"  # a replay proposed what its original did not (or met an unknown outcome)


class Principal(Frozen):
    """Who a run acts for : the submitting
    user and the scope set stamped on the run at submission (its permissions
    then), or the system (a shell command, no user). Resolved once per
    execution and handed to every tool as `ctx.principal`."""

    kind: str  # "user" | "system"
    tenant_id: UUID
    user_id: int | None = None
    username: str | None = None
    scopes: frozenset[str] = frozenset()

    @property
    def is_user(self) -> bool:
        return self.kind == "user"


class RunFailure(Frozen):
    reason: FailureReason
    error_class: str
    message: str
    step_number: int | None = None
    attempt_number: int | None = None
    occurred_at: datetime
    details: dict[str, Any] = Field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class ModelUsage(Frozen):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0


class RunUsage(Frozen):
    """Five token classes, cost and counters; a rollup of `model_calls`."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    tool_calls: int = 0
    steps: int = 0

    def add_model(self, usage: ModelUsage, *, calls: int = 0) -> RunUsage:
        """This usage plus a model call's tokens and cost (and `calls` more model calls)."""
        return self.model_copy(
            update={
                "model_calls": self.model_calls + calls,
                "input_tokens": self.input_tokens + usage.input_tokens,
                "output_tokens": self.output_tokens + usage.output_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens + usage.cache_read_input_tokens,
                "cache_creation_input_tokens": self.cache_creation_input_tokens + usage.cache_creation_input_tokens,
                "reasoning_tokens": self.reasoning_tokens + usage.reasoning_tokens,
                "cost_usd": round(self.cost_usd + usage.cost_usd, 8),
            }
        )


def _limit(name: str) -> Any:
    """The field of one limit: its default and lower bounds from the limits table."""
    limit = BY_NAME[name]
    return Field(limit.default, **limit.bounds(upper=False))


class RunLimits(Frozen):
    """A run's limits; names, defaults and bounds come from `runs.domain.limits.LIMITS`
    (tests/unit/test_limits.py checks the fields are exactly the table's)."""

    max_steps: int = _limit("max_steps")
    max_model_calls: int = _limit("max_model_calls")
    max_tool_calls: int = _limit("max_tool_calls")
    max_input_tokens: int | None = _limit("max_input_tokens")
    max_output_tokens: int | None = _limit("max_output_tokens")
    max_cost_usd: float | None = _limit("max_cost_usd")
    deadline_seconds: float | None = _limit("deadline_seconds")
    synthesis_reserve_steps: int = _limit("synthesis_reserve_steps")
    synthesis_reserve_model_calls: int = _limit("synthesis_reserve_model_calls")
    synthesis_reserve_tool_calls: int = _limit("synthesis_reserve_tool_calls")
    synthesis_reserve_cost_usd: float = _limit("synthesis_reserve_cost_usd")

    @model_validator(mode="before")
    @classmethod
    def _reserves_below_limits(cls, data: Any) -> Any:
        """A reserve as large as its limit would forbid tools from the first call: it is dropped."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for reserve, limit in (
            ("synthesis_reserve_model_calls", "max_model_calls"),
            ("synthesis_reserve_tool_calls", "max_tool_calls"),
            ("synthesis_reserve_steps", "max_steps"),
        ):
            r = data.get(reserve, cls.model_fields[reserve].default)
            lim = data.get(limit, cls.model_fields[limit].default)
            if isinstance(r, int) and isinstance(lim, int) and r and r >= lim:
                data[reserve] = 0
        return data


class BudgetScope(StrEnum):
    ADMISSION = "admission"
    STEP = "step"
    ATTEMPT = "attempt"
    TOOL_CALL = "tool_call"


class Step(Frozen):
    """One model call plus the full disposition of its tool calls.

    Its persisted identity is `(run_id, step_number)` on `model_calls`.
    """

    run_id: UUID
    step_number: int = Field(ge=1)
    started_at: datetime
    attempt_count: int = 0
    tool_call_count: int = 0
    compactions: int = 0


class OutcomeKind(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    FENCED = "fenced"
    YIELDED = "yielded"
    UNKNOWN = "unknown"  # a side-effect call ended uncertain: the reconciler or an operator decides
    LOST = "lost"  # the slice lost its database: nothing more is written, the lease lapses, a takeover resumes


class SuspensionKind(StrEnum):
    APPROVAL = "approval"
    USER = "user"
    CHILD_RUN = "child_run"


class ChildRunRequest(Frozen):
    """One child run a `delegate_run` call starts: its id (from
    the IdFactory), the parent's invocation it answers, the agent and input
    the model asked for, and `caps` — what remains of the parent's budget,
    the most each of the child's own limits may be."""

    run_id: UUID
    invocation_id: UUID
    agent: str
    input: str
    caps: dict[str, int | float] = Field(default_factory=dict)


class Suspension(Frozen):
    kind: SuspensionKind
    invocation_ids: list[UUID] = Field(default_factory=list)
    approval_ids: list[UUID] = Field(default_factory=list)
    question: str | None = None
    expires_at: datetime | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    children: list[ChildRunRequest] = Field(default_factory=list)  # kind CHILD_RUN: the runs to start


class CancelReason(StrEnum):
    REQUESTED = "requested"
    DEADLINE = "deadline"
    FENCED = "fenced"


class StopReason(StrEnum):
    END_TURN = "end_turn"
    TOOL_CALLS = "tool_calls"
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"


class ToolCallRequest(Frozen):
    """A call as the model proposed it: arguments are raw text until parsed."""

    call_id: str
    name: str
    raw_arguments: str


class ModelTurn(Frozen):
    text: str | None = None
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    stop_reason: StopReason = StopReason.END_TURN
    usage: ModelUsage = Field(default_factory=ModelUsage)

    @property
    def is_empty(self) -> bool:
        return not self.tool_calls and not (self.text or "").strip() and self.stop_reason != StopReason.MAX_TOKENS


class ModelRequest(Frozen):
    run_id: UUID
    step_number: int
    attempt_number: int
    instructions: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: str = "auto"


class ToolSpec(Frozen):
    """What the registry knows about a tool; hashed into approvals."""

    name: str
    description: str = ""
    parameters: dict[str, Any]
    schema_version: str = "1"
    read_only: bool
    side_effect: str = "none"
    timeout_seconds: float = 30.0
    control: str | None = None  # the suspension a control tool causes ("ask_user", "delegate"); None otherwise


class RunOutcome(BaseModel):
    """What `run_loop` computed; `finalize` performs it."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    kind: OutcomeKind
    final_message: str | None = None
    failure: RunFailure | None = None
    suspension: Suspension | None = None
    result: Any = None
    pending: Any = None  # a UnitOfWork whose writes finalize commits with the transition
    late: dict[str, Any] | None = None  # a tool outcome that finished after the lease was lost
