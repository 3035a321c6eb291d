"""The admin as the operator console: permission-gated, tenant-scoped,
hash-bound decisions through the approval service."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from approvals.models import Approval
from runs.models import Run
from runs.runtime.executor import run_drive
from runs.services import tenant_create

pytestmark = pytest.mark.django_db(transaction=True)

POLICY = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


@pytest.fixture
def waiting(load_agent, submit, sink):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 500}}}]},
            {"text": "ok"},
        ],
        tools=("http_post",),
        policy=POLICY,
    )
    run = submit()
    run_drive(run_id=run.id)
    return Approval.objects.get(run=run)


def staff(username, tenant_name="acme", perms=("view_approval", "view_run")):
    _, user = tenant_create(name=tenant_name, username=username, password="pw")
    user.is_staff = True  # members are not staff by default (create_tenant --operator is)
    user.save()
    user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def test_the_console_lists_pending_approvals_with_what_would_run(waiting, operator):
    client = Client()
    client.force_login(operator)
    page = client.get("/admin/approvals/approval/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "http_post" in html and "external_write" in html and "500" in html
    assert "approve_selected" in html
    detail = client.get(f"/admin/approvals/approval/{waiting.id}/change/").content.decode()
    assert waiting.request_hash in detail and "Approve" in detail and "&quot;amount&quot;: 500" in detail


def test_approve_through_the_confirmation_page_posts_the_hash_shown(waiting, operator, sink):
    client = Client()
    client.force_login(operator)
    confirm = client.post(
        "/admin/approvals/approval/", {"action": "approve_selected", "_selected_action": [waiting.id]}
    )
    assert confirm.status_code == 200 and waiting.request_hash in confirm.content.decode()
    assert Approval.objects.get(id=waiting.id).status == "pending"  # nothing decided yet
    done = client.post(
        "/admin/approvals/approval/",
        {
            "action": "approve_selected",
            "_selected_action": [waiting.id],
            "confirm": "yes",
            f"hash_{waiting.id}": waiting.request_hash,
            "reason": "looks right",
        },
    )
    assert done.status_code == 302
    decided = Approval.objects.get(id=waiting.id)
    assert decided.status == "approved" and decided.decided_via == "admin" and decided.reason == "looks right"
    assert Run.objects.get(id=waiting.run_id).status == "QUEUED"


def test_a_hash_other_than_the_one_shown_changes_nothing(waiting, operator):
    client = Client()
    client.force_login(operator)
    client.post(f"/admin/approvals/approval/{waiting.id}/decide/", {"decision": "approve", "request_hash": "f" * 64})
    assert Approval.objects.get(id=waiting.id).status == "pending"
    client.post(
        f"/admin/approvals/approval/{waiting.id}/decide/",
        {"decision": "reject", "request_hash": waiting.request_hash, "reason": "no"},
    )
    assert Approval.objects.get(id=waiting.id).status == "rejected"


def test_staff_without_the_permission_see_no_action_and_a_forged_post_changes_nothing(waiting):
    client = staff("viewer")
    page = client.get("/admin/approvals/approval/")
    assert page.status_code == 200 and "approve_selected" not in page.content.decode()
    client.post(
        "/admin/approvals/approval/",
        {
            "action": "approve_selected",
            "_selected_action": [waiting.id],
            "confirm": "yes",
            f"hash_{waiting.id}": waiting.request_hash,
        },
    )
    forged = client.post(
        f"/admin/approvals/approval/{waiting.id}/decide/", {"decision": "approve", "request_hash": waiting.request_hash}
    )
    assert forged.status_code == 403
    assert Approval.objects.get(id=waiting.id).status == "pending"


def test_another_tenants_approval_is_404(waiting):
    client = staff("outsider", tenant_name="globex", perms=("view_approval", "resolve_approval"))
    assert client.get(f"/admin/approvals/approval/{waiting.id}/change/").status_code == 404
    assert client.get(f"/admin/runs/run/{waiting.run_id}/change/").status_code == 404
    assert str(waiting.id) not in client.get("/admin/approvals/approval/?status=all").content.decode()
    assert (
        client.post(
            f"/admin/approvals/approval/{waiting.id}/decide/",
            {"decision": "approve", "request_hash": waiting.request_hash},
        ).status_code
        == 404
    )
    assert Approval.objects.get(id=waiting.id).status == "pending"


def test_admin_decisions_are_csrf_protected(waiting, operator):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(
        f"/admin/approvals/approval/{waiting.id}/decide/", {"decision": "approve", "request_hash": waiting.request_hash}
    )
    assert response.status_code == 403
    assert Approval.objects.get(id=waiting.id).status == "pending"


def test_status_fields_are_read_only_in_the_run_admin(waiting, operator):
    operator.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(operator)
    page = client.get(f"/admin/runs/run/{waiting.run_id}/change/")
    assert page.status_code == 200
    assert 'name="status"' not in page.content.decode()
