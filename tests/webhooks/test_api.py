"""REST of webhook subscriptions: the secret is shown once and never read
back; writes need webhooks.manage_webhooks; another tenant's subscriptions
and deliveries are 404 and stay unchanged; URLs off the allow-list are 400
naming `url`."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import token_client
from webhooks.models import Delivery, WebhookSubscription

pytestmark = pytest.mark.django_db(transaction=True)

URL = "http://127.0.0.1:9/hook"


@pytest.fixture(autouse=True)
def _hosts(settings):
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1:9", "hooks.example.com"]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def ops(tenant):
    """acme's operator (create_tenant --operator grants webhooks.manage_webhooks) and globex's."""
    from runs.services import tenant_create

    _, mine = tenant_create(name="acme", username="acme-op", password="pw", operator=True)
    _, theirs = tenant_create(name="globex", username="globex-op", password="pw", operator=True)
    return token_client(mine), token_client(theirs)


def create(client, **body):
    return client.post("/api/webhooks/", {"url": URL, "event_types": ["run.completed"], **body}, format="json")


def test_the_secret_is_shown_once_at_creation_and_never_again(ops):
    mine, _ = ops
    response = create(mine, event_types=["approval.requested", "run.completed", "run.completed"], description="pager")
    assert response.status_code == 201, response.content
    body = response.json()
    secret = body["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert body["event_types"] == ["run.completed", "approval.requested"] and body["active"] is True
    row = WebhookSubscription.objects.get(id=body["id"])
    assert secret not in row.secret_encrypted  # stored encrypted, not in clear
    reads = [
        mine.get("/api/webhooks/"),
        mine.get(f"/api/webhooks/{row.id}/"),
        mine.patch(f"/api/webhooks/{row.id}/", {"description": "pager 2"}, format="json"),
        mine.post(f"/api/webhooks/{row.id}/test/", {}, format="json"),
        mine.get(f"/api/webhooks/{row.id}/deliveries/"),
    ]
    assert [r.status_code for r in reads] == [200, 200, 200, 202, 200]
    for r in reads:
        assert "secret" not in r.json() and secret not in r.content.decode()
        assert row.secret_encrypted not in r.content.decode()
    test = Delivery.objects.get(subscription=row)
    assert test.event_type == "webhook.test" and secret not in str(test.payload)


def test_the_stored_secret_decrypts_only_with_the_configured_keys(ops, settings):
    from cryptography.fernet import Fernet

    from webhooks.secrets import SecretUnreadable, decrypt, encrypt

    mine, _ = ops
    body = create(mine).json()
    row = WebhookSubscription.objects.get(id=body["id"])
    assert decrypt(row.secret_encrypted) == body["secret"]
    # A dedicated key takes over encryption; secrets stored under the SECRET_KEY-derived key still decrypt.
    settings.AGENTRT_WEBHOOK_SECRET_KEYS = [Fernet.generate_key().decode()]
    assert decrypt(row.secret_encrypted) == body["secret"]
    token = encrypt("whsec_new")
    settings.AGENTRT_WEBHOOK_SECRET_KEYS = []
    with pytest.raises(SecretUnreadable):
        decrypt(token)  # that key is gone
    settings.SECRET_KEY = "another key entirely, long enough to be a real one, 1234567890"
    with pytest.raises(SecretUnreadable):
        decrypt(row.secret_encrypted)


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://evil.example.net/hook", "not in AGENTRT_WEBHOOK_ALLOWED_HOSTS"),
        ("http://127.0.0.1:10/hook", "not in AGENTRT_WEBHOOK_ALLOWED_HOSTS"),  # the right host, another port
        ("ftp://127.0.0.1:9/hook", "only http and https"),
        ("http://user:pw@127.0.0.1:9/hook", "credentials"),
        ("http://127.0.0.1:9/hook#x", "fragment"),
        ("http://hooks.example.com.evil.net/", "not in AGENTRT_WEBHOOK_ALLOWED_HOSTS"),
        ("http://127.0.0.1:99999/", "port"),
        ("javascript:alert(1)", "only http and https"),
    ],
)
def test_a_url_off_the_allow_list_is_refused_naming_url(ops, url, why):
    mine, _ = ops
    response = create(mine, url=url)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid" and why in response.json()["fields"]["url"][0]
    sub = create(mine).json()
    response = mine.patch(f"/api/webhooks/{sub['id']}/", {"url": url}, format="json")
    assert response.status_code == 400 and "url" in response.json()["fields"]
    assert WebhookSubscription.objects.get(id=sub["id"]).url == URL


def test_bad_fields_are_named(ops):
    mine, _ = ops
    for body, field in [
        ({"event_types": []}, "event_types"),
        ({"event_types": ["run.started"]}, "event_types"),
        ({"event_types": "run.completed"}, "event_types"),
        ({"active": "yes"}, "active"),
        ({"secret": "mine"}, "secret"),
        ({"tenant": "globex"}, "tenant"),
    ]:
        response = create(mine, **body)
        fields = response.json()["fields"]
        assert response.status_code == 400 and any(k == field or k.startswith(field + ".") for k in fields), (
            body,
            response.content,
        )
    assert not WebhookSubscription.objects.exists()


def test_a_member_without_the_permission_reads_but_cannot_write(ops, tenant):
    from django.contrib.auth import get_user_model

    mine, _ = ops
    sub = create(mine).json()
    alice = token_client(get_user_model().objects.get(username="alice"))  # a plain member of acme
    assert alice.get("/api/webhooks/").json()["count"] == 1
    assert alice.get(f"/api/webhooks/{sub['id']}/").status_code == 200
    for response in [
        create(alice),
        alice.patch(f"/api/webhooks/{sub['id']}/", {"active": False}, format="json"),
        alice.delete(f"/api/webhooks/{sub['id']}/"),
        alice.post(f"/api/webhooks/{sub['id']}/test/", {}, format="json"),
    ]:
        assert response.status_code == 403 and response.json()["code"] == "permission_denied", response.content
    row = WebhookSubscription.objects.get(id=sub["id"])
    assert row.active and not Delivery.objects.exists() and WebhookSubscription.objects.count() == 1


def test_another_tenant_cannot_see_change_delete_or_test_a_subscription_or_its_deliveries(ops):
    mine, theirs = ops
    sub = create(mine).json()
    assert mine.post(f"/api/webhooks/{sub['id']}/test/", {}, format="json").status_code == 202
    before = (
        sorted(WebhookSubscription.objects.values_list("id", "url", "active", "event_types", "secret_encrypted")),
        sorted(Delivery.objects.values_list("id", "status")),
    )
    listing = theirs.get("/api/webhooks/")
    assert listing.status_code == 200 and listing.json()["count"] == 0 and sub["id"] not in listing.content.decode()
    for response in [
        theirs.get(f"/api/webhooks/{sub['id']}/"),
        theirs.get(f"/api/webhooks/{sub['id']}/deliveries/"),
        theirs.patch(f"/api/webhooks/{sub['id']}/", {"url": "http://hooks.example.com/steal"}, format="json"),
        theirs.delete(f"/api/webhooks/{sub['id']}/"),
        theirs.post(f"/api/webhooks/{sub['id']}/test/", {}, format="json"),
    ]:
        assert response.status_code == 404 and response.json()["code"] == "not_found", response.content
    after = (
        sorted(WebhookSubscription.objects.values_list("id", "url", "active", "event_types", "secret_encrypted")),
        sorted(Delivery.objects.values_list("id", "status")),
    )
    assert before == after


def test_delete_cancels_pending_deliveries_and_keeps_their_history(ops):
    mine, _ = ops
    sub = create(mine).json()
    delivery = mine.post(f"/api/webhooks/{sub['id']}/test/", {}, format="json").json()
    assert delivery["status"] == "pending" and delivery["attempts"] == 0
    assert mine.delete(f"/api/webhooks/{sub['id']}/").status_code == 204
    assert mine.get(f"/api/webhooks/{sub['id']}/").status_code == 404
    row = Delivery.objects.get(id=delivery["id"])
    assert (row.status, row.subscription_id) == ("cancelled", None)


def test_the_secret_never_reaches_the_event_log_or_a_delivery(ops, tenant, load_agent, submit):
    from runs.models import Event
    from runs.runtime.executor import run_drive

    mine, _ = ops
    body = create(mine, event_types=["run.completed"]).json()
    load_agent()
    run = submit()
    run_drive(run_id=run.id)
    (delivery,) = Delivery.objects.filter(run_id=run.id)
    assert body["secret"] not in str(delivery.payload)
    assert not any(body["secret"] in str(p) for p in Event.objects.values_list("payload", flat=True))


def test_a_tenant_has_at_most_the_configured_number_of_subscriptions(ops, settings):
    settings.AGENTRT_WEBHOOK_MAX_PER_TENANT = 2
    mine, theirs = ops
    assert [create(mine).status_code for _ in range(2)] == [201, 201]
    response = create(mine)
    assert response.status_code == 409 and response.json()["code"] == "webhook_limit"
    assert WebhookSubscription.objects.count() == 2
    assert create(theirs).status_code == 201  # per tenant


def test_a_test_event_sent_from_the_api_reaches_a_real_receiver_signed(ops, receiver):
    """POST /api/webhooks/{id}/test/ queues a doorbell; running the task it queued sends `webhook.test`."""
    from django.utils.module_loading import import_string
    from django_q.models import OrmQ

    from .receiver import verify

    mine, _ = ops
    created = create(mine, url=receiver.url)
    assert created.status_code == 201, created.content
    sub = created.json()
    answer = mine.post(f"/api/webhooks/{sub['id']}/test/", {}, format="json")
    assert answer.status_code == 202, answer.content
    delivery = answer.json()
    (task,) = [row.task for row in OrmQ.objects.all() if list(row.task.get("args") or ()) == [delivery["id"]]]
    assert import_string(task["func"])(*task["args"]) == "succeeded"  # what a qcluster worker runs
    (request,) = receiver.requests
    assert verify(sub["secret"], request["headers"], request["body"])
    assert request["headers"]["x-agentrt-delivery"] == delivery["id"]
    assert request["headers"]["x-agentrt-event"] == "webhook.test"
    body = json.loads(request["body"])
    assert (body["id"], body["type"], body["tenant"]) == (delivery["id"], "webhook.test", "acme")
    assert body["data"] == {"subscription": sub["id"], "sent_by": "acme-op"}
    assert list(receiver.processed) == [delivery["id"]]
    row = mine.get(f"/api/webhooks/{sub['id']}/deliveries/").json()["results"][0]
    assert (row["id"], row["status"], row["attempts"], row["last_status_code"]) == (
        delivery["id"],
        "succeeded",
        1,
        200,
    )
