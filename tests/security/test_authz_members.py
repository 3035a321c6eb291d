"""Issue 10 item 10: tenant members are not staff; `create_tenant --operator`
makes an operator with admin access and the operator permissions; the auth
(User, Group) and django-q2 admins are superuser-only; `make run`'s demo
operator still has what the first five minutes need."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)
OPERATOR_PERMS = {
    "approvals.resolve_approval",
    "runs.cancel_run",
    "runs.resume_run",
    "runs.view_run",
    "approvals.view_approval",
}
SUPERUSER_ONLY = [
    "/admin/auth/user/",
    "/admin/auth/group/",
    "/admin/django_q/schedule/",
    "/admin/django_q/failure/",
    "/admin/django_q/success/",
    "/admin/django_q/ormq/",
    "/admin/knox/authtoken/",
    "/admin/axes/accessattempt/",
    "/admin/axes/accesslog/",
]


def login(username) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def test_a_member_is_not_staff_and_gets_no_admin(capsys):
    call_command("create_tenant", "acme", "--user", "alice")
    assert "member alice" in capsys.readouterr().out
    alice = get_user_model().objects.get(username="alice")
    assert not alice.is_staff and not alice.user_permissions.exists()
    response = login("alice").get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_an_operator_has_admin_access_and_the_operator_permissions_only(capsys):
    call_command("create_tenant", "acme", "--user", "op", "--operator")
    assert "operator op" in capsys.readouterr().out
    op = get_user_model().objects.get(username="op")
    assert op.is_staff and not op.is_superuser
    assert OPERATOR_PERMS <= op.get_all_permissions()
    assert not op.has_perm("runs.publish_agent") and not op.has_perm("runs.change_tenant")
    client = login("op")
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/approvals/approval/").status_code == 200
    assert client.get("/admin/runs/run/").status_code == 200
    for path in SUPERUSER_ONLY:
        assert client.get(path).status_code == 403, path


def test_even_granted_permissions_do_not_open_the_auth_and_q_admins():
    from django.contrib.auth.models import Permission

    call_command("create_tenant", "acme", "--user", "op", "--operator")
    op = get_user_model().objects.get(username="op")
    op.user_permissions.add(
        *Permission.objects.filter(content_type__app_label__in=["auth", "django_q", "knox", "axes"])
    )
    client = login("op")
    for path in SUPERUSER_ONLY:
        assert client.get(path).status_code == 403, path
    assert (
        client.post(
            "/admin/auth/user/add/", {"username": "evil", "password1": "x1!Aaaaaaaaa", "password2": "x1!Aaaaaaaaa"}
        ).status_code
        == 403
    )
    assert not get_user_model().objects.filter(username="evil").exists()


def test_a_superuser_opens_them():
    get_user_model().objects.create_superuser("admin", password="pw")
    client = login("admin")
    for path in SUPERUSER_ONLY:
        assert client.get(path).status_code == 200, path


def test_the_demo_operator_can_do_the_first_five_minutes():
    call_command("demo", "--no-serve")
    op = get_user_model().objects.get(username="operator")
    assert op.is_staff and op.check_password("operator")
    assert OPERATOR_PERMS <= op.get_all_permissions() and op.has_perm("runs.publish_agent")
    client = login("operator")
    assert client.get("/admin/approvals/approval/").status_code == 200
    assert client.get("/runs/").status_code == 200


def test_a_member_logs_in_to_the_live_pages_without_admin_access():
    call_command("create_tenant", "acme", "--user", "alice", "--password", "correct-Horse-battery-9")
    client = Client()
    assert client.get("/runs/")["Location"].startswith("/accounts/login/")
    assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    response = client.post(
        "/accounts/login/", {"username": "alice", "password": "correct-Horse-battery-9", "next": "/runs/"}
    )
    assert response.status_code == 302 and response["Location"] == "/runs/"
    assert client.get("/runs/").status_code == 200
    assert client.get("/admin/").status_code == 302  # still no admin


def test_the_live_pages_login_is_throttled_like_the_admins():
    from runs.services import tenant_create

    tenant_create(name="acme", username="alice", password="correct-Horse-battery-9")

    def attempt(password):
        return Client(REMOTE_ADDR="127.0.0.1").post("/accounts/login/", {"username": "alice", "password": password})

    for _ in range(4):
        assert attempt("wrong-guess").status_code == 200
    assert attempt("wrong-guess").status_code == 429
    assert attempt("correct-Horse-battery-9").status_code == 429
