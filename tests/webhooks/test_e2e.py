"""Hooks and webhooks end to end: a real `qcluster`, a real `run_maintenance`
(it rings retries and lapsed claims), and a local receiver that verifies
signatures and dedupes on X-Agentrt-Delivery (issue 17, "Evidence")."""

from __future__ import annotations

import json
import os
import signal

import pytest

from runs.models import Run
from tests.conftest import wait_for
from webhooks.models import Delivery

from .conftest import approver_agent, subscribe
from .receiver import verify

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ALL = [
    "run.completed",
    "run.failed",
    "run.cancelled",
    "approval.requested",
    "approval.resolved",
    "run.waiting_for_user",
]


@pytest.fixture
def node(cluster, tmp_path, receiver, procs):
    """A worker node and a maintenance process configured for fast retries, with the test hooks."""

    def start(**extra):
        env = dict(
            AGENTRT_WEBHOOK_ALLOWED_HOSTS=receiver.host,
            AGENTRT_DELIVERY_BACKOFF_SECONDS=0.5,
            AGENTRT_DELIVERY_CLAIM_SECONDS=4,
            AGENTRT_WEBHOOK_TIMEOUT_SECONDS=2,
            AGENTRT_DELIVERY_SWEEP_SECONDS=0.5,
            AGENTRT_HOOK_MODULES="tests.webhooks.hookmods",
            AGENTRT_TEST_HOOK_LOG=str(tmp_path / "hooks.jsonl"),
            **extra,
        )
        c = cluster(**env)
        procs(["manage.py", "run_maintenance"], "maintenance", **env)
        return c

    return start


def hook_log(tmp_path) -> list[dict]:
    path = tmp_path / "hooks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_approval_is_announced_when_it_is_requested_and_when_it_is_resolved_then_the_run_completes(
    node, tenant, load_agent, submit, operator, manager, receiver, sink, settings, tmp_path
):
    from approvals.services import approval_decide

    sub, secret = subscribe(manager, receiver.url, ALL)
    approver_agent(load_agent, post_url=sink.url)
    c = node(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit(agent="payer")

    requested = wait_for(
        lambda: receiver.of_type("approval.requested"), timeout=60, message=f"approval.requested\n{c.output()}"
    )
    (request,) = requested
    assert verify(secret, request["headers"], request["body"])
    body = json.loads(request["body"])
    approval = body["data"]["approval"]
    assert body["data"]["run"]["id"] == str(run.id) and approval["presentation"]["tool"] == "http_post"
    assert body["links"]["approve"].endswith(f"/api/approvals/{approval['id']}/approve/")
    assert request["headers"]["x-agentrt-delivery"] == body["id"]
    row = Delivery.objects.get(id=body["id"])
    assert row.event_sequence == body["data"]["event"]["sequence"]
    # A figure, not a check: from the commit that made the run wait to the request's arrival (pytest -s shows it).
    print(
        f"\napproval.requested arrived {1000 * (request['wall'] - row.created_at.timestamp()):.0f} ms after its commit"
    )

    approval_decide(
        user=operator, approval_id=approval["id"], approve=True, request_hash=approval["request_hash"], via="api"
    )
    wait_for(lambda: receiver.of_type("run.completed"), timeout=60, message=f"run.completed\n{c.output()}")
    resolved = wait_for(lambda: receiver.of_type("approval.resolved"), timeout=60, message="approval.resolved")
    completed = receiver.of_type("run.completed")
    assert len(resolved) == len(completed) == 1
    resolved_body, completed_body = json.loads(resolved[0]["body"]), json.loads(completed[0]["body"])
    assert resolved_body["data"]["event"]["payload"]["decision"] == "approved"
    assert (
        resolved_body["data"]["event"]["sequence"] < completed_body["data"]["event"]["sequence"]
    )  # resolved, then completed
    assert (
        completed_body["data"]["run"]["status"] == "COMPLETED"
        and completed_body["data"]["run"]["final_message"] == "paid"
    )
    for r in receiver.requests:
        assert verify(secret, r["headers"], r["body"])
        assert secret not in r["body"].decode()
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    assert sink.count() == 1  # the approved call ran once

    # The post-run hooks: test.record ran once for the run; test.explode failed, was retried, and changed nothing.
    wait_for(lambda: hook_log(tmp_path), timeout=30, message="the recording hook")
    (seen,) = hook_log(tmp_path)
    assert (seen["run"], seen["status"], seen["event"]) == (str(run.id), "COMPLETED", "run.completed")
    explode = Delivery.objects.get(run_id=run.id, hook="test.explode")
    wait_for(
        lambda: Delivery.objects.get(id=explode.id).attempts >= 2, timeout=30, message="the failing hook to be retried"
    )
    explode.refresh_from_db()
    assert explode.status == "pending" and f"RuntimeError: the hook exploded on run {run.id}" == explode.last_error
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    assert Delivery.objects.get(run_id=run.id, hook="test.record").status == "succeeded"


def test_a_receiver_answering_500_twice_then_200_gets_three_attempts_with_one_delivery_id(
    node, tenant, load_agent, submit, manager, receiver
):
    sub, secret = subscribe(manager, receiver.url, ["run.completed"])
    receiver.script = ["500", "500", "200"]
    load_agent()
    c = node()
    run = submit()
    wait_for(
        lambda: Delivery.objects.filter(run_id=run.id, kind="webhook", status="succeeded").exists(),
        timeout=60,
        message=f"the webhook to be delivered\n{c.output()}",
    )
    (delivery,) = Delivery.objects.filter(run_id=run.id, kind="webhook")
    assert delivery.attempts == 3 and delivery.last_error == ""
    assert [r["answer"] for r in receiver.requests] == ["500", "500", "200"]
    assert {r["headers"]["x-agentrt-delivery"] for r in receiver.requests} == {str(delivery.id)}
    assert [r["headers"]["x-agentrt-attempt"] for r in receiver.requests] == ["1", "2", "3"]
    assert all(verify(secret, r["headers"], r["body"]) for r in receiver.requests)
    assert list(receiver.processed) == [str(delivery.id)]


def test_a_worker_killed_mid_delivery_leaves_it_to_be_delivered_later_once_per_id(
    node, tenant, load_agent, submit, manager, receiver
):
    sub, secret = subscribe(manager, receiver.url, ["run.completed"])
    receiver.script = ["hold"]  # the first attempt arrives and gets no answer; later ones get 200
    load_agent()
    c = node()
    run = submit()
    wait_for(receiver.held.is_set, timeout=60, message=f"the first attempt to arrive\n{c.output()}")
    delivery = Delivery.objects.get(run_id=run.id, kind="webhook")
    assert delivery.status == "pending" and delivery.attempts == 1
    pid = int(delivery.claimed_by.rsplit(":", 1)[1])
    os.kill(pid, signal.SIGKILL)  # the worker that holds the delivery dies mid-request
    wait_for(
        lambda: Delivery.objects.get(id=delivery.id).status == "succeeded",
        timeout=90,
        message=f"the delivery to complete after the kill\n{c.output()}",
    )
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and int(delivery.claimed_by.rsplit(":", 1)[1]) != pid
    assert [r["headers"]["x-agentrt-delivery"] for r in receiver.requests] == [str(delivery.id)] * 2  # at least once...
    assert list(receiver.processed) == [str(delivery.id)]  # ... and once after the receiver's dedupe
    assert len({r["body"] for r in receiver.requests}) == 1
    assert Run.objects.get(id=run.id).status == "COMPLETED"


def test_a_worker_killed_after_a_200_before_recording_it_sends_it_again_and_a_deduping_receiver_acts_once(
    node, tenant, load_agent, submit, manager, receiver, tmp_path
):
    """Exactly once after dedupe, where it is hard: the receiver has answered 200 (and acted), and the worker
    is SIGKILLed at fault point `webhook.after_send`, before it records the attempt. The claim lapses, the
    sweep rings the delivery again, another worker sends it again under the same id; the receiver sees it
    twice and, deduping on X-Agentrt-Delivery, acts once."""
    faults = tmp_path / "faults"
    sub, secret = subscribe(manager, receiver.url, ["run.completed"])
    load_agent()
    c = node(AGENTRT_ENABLE_FAULTPOINTS=1, AGENTRT_FAULTPOINTS="webhook.after_send=kill", AGENTRT_FAULTPOINT_DIR=faults)
    run = submit()
    wait_for(
        lambda: Delivery.objects.filter(run_id=run.id, kind="webhook", status="succeeded").exists(),
        timeout=90,
        message=f"the delivery to complete after the kill\n{c.output()}",
    )
    delivery = Delivery.objects.get(run_id=run.id, kind="webhook")
    marker = faults / f"webhook.after_send.{delivery.id}"
    assert marker.exists(), "the fault point never fired"
    killed = int(marker.read_text())  # the worker that sent attempt 1, got its 200, and died before recording it
    assert delivery.attempts == 2 and int(delivery.claimed_by.rsplit(":", 1)[1]) != killed
    assert delivery.last_status_code == 200 and delivery.last_error == ""
    assert [r["answer"] for r in receiver.requests] == ["200", "200"]  # both arrivals were answered 200
    assert [r["headers"]["x-agentrt-delivery"] for r in receiver.requests] == [str(delivery.id)] * 2
    assert [r["headers"]["x-agentrt-attempt"] for r in receiver.requests] == ["1", "2"]
    assert len({r["body"] for r in receiver.requests}) == 1  # the same event both times
    assert all(verify(secret, r["headers"], r["body"]) for r in receiver.requests)
    assert list(receiver.processed) == [str(delivery.id)]  # processed once
    assert json.loads(receiver.requests[0]["body"])["data"]["run"]["id"] == str(run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED"
