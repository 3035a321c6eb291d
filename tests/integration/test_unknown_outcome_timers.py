"""Issue 33 item 2: no timer closes an unknown outcome (DESIGN §18).

A side-effect call whose outcome is unknown waits on an `uncertain_side_effect`
(or, after a crash, `interrupted_side_effect`) approval. Neither the approval
TTL, nor the run's deadline, nor the expiry sweep, nor a cancel — the run's own
or its parent's — closes that question: past the deadline (or with the budget
spent, or a cancel requested) the run keeps waiting and offers only confirm and
reject, approve is 409, and the decision ends the run with the outcome recorded
on the invocation. In-process on PostgreSQL; tests/e2e/test_unknown_outcome_deadline.py
has the same through a real cluster with the deadline passing for real."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from knox.models import AuthToken
from rest_framework.test import APIClient

from approvals.errors import RunBudgetExhausted, RunCancelRequested, RunDeadlinePassed
from approvals.models import Approval
from approvals.services import approval_confirm, approval_decide
from maintenance.sweeps import expiry
from maintenance.sweeps.expiry import sweep_expiry
from runs.clock import CLOCK
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from runs.services.lifecycle import run_cancel
from tests.crash import die_at

pytestmark = pytest.mark.django_db(transaction=True)


def reload(row):
    return type(row).objects.get(id=row.id)


def types(run) -> list[str]:
    return list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", flat=True))


def post_turns(sink) -> list[dict]:
    return [
        {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
        {"text": "paid"},
    ]


def past_deadline(*runs) -> None:
    """The run's deadline passed while it waited (a second ago)."""
    Run.objects.filter(id__in=[r.id for r in runs]).update(deadline_at=CLOCK.now() - timedelta(seconds=1))


@pytest.fixture
def unknown(load_agent, submit, sink):
    """A run whose POST reached the sink and got no answer (the connection
    closed): it waits on an `uncertain_side_effect` approval."""

    def make(name="payer", **kw):
        sink.behaviours.append("close")
        load_agent(name=name, turns=post_turns(sink), tools=("http_post",), **kw)
        run = submit(agent=name)
        run_drive(run_id=run.id)
        run = reload(run)
        assert run.status == "WAITING_FOR_APPROVAL", run.status
        approval = Approval.objects.get(run=run, status="pending")
        assert approval.kind == "uncertain_side_effect"
        return run, approval

    return make


@pytest.fixture
def api(operator):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=operator)[1]}")
    return client


def confirm(operator, approval, took_effect=True, reason="seen in the ledger"):
    return approval_confirm(
        user=operator,
        approval_id=approval.id,
        request_hash=approval.request_hash,
        took_effect=took_effect,
        reason=reason,
    )


# -- the timers ---------------------------------------------------------------------------------------------


def test_the_expiry_sweep_leaves_an_unknown_outcome_past_its_deadline_waiting_and_fails_the_others(
    unknown, load_agent, submit, sink, monkeypatch
):
    """The run past its deadline with an unknown outcome is neither failed nor
    expired, and does not take the sweep's batch from the run it must fail (a
    policy approval past the deadline, whose deadline passed later)."""
    run, approval = unknown()
    load_agent(
        name="asker",
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    other = submit(agent="asker")
    run_drive(run_id=other.id)
    assert reload(other).status == "WAITING_FOR_APPROVAL"
    past_deadline(run)
    Run.objects.filter(id=other.id).update(deadline_at=CLOCK.now() - timedelta(milliseconds=500))
    monkeypatch.setattr(expiry, "BATCH", 1)  # the unknown outcome's deadline is the older: it would come first

    assert sweep_expiry() == {"approval_expired": 0, "deadline_exceeded": 1, "input_deadline_exceeded": 0}
    assert sweep_expiry()["deadline_exceeded"] == 0

    assert reload(other).status == "FAILED" and reload(other).failure["reason"] == "deadline_exceeded"
    run = reload(run)
    assert run.status == "WAITING_FOR_APPROVAL" and run.failure is None
    assert reload(approval).status == "pending" and reload(approval).expires_at is None
    assert "run.failed" not in types(run)
    assert ToolInvocation.objects.get(run=run).status == "uncertain"


def test_an_unknown_outcome_never_expires_whatever_the_approval_ttl(
    unknown, settings, operator, monkeypatch, load_agent, submit, sink
):
    settings.AGENTRT_APPROVAL_TTL_SECONDS = 1
    run, approval = unknown()
    assert approval.expires_at is None
    # an approval written before this rule, with an expiry: the sweep leaves it and it can still be decided
    with connection.cursor() as cur:
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [approval.id])
    assert sweep_expiry()["approval_expired"] == 0
    assert reload(approval).status == "pending" and reload(run).status == "WAITING_FOR_APPROVAL"
    confirm(operator, approval)
    assert reload(approval).status == "confirmed" and reload(run).status == "QUEUED"  # in time: the run goes on
    assert run_drive(run_id=run.id).kind.value == "completed"

    # the same for the approval Resume writes after a worker died with the call in flight
    load_agent(name="crashy", turns=post_turns(sink), tools=("http_post",))
    crashed = submit(agent="crashy")
    die_at(monkeypatch, crashed, "tool.after_watermark")
    assert run_resume(run_id=crashed.id) == "waiting"
    interrupted = Approval.objects.get(run=crashed)
    assert interrupted.kind == "interrupted_side_effect" and interrupted.expires_at is None


def test_a_policy_approval_still_expires(load_agent, submit, settings):
    """The rule is the unknown outcome's: nothing of a policy pause ran, and its TTL holds."""
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}, {"text": "ok"}],
        policy={"default": "require_approval"},
    )
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    assert approval.expires_at is not None
    with connection.cursor() as cur:
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [approval.id])
    assert sweep_expiry()["approval_expired"] == 1
    assert reload(run).failure["reason"] == "approval_expired"


# -- past the deadline: confirm or reject -------------------------------------------------------------------


def test_past_the_deadline_approve_is_409_and_confirm_ends_the_run_failed_with_the_outcome_recorded(unknown, api, sink):
    run, approval = unknown()
    past_deadline(run)
    url = f"/api/approvals/{approval.id}/"
    body = api.get(url).json()
    assert (body["deadline_passed"], body["decisions"], body["ends_run"], body["expires_at"]) == (
        True,
        ["reject", "confirm"],
        "deadline_exceeded",
        None,
    )
    listed = api.get("/api/approvals/", {"status": "pending", "deadline_passed": "true"}).json()
    assert [a["id"] for a in listed["results"]] == [str(approval.id)]
    assert api.get("/api/approvals/", {"status": "pending", "deadline_passed": "false"}).json()["count"] == 0
    bad = api.get("/api/approvals/", {"deadline_passed": "yes"})
    assert bad.status_code == 400 and "deadline_passed" in bad.json()["fields"]

    r = api.post(url + "approve/", {"request_hash": approval.request_hash}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "run_deadline_passed", r.content
    assert "deadline" in r.json()["message"] and "confirm" in r.json()["message"].lower()
    assert reload(approval).status == "pending" and reload(run).status == "WAITING_FOR_APPROVAL"
    r = api.post(url + "approve/", {"request_hash": "0" * 64}, format="json")
    assert r.json()["code"] == "approval_stale"  # a wrong hash is still told first

    r = api.post(
        url + "confirm/",
        {"request_hash": approval.request_hash, "took_effect": True, "reason": "receipt r-7"},
        format="json",
    )
    assert r.status_code == 200 and r.json()["status"] == "confirmed" and r.json()["decisions"] == []
    run = reload(run)
    assert run.status == "FAILED" and run.failure["reason"] == "deadline_exceeded"
    assert run.failure["details"] == {
        "approval": str(approval.id),
        "decision": "confirmed",
        "decided_by": "op",
        "took_effect": True,
    }
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.result["outcome"], inv.result["took_effect"]) == (
        "completed",
        "succeeded",
        "confirmed",
        True,
    )
    tail = types(run)[types(run).index("approval.resolved") :]
    assert tail == ["approval.resolved", "tool.call.completed", "run.failed"]  # never requeued
    assert run_drive(run_id=run.id) is None and sink.count() == 1


def test_past_the_deadline_reject_ends_the_run_failed_and_the_outcome_stays_unknown(unknown, operator, sink):
    run, approval = unknown()
    past_deadline(run)
    approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash)
    run = reload(run)
    assert run.status == "FAILED" and run.failure["reason"] == "deadline_exceeded"
    assert run.failure["details"]["decision"] == "rejected"
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.result) == ("uncertain", "uncertain", None)
    assert inv.attempts[-1]["decision"] == "rejected" and inv.attempts[-1]["rejected_by"] == "op"
    assert sink.count() == 1


def test_with_its_budget_spent_an_unknown_outcome_offers_only_confirm_or_reject(unknown, api, operator):
    run, approval = unknown(limits={"max_cost_usd": 0.01})
    Run.objects.filter(id=run.id).update(usage={**(run.usage or {}), "cost_usd": 0.01})  # the limit is reached
    body = api.get(f"/api/approvals/{approval.id}/").json()
    assert (body["deadline_passed"], body["decisions"], body["ends_run"]) == (
        False,
        ["reject", "confirm"],
        "budget_exceeded",
    )
    with pytest.raises(RunBudgetExhausted, match="budget"):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    confirm(operator, approval, took_effect=False)
    run = reload(run)
    assert run.status == "FAILED" and run.failure["reason"] == "budget_exceeded"
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.result["took_effect"]) == ("failed", "failed", False)


# -- cancel: the question stays open ----------------------------------------------------------------------


def test_a_cancel_keeps_the_question_open_and_the_decision_ends_the_run_cancelled(unknown, api, sink):
    run, approval = unknown()
    r = api.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert r.status_code == 202 and r.json()["status"] == "WAITING_FOR_APPROVAL"
    assert api.post(f"/api/runs/{run.id}/cancel/", {}, format="json").status_code == 202  # again: the same request
    assert reload(run).cancel_requested_at is not None and reload(approval).status == "pending"
    body = api.get(f"/api/approvals/{approval.id}/").json()
    assert (body["decisions"], body["ends_run"]) == (["reject", "confirm"], "cancelled")
    r = api.post(f"/api/approvals/{approval.id}/approve/", {"request_hash": approval.request_hash}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "run_cancel_requested"
    # the deadline passes after the cancel was requested: the cancel came first
    Run.objects.filter(id=run.id).update(deadline_at=F("cancel_requested_at") + timedelta(microseconds=1))
    assert sweep_expiry()["deadline_exceeded"] == 0

    r = api.post(
        f"/api/approvals/{approval.id}/confirm/",
        {"request_hash": approval.request_hash, "took_effect": True},
        format="json",
    )
    assert r.status_code == 200
    run = reload(run)
    assert run.status == "CANCELLED" and run.failure is None
    cancelled = Event.objects.get(run=run, type="run.cancelled").payload
    assert cancelled["after_decision"] == {
        "approval": str(approval.id),
        "decision": "confirmed",
        "decided_by": "op",
        "took_effect": True,
    }
    assert ToolInvocation.objects.get(run=run).outcome == "succeeded"
    r = api.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "run_terminal"
    assert sink.count() == 1


def test_a_cancel_while_the_call_is_in_flight_parks_the_unknown_outcome_instead_of_ending(
    load_agent, submit, sink, operator
):
    """The cancel arrives while the sink holds the request and the call ends
    uncertain: the run waits on the question (cancel requested), and the
    decision ends it CANCELLED."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {}, "timeout_seconds": 0.5}}]},
            {"text": "never"},
        ],
        tools=("http_post",),
    )
    run = submit()
    sink.behaviours = ["delay:30"]
    sink.on_request = lambda path: Run.objects.filter(id=run.id).update(cancel_requested_at=CLOCK.now())
    run_drive(run_id=run.id)
    run = reload(run)
    assert run.status == "WAITING_FOR_APPROVAL" and run.cancel_requested_at is not None
    approval = Approval.objects.get(run=run, status="pending")
    with pytest.raises(RunCancelRequested):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    confirm(operator, approval, took_effect=False)
    assert reload(run).status == "CANCELLED" and sink.count() == 1


# -- a parent's cancel, deadline or budget ------------------------------------------------------------------


def delegate(agent: str, text: str) -> dict:
    return {"name": "delegate_run", "arguments": {"agent": agent, "input": text}}


@pytest.fixture
def family(load_agent, submit, sink):
    """A lead that delegated to `payer`, whose POST got no answer: the child
    waits on its unknown outcome, the parent on its child (and on `spender`,
    when asked for: a child whose tokens take the parent over its budget)."""

    def make(*, spender=False, lead_limits=None):
        sink.behaviours.append("close")
        load_agent(name="payer", turns=post_turns(sink), tools=("http_post",))
        load_agent(name="spender", turns=[{"text": "spent", "usage": {"input_tokens": 1, "output_tokens": 60}}])
        calls = [delegate("payer", "pay")] + ([delegate("spender", "spend")] if spender else [])
        load_agent(
            name="lead",
            turns=[{"tool_calls": calls}, {"text": "done"}],
            tools=("delegate_run",),
            delegates=["payer", "spender"],
            limits=lead_limits,
        )
        parent = submit(agent="lead")
        assert run_drive(run_id=parent.id).kind.value == "suspended"
        children = list(Run.objects.filter(parent_id=parent.id).order_by("created_at", "id"))
        run_drive(run_id=children[0].id)
        child = reload(children[0])
        assert child.status == "WAITING_FOR_APPROVAL"
        return reload(parent), child, Approval.objects.get(run=child, status="pending"), children[1:]

    return make


def test_a_parents_cancel_keeps_its_childs_question_and_the_decision_ends_the_child(family, operator, sink):
    parent, child, approval, _ = family()
    assert run_cancel(run=parent, by="alice") == "CANCELLED"
    assert reload(parent).status == "CANCELLED"
    child = reload(child)
    assert child.status == "WAITING_FOR_APPROVAL" and child.cancel_requested_at is not None
    assert reload(approval).status == "pending"
    assert "run.cancelled" not in types(child)
    with pytest.raises(RunCancelRequested):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    confirm(operator, approval)
    assert reload(child).status == "CANCELLED"
    assert ToolInvocation.objects.get(run=child).outcome == "succeeded"
    assert reload(parent).status == "CANCELLED" and "run.requeued" not in types(parent)
    assert sink.count() == 1


def test_a_parent_failed_by_the_deadline_sweep_leaves_its_childs_question_open(family, operator):
    parent, child, approval, _ = family()
    past_deadline(parent, child)  # a child has its parent's deadline
    assert sweep_expiry()["deadline_exceeded"] == 1  # the parent, not the child
    assert reload(parent).status == "FAILED" and reload(parent).failure["reason"] == "deadline_exceeded"
    assert reload(child).status == "WAITING_FOR_APPROVAL" and reload(approval).status == "pending"
    with pytest.raises(RunDeadlinePassed):
        approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash)
    confirm(operator, approval, took_effect=False)
    child = reload(child)
    assert child.status == "FAILED" and child.failure["reason"] == "deadline_exceeded"  # its deadline came first


def test_a_parent_over_budget_cancels_its_other_children_but_not_an_unknown_outcome(family, operator):
    parent, child, approval, (spender,) = family(spender=True, lead_limits={"max_output_tokens": 50})
    run_drive(run_id=spender.id)  # its 60 output tokens take the lead over its 50
    assert reload(parent).status == "FAILED" and reload(parent).failure["reason"] == "budget_exceeded"
    assert reload(child).status == "WAITING_FOR_APPROVAL" and reload(approval).status == "pending"
    assert reload(child).cancel_requested_at is not None
    approval_decide(user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash)
    assert reload(child).status == "CANCELLED"
    assert ToolInvocation.objects.get(run=child).outcome == "uncertain"


# -- the admin and the live page ----------------------------------------------------------------------------


def staff(operator):
    operator.is_staff = True
    operator.save()
    return operator


def test_the_admin_lists_it_under_a_passed_deadline_and_refuses_approve_with_a_message(client, operator, unknown):
    run, approval = unknown()
    past_deadline(run)
    client.force_login(staff(operator))
    page = client.get("/admin/approvals/approval/", {"deadline": "passed"})
    assert page.status_code == 200 and str(approval.id) in page.content.decode()
    assert "confirm or reject; the run then ends deadline_exceeded" in page.content.decode()
    assert str(approval.id) not in client.get("/admin/approvals/approval/", {"deadline": "not_passed"}).content.decode()
    change = client.get(f"/admin/approvals/approval/{approval.id}/change/").content.decode()
    assert 'value="approve"' not in change and 'value="took_effect"' in change and "cannot go on" in change
    answer = client.post(
        "/admin/approvals/approval/",
        {
            "action": "approve_selected",
            "_selected_action": [str(approval.id)],
            "confirm": "yes",
            f"hash_{approval.id}": approval.request_hash,
        },
        follow=True,
    )
    assert "deadline has passed" in answer.content.decode()
    assert reload(approval).status == "pending"
    client.post(
        f"/admin/approvals/approval/{approval.id}/decide/",
        {"decision": "not_taken", "request_hash": approval.request_hash},
    )
    assert reload(run).status == "FAILED" and reload(run).failure["reason"] == "deadline_exceeded"


def test_the_live_page_offers_only_confirm_or_reject_and_refuses_approve_with_a_message(client, operator, unknown):
    run, approval = unknown()
    past_deadline(run)
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    data = re.search(r'<script id="pending-data" type="application/json">(.*?)</script>', page).group(1)
    assert '"decisions": ["reject", "confirm"]' in data and '"deadline_passed": true' in data
    assert '"ends_run": "deadline_exceeded"' in data
    answer = client.post(
        f"/runs/{run.id}/decide/",
        {"approval": str(approval.id), "request_hash": approval.request_hash, "decision": "approve"},
        follow=True,
    )
    assert "deadline has passed" in answer.content.decode()
    assert reload(approval).status == "pending"
    answer = client.post(f"/runs/{run.id}/cancel/", follow=True)
    assert "it ends as soon as someone confirms" in answer.content.decode()
    client.post(
        f"/runs/{run.id}/decide/",
        {"approval": str(approval.id), "request_hash": approval.request_hash, "decision": "took_effect"},
    )
    run = reload(run)
    # the deadline had passed before the cancel was requested: the deadline ends it
    assert run.status == "FAILED" and run.failure["reason"] == "deadline_exceeded"
