"""Frozen records the ports hand the domain: rows read back from the store,
typed, never ORM `.values()` dicts read by column name. No Django here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class InvocationRecord:
    """One `tool_invocations` row, as the pipeline needs it to re-enter an open batch."""

    id: UUID
    call_id: str
    call_index: int
    tool_name: str
    arguments: Any
    status: str  # an InvocationStatus value
    result: Any
    effect_sent_at: datetime | None
    attempt: int | None
    read_only: bool
    idempotency_key: str
    suspended_kind: str | None = None
    attempts: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """The newest approval of an invocation, as the pipeline re-checks it."""

    id: UUID
    status: str  # an ApprovalStatus value
    kind: str
    request_hash: str
    presentation: dict[str, Any]
    capability: dict[str, Any]
    decided_at: datetime | None = None  # a call approved before the run's deadline is exempt from its reserve


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call another run made at some position, as a fork's approval card
    and a replay compare against it: what was proposed and how it ended."""

    run_id: UUID  # the run that made it (for a step before a fork's, the run the fork was taken from)
    invocation_id: UUID
    step_number: int
    call_index: int
    tool_name: str
    arguments: Any  # the parsed arguments, or None when they were not a JSON object
    raw_arguments: str
    status: str  # an InvocationStatus value
    result: Any
    outcome: str | None
    started: bool  # a side effect's watermark was set: it may have taken effect
