"""Where two features meet, through a real `qcluster` and a real HTTP sink:

- a cancel that lands while a side effect's request is in flight does not cut
  it short: the call completes, its answer is in the log before
  `run.cancelled`, it was sent once, and the batch's next call is cancelled;
- an approval does not outlive the policy it was granted under: approved,
  then the tenant's floor set to deny the tool, the resumed run sends
  nothing, the approval is invalidated with the reason and the model sees
  `denied_by_policy`.
"""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from checkpoints.repository import checkpoint_latest
from runs.models import Event, Run, Tenant, ToolInvocation
from runs.services.lifecycle import run_cancel
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def row(run):
    return Run.objects.get(id=run.id)


def post(sink, amount):
    return {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": amount}}}


def test_a_cancel_while_a_side_effect_is_in_flight_waits_for_its_answer_and_keeps_it(cluster, load_agent, submit, sink):
    sink.behaviours = ["delay:60"]  # the first POST's answer is held until `release`
    load_agent(turns=[{"tool_calls": [post(sink, 5), post(sink, 7)]}, {"text": "never"}], tools=("http_post",))
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit()
    wait_for(lambda: sink.count() == 1, timeout=60, message=f"the first POST to arrive\n{c.output()[-3000:]}")

    assert run_cancel(run=run, by="alice") == "RUNNING"
    asked = row(run)
    # The worker learns of the cancel with its next heartbeat (the renew reads cancel_requested_at): once the
    # lease was renewed after the request, the run's token is set while the request is still unanswered.
    wait_for(
        lambda: row(run).lease_expires_at > asked.lease_expires_at,
        timeout=30,
        message="a heartbeat after the cancel request",
    )
    assert row(run).status == "RUNNING" and sink.count() == 1
    sink.release.set()  # only now does the answer come back

    wait_for(lambda: row(run).status == "CANCELLED", timeout=60, message=f"the cancel\n{c.output()[-3000:]}")
    assert sink.count() == 1  # sent once; the batch's second call never left
    first, second = ToolInvocation.objects.filter(run=run).order_by("call_index")
    assert (first.status, first.outcome) == ("completed", "succeeded")
    assert first.result["status"] == 200 and first.result["json"] == {"ok": True}
    assert second.status == "cancelled" and second.effect_sent_at is None
    types = list(Event.objects.filter(run=run).order_by("sequence").values_list("type", flat=True))
    assert types.index("tool.call.completed") < types.index("run.cancelled")
    assert "tool.run_cancelled" in types
    assert not Approval.objects.filter(run=run).exists()  # nothing was left unknown: nobody needs asking


def test_an_approval_granted_under_a_looser_floor_sends_nothing_once_the_floor_denies(
    cluster, load_agent, submit, sink, operator, tenant
):
    load_agent(
        turns=[{"tool_calls": [post(sink, 5)]}, {"text": "as you wish"}],
        tools=("http_post",),
        policy={"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]},
    )
    env = dict(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    c = cluster(**env)
    run = submit()
    wait_for(
        lambda: row(run).status == "WAITING_FOR_APPROVAL", timeout=60, message=f"the approval\n{c.output()[-3000:]}"
    )
    c.stop()  # no worker while the decision and the floor change land, in that order

    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    Tenant.objects.filter(id=tenant.id).update(
        policy_floor={"default": "allow", "rules": [{"tool": "http_post", "decision": "deny"}]}
    )
    c = cluster(**env)
    wait_for(lambda: row(run).status == "COMPLETED", timeout=60, message=f"the run to end\n{c.output()[-3000:]}")

    assert sink.count() == 0
    approval.refresh_from_db()
    assert approval.status == "invalidated"
    invalidated = Event.objects.get(run=run, type="approval.invalidated")
    assert invalidated.payload["approval"] == str(approval.id) and "deny" in invalidated.payload["reason"]
    inv = ToolInvocation.objects.get(run=run)
    assert inv.status == "failed" and inv.effect_sent_at is None and inv.result["error"] == "denied_by_policy"
    tool_messages = [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]
    assert len(tool_messages) == 1 and "denied_by_policy" in tool_messages[0]["content"]
