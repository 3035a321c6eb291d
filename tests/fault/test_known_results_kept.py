"""A known result is never lost (seed 000's "it always records the
interruption", per call): a batch of two `http_post` calls, the first
answered, the worker SIGKILLed while the second is in flight. The first
call's outcome was written in the second call's watermark transaction, so
Resume asks about the second call alone; approving it re-sends the second
and never the first."""

from __future__ import annotations

import signal

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.models import Event, Run, ToolInvocation
from tests.conftest import wait_for
from tests.fault.test_kill_anything import APP, terminate_backends

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]


def status(run):
    return Run.objects.filter(id=run.id).values_list("status", flat=True).get()


def two_posts(load_agent, sink):
    """An agent whose first turn makes two `http_post` calls to the sink in one batch, then answers."""
    load_agent(
        turns=[
            {
                "tool_calls": [
                    {"name": "http_post", "arguments": {"url": sink.url, "json": {"n": 1}}},
                    {"name": "http_post", "arguments": {"url": sink.url, "json": {"n": 2}}},
                ]
            },
            {"text": "both sent"},
        ],
        tools=("http_post",),
    )


def test_a_kill_during_the_second_side_effect_asks_about_that_call_alone(
    stack, cluster, load_agent, submit, sink, operator
):
    sink.behaviours = ["ok", "delay:120"]  # the first POST is answered, the second is held
    two_posts(load_agent, sink)
    c = stack()
    run = submit()
    wait_for(lambda: sink.count() == 2, timeout=60, message=f"the second POST to arrive\n{c.output()[-3000:]}")
    c.signal(signal.SIGKILL)  # the whole qcluster group, while the second call waits for its answer
    c.proc.wait(timeout=30)
    sink.release.set()  # the held answer goes nowhere: its worker is dead

    wait_for(lambda: status(run) not in ("QUEUED", "RUNNING"), timeout=90, message="the takeover to park the run")
    assert status(run) == "WAITING_FOR_APPROVAL"
    first, second = ToolInvocation.objects.filter(run=run).order_by("call_index")
    assert (first.status, first.outcome) == ("completed", "succeeded") and first.result["status"] == 200
    assert second.status == "interrupted" and second.result is None and second.effect_sent_at is not None
    pending = list(Approval.objects.filter(run=run, status="pending"))
    assert [(a.invocation_id, a.kind) for a in pending] == [(second.id, "interrupted_side_effect")]
    # The first call's result is in the log before the second call's watermark.
    events = list(Event.objects.filter(run=run).order_by("sequence").values_list("type", "payload"))
    completed = next(i for i, (t, p) in enumerate(events) if t == "tool.call.completed")
    started = [i for i, (t, p) in enumerate(events) if t == "tool.call.started"]
    assert events[completed][1]["invocation"] == str(first.id) and started[0] < completed < started[1]

    approval = pending[0]
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    cluster(AGENTRT_LEASE_SECONDS=2, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)  # a new node runs the re-run
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message="completion after the approval")
    assert sink.count(first.idempotency_key) == 1  # never sent again
    assert sink.count(second.idempotency_key) == 2  # the approved re-run, same key
    assert Run.objects.get(id=run.id).final_message == "both sent"


def test_a_lost_database_connection_before_the_second_watermark_is_a_lost_lease_not_a_failed_run(
    stack, load_agent, submit, sink, operator
):
    """Every backend of the cluster cut while the first of two `http_post`
    calls waits for its answer: the worker's next statement (the second
    call's watermark, which carries the first call's result) meets a dead
    connection. That is a lost lease, not an internal error: nothing is
    committed on a fresh connection, the lease lapses, the takeover finds the
    first call sent with no result, marks it interrupted and asks; the second
    call was never sent."""
    sink.behaviours = ["delay:120"]  # the first POST is held until the backends are cut
    two_posts(load_agent, sink)
    c = stack(PGAPPNAME=APP)  # the cluster's connections, told apart by their application_name
    run = submit()
    wait_for(lambda: sink.count() == 1, timeout=60, message=f"the first POST to arrive\n{c.output()[-3000:]}")
    assert terminate_backends() >= 1  # the worker's connection among them
    sink.release.set()  # the answer comes back to a worker whose database connection is gone

    wait_for(lambda: status(run) not in ("QUEUED", "RUNNING"), timeout=90, message="the takeover to park the run")
    row = Run.objects.get(id=run.id)
    assert row.status == "WAITING_FOR_APPROVAL", (row.status, row.failure, c.output()[-3000:])
    assert "lost the database in the slice" in c.output()
    first, second = ToolInvocation.objects.filter(run=run).order_by("call_index")
    assert first.status == "interrupted" and first.effect_sent_at is not None and first.result is None
    assert second.effect_sent_at is None  # never sent
    assert sink.count() == 1
    pending = list(Approval.objects.filter(run=run, status="pending"))
    assert [(a.invocation_id, a.kind) for a in pending] == [(first.id, "interrupted_side_effect")]
    assert not Event.objects.filter(run=run, type="run.failed").exists()

    approval = pending[0]  # the operator checked: it did not happen; send it again
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    wait_for(lambda: status(run) == "COMPLETED", timeout=60, message=f"completion\n{c.output()[-3000:]}")
    assert sink.count(first.idempotency_key) == 2 and sink.count(second.idempotency_key) == 1
