"""The writes of one fenced transaction, collected in memory, then committed.

A step's transactions (DESIGN §6) are built as a `UnitOfWork` by the loop and
the pipeline and handed to `RunStore.commit`, which opens one transaction,
runs the fenced UPDATE of the run row first and then every insert/update
below. Plain dataclasses: this is the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID


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
    outcome: str | None = None  # succeeded | failed | uncertain (DESIGN §7 step 11)
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


@dataclass(slots=True)
class UnitOfWork:
    """Everything one fenced transaction writes, in order."""

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
        )
