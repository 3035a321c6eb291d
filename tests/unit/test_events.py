"""The event vocabulary's builders write the payloads the wire has always
carried (DESIGN §16): the same keys, the same values, plain strings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from runs.domain import events
from runs.domain.events import EventType
from runs.domain.values import InvocationOutcome, InvocationStatus
from runs.domain.writes import CheckpointInsert

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
APPROVAL, INVOCATION = uuid.UUID(int=1), uuid.UUID(int=2)


def wire(event) -> tuple[str, dict]:
    """What the store writes: the type as text and the payload as JSON."""
    return json.loads(json.dumps(event.type)), json.loads(json.dumps(event.payload))


def test_approval_requested_carries_what_the_approval_card_is_built_from():
    event = events.approval_requested(
        approval_id=APPROVAL,
        invocation_id=INVOCATION,
        kind="policy",
        tool="http_post",
        request_hash="ab" * 32,
        step=3,
        presentation={"tool": "http_post"},
        at=AT,
    )
    assert wire(event) == (
        "approval.requested",
        {
            "approval": str(APPROVAL),
            "invocation": str(INVOCATION),
            "kind": "policy",
            "tool": "http_post",
            "request_hash": "ab" * 32,
            "step": 3,
            "presentation": {"tool": "http_post"},
        },
    )
    assert event.occurred_at == AT


def test_a_call_not_run_is_a_failed_call_not_executed_with_its_outcome_when_given():
    plain = events.call_not_run(invocation_id=INVOCATION, call_id="c1", tool="echo", result={"error": "x"}, at=AT)
    assert wire(plain) == (
        "tool.call.failed",
        {"invocation": str(INVOCATION), "call_id": "c1", "tool": "echo", "result": {"error": "x"}, "executed": False},
    )
    refused = events.call_not_run(
        invocation_id=INVOCATION, call_id="c1", tool="echo", result={}, at=AT, outcome=InvocationOutcome.FAILED
    )
    assert wire(refused)[1]["outcome"] == "failed"
    assert list(wire(refused)[1]) == ["invocation", "call_id", "tool", "result", "executed", "outcome"]


def test_checkpointed_names_the_row_it_accompanies():
    row = CheckpointInsert(version=9, full=True, base_version=None, trigger="suspension", state={}, created_at=AT)
    event = events.checkpointed(row)
    assert wire(event) == ("run.checkpointed", {"version": 9, "trigger": "suspension", "full": True})
    assert event.occurred_at == AT


def test_a_cancelled_call_says_unknown_only_when_an_earlier_attempt_started():
    fresh = events.call_cancelled(invocation_id=INVOCATION, call_id="c1", tool="post", reason="requested", at=AT)
    started = events.call_cancelled(
        invocation_id=INVOCATION, call_id="c1", tool="post", reason="requested", at=AT, outcome_unknown=True
    )
    assert "outcome" not in fresh.payload
    assert wire(started)[1]["outcome"] == "unknown"
    assert wire(started)[0] == "tool.run_cancelled"


def test_enum_values_are_plain_strings_on_the_wire():
    assert json.dumps({"type": EventType.RUN_FAILED, "status": InvocationStatus.AWAITING_APPROVAL}) == (
        '{"type": "run.failed", "status": "awaiting_approval"}'
    )
    assert EventType.RUN_FAILED == "run.failed" and str(EventType.RUN_FAILED) == "run.failed"
