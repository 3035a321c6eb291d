"""The admin over subscriptions and deliveries: tenant-scoped (another
tenant's row is 404), the secret shown once on the page after "Save", a
"send test event" button and action, and a hook's failure visible."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from runs.models import Run
from runs.services import tenant_create
from webhooks.delivery import deliver
from webhooks.models import Delivery, WebhookSubscription
from webhooks.secrets import decrypt

from .conftest import completed_delivery, subscribe

pytestmark = pytest.mark.django_db(transaction=True)


def console(username, tenant_name, operator=True):
    _, user = tenant_create(name=tenant_name, username=username, password="pw", operator=operator)
    client = Client()
    client.force_login(user)
    return client, user


@pytest.fixture(autouse=True)
def _hosts(settings):
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1:9"]


def test_a_subscription_made_in_the_admin_shows_its_secret_once(tenant):
    client, _ = console("acme-op", "acme")
    page = client.post(
        "/admin/webhooks/webhooksubscription/add/",
        {
            "url": "http://127.0.0.1:9/hook",
            "event_types": ["approval.requested", "run.waiting_for_user"],
            "active": "on",
            "description": "pager",
        },
    )
    assert page.status_code == 200, page.content[:500]
    assert "no-store" in page["Cache-Control"]
    secret = re.search(r'<code id="webhook-secret">(whsec_[A-Za-z0-9_\-]+)</code>', page.content.decode()).group(1)
    row = WebhookSubscription.objects.get()
    assert row.tenant_id == tenant.id and row.event_types == ["approval.requested", "run.waiting_for_user"]
    assert decrypt(row.secret_encrypted) == secret
    for path in ("/admin/webhooks/webhooksubscription/", f"/admin/webhooks/webhooksubscription/{row.id}/change/"):
        html = client.get(path).content.decode()
        assert secret not in html and row.secret_encrypted not in html


def test_the_admin_refuses_a_url_off_the_allow_list(tenant):
    client, _ = console("acme-op", "acme")
    page = client.post(
        "/admin/webhooks/webhooksubscription/add/", {"url": "http://evil.example.net/", "event_types": ["run.failed"]}
    )
    assert page.status_code == 200 and "not in AGENTRT_WEBHOOK_ALLOWED_HOSTS" in page.content.decode()
    assert not WebhookSubscription.objects.exists()


def test_send_test_event_button_and_tenant_scoping(tenant):
    mine, me = console("acme-op", "acme")
    theirs, _ = console("globex-op", "globex")
    sub, _ = subscribe(me, "http://127.0.0.1:9/hook", ["run.completed"])
    change = mine.get(f"/admin/webhooks/webhooksubscription/{sub.id}/change/")
    assert change.status_code == 200 and "Send test event" in change.content.decode()
    assert mine.post(f"/admin/webhooks/webhooksubscription/{sub.id}/test/").status_code == 302
    assert (
        mine.post(
            "/admin/webhooks/webhooksubscription/", {"action": "send_test_event", "_selected_action": [sub.id]}
        ).status_code
        == 302
    )
    tests = list(Delivery.objects.filter(subscription=sub, event_type="webhook.test"))
    assert len(tests) == 2
    # globex's staff: nothing of acme's, 404 on every page and action
    assert str(sub.id) not in theirs.get("/admin/webhooks/webhooksubscription/").content.decode()
    for path in (
        f"/admin/webhooks/webhooksubscription/{sub.id}/change/",
        f"/admin/webhooks/webhooksubscription/{sub.id}/delete/",
        f"/admin/webhooks/delivery/{tests[0].id}/change/",
    ):
        assert theirs.get(path).status_code == 404, path
    assert theirs.post(f"/admin/webhooks/webhooksubscription/{sub.id}/test/").status_code == 404
    assert (
        theirs.post(
            f"/admin/webhooks/webhooksubscription/{sub.id}/change/",
            {"url": "http://127.0.0.1:9/steal", "event_types": ["run.completed"]},
        ).status_code
        == 404
    )
    assert str(tests[0].id) not in theirs.get("/admin/webhooks/delivery/").content.decode()
    assert Delivery.objects.filter(subscription=sub).count() == 2 and WebhookSubscription.objects.get(
        id=sub.id
    ).url.endswith("/hook")


def test_a_member_without_the_permission_cannot_add_or_test(tenant):
    client, user = console("viewer", "acme", operator=False)
    user.is_staff = True
    user.save()
    client.force_login(user)
    assert client.get("/admin/webhooks/webhooksubscription/add/").status_code == 403
    op, me = console("acme-op", "acme")
    sub, _ = subscribe(me, "http://127.0.0.1:9/hook", ["run.completed"])
    assert client.post(f"/admin/webhooks/webhooksubscription/{sub.id}/test/").status_code in (403, 404)
    assert not Delivery.objects.exists()


def test_a_failing_hook_shows_in_the_admin_and_the_run_stays_completed(tenant, load_agent, submit, hook_registry):
    def boom(view):
        raise RuntimeError("crm is down")

    hook_registry.register("crm.sync")(boom)
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    client, _ = console("acme-op", "acme")
    listing = client.get("/admin/webhooks/delivery/").content.decode()
    assert "crm.sync" in listing and "RuntimeError: crm is down" in listing
    detail = client.get(f"/admin/webhooks/delivery/{d.id}/change/").content.decode()
    assert "RuntimeError: crm is down" in detail and str(run.id) in detail
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    theirs, _ = console("globex-op", "globex")
    assert theirs.get(f"/admin/webhooks/delivery/{d.id}/change/").status_code == 404


def test_the_admin_refuses_a_subscription_beyond_the_limit(tenant, settings):
    settings.AGENTRT_WEBHOOK_MAX_PER_TENANT = 1
    client, me = console("acme-op", "acme")
    subscribe(me, "http://127.0.0.1:9/hook", ["run.completed"])
    page = client.post(
        "/admin/webhooks/webhooksubscription/add/", {"url": "http://127.0.0.1:9/b", "event_types": ["run.failed"]}
    )
    assert page.status_code == 200 and "AGENTRT_WEBHOOK_MAX_PER_TENANT" in page.content.decode()
    assert WebhookSubscription.objects.count() == 1
