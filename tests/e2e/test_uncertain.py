"""Issue 11: an unknown outcome without any process dying, end to end through a
real `qcluster` and a real HTTP server that takes a POST and never answers it
(closes the connection, or answers only after the tool's timeout).

The request left, so the call may have taken effect: the run must not hand
the model a failure to retry under a new key. It waits on an
`uncertain_side_effect` approval; approve sends the same request once more
with the same Idempotency-Key, confirm sends nothing, reject ends the run."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_confirm, approval_decide
from checkpoints.repository import checkpoint_latest
from runs.models import Event, ModelCall, Run, ToolInvocation
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# `close`: the server reads the POST and closes the connection with no answer.
# `delay`: it answers 5 s later; the call's own timeout is 0.5 s (a read timeout).
MODES = {"close": ("close", {}), "read_timeout": ("delay:5", {"timeout_seconds": 0.5})}


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


@pytest.fixture
def parked(cluster, load_agent, submit, sink):
    """Start a cluster, submit a run whose only POST goes unanswered, and wait
    until it parks on its uncertain_side_effect approval."""

    def start(mode: str):
        behaviour, extra = MODES[mode]
        sink.behaviours = [behaviour]
        load_agent(
            turns=[
                {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}, **extra}}]},
                {"text": "paid"},
            ],
            tools=("http_post",),
        )
        c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
        run = submit()
        wait_for(
            lambda: status(run) == "WAITING_FOR_APPROVAL", timeout=60, message=f"the run to park\n{c.output()[-3000:]}"
        )
        return run

    return start


def check_parked(run, sink):
    """What every mode shares once the run waits: one send, an uncertain row,
    an approval that says so, and a model that was told nothing."""
    assert sink.count() == 1
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.result, inv.attempt) == ("uncertain", "uncertain", None, 1)
    assert inv.error["uncertain"] is True
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "uncertain_side_effect"
    p = approval.presentation
    assert p["tool"] == "http_post" and p["arguments"]["json"] == {"amount": 5} and p["side_effect"] == "external_write"
    assert p["error"]["error"] in ("connection_lost", "timeout")
    assert "sent" in p["notice"] and "unknown" in p["notice"]
    # No second model call: the model has not seen a result for this call.
    assert not ModelCall.objects.filter(run=run, step_number=2).exists()
    failed = Event.objects.get(run=run, type="tool.call.failed")
    assert failed.payload["outcome"] == "uncertain" and failed.payload["awaiting_decision"] is True
    row = Run.objects.get(id=run.id)
    assert row.lease_owner is None
    return inv, approval


@pytest.mark.parametrize("mode", sorted(MODES))
def test_approve_sends_the_same_request_once_more_with_the_same_key(parked, sink, operator, mode):
    run = parked(mode)
    inv, approval = check_parked(run, sink)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after approval")
    assert sink.count() == 2
    assert [s["key"] for s in sink.sends] == [inv.idempotency_key, inv.idempotency_key]
    assert [s["attempt"] for s in sink.sends] == ["1", "2"]
    assert Run.objects.get(id=run.id).final_message == "paid"
    # One consistent record (item 7): attempt 1 unknown, attempt 2 succeeded, no stale error.
    inv.refresh_from_db()
    assert (inv.status, inv.outcome, inv.error, inv.attempt) == ("completed", "succeeded", None, 2)
    assert [(a["attempt"], a["outcome"]) for a in inv.attempts] == [(1, "uncertain"), (2, "succeeded")]
    results = [
        (e.type, e.payload["attempt"], e.payload["outcome"])
        for e in Event.objects.filter(run=run, type__in=("tool.call.failed", "tool.call.completed")).order_by(
            "sequence"
        )
    ]
    assert results == [("tool.call.failed", 1, "uncertain"), ("tool.call.completed", 2, "succeeded")]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_confirm_sends_nothing_and_the_model_sees_the_confirmation(parked, sink, operator, mode):
    run = parked(mode)
    inv, approval = check_parked(run, sink)
    approval_confirm(
        user=operator,
        approval_id=approval.id,
        request_hash=approval.request_hash,
        took_effect=True,
        reason="the ledger shows the payment",
        via="api",
    )
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after confirmation")
    assert sink.count() == 1
    approval.refresh_from_db()
    assert approval.status == "confirmed"
    resolved = Event.objects.get(run=run, type="approval.resolved")
    assert resolved.payload["decision"] == "confirmed" and resolved.payload["took_effect"] is True
    inv.refresh_from_db()
    assert (inv.status, inv.outcome, inv.error, inv.attempt) == ("completed", "succeeded", None, 1)
    assert (
        inv.result["outcome"] == "confirmed"
        and inv.result["took_effect"] is True
        and inv.result["confirmed_by"] == "op"
    )
    tool_messages = [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]
    assert len(tool_messages) == 1 and '"confirmed"' in tool_messages[0]["content"] and not tool_messages[0]["is_error"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_reject_ends_the_run_failed_and_sends_nothing_more(parked, sink, operator, mode):
    run = parked(mode)
    _, approval = check_parked(run, sink)
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    assert status(run) == "FAILED"
    assert Run.objects.get(id=run.id).failure["reason"] == "operator_rejected"
    assert sink.count() == 1
    assert not ModelCall.objects.filter(run=run, step_number=2).exists()
