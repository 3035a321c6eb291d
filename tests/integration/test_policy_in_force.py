"""Every approved call is judged again against the policy in force when it
runs: the pinned version's policy and the tenant's current floor (a side
effect's floor read in the transaction that marks it executing). A decision
that changed to deny since the approval is a denied result the model sees,
`approval.invalidated` says why, and nothing is sent; a floor that still
allows, or still asks for approval, lets the approved call run."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from runs.models import Event, Run, Tenant, ToolInvocation
from runs.runtime.executor import run_drive

pytestmark = pytest.mark.django_db(transaction=True)

ASK = {"default": "allow", "rules": [{"tool": "*", "decision": "require_approval"}]}


def floor(tenant, decision, tool):
    Tenant.objects.filter(id=tenant.id).update(
        policy_floor={"default": "allow", "rules": [{"tool": tool, "decision": decision}]}
    )


def approved(load_agent, submit, operator, call):
    load_agent(turns=[{"tool_calls": [call]}, {"text": "after"}], tools=(call["name"],), policy=ASK)
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    return run, approval


def denied_after_approval(run, approval):
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED" and row.final_message == "after"
    approval.refresh_from_db()
    assert approval.status == "invalidated"
    event = Event.objects.get(run=run, type="approval.invalidated")
    assert event.payload["approval"] == str(approval.id) and "'deny'" in event.payload["reason"]
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.outcome == "failed" and inv.result["error"] == "denied_by_policy"
    assert inv.effect_sent_at is None
    tool = [m for m in checkpoint_latest(run.id).conversation if m["role"] == "tool"]
    assert len(tool) == 1 and "denied_by_policy" in tool[0]["content"] and tool[0]["is_error"]


def test_an_approved_side_effect_the_floor_now_denies_is_not_sent(load_agent, submit, sink, operator, tenant):
    run, approval = approved(
        load_agent, submit, operator, {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 9}}}
    )
    floor(tenant, "deny", "http_post")
    run_drive(run_id=run.id)
    denied_after_approval(run, approval)
    assert sink.count() == 0
    assert not Event.objects.filter(run=run, type="tool.call.started").exists()  # no watermark either


def test_an_approved_read_only_call_the_floor_now_denies_is_not_run(load_agent, submit, sink, operator, tenant):
    run, approval = approved(load_agent, submit, operator, {"name": "http_get", "arguments": {"url": sink.url}})
    floor(tenant, "deny", "*")
    run_drive(run_id=run.id)
    denied_after_approval(run, approval)
    assert sink.gets == 0


@pytest.mark.parametrize("decision", ["allow", "require_approval"])
def test_a_floor_that_still_allows_or_asks_lets_the_approved_call_run(
    load_agent, submit, sink, operator, tenant, decision
):
    run, approval = approved(
        load_agent, submit, operator, {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 9}}}
    )
    floor(tenant, decision, "http_post")  # require_approval again: the approval already given is that approval
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED" and sink.count() == 1
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert not Event.objects.filter(run=run, type="approval.invalidated").exists()
