"""The writes of one fenced transaction, collected in memory, then committed.

A step's transactions are built as a `UnitOfWork` by the loop and
the pipeline and handed to `RunStore.commit`, which opens one transaction,
runs the fenced UPDATE of the run row first and then every insert/update
below. Plain dataclasses: this is the hot path.

What else joins the transaction is data too: finalize's `Transition` of the
run row, and the unit's *intents* (ring the run's doorbell, start the
suspension's children, join a child's parent), each run by the one handler
the composition root registers for its type (runs/runtime/wiring.py). The
store raises two intents of its own around the events it appends: their
hooks' and webhooks' deliveries (`EnqueueDeliveries`, in the transaction)
and the live pages' wake-up (`Wake`, once it has committed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

from runs.domain.values import Suspension


@dataclass(slots=True)
class EventWrite:
    type: str
    payload: dict[str, Any]
    occurred_at: datetime
    sequence: int | None = None  # set by the store once the event is committed


@dataclass(slots=True)
class ModelCallInsert:
    id: UUID
    step_number: int
    attempt_number: int
    started_at: datetime


@dataclass(slots=True)
class ModelCallFinish:
    id: UUID
    status: str  # completed | failed
    usage: dict[str, Any]
    stop_reason: str | None
    stream_had_output: bool
    error: dict[str, Any] | None
    prefix_sha256: str | None
    finished_at: datetime


@dataclass(slots=True)
class InvocationInsert:
    id: UUID
    step_number: int
    call_index: int
    call_id: str
    tool_name: str
    arguments: Any
    raw_arguments: str
    idempotency_key: str
    status: str
    read_only: bool
    side_effect: str
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: datetime | None = None
    suspended_kind: str | None = None
    outcome: str | None = None


@dataclass(slots=True)
class InvocationUpdate:
    id: UUID
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    attempt: int | None = None
    suspended_kind: str | None = None
    updated_at: datetime | None = None
    outcome: str | None = None  # succeeded | failed | uncertain (pipeline step 11)
    attempts: list[dict[str, Any]] | None = None  # the whole per-attempt history, replacing the row's
    clear_error: bool = False  # a completed call keeps no stale error


@dataclass(slots=True)
class CheckpointInsert:
    """A checkpoint row in its materialised form: `state` holds the
    conversation items themselves (`conversation` in a full row, `items` in a
    delta). The store writes the stored form, references to the events that
    hold them (runs.domain.stored_form): `prefix` is the stored form of the
    first items of a full row, as (parts, how many items they cover), and
    `sources` runs beside the items after those: for each, the event that
    holds it (an `EventWrite`, or a committed sequence) or None."""

    version: int
    full: bool
    base_version: int | None
    trigger: str
    state: dict[str, Any]
    created_at: datetime
    sources: list[Any] | None = None
    prefix: tuple[list[Any], int] | None = None


@dataclass(slots=True)
class ApprovalInsert:
    id: UUID
    invocation_id: UUID | None
    kind: str
    request_hash: str
    capability: dict[str, Any]
    presentation: dict[str, Any]
    expires_at: datetime | None
    created_at: datetime


@dataclass(frozen=True)
class Transition:
    """What finalize's fenced UPDATE changes on the run row, as a value (only
    finalize makes one: the terminal writer).

    Columns set: `status` (always), `lease_owner` and `lease_expires_at`
    (NULL when `release_lease`), and `final_message`, `failure`, `result`
    when not None (a RUNNING run has none of them yet). The guard is
    `GUARD`: the row is ours (owner and epoch) and RUNNING; zero rows
    matched means fenced, and nothing of the unit is written."""

    status: str
    release_lease: bool
    final_message: str | None = None
    failure: dict[str, Any] | None = None
    result: Any = None

    GUARD: ClassVar[str] = "id = run AND lease_owner = owner AND lease_epoch = epoch AND status = 'RUNNING'"
    STATUSES: ClassVar[frozenset[str]] = frozenset(
        {"QUEUED", "WAITING_FOR_USER", "WAITING_FOR_APPROVAL", "COMPLETED", "FAILED", "CANCELLED"}
    )

    def __post_init__(self) -> None:
        if self.status not in self.STATUSES:
            raise ValueError(f"finalize cannot move a run to {self.status!r}")


# -- intents: what joins a commit besides its rows ------------------------------------------------------


class Intent:
    """Something a commit does besides writing its rows, as a value. Each type
    has exactly one handler, registered at start-up by the composition root;
    the store runs it in the transaction (last, after the unit's writes,
    in the order the unit carries them) and knows nothing of what it does."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class RingDoorbell(Intent):
    """The run's `drive_run` doorbell, enqueued in the transaction that made it
    runnable (a yield back to the queue): no doorbell for a transition that
    did not commit, none lost for one that did."""

    run_id: UUID


@dataclass(frozen=True, slots=True)
class StartChildren(Intent):
    """The suspension's child runs, started in the transaction that parks their
    parent (after its fenced transition: a fenced worker starts none)."""

    parent_id: UUID
    suspension: Suspension
    now: datetime


@dataclass(frozen=True, slots=True)
class JoinParent(Intent):
    """A child's end joins its parent in the same transaction: the parent's row
    is locked first, ahead of the child's own fence (the family's lock order,
    ancestor before descendant), and, for a run that has a parent, the join
    runs last."""

    run_id: UUID
    now: datetime


@dataclass(frozen=True, slots=True)
class EnqueueDeliveries(Intent):
    """The hooks' and webhooks' deliveries of `events` (and the tasks that ring
    them), written in the transaction that appends the events, once they have
    their `sequences`. The store raises it for every batch of events that
    something announces."""

    tenant_id: UUID
    run_id: UUID | None
    events: tuple[EventWrite, ...]
    sequences: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wake(Intent):
    """Live pages of the run and of its tenant have news: a hint sent once the
    transaction that wrote the events has committed (pages read the table)."""

    run_id: UUID | None
    tenant_id: UUID


@dataclass(slots=True)
class UnitOfWork:
    """Everything one fenced transaction writes, in order; then its intents."""

    usage: dict[str, Any] | None = None
    step_count: int | None = None
    model_call_inserts: list[ModelCallInsert] = field(default_factory=list)
    model_call_finishes: list[ModelCallFinish] = field(default_factory=list)
    invocation_inserts: list[InvocationInsert] = field(default_factory=list)
    invocation_updates: list[InvocationUpdate] = field(default_factory=list)
    checkpoint: CheckpointInsert | None = None
    approval_inserts: list[ApprovalInsert] = field(default_factory=list)
    approval_invalidations: list[UUID] = field(default_factory=list)  # approved grants that no longer hold
    events: list[EventWrite] = field(default_factory=list)
    transition: Transition | None = None  # the run row's change: finalize's unit only
    intents: list[Intent] = field(default_factory=list)  # run last in the transaction, in order

    def event(self, type_: str, payload: dict[str, Any], at: datetime) -> EventWrite:
        event = EventWrite(type_, payload, at)
        self.events.append(event)
        return event

    def is_empty(self) -> bool:
        return not (
            self.usage is not None
            or self.step_count is not None
            or self.model_call_inserts
            or self.model_call_finishes
            or self.invocation_inserts
            or self.invocation_updates
            or self.checkpoint
            or self.approval_inserts
            or self.approval_invalidations
            or self.events
            or self.transition is not None
            or self.intents
        )
