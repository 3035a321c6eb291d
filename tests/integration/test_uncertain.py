"""Issue 11 on PostgreSQL: how the built-in HTTP tools classify an error by
where it happened, the runtime's own timeout, read-only vs side-effect
uncertain calls in a run, the reconciler's view of an uncertain call, and the
`confirm` decision over REST, the admin and the live page."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from knox.models import AuthToken
from rest_framework.test import APIClient

from approvals.models import Approval
from approvals.services import approval_confirm, approval_decide
from checkpoints.repository import checkpoint_latest
from runs.clock import CLOCK
from runs.domain.cancellation import Token
from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.domain.pipeline import ToolExecutionContext
from runs.domain.values import CancelReason, ToolSpec
from runs.models import Event, ModelCall, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.runtime.resume import run_resume
from runs.services.selectors import tool_uncertain_counts
from runs.tools import REGISTRY, builtin
from runs.tools import OutcomeUnknown as PublicOutcomeUnknown
from tests.conftest import free_port
from tests.crash import die_at

pytestmark = pytest.mark.django_db(transaction=True)


def context(*, timeout=5.0, deadline=None, token=None, key="run:1:call_1_0"):
    return ToolExecutionContext(
        run_id=None,
        step_number=1,
        call_id="call_1_0",
        invocation_id=None,
        idempotency_key=key,
        attempt=1,
        timeout_seconds=timeout,
        token=token or Token(),
        deadline=deadline,
        clock=CLOCK,
    )


def post(sink, ctx, **extra):
    return builtin.http_post({"url": sink.url, "json": {"amount": 5}, **extra}, ctx)


def reload(run):
    return Run.objects.get(id=run.id)


# -- the built-in HTTP tools classify by where the error happened ---------------


def test_the_public_name_is_the_domain_error():
    assert PublicOutcomeUnknown is OutcomeUnknown and issubclass(OutcomeUnknown, ToolFailure)
    assert OutcomeUnknown().uncertain is True


def test_connection_refused_is_failed_the_request_never_left(settings):
    port = free_port()
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"127.0.0.1:{port}"]
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": f"http://127.0.0.1:{port}/x", "json": {}}, context())
    assert err.value.code == "connection_failed" and err.value.uncertain is False


def test_a_dns_failure_is_failed(settings):
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["no-such-host.invalid"]
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": "http://no-such-host.invalid/x", "json": {}}, context())
    assert err.value.code == "dns_failed" and err.value.uncertain is False


def test_a_name_server_that_does_not_answer_fails_the_call_and_nothing_is_sent(settings, silent_name_server):
    """getaddrinfo has no timeout: a side-effect call whose host never
    resolved used to outlive the runtime's timeout and become an unknown
    outcome (an operator's decision for a request that never left). Its
    lookup now gets half the call's time, and the call fails as `dns_failed`."""
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["slow-name.example"]
    lookups = silent_name_server("slow-name.example")
    assert REGISTRY.spec("http_post").side_effect == "external_write"
    with pytest.raises(ToolFailure) as err:  # through the runtime, its own timeout 1 s
        REGISTRY.execute("http_post", {"url": "http://slow-name.example/x", "json": {}}, context(timeout=1.0))
    assert err.value.code == "dns_failed" and err.value.uncertain is False, err.value
    assert lookups.asked == ["slow-name.example"]
    assert lookups.answered == []  # the call ended while the lookup still waited


def test_a_closed_connection_after_the_request_was_sent_is_uncertain(sink):
    sink.behaviours = ["close"]
    with pytest.raises(OutcomeUnknown) as err:
        post(sink, context())
    assert err.value.code == "connection_lost"
    assert sink.count() == 1  # it did arrive


def test_a_read_timeout_is_uncertain(sink):
    sink.behaviours = ["delay:5"]
    with pytest.raises(OutcomeUnknown) as err:
        post(sink, context(), timeout_seconds=0.3)
    assert err.value.code == "timeout" and sink.count() == 1


def test_the_deadline_bounds_the_timeout_and_a_passed_deadline_sends_nothing(sink):
    sink.behaviours = ["delay:5"]
    with pytest.raises(OutcomeUnknown) as err:  # tool timeout 20 s, the run has 0.3 s left
        post(sink, context(timeout=20, deadline=CLOCK.now() + timedelta(seconds=0.3)))
    assert err.value.code == "timeout"
    assert (
        0 < float(re.search(r"within ([0-9.e-]+) s", str(err.value)).group(1)) <= 0.3
    )  # the deadline's bound, not the 20 s
    with pytest.raises(ToolFailure) as err:
        post(sink, context(deadline=CLOCK.now() - timedelta(seconds=1)))
    assert err.value.code == "deadline_exceeded" and err.value.uncertain is False
    assert sink.count() == 1


def test_cancellation_stops_a_read_in_flight_and_its_outcome_is_uncertain(sink):
    token = Token()
    sink.behaviours = ["delay:30"]
    sink.on_request = lambda path: token.cancel(
        CancelReason.REQUESTED
    )  # the cancel arrives while the server holds the request
    with pytest.raises(OutcomeUnknown) as err:
        builtin.http_get({"url": sink.url}, context(timeout=20, token=token))
    assert err.value.code == "cancelled" and sink.gets == 1
    # Already cancelled: nothing is sent at all, and that is a definite failure.
    with pytest.raises(ToolFailure) as err:
        builtin.http_get({"url": sink.url}, context(token=token))
    assert err.value.code == "cancelled" and err.value.uncertain is False and sink.gets == 1


def test_cancellation_never_cuts_a_post_short_once_it_is_sent(sink):
    """A side effect's watermark is committed before it gets here: a cancel
    that arrives while the server holds the request does not shut the
    socket; the answer, when it comes, is the call's result."""
    token = Token()
    sink.behaviours = ["delay:30"]

    def cancel_then_answer(path):
        token.cancel(CancelReason.REQUESTED)
        sink.release.set()  # the answer comes only after the cancel was set

    sink.on_request = cancel_then_answer
    status, _, body = builtin._request(
        "POST", sink.url, {"Content-Type": "application/json"}, b"{}", 20, context(token=token), abandon_on_cancel=False
    )
    assert (status, body) == (200, b'{"ok": true}') and sink.count() == 1
    assert post(sink, context(token=token)) == {"status": 200, "json": {"ok": True}}  # and sent even when cancelled


def test_an_http_error_status_is_an_answer_not_an_unknown_outcome(sink):
    sink.status = 503
    assert post(sink, context()) == {"status": 503, "json": {"ok": True}}


def test_the_runtime_enforces_timeout_seconds_and_the_call_is_then_uncertain():
    release = threading.Event()
    spec = ToolSpec(
        name="blocker",
        parameters={"type": "object"},
        read_only=False,
        side_effect="external_write",
        timeout_seconds=0.2,
    )
    REGISTRY.register(spec, lambda arguments, ctx: release.wait(30))
    try:
        with pytest.raises(OutcomeUnknown) as err:
            REGISTRY.execute("blocker", {}, context(timeout=0.2))
        assert err.value.code == "timeout"
    finally:
        release.set()
        REGISTRY.unregister("blocker")


# -- in a run ------------------------------------------------------------------


def test_a_read_only_uncertain_call_is_a_failure_the_model_sees(load_agent, submit, sink):
    sink.behaviours = ["close"]
    load_agent(
        turns=[{"tool_calls": [{"name": "http_get", "arguments": {"url": sink.url}}]}, {"text": "it failed"}],
        tools=("http_get",),
    )
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.gets == 1
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome) == ("failed", "uncertain")
    assert not Approval.objects.filter(run=run).exists()
    assert ModelCall.objects.filter(run=run, step_number=2).exists()  # the model saw it and answered
    (message,) = [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]
    assert message["is_error"] and "connection_lost" in message["content"]
    assert tool_uncertain_counts() == {"http_get": 1}


@pytest.fixture
def slow_post():
    """A side-effect tool whose runtime timeout (0.2 s) elapses."""
    release = threading.Event()
    spec = ToolSpec(
        name="slow_post",
        parameters={"type": "object"},
        read_only=False,
        side_effect="external_write",
        timeout_seconds=0.2,
    )
    REGISTRY.register(spec, lambda arguments, ctx: release.wait(30))
    yield spec
    release.set()
    REGISTRY.unregister("slow_post")


def test_a_side_effect_timed_out_by_the_runtime_waits_and_confirming_it_did_not_happen_goes_on(
    load_agent, submit, slow_post, operator
):
    load_agent(
        turns=[{"tool_calls": [{"name": "slow_post", "arguments": {}}]}, {"text": "noted"}], tools=("slow_post",)
    )
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "suspended"
    row = reload(run)
    assert row.status == "WAITING_FOR_APPROVAL" and row.lease_owner is None
    approval = Approval.objects.get(run=run)
    assert approval.kind == "uncertain_side_effect" and approval.presentation["error"]["error"] == "timeout"
    assert [
        e
        for e in Event.objects.filter(run=run, type="run.waiting_for_approval").values_list(
            "payload__reason", flat=True
        )
    ] == ["interrupted_side_effect"]
    assert tool_uncertain_counts() == {"slow_post": 1}
    approval_confirm(
        user=operator, approval_id=approval.id, request_hash=approval.request_hash, took_effect=False, via="api"
    )
    assert reload(run).status == "QUEUED"
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED"
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.attempt) == ("failed", "failed", 1)
    assert inv.result["took_effect"] is False
    assert inv.attempts[-1]["decision"] == "confirmed" and inv.attempts[0]["outcome"] == "uncertain"
    (message,) = [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]
    assert message["is_error"] and '"took_effect": false' in message["content"]
    assert tool_uncertain_counts() == {"slow_post": 1}  # a durable count: the confirmation does not lower it


def test_the_reconciler_sees_the_uncertain_call_and_may_let_the_model_see_it(settings, load_agent, submit, sink):
    from tests.integration import reconcilers

    settings.AGENTRT_RECONCILER = "tests.integration.reconcilers.always_continue"
    reconcilers.SEEN.clear()
    sink.behaviours = ["close"]
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "checked"},
        ],
        tools=("http_post",),
    )
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "yielded"  # continue: back to the queue
    (view,) = reconcilers.SEEN
    (seen,) = view.invocations
    assert (
        seen["status"] == "uncertain" and seen["outcome"] == "uncertain" and seen["error"]["error"] == "connection_lost"
    )
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.count() == 1
    assert not Approval.objects.filter(run=run).exists()
    (message,) = [m for m in checkpoint_latest(run.id).conversation if m.get("role") == "tool"]
    assert message["is_error"] and "outcome_unknown" in message["content"]


def test_the_reconciler_waiting_pauses_on_a_reconcile_approval(settings, load_agent, submit, sink):
    settings.AGENTRT_RECONCILER = "tests.integration.reconcilers.waiting"
    sink.behaviours = ["close"]
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "x"},
        ],
        tools=("http_post",),
    )
    run = submit()
    run_drive(run_id=run.id)
    assert reload(run).status == "WAITING_FOR_APPROVAL"
    assert Approval.objects.get(run=run).kind == "reconcile" and sink.count() == 1


# -- confirm over REST ------------------------------------------------------------


@pytest.fixture
def api(operator):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=operator)[1]}")
    return client


@pytest.fixture
def uncertain_run(load_agent, submit, sink):
    sink.behaviours = ["close"]
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
    )
    run = submit()
    run_drive(run_id=run.id)
    return run, Approval.objects.get(run=run)


def test_confirm_over_rest_records_the_decision_and_refuses_bad_input(api, uncertain_run, sink):
    run, approval = uncertain_run
    url = f"/api/approvals/{approval.id}/confirm/"
    for body in (
        {"request_hash": approval.request_hash},
        {"request_hash": approval.request_hash, "took_effect": "yes"},
        {"request_hash": approval.request_hash, "took_effect": 1},
        {"request_hash": approval.request_hash, "took_effect": None},
    ):
        r = api.post(url, body, format="json")
        assert r.status_code == 400 and "took_effect" in r.json()["fields"], body
    r = api.post(url, {"request_hash": "0" * 64, "took_effect": True}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "approval_stale"
    assert Approval.objects.get(id=approval.id).status == "pending"  # nothing half-written
    r = api.post(
        url, {"request_hash": approval.request_hash, "took_effect": True, "reason": "receipt r-42"}, format="json"
    )
    assert r.status_code == 200 and r.json()["status"] == "confirmed"
    r = api.post(url, {"request_hash": approval.request_hash, "took_effect": False}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "approval_decided"
    r = api.post(f"/api/approvals/{approval.id}/approve/", {"request_hash": approval.request_hash}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "approval_decided"
    resolved = Event.objects.get(run=run, type="approval.resolved").payload
    assert (resolved["decision"], resolved["took_effect"], resolved["decided_via"], resolved["reason"]) == (
        "confirmed",
        True,
        "api",
        "receipt r-42",
    )
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.count() == 1


def test_confirm_needs_the_permission(uncertain_run, tenant):
    from runs.services import tenant_create

    _, viewer = tenant_create(name=tenant.name, username="viewer", password="pw")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {AuthToken.objects.create(user=viewer)[1]}")
    _, approval = uncertain_run
    r = client.post(
        f"/api/approvals/{approval.id}/confirm/",
        {"request_hash": approval.request_hash, "took_effect": True},
        format="json",
    )
    assert r.status_code == 403 and Approval.objects.get(id=approval.id).status == "pending"


def test_a_policy_approval_cannot_be_confirmed(api, load_agent, submit):
    policy = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": "http://127.0.0.1:9/x", "json": {}}}]},
            {"text": "x"},
        ],
        tools=("http_post",),
        policy=policy,
    )
    run = submit()
    run_drive(run_id=run.id)
    approval = Approval.objects.get(run=run)
    r = api.post(
        f"/api/approvals/{approval.id}/confirm/",
        {"request_hash": approval.request_hash, "took_effect": True},
        format="json",
    )
    assert r.status_code == 409 and r.json()["code"] == "approval_not_confirmable"
    assert Approval.objects.get(id=approval.id).status == "pending"


def test_an_interrupted_side_effect_can_be_confirmed_and_nothing_is_sent(
    monkeypatch, load_agent, submit, sink, operator
):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
    )
    run = submit()
    die_at(monkeypatch, run, "tool.after_execute")  # sent, then the process died before recording it
    assert run_resume(run_id=run.id, via="test") == "waiting"
    approval = Approval.objects.get(run=run)
    assert approval.kind == "interrupted_side_effect"
    approval_confirm(
        user=operator, approval_id=approval.id, request_hash=approval.request_hash, took_effect=True, via="api"
    )
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and reload(run).final_message == "paid"
    assert sink.count() == 1
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.error, inv.result["outcome"]) == ("completed", "succeeded", None, "confirmed")


def test_the_openapi_schema_documents_confirm(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    op = schema["paths"]["/api/approvals/{id}/confirm/"]["post"]
    assert op["operationId"] == "approvals_confirm" and {"200", "400", "403", "404", "409"} <= set(op["responses"])
    body = schema["components"]["schemas"]["ApprovalConfirmationRequest"]
    assert body["properties"]["took_effect"]["type"] == "boolean" and set(body["required"]) == {
        "request_hash",
        "took_effect",
    }


# -- confirm in the admin and on the live page ------------------------------------------


def staff(operator):
    operator.is_staff = True
    operator.save()
    return operator


def test_the_admin_confirm_action_shows_a_confirmation_page_then_confirms(client, operator, uncertain_run, sink):
    run, approval = uncertain_run
    client.force_login(staff(operator))
    url = "/admin/approvals/approval/"
    page = client.post(url, {"action": "confirm_took_effect_selected", "_selected_action": [str(approval.id)]})
    assert (
        page.status_code == 200 and b"Yes, confirm" in page.content and approval.request_hash.encode() in page.content
    )
    assert Approval.objects.get(id=approval.id).status == "pending"
    client.post(
        url,
        {
            "action": "confirm_took_effect_selected",
            "_selected_action": [str(approval.id)],
            "confirm": "yes",
            f"hash_{approval.id}": approval.request_hash,
            "reason": "seen in the ledger",
        },
    )
    approval.refresh_from_db()
    assert (approval.status, approval.decided_via) == ("confirmed", "admin")
    assert Event.objects.get(run=run, type="approval.resolved").payload["took_effect"] is True


def test_the_live_page_offers_confirm_and_records_it(client, operator, uncertain_run):
    run, approval = uncertain_run
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/")
    assert (
        page.status_code == 200 and b"uncertain_side_effect" in page.content
    )  # the pending card's data; detail.js draws the buttons
    client.post(
        f"/runs/{run.id}/decide/",
        {"approval": str(approval.id), "request_hash": approval.request_hash, "decision": "not_taken"},
    )
    approval.refresh_from_db()
    assert (approval.status, approval.decided_via) == ("confirmed", "live")
    assert Event.objects.get(run=run, type="approval.resolved").payload["took_effect"] is False
    assert reload(run).status == "QUEUED"


def test_an_approved_rerun_of_an_interrupted_call_leaves_one_consistent_record(
    monkeypatch, load_agent, submit, sink, operator
):
    """Item 7: before, the row said `completed` with the first attempt's
    "outcome unknown" still in `error`; now every attempt is in `attempts`
    and a completed call carries no error."""
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "paid"},
        ],
        tools=("http_post",),
    )
    run = submit()
    die_at(monkeypatch, run, "tool.after_watermark")
    assert run_resume(run_id=run.id, via="test") == "waiting"
    assert ToolInvocation.objects.get(run=run).error["outcome"] == "unknown"
    approval = Approval.objects.get(run=run)
    approval_decide(user=operator, approval_id=approval.id, approve=True, request_hash=approval.request_hash, via="api")
    run_drive(run_id=run.id)
    assert reload(run).status == "COMPLETED" and sink.count() == 1
    inv = ToolInvocation.objects.get(run=run)
    assert (inv.status, inv.outcome, inv.error, inv.attempt) == ("completed", "succeeded", None, 2)
    assert [(a["attempt"], a["outcome"]) for a in inv.attempts] == [(1, "uncertain"), (2, "succeeded")]
    completed = Event.objects.get(run=run, type="tool.call.completed").payload
    assert (completed["attempt"], completed["outcome"]) == (2, "succeeded")
