"""Deliveries are written in the transaction of the event they announce, and
performed once per claim with a stable id (in-process, real PostgreSQL)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection, transaction
from pydantic import ValidationError

from runs.models import Run
from runs.runtime.executor import run_drive
from tests.conftest import wait_for
from webhooks.delivery import deliver
from webhooks.models import Delivery

from .conftest import approver_agent, completed_delivery, subscribe
from .receiver import verify

pytestmark = pytest.mark.django_db(transaction=True)


def xmins(sql, params) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def deliver_rows() -> list:
    from django_q.models import OrmQ

    return [row for row in OrmQ.objects.order_by("id") if row.task.get("func") == "webhooks.tasks.deliver"]


def doorbells() -> list[str]:
    return [row.task["args"][0] for row in deliver_rows()]


def test_the_terminal_transition_writes_each_hooks_delivery_and_its_task_in_its_own_transaction(
    load_agent, submit, hook_registry
):
    seen = []
    hook_registry.register("t.one")(lambda view: seen.append(view))
    hook_registry.register("t.two")(lambda view: seen.append(view))
    load_agent(turns=[{"text": "done"}])
    run = submit()
    assert not Delivery.objects.exists()  # run.created announces nothing
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    rows = list(Delivery.objects.filter(run_id=run.id).order_by("hook"))
    assert [(d.kind, d.hook, d.event_type, d.status, d.attempts) for d in rows] == [
        ("hook", "t.one", "run.completed", "pending", 0),
        ("hook", "t.two", "run.completed", "pending", 0),
    ]
    # One transaction: the run's terminal UPDATE, the delivery rows and django-q2's queue rows share one xmin.
    run_x = xmins("SELECT xmin::text FROM runs WHERE id = %s", [run.id])
    assert run_x == xmins("SELECT xmin::text FROM deliveries WHERE run_id = %s", [run.id])
    assert run_x == xmins("SELECT xmin::text FROM events WHERE run_id = %s AND type = 'run.completed'", [run.id])
    queued = doorbells()
    assert sorted(queued) == sorted(str(d.id) for d in rows)
    assert run_x == xmins("SELECT xmin::text FROM django_q_ormq WHERE id = ANY(%s)", [[r.id for r in deliver_rows()]])
    assert not seen  # enqueued, not run inline
    # The task runs each hook once with a read-only view of the terminal run.
    for d in rows:
        assert deliver(d.id) == "succeeded"
        assert deliver(d.id) == "not_claimed"  # a duplicate doorbell changes nothing
    assert sorted((v.run["status"], v.event, v.attempt) for v in seen) == [("COMPLETED", "run.completed", 1)] * 2
    assert {v.delivery for v in seen} == {str(d.id) for d in rows}
    with pytest.raises(ValidationError):
        seen[0].event = "run.failed"  # the view is frozen


def test_a_fenced_terminal_commit_writes_no_delivery(tenant, load_agent, submit, hook_registry):
    """The deliveries ride on the transition's transaction: no transition, no delivery."""
    from runs.domain.errors import WorkerFenced
    from runs.domain.writes import EventWrite, Transition, UnitOfWork
    from runs.runtime.queue import run_claim
    from runs.store.repository import DjangoRunStore

    hook_registry.register("t.one")(lambda view: None)
    load_agent()
    run = submit()
    claim = run_claim(run_id=run.id, owner="w1")
    store = DjangoRunStore(
        run_id=run.id, tenant_id=run.tenant_id, session_id=run.session_id, owner="w1", epoch=claim.epoch + 1
    )
    work = UnitOfWork()
    work.events.append(
        EventWrite(
            "run.completed", {"lease_epoch": claim.epoch + 1}, __import__("runs.clock", fromlist=["CLOCK"]).CLOCK.now()
        )
    )
    with pytest.raises(WorkerFenced):
        work.transition = Transition(status="COMPLETED", release_lease=True)
        store.commit(work)
    assert not Delivery.objects.exists() and not doorbells()


def test_a_direct_cancel_enqueues_hooks_and_webhooks(tenant, load_agent, submit, hook_registry, manager, receiver):
    from runs.services.lifecycle import run_cancel

    hook_registry.register("t.one")(lambda view: None)
    sub, secret = subscribe(manager, receiver.url, ["run.cancelled", "run.completed"])
    load_agent()
    run = submit()
    assert run_cancel(run=run, by="alice") == "CANCELLED"
    rows = {d.kind: d for d in Delivery.objects.filter(run_id=run.id)}
    assert set(rows) == {"hook", "webhook"} and rows["webhook"].event_type == "run.cancelled"
    assert rows["webhook"].subscription_id == sub.id
    assert deliver(rows["webhook"].id) == "succeeded"
    (request,) = receiver.requests
    body = json.loads(request["body"])
    assert (
        body["type"] == "run.cancelled"
        and body["data"]["run"]["status"] == "CANCELLED"
        and body["id"] == str(rows["webhook"].id)
    )
    assert verify(secret, request["headers"], request["body"])
    assert request["headers"]["x-agentrt-delivery"] == str(rows["webhook"].id)


def test_approval_requested_carries_the_presentation_and_links_to_decide(
    tenant, load_agent, submit, manager, receiver, settings
):
    settings.AGENTRT_PUBLIC_URL = "https://agentrt.example.com"
    sub, secret = subscribe(manager, receiver.url, ["approval.requested"])
    approver_agent(load_agent)
    run = submit(agent="payer")
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "WAITING_FOR_APPROVAL"
    (d,) = Delivery.objects.filter(run_id=run.id)
    assert deliver(d.id) == "succeeded"
    body = json.loads(receiver.requests[0]["body"])
    approval = body["data"]["approval"]
    assert approval["status"] == "pending" and approval["presentation"]["tool"] == "http_post"
    assert approval["presentation"]["arguments"] == {"url": "http://127.0.0.1:9/pay", "json": {"amount": 500}}
    assert body["data"]["run"]["status"] == "WAITING_FOR_APPROVAL"  # read in the transaction that made it wait
    assert body["links"]["decide"] == f"https://agentrt.example.com/runs/{run.id}/"
    assert body["links"]["approve"] == f"https://agentrt.example.com/api/approvals/{approval['id']}/approve/"
    assert secret not in receiver.requests[0]["body"].decode()


def test_a_failing_receiver_is_retried_with_backoff_under_one_delivery_id(
    tenant, load_agent, submit, manager, receiver, settings
):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 0.3
    sub, secret = subscribe(manager, receiver.url, ["run.completed"])
    receiver.script = ["500", "500", "200"]
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, 500) and "HTTP 500" in row.last_error
    assert deliver(d.id) == "not_claimed"  # not due yet: backoff
    wait_for(lambda: deliver(d.id) != "not_claimed", timeout=10, interval=0.05, message="the second attempt")
    row = Delivery.objects.get(id=d.id)
    assert row.attempts == 2 and row.due_at - row.updated_at >= timedelta(seconds=0.5)  # 0.3 × 2: exponential
    wait_for(lambda: deliver(d.id) == "succeeded", timeout=10, interval=0.05, message="the third attempt")
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_error) == ("succeeded", 3, "")
    assert [r["answer"] for r in receiver.requests] == ["500", "500", "200"]
    assert {r["headers"]["x-agentrt-delivery"] for r in receiver.requests} == {str(d.id)}
    assert len({r["body"] for r in receiver.requests}) == 1  # the same body every time
    assert all(verify(secret, r["headers"], r["body"]) for r in receiver.requests)
    assert [r["headers"]["x-agentrt-attempt"] for r in receiver.requests] == ["1", "2", "3"]


def test_past_the_maximum_age_a_delivery_is_marked_failed(tenant, load_agent, submit, manager, receiver, settings):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 10
    settings.AGENTRT_DELIVERY_MAX_AGE_SECONDS = 15  # the second retry (20 s later) would be too late
    subscribe(manager, receiver.url, ["run.completed"])
    receiver.script = ["503", "503"]
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    Delivery.objects.filter(id=d.id).update(due_at=Delivery.objects.get(id=d.id).created_at)  # test-only: skip the wait
    assert deliver(d.id) == "failed"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts) == ("failed", 2) and "HTTP 503" in row.last_error
    assert deliver(d.id) == "not_claimed"


def test_a_hook_that_raises_never_changes_the_run_and_its_failure_is_recorded(
    tenant, load_agent, submit, hook_registry, settings
):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60

    def boom(view):
        raise RuntimeError("hook exploded")

    hook_registry.register("t.boom")(boom)
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    row = Delivery.objects.get(id=d.id)
    assert row.last_error == "RuntimeError: hook exploded" and row.attempts == 1
    assert Run.objects.get(id=run.id).status == "COMPLETED"


def test_a_delivery_is_never_performed_inside_a_transaction(tenant, load_agent, submit, hook_registry):
    hook_registry.register("t.one")(lambda view: None)
    run, d = completed_delivery(load_agent, submit)
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="outside any database transaction"):
            deliver(d.id)
    assert Delivery.objects.get(id=d.id).attempts == 0


def test_a_host_no_longer_allowed_is_refused_at_delivery_and_nothing_is_sent(
    tenant, load_agent, submit, manager, receiver, settings
):
    subscribe(manager, receiver.url, ["run.completed"])
    run, d = completed_delivery(load_agent, submit)
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    assert deliver(d.id) == "failed"
    row = Delivery.objects.get(id=d.id)
    assert "not in AGENTRT_WEBHOOK_ALLOWED_HOSTS" in row.last_error and not receiver.requests


def test_a_redirect_is_never_followed(tenant, load_agent, submit, manager, receiver, settings):
    from .receiver import Receiver

    elsewhere = Receiver()
    try:
        settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = [receiver.host, elsewhere.host]  # even to an allowed host
        subscribe(manager, receiver.url, ["run.completed"])
        receiver.script = [f"redirect:{elsewhere.url}"]
        run, d = completed_delivery(load_agent, submit)
        assert deliver(d.id) == "retry"
        row = Delivery.objects.get(id=d.id)
        assert row.last_status_code == 302 and "redirects are not followed" in row.last_error
        assert len(receiver.requests) == 1 and not elsewhere.requests
    finally:
        elsewhere.close()


def test_the_sweep_rings_due_deliveries_once_and_gives_up_on_old_ones(
    tenant, load_agent, submit, hook_registry, settings
):
    from maintenance.sweeps.deliveries import sweep_deliveries
    from runs.runtime.queue import db_now

    hook_registry.register("t.one")(lambda view: None)
    load_agent()
    runs = [submit(text=f"r{i}") for i in range(3)]
    for run in runs:
        run_drive(run_id=run.id)
    fresh, lapsed, old = (Delivery.objects.get(run_id=r.id) for r in runs)
    now = db_now()
    # fresh: rung at creation, not yet claimed -> not rung again;
    # lapsed: a claim that ran out; old: past the maximum age.
    Delivery.objects.filter(id=lapsed.id).update(
        attempts=1, rung_at=now - timedelta(seconds=5), due_at=now - timedelta(seconds=1)
    )
    Delivery.objects.filter(id=old.id).update(created_at=now - timedelta(days=2), last_error="HTTP 500: nope")
    before = len(doorbells())
    assert sweep_deliveries() == {"rung": 1, "gave_up": 1}
    assert doorbells()[before:] == [str(lapsed.id)]
    assert sweep_deliveries() == {"rung": 0, "gave_up": 0}  # rung once per time it became due
    row = Delivery.objects.get(id=old.id)
    assert (
        row.status == "failed" and row.last_error.startswith("gave up:") and row.last_error.endswith("HTTP 500: nope")
    )
    assert Delivery.objects.get(id=fresh.id).status == "pending"


def test_waiting_for_the_user_and_a_rejection_are_announced(tenant, load_agent, submit, manager, operator, receiver):
    from approvals.models import Approval
    from approvals.services import approval_decide

    subscribe(manager, receiver.url, ["run.waiting_for_user", "approval.resolved", "run.failed", "run.completed"])
    load_agent(
        name="asker",
        tools=["ask_user"],
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]}, {"text": "ok"}],
    )
    asking = submit(agent="asker")
    run_drive(run_id=asking.id)
    (waiting,) = Delivery.objects.filter(run_id=asking.id)
    assert waiting.event_type == "run.waiting_for_user"
    assert waiting.payload["data"]["event"]["payload"]["question"] == "Which region?"
    assert waiting.payload["data"]["run"]["status"] == "WAITING_FOR_USER"
    # A rejected interrupted call fails the run: approval.resolved and run.failed, in the decision's transaction.
    from runs.models import ToolInvocation

    approver_agent(load_agent)
    paying = submit(agent="payer")
    run_drive(run_id=paying.id)
    approval = Approval.objects.get(run_id=paying.id)
    Approval.objects.filter(id=approval.id).update(
        kind="interrupted_side_effect"
    )  # test-only: a re-run grant, whose reject fails the run
    ToolInvocation.objects.filter(id=approval.invocation_id).update(suspended_kind="interrupted_side_effect")
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, via="api"
    )
    rows = {d.event_type: d for d in Delivery.objects.filter(run_id=paying.id)}
    assert set(rows) == {"approval.resolved", "run.failed"}
    assert rows["approval.resolved"].payload["data"]["approval"]["status"] == "rejected"
    assert rows["run.failed"].payload["data"]["run"]["failure"]["reason"] == "operator_rejected"
    assert rows["approval.resolved"].event_sequence < rows["run.failed"].event_sequence
    assert xmins("SELECT xmin::text FROM deliveries WHERE run_id = %s", [paying.id]) == xmins(
        "SELECT xmin::text FROM approvals WHERE id = %s", [approval.id]
    )


def test_an_inactive_subscription_gets_no_delivery(tenant, load_agent, submit, manager, receiver):
    active, _ = subscribe(manager, receiver.url, ["run.completed"])
    inactive, _ = subscribe(manager, receiver.url, ["run.completed"], active=False)
    run, d = completed_delivery(load_agent, submit)
    assert d.subscription_id == active.id
    assert not Delivery.objects.filter(subscription=inactive).exists()
    assert deliver(d.id) == "succeeded"
    assert [r["headers"]["x-agentrt-delivery"] for r in receiver.requests] == [str(d.id)]
    # Made inactive after its delivery was written: the delivery ends cancelled and nothing is sent.
    from webhooks.services import subscription_update

    later = submit(text="again")
    run_drive(run_id=later.id)
    (pending,) = Delivery.objects.filter(run_id=later.id)
    subscription_update(user=manager, subscription_id=active.id, active=False)
    assert deliver(pending.id) == "cancelled"
    row = Delivery.objects.get(id=pending.id)
    assert (row.status, row.last_error) == ("cancelled", "the subscription is inactive")
    assert len(receiver.requests) == 1


def test_an_approval_expired_by_the_sweep_is_announced_as_resolved_expired(
    tenant, load_agent, submit, manager, receiver
):
    from approvals.models import Approval
    from maintenance.sweeps.expiry import sweep_expiry
    from runs.runtime.queue import db_now

    sub, secret = subscribe(manager, receiver.url, ["approval.resolved", "run.failed"])
    approver_agent(load_agent)
    run = submit(agent="payer")
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run_id=run.id)
    Approval.objects.filter(id=approval.id).update(expires_at=db_now() - timedelta(seconds=1))  # test-only: expired
    assert sweep_expiry()["approval_expired"] == 1
    rows = {d.event_type: d for d in Delivery.objects.filter(run_id=run.id)}
    assert set(rows) == {"approval.resolved", "run.failed"}
    assert rows["approval.resolved"].event_sequence < rows["run.failed"].event_sequence
    # Written in the sweep's transaction, with the expiry itself (before any attempt updates them).
    assert xmins("SELECT xmin::text FROM deliveries WHERE run_id = %s", [run.id]) == xmins(
        "SELECT xmin::text FROM approvals WHERE id = %s", [approval.id]
    )
    for d in rows.values():
        assert deliver(d.id) == "succeeded"
    resolved = json.loads(receiver.of_type("approval.resolved")[0]["body"])
    assert all(verify(secret, r["headers"], r["body"]) for r in receiver.requests)
    event = resolved["data"]["event"]["payload"]
    assert (event["approval"], event["decision"], event["decided_via"], event["decided_by"]) == (
        str(approval.id),
        "expired",
        "maintenance",
        None,
    )
    assert resolved["data"]["approval"]["status"] == "expired"
    failed = json.loads(receiver.of_type("run.failed")[0]["body"])
    assert failed["data"]["run"]["failure"]["reason"] == "approval_expired"


def test_a_hook_that_keeps_failing_ends_failed_after_the_maximum_age(
    tenant, load_agent, submit, hook_registry, settings
):
    from webhooks.delivery import backoff

    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 0.2
    settings.AGENTRT_DELIVERY_MAX_AGE_SECONDS = 1  # attempts ~0.2 s, then ~0.4 s apart: the third is the last

    def always(view):
        raise RuntimeError("the CRM is down")

    hook_registry.register("t.always")(always)
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    assert Delivery.objects.get(id=d.id).status == "pending"  # failing, not yet failed
    outcomes: list[str] = []
    wait_for(
        lambda: outcomes.append(deliver(d.id)) or outcomes[-1] == "failed",
        timeout=30,
        interval=0.05,
        message="the hook to be given up on",
    )
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.last_error) == ("failed", "RuntimeError: the CRM is down")
    assert row.attempts >= 2 and set(outcomes) <= {"not_claimed", "retry", "failed"}
    # Given up because its next attempt would have come after the maximum age, not before.
    assert row.updated_at + timedelta(seconds=backoff(row.attempts)) > row.created_at + timedelta(seconds=1)
    assert deliver(d.id) == "not_claimed"
    assert Run.objects.get(id=run.id).status == "COMPLETED"
