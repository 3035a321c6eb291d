"""Every route of DESIGN §16: the happy path and each documented error code."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals.models import Approval
from runs.models import Event, Run
from runs.runtime.queue import run_claim

pytestmark = pytest.mark.django_db(transaction=True)


def reload(run):
    return Run.objects.get(id=run.id)


def expire_lease(run):
    # Test-only: make a claimed run's lease lapse, as a dead worker's would.
    with connection.cursor() as cur:
        cur.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [run.id])


def assert_error(response, status, code, field=None):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code, body
    assert body["message"] and body["request_id"]
    if field is not None:
        assert field in body.get("fields", {}), body
    return body


RUN_KEYS = {
    "id",
    "session",
    "agent",
    "agent_version",
    "status",
    "failure",
    "usage",
    "step_count",
    "final_message",
    "result",
    "parent",
    "children",
    "forked_from",
    "forks",
    "replay_of",
    "cancel_requested_at",
    "retryable",
    "created_at",
    "updated_at",
}
USAGE_KEYS = {
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "cost_usd",
    "model_calls",
    "tool_calls",
    "steps",
}
APPROVAL_KEYS = {
    "id",
    "run",
    "invocation",
    "kind",
    "status",
    "request_hash",
    "presentation",
    "expires_at",
    "deadline_passed",
    "decisions",
    "ends_run",
    "decided_by",
    "decided_at",
    "decided_via",
    "reason",
    "created_at",
}


# -- agents ------------------------------------------------------------------------


def test_post_agent_creates_a_version_and_get_lists_versions(tenant, operator, as_user):
    client = as_user(operator)
    definition = {
        "name": "greeter",
        "instructions": "hi",
        "model": {"provider": "scripted", "turns": [{"text": "hi"}]},
        "tools": ["echo"],
        "limits": {"max_steps": 4},
    }
    first = client.post("/api/agents/", definition, format="json")
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["agent"] == "greeter" and len(body["version"]) == 64 and body["latest"] is True
    assert body["definition"]["limits"] == {"max_steps": 4}
    assert body["published_by"] == "op" and body["published_at"]
    definition["instructions"] = "hello"
    second = client.post("/api/agents/", definition, format="json").json()
    assert second["version"] != body["version"]
    listed = client.get("/api/agents/", {"name": "greeter"}).json()
    assert listed["count"] == 2 and {"count", "next", "previous", "results"} <= set(listed)
    assert [v["latest"] for v in listed["results"]] == [True, False]


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d.update(tools=["rm_rf"]), "tools"),
        (lambda d: d["model"].update(provider="nope"), "model"),
        (lambda d: d.update(limits={"max_steps": "10"}), "limits.max_steps"),
        (lambda d: d.update(limits={"max_steps": True}), "limits.max_steps"),
        (lambda d: d.update(name=7), "name"),
        (lambda d: d.update(policy={"rules": [{"tool": "echo", "decision": "maybe"}]}), "policy.rules.0.decision"),
    ],
)
def test_post_agent_refuses_an_invalid_definition_naming_the_field(tenant, operator, as_user, mutate, field):
    definition = {"name": "greeter", "model": {"provider": "scripted", "turns": []}, "tools": ["echo"]}
    mutate(definition)
    response = as_user(operator).post("/api/agents/", definition, format="json")
    body = assert_error(response, 400, "invalid")
    assert any(key.startswith(field) for key in body["fields"]), body


# -- runs --------------------------------------------------------------------------


def test_post_run_creates_a_queued_run_in_the_rest_shape(world, alice, as_user):
    response = as_user(alice).post(
        "/api/runs/", {"agent": "bot", "input": "hello", "limits": {"max_steps": 3}}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == RUN_KEYS and set(body["usage"]) == USAGE_KEYS
    assert body["status"] == "QUEUED" and body["agent"] == "bot" and body["failure"] is None
    row = Run.objects.get(id=body["id"])
    assert row.tenant_id == world.tenant.id and row.limits["max_steps"] == 3
    assert response["X-Request-ID"]


def test_post_run_continues_a_session_once_its_run_ended(world, alice, as_user):
    response = as_user(alice).post(
        "/api/runs/", {"agent": "bot", "input": "again", "session": str(world.done.session_id)}, format="json"
    )
    assert response.status_code == 201 and response.json()["session"] == str(world.done.session_id)


def test_post_run_refuses_an_unknown_agent_and_invalid_fields(world, alice, as_user):
    client = as_user(alice)
    assert_error(
        client.post("/api/runs/", {"agent": "ghost", "input": "x"}, format="json"), 400, "unknown_agent", "agent"
    )
    assert_error(client.post("/api/runs/", {"agent": "bot"}, format="json"), 400, "invalid", "input")
    assert_error(client.post("/api/runs/", {"agent": "bot", "input": "   "}, format="json"), 400, "invalid", "input")
    assert_error(client.post("/api/runs/", {"agent": "bot", "input": 5}, format="json"), 400, "invalid", "input")
    assert_error(
        client.post("/api/runs/", {"agent": "bot", "input": "x", "session": "nope"}, format="json"),
        400,
        "invalid",
        "session",
    )
    assert_error(
        client.post("/api/runs/", {"agent": "bot", "input": "x", "limits": {"max_steps": 99999}}, format="json"),
        400,
        "invalid",
        "limits.max_steps",
    )
    assert_error(
        client.post("/api/runs/", {"agent": "bot", "input": "x", "limits": {"max_steps": 64}}, format="json"),
        400,
        "invalid",
        "limits.max_steps",
    )  # may only tighten the agent's 32
    assert_error(
        client.post("/api/runs/", {"agent": "bot", "input": "x", "limits": [1]}, format="json"),
        400,
        "invalid",
        "limits",
    )
    assert_error(client.post("/api/runs/", [1, 2], format="json"), 400, "invalid", "(root)")


def test_post_run_with_another_tenants_session_is_an_unknown_session(world, other_world, alice, as_user):
    response = as_user(alice).post(
        "/api/runs/", {"agent": "bot", "input": "x", "session": str(other_world.done.session_id)}, format="json"
    )
    assert_error(response, 400, "invalid", "session")


def test_post_run_to_a_busy_session_is_409_unless_its_run_waits_for_the_user(world, alice, as_user):
    client = as_user(alice)
    busy = client.post(
        "/api/runs/", {"agent": "bot", "input": "x", "session": str(world.queued.session_id)}, format="json"
    )
    assert_error(busy, 409, "session_busy")
    routed = client.post(
        "/api/runs/", {"agent": "asker", "input": "eu-west", "session": str(world.asking.session_id)}, format="json"
    )
    assert routed.status_code == 202, routed.content
    assert routed.json() == {"run": str(world.asking.id), "routed": "input"}
    assert reload(world.asking).status == "QUEUED"
    assert Event.objects.get(run=world.asking, type="run.input_received").payload["text"] == "eu-west"


def test_get_runs_is_paginated_newest_first_and_filters(world, alice, as_user):
    client = as_user(alice)
    body = client.get("/api/runs/").json()
    assert body["count"] == 6 and body["previous"] is None
    assert [r["id"] for r in body["results"]][0] == str(world.child.id)  # the lead's child was created last
    page = client.get("/api/runs/", {"page_size": 2}).json()
    assert len(page["results"]) == 2 and page["next"]
    waiting = client.get("/api/runs/", {"status": "WAITING_FOR_USER"}).json()
    assert [r["id"] for r in waiting["results"]] == [str(world.asking.id)]
    by_session = client.get("/api/runs/", {"session": str(world.done.session_id)}).json()
    assert [r["id"] for r in by_session["results"]] == [str(world.done.id)]
    assert_error(client.get("/api/runs/", {"status": "SUCCEEDED"}), 400, "invalid", "status")
    assert_error(client.get("/api/runs/", {"session": "x"}), 400, "invalid", "session")
    assert_error(client.get("/api/runs/", {"page": 99}), 404, "not_found")


def test_get_run_shows_the_rest_shape(world, alice, as_user):
    body = as_user(alice).get(f"/api/runs/{world.done.id}/").json()
    assert set(body) == RUN_KEYS
    assert body["status"] == "COMPLETED" and body["final_message"] == "done" and body["usage"]["model_calls"] == 1
    assert body["created_at"].endswith("Z")


def test_events_page_with_an_exclusive_cursor(world, alice, as_user):
    client = as_user(alice)
    everything = client.get(f"/api/runs/{world.done.id}/events/").json()
    sequences = [e["sequence"] for e in everything["results"]]
    assert len(sequences) >= 4 and everything["next_after"] is None
    assert set(everything["results"][0]) == {"sequence", "type", "run", "payload", "occurred_at"}
    assert everything["results"][0]["type"] == "run.created"
    first = client.get(f"/api/runs/{world.done.id}/events/", {"limit": 2}).json()
    assert [e["sequence"] for e in first["results"]] == sequences[:2] and first["next_after"] == sequences[1]
    rest = client.get(f"/api/runs/{world.done.id}/events/", {"after": first["next_after"], "limit": 500}).json()
    assert [e["sequence"] for e in rest["results"]] == sequences[2:] and rest["next_after"] is None


@pytest.mark.parametrize(
    "query, field",
    [
        ({"after": "-1"}, "after"),
        ({"after": "x"}, "after"),
        ({"after": "1.5"}, "after"),
        ({"after": str(2**64)}, "after"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "-3"}, "limit"),
        ({"limit": "ten"}, "limit"),
    ],
)
def test_events_refuse_a_bad_cursor_or_limit_naming_the_field(world, alice, as_user, query, field):
    assert_error(as_user(alice).get(f"/api/runs/{world.done.id}/events/", query), 400, "invalid", field)


def test_cancel_a_queued_run_then_again_is_run_terminal(world, alice, as_user):
    client = as_user(alice)
    response = client.post(f"/api/runs/{world.queued.id}/cancel/")
    assert response.status_code == 202 and response.json()["status"] == "CANCELLED"
    assert_error(client.post(f"/api/runs/{world.queued.id}/cancel/"), 409, "run_terminal")


def test_cancel_a_running_run_twice_is_202_twice(world, alice, as_user):
    run_claim(run_id=world.queued.id, owner="worker-x")
    client = as_user(alice)
    for _ in range(2):
        response = client.post(f"/api/runs/{world.queued.id}/cancel/", {}, format="json")
        assert response.status_code == 202 and response.json()["status"] == "RUNNING"
    assert reload(world.queued).cancel_requested_at is not None


def test_cancel_a_waiting_run_ends_it_and_its_approval(world, alice, as_user):
    response = as_user(alice).post(f"/api/runs/{world.waiting.id}/cancel/")
    assert response.status_code == 202 and response.json()["status"] == "CANCELLED"
    assert Approval.objects.get(id=world.approval.id).status == "cancelled"


def test_resume_takes_over_an_expired_lease(world, alice, as_user):
    run_claim(run_id=world.queued.id, owner="dead-worker")
    expire_lease(world.queued)
    response = as_user(alice).post(f"/api/runs/{world.queued.id}/resume/")
    assert response.status_code == 200, response.content
    assert response.json() == {"outcome": "continue"}
    assert reload(world.queued).status == "QUEUED"
    assert Event.objects.get(run=world.queued, type="lease.taken_over").payload["via"] == "api"


def test_resume_refuses_a_live_lease_and_a_run_that_is_not_running(world, alice, as_user):
    client = as_user(alice)
    assert_error(client.post(f"/api/runs/{world.queued.id}/resume/"), 409, "run_not_running")
    run_claim(run_id=world.queued.id, owner="live-worker")
    assert_error(client.post(f"/api/runs/{world.queued.id}/resume/"), 409, "run_leased")
    assert reload(world.queued).lease_owner == "live-worker"


def test_input_requeues_a_run_waiting_for_the_user_and_only_that(world, alice, as_user):
    client = as_user(alice)
    response = client.post(f"/api/runs/{world.asking.id}/input/", {"text": "eu-west"}, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "QUEUED"
    assert Event.objects.get(run=world.asking, type="run.input_received").payload["by"] == "alice"
    assert_error(
        client.post(f"/api/runs/{world.asking.id}/input/", {"text": "again"}, format="json"),
        409,
        "run_not_waiting_for_input",
    )
    assert_error(
        client.post(f"/api/runs/{world.done.id}/input/", {"text": "x"}, format="json"), 409, "run_not_waiting_for_input"
    )
    assert_error(client.post(f"/api/runs/{world.queued.id}/input/", {}, format="json"), 400, "invalid", "text")


# -- approvals ---------------------------------------------------------------------


def test_approvals_list_filters_by_status_and_detail_shows_the_decision_fields(world, alice, as_user):
    client = as_user(alice)
    pending = client.get("/api/approvals/", {"status": "pending"}).json()
    assert pending["count"] == 1 and pending["results"][0]["id"] == str(world.approval.id)
    assert client.get("/api/approvals/", {"status": "approved"}).json()["count"] == 0
    assert client.get("/api/approvals/", {"run": str(world.waiting.id)}).json()["count"] == 1
    assert_error(client.get("/api/approvals/", {"status": "maybe"}), 400, "invalid", "status")
    body = client.get(f"/api/approvals/{world.approval.id}/").json()
    assert set(body) == APPROVAL_KEYS
    assert (
        body["kind"] == "policy" and body["status"] == "pending" and body["request_hash"] == world.approval.request_hash
    )
    assert body["presentation"]["tool"] == "http_post" and body["presentation"]["arguments"]["json"] == {"amount": 500}
    assert body["decided_by"] is None and body["decided_via"] is None and body["expires_at"]
    assert body["deadline_passed"] is False and body["decisions"] == ["approve", "reject"] and body["ends_run"] is None


def test_approve_with_the_shown_hash_requeues_the_run(world, operator, as_user):
    response = as_user(operator).post(
        f"/api/approvals/{world.approval.id}/approve/",
        {"request_hash": world.approval.request_hash, "reason": "looks fine"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved" and body["decided_by"] == "op" and body["decided_via"] == "api"
    assert body["reason"] == "looks fine" and body["decided_at"]
    assert reload(world.waiting).status == "QUEUED"
    resolved = Event.objects.get(run=world.waiting, type="approval.resolved").payload
    assert resolved["decided_via"] == "api" and resolved["decision"] == "approved"


def test_reject_gives_a_rejected_approval(world, operator, as_user):
    response = as_user(operator).post(
        f"/api/approvals/{world.approval.id}/reject/", {"request_hash": world.approval.request_hash}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "rejected"


def test_decisions_conflict_when_decided_stale_or_expired(world, operator, as_user):
    client = as_user(operator)
    url = f"/api/approvals/{world.approval.id}/approve/"
    assert_error(client.post(url, {"request_hash": "0" * 64}, format="json"), 409, "approval_stale")
    assert Approval.objects.get(id=world.approval.id).status == "pending"
    with connection.cursor() as cur:  # test-only: the approval's time runs out
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [world.approval.id])
    assert_error(
        client.post(url, {"request_hash": world.approval.request_hash}, format="json"), 409, "approval_expired"
    )
    with connection.cursor() as cur:
        cur.execute("UPDATE approvals SET expires_at = now() + interval '1 hour' WHERE id = %s", [world.approval.id])
    assert client.post(url, {"request_hash": world.approval.request_hash}, format="json").status_code == 200
    assert_error(
        client.post(url, {"request_hash": world.approval.request_hash}, format="json"), 409, "approval_decided"
    )
    assert_error(
        client.post(
            f"/api/approvals/{world.approval.id}/reject/", {"request_hash": world.approval.request_hash}, format="json"
        ),
        409,
        "approval_decided",
    )


def test_deciding_needs_the_permission_and_a_valid_body(world, alice, operator, as_user):
    url = f"/api/approvals/{world.approval.id}/approve/"
    assert_error(
        as_user(alice).post(url, {"request_hash": world.approval.request_hash}, format="json"), 403, "permission_denied"
    )
    assert_error(as_user(alice).post(url, {}, format="json"), 403, "permission_denied")  # permission before body
    assert Approval.objects.get(id=world.approval.id).status == "pending"
    client = as_user(operator)
    assert_error(client.post(url, {}, format="json"), 400, "invalid", "request_hash")
    assert_error(client.post(url, {"request_hash": 5}, format="json"), 400, "invalid", "request_hash")
    assert_error(
        client.post(url, {"request_hash": world.approval.request_hash, "decided_via": "admin"}, format="json"),
        400,
        "invalid",
        "decided_via",
    )
    assert_error(
        client.post(url, {"request_hash": world.approval.request_hash, "reason": "x" * 2001}, format="json"),
        400,
        "invalid",
        "reason",
    )
    assert Approval.objects.get(id=world.approval.id).status == "pending"


# -- tenancy roles -------------------------------------------------------------------


def test_a_user_without_a_tenant_gets_403_everywhere(world, stranger, as_user):
    client = as_user(stranger)
    for response in (
        client.get("/api/runs/"),
        client.get(f"/api/runs/{world.done.id}/"),
        client.get("/api/approvals/"),
        client.get("/api/agents/"),
        client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json"),
    ):
        assert_error(response, 403, "no_tenant")


def test_a_superuser_sees_every_tenant_and_creates_in_its_own(world, other_world, root, as_user):
    client = as_user(root)
    assert client.get(f"/api/runs/{other_world.done.id}/").status_code == 200
    assert client.get(f"/api/approvals/{other_world.approval.id}/").status_code == 200
    assert client.get("/api/runs/").json()["count"] == 12
    created = client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json")
    assert created.status_code == 201
    assert Run.objects.get(id=created.json()["id"]).tenant_id == world.tenant.id


def test_a_superuser_without_a_tenant_reads_but_cannot_create(world, as_user):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser(username="admin", password="pw")
    client = as_user(admin)
    assert client.get(f"/api/runs/{world.done.id}/").status_code == 200
    assert_error(client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json"), 403, "no_tenant")


# -- auth, schema, docs ----------------------------------------------------------------


def test_drf_create_token_gives_a_working_token(world, alice):
    from io import StringIO

    from django.core.management import call_command
    from rest_framework.test import APIClient

    out = StringIO()
    call_command("drf_create_token", "alice", stdout=out)
    printed = out.getvalue().split()
    assert printed[:2] == ["Generated", "token"] and printed[3:] == ["for", "user", "alice"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {printed[2]}")
    assert client.get("/api/runs/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert_error(client.get("/api/runs/"), 401, "authentication_failed")


def test_session_auth_reads_and_needs_csrf_for_writes(world, alice):
    from rest_framework.test import APIClient

    client = APIClient(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/runs/").status_code == 200
    assert_error(client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json"), 403, "permission_denied")
    token = "a" * 32  # a CSRF secret: the cookie and the header must match
    client.cookies["csrftoken"] = token
    response = client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201, response.content


def test_schema_and_docs_are_served_to_authenticated_users(world, alice, as_user, anon):
    client = as_user(alice)
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    doc = schema.json()
    assert doc["openapi"].startswith("3.")
    paths = set(doc["paths"])
    assert {
        "/api/agents/",
        "/api/runs/",
        "/api/runs/{id}/",
        "/api/runs/{id}/events/",
        "/api/runs/{id}/cancel/",
        "/api/runs/{id}/retry/",
        "/api/runs/{id}/resume/",
        "/api/runs/{id}/input/",
        "/api/runs/{id}/fork/",
        "/api/runs/{id}/replay/",
        "/api/runs/{id}/compare/{other}/",
        "/api/runs/{id}/compare/{other}",
        "/api/approvals/",
        "/api/approvals/{id}/",
        "/api/approvals/{id}/approve/",
        "/api/approvals/{id}/reject/",
        "/api/approvals/{id}/confirm/",
        "/api/webhooks/",
        "/api/webhooks/{id}/",
        "/api/webhooks/{id}/test/",
        "/api/webhooks/{id}/deliveries/",
    } == paths
    create = doc["paths"]["/api/runs/"]["post"]
    assert {"200", "201", "202", "400", "409", "413", "415"} <= set(create["responses"])
    assert "requestBody" in create
    assert doc["components"]["schemas"]["RunCreateRequest"]["additionalProperties"] is False
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    assert client.get("/api/docs/redoc/").status_code == 200
    assert anon.get("/api/schema/").status_code == 401
