"""Nobody escapes through delegation (issue 34 items 1-3), through a real
`qcluster`: children started together share their parent's remaining budget
(reserved, never each given all of it) and their usage is the parent's too;
they count against the tenant's active-run quota in the transaction that
starts them; and a child is never less restricted than its ancestors."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from runs.models import Run, Tenant, ToolInvocation
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

CHILDREN = 6


def status(run_id) -> str:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def lead(load_agent, agent: str, n: int = CHILDREN, **extra):
    calls = [{"name": "delegate_run", "arguments": {"agent": agent, "input": f"part {i}"}} for i in range(n)]
    return load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=[agent],
        turns=[{"tool_calls": calls}, {"text": "all parts back"}],
        **extra,
    )


def test_six_parallel_children_spend_no_more_than_their_parents_budget(cluster, load_agent, submit):
    # Each child would spend 50 output tokens (five 10-token turns); the parent may spend 120 in all.
    turn = {"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}], "usage": {"output_tokens": 10}}
    load_agent(name="worker", turns=[turn] * 5 + [{"text": "done", "usage": {"output_tokens": 10}}])
    lead(load_agent, "worker", limits={"max_output_tokens": 120})
    c = cluster(AGENTRT_LEASE_SECONDS=3)
    run = submit(agent="lead")

    wait_for(lambda: status(run.id) in ("COMPLETED", "FAILED"), timeout=120, message=f"the parent\n{c.output()}")

    children = list(Run.objects.filter(parent_id=run.id))
    assert len(children) == CHILDREN
    share = children[0].limits["max_output_tokens"]
    assert share * CHILDREN <= 120 and all(ch.limits["max_output_tokens"] == share for ch in children)
    spent = [ch.usage.get("output_tokens", 0) for ch in children]
    # each child stops when its share is used, plus at most the one call it had in flight (10 tokens)
    assert all(s <= share + 10 for s in spent), spent
    assert sum(spent) <= 120 + CHILDREN * 10
    parent = Run.objects.get(id=run.id)
    # the parent's recorded usage is its own plus its children's, counters included
    assert parent.usage["output_tokens"] >= sum(spent)
    assert parent.usage["model_calls"] >= sum(ch.usage.get("model_calls", 0) for ch in children)


def test_children_count_against_the_tenant_quota(cluster, load_agent, submit, tenant):
    load_agent(name="worker", turns=[{"text": "done"}])
    lead(load_agent, "worker")
    Tenant.objects.filter(id=tenant.id).update(max_active_runs=4)
    c = cluster(AGENTRT_LEASE_SECONDS=3)
    run = submit(agent="lead")

    wait_for(lambda: status(run.id) == "COMPLETED", timeout=120, message=f"the parent\n{c.output()}")

    # the waiting parent is one of the four: three children started, three calls refused
    assert Run.objects.filter(parent_id=run.id).count() == 3
    calls = list(ToolInvocation.objects.filter(run_id=run.id, tool_name="delegate_run").order_by("call_index"))
    assert [inv.result.get("error") for inv in calls] == [None, None, None] + ["quota_exceeded"] * 3
    assert all("quota is 4" in inv.result["message"] for inv in calls[3:])


def test_a_child_is_held_to_its_parents_policy(cluster, load_agent, submit, sink):
    post = {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}
    load_agent(name="loose", tools=("http_post",), turns=[{"tool_calls": [post]}, {"text": "paid"}])
    lead(
        load_agent,
        "loose",
        n=1,
        policy={"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]},
    )
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit(agent="lead")

    def child_waits():
        child = Run.objects.filter(parent_id=run.id).first()
        return child is not None and child.status == "WAITING_FOR_APPROVAL"

    wait_for(child_waits, timeout=60, message=f"the child to wait for approval\n{c.output()}")
    child = Run.objects.get(parent_id=run.id)
    approval = Approval.objects.get(run=child, status="pending")
    assert approval.kind == "policy" and approval.presentation["tool"] == "http_post"
    assert sink.count() == 0  # the loose agent's own policy would have sent it
    assert child.agent_version  # pinned when the child started
