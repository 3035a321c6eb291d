"""Issue 10 item 5: a superuser sees every tenant but acts only in its own.
`root` is a superuser and a member of acme; on globex's run and approval
every act — cancel, resume, input, approve, reject — is 404 on REST, the
live pages and the admin, and changes nothing; reading still works."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import Approval
from runs.models import Event, Run
from tests.api.conftest import token_client
from tests.security.authz_world import live_server_url, two_tenants  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def snapshot(tenant):
    return (
        sorted(Run.objects.filter(tenant=tenant).values_list("id", "status", "cancel_requested_at", "lease_epoch")),
        sorted(Approval.objects.filter(tenant=tenant).values_list("id", "status")),
        Event.objects.filter(tenant=tenant).count(),
    )


def test_rest_acts_of_a_superuser_in_another_tenant_are_404(two_tenants):
    api = token_client(two_tenants.root)
    other = two_tenants.globex
    before = snapshot(other.tenant)
    assert api.get(f"/api/runs/{other.waiting.id}/").status_code == 200
    assert api.get(f"/api/approvals/{other.approval.id}/").status_code == 200
    acts = [
        (f"/api/runs/{other.waiting.id}/cancel/", {}),
        (f"/api/runs/{other.waiting.id}/resume/", {}),
        (f"/api/runs/{other.asking.id}/input/", {"text": "eu-west"}),
        (f"/api/approvals/{other.approval.id}/approve/", {"request_hash": other.approval.request_hash}),
        (f"/api/approvals/{other.approval.id}/reject/", {"request_hash": other.approval.request_hash}),
    ]
    for path, body in acts:
        response = api.post(path, body, format="json")
        assert response.status_code == 404 and response.json()["code"] == "not_found", (path, response.content)
    assert snapshot(other.tenant) == before
    # ... and in its own tenant the same acts work.
    own = two_tenants.acme
    assert (
        api.post(
            f"/api/approvals/{own.approval.id}/approve/", {"request_hash": own.approval.request_hash}, format="json"
        ).status_code
        == 200
    )
    assert api.post(f"/api/runs/{own.asking.id}/input/", {"text": "eu-west"}, format="json").status_code == 202


def test_live_page_acts_of_a_superuser_in_another_tenant_are_404(two_tenants):
    client = Client()
    client.force_login(two_tenants.root)
    other = two_tenants.globex
    before = snapshot(other.tenant)
    assert client.get(f"/runs/{other.waiting.id}/").status_code == 200
    assert client.post(f"/runs/{other.waiting.id}/cancel/").status_code == 404
    assert (
        client.post(
            f"/runs/{other.waiting.id}/decide/",
            {"approval": str(other.approval.id), "decision": "approve", "request_hash": other.approval.request_hash},
        ).status_code
        == 404
    )
    assert snapshot(other.tenant) == before


def test_admin_acts_of_a_superuser_in_another_tenant_are_404(two_tenants):
    client = Client()
    client.force_login(two_tenants.root)
    other = two_tenants.globex
    before = snapshot(other.tenant)
    assert client.get(f"/admin/runs/run/{other.waiting.id}/change/").status_code == 200
    for action in ("cancel_runs", "resume_runs"):
        for confirm in ({}, {"confirm": "yes"}):
            response = client.post(
                "/admin/runs/run/", {"action": action, "_selected_action": [str(other.waiting.id)], **confirm}
            )
            assert response.status_code == 404, (action, confirm)
    for action in ("approve_selected", "reject_selected"):
        response = client.post(
            "/admin/approvals/approval/",
            {
                "action": action,
                "_selected_action": [str(other.approval.id)],
                "confirm": "yes",
                f"hash_{other.approval.id}": other.approval.request_hash,
            },
        )
        assert response.status_code == 404
    response = client.post(
        f"/admin/approvals/approval/{other.approval.id}/decide/",
        {"decision": "approve", "request_hash": other.approval.request_hash},
    )
    assert response.status_code == 404
    assert snapshot(other.tenant) == before
    # its own tenant's run: the confirmation page, then the cancel.
    own = two_tenants.acme.waiting
    assert (
        client.post("/admin/runs/run/", {"action": "cancel_runs", "_selected_action": [str(own.id)]}).status_code == 200
    )
    client.post("/admin/runs/run/", {"action": "cancel_runs", "_selected_action": [str(own.id)], "confirm": "yes"})
    assert Run.objects.get(id=own.id).status == "CANCELLED"


@pytest.mark.e2e
def test_over_a_real_server_a_superusers_cross_tenant_acts_are_404(two_tenants, live_server_url):
    from tests.security.authz_world import http, token_header

    auth = token_header(two_tenants.root)
    other = two_tenants.globex
    before = snapshot(other.tenant)
    code, body = http(live_server_url, "GET", f"/api/runs/{other.waiting.id}/", auth=auth)
    assert code == 200 and body["id"] == str(other.waiting.id)
    for path, body in [
        (f"/api/runs/{other.waiting.id}/cancel/", {}),
        (f"/api/runs/{other.asking.id}/input/", {"text": "x"}),
        (f"/api/approvals/{other.approval.id}/approve/", {"request_hash": other.approval.request_hash}),
    ]:
        code, answer = http(live_server_url, "POST", path, auth=auth, body=body)
        assert code == 404 and answer["code"] == "not_found", (path, answer)
    assert snapshot(other.tenant) == before
