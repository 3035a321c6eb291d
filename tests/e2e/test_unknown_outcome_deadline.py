"""Issue 33 item 2 through real processes: the run's deadline passes while the
effect sink holds the answer to its POST. The call is `uncertain`, the run
waits on an `uncertain_side_effect` approval that says the deadline passed
(REST, the event, the `approval.requested` webhook's body); the expiry sweep,
run for real (`run_maintenance --once`), neither fails the run nor expires the
approval; approve (a re-send) is 409 `run_deadline_passed`; confirm ends the
run FAILED `deadline_exceeded` with the outcome recorded on the invocation,
and `agent_run_waiting_seconds` observes the whole wait."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from knox.models import AuthToken
from rest_framework.test import APIClient

from approvals.models import Approval
from ops import fleet
from runs.clock import CLOCK
from runs.models import Event, Run, ToolInvocation
from tests.conftest import ROOT, subprocess_env, wait_for
from webhooks.models import Delivery
from webhooks.services import subscription_create

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def row(run) -> Run:
    return Run.objects.get(id=run.id)


def maintenance_once() -> dict:
    """`manage.py run_maintenance --once`: every sweep once, in its own process; what each did."""
    done = subprocess.run(
        [sys.executable, "manage.py", "run_maintenance", "--once"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def test_a_deadline_passing_while_the_answer_is_held_leaves_the_question_to_a_person(
    cluster, load_agent, submit, sink, operator, settings
):
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1:9"]
    subscription_create(user=operator, url="http://127.0.0.1:9/hook", event_types=["approval.requested"])
    sink.behaviours = ["delay:120"]  # the POST arrives; its answer is held past the run's deadline
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
        limits={"deadline_seconds": 4},
    )
    load_agent(name="warm", turns=[{"text": "up"}])
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    warm = submit(agent="warm")  # the workers are up before the deadline's clock starts: it passes in the call
    wait_for(lambda: row(warm).status == "COMPLETED", timeout=60, message=f"a warm-up run\n{c.output()[-3000:]}")
    run = submit()
    wait_for(
        lambda: row(run).status == "WAITING_FOR_APPROVAL", timeout=60, message=f"the run to wait\n{c.output()[-3000:]}"
    )
    c.stop()  # nothing of what follows needs a worker: the decision ends the run

    waiting = row(run)
    assert waiting.deadline_at <= CLOCK.now() and sink.count() == 1
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.result) == ("uncertain", "uncertain", None)
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.kind == "uncertain_side_effect" and approval.expires_at is None
    requested = Event.objects.get(run=run, type="approval.requested").payload
    assert requested["deadline_passed"] is True
    (delivery,) = Delivery.objects.filter(run_id=run.id, event_type="approval.requested")
    assert delivery.payload["data"]["event"]["payload"]["deadline_passed"] is True
    assert delivery.payload["data"]["approval"]["deadline_passed"] is True
    assert delivery.payload["data"]["approval"]["decisions"] == ["reject", "confirm"]

    swept = maintenance_once()
    assert swept["expiry"] == {"approval_expired": 0, "deadline_exceeded": 0, "input_deadline_exceeded": 0}, swept
    assert row(run).status == "WAITING_FOR_APPROVAL" and Approval.objects.get(id=approval.id).status == "pending"

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=operator)[1]}")
    shown = api.get(f"/api/approvals/{approval.id}/").json()
    assert (shown["deadline_passed"], shown["decisions"], shown["ends_run"]) == (
        True,
        ["reject", "confirm"],
        "deadline_exceeded",
    )
    r = api.post(f"/api/approvals/{approval.id}/approve/", {"request_hash": approval.request_hash}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "run_deadline_passed", r.content
    waits_before = fleet.deployment_counters()["waiting"]["approval"].count

    r = api.post(
        f"/api/approvals/{approval.id}/confirm/",
        {"request_hash": approval.request_hash, "took_effect": True, "reason": "the gateway shows the charge"},
        format="json",
    )
    assert r.status_code == 200 and r.json()["status"] == "confirmed", r.content
    ended = row(run)
    assert ended.status == "FAILED" and ended.failure["reason"] == "deadline_exceeded"
    assert ended.failure["details"]["took_effect"] is True
    inv.refresh_from_db()
    assert (inv.status, inv.outcome, inv.result["outcome"], inv.result["took_effect"]) == (
        "completed",
        "succeeded",
        "confirmed",
        True,
    )
    assert fleet.deployment_counters()["waiting"]["approval"].count == waits_before + 1  # the wait, now ended
    sink.release.set()
    assert sink.count() == 1  # sent once, never again
