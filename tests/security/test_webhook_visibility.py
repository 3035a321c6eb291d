"""Issue 34 item 7b: a receiver's answers and a webhook URL's secrets are
shown to operators (webhooks.manage_webhooks) only.

The review (N7) subscribed an internal URL as an operator, sent a test
event, and read the internal service's answer (the first 200 bytes, kept as
the delivery's `last_error`) as a plain member; and a URL's `?token=` was in
every member's `GET /api/webhooks/`. Here a real receiver answers 401 with a
canary in its body, to a subscription whose URL carries a canary token, and
every surface is read as a member, as view-only staff and as the operator."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from runs.services import tenant_create
from webhooks.delivery import deliver
from webhooks.models import Delivery, WebhookSubscription
from webhooks.services import send_test

from .conftest import token_client

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = "CANARY-answer internal service says: admin=true; build 4711"
TOKEN = "CANARYquerytoken"


class Internal:
    """An internal HTTP service on an allowed host: answers every POST 401 with ANSWER."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = ANSWER.encode()
                self.send_response(401)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def internal(settings):
    service = Internal()
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = [f"127.0.0.1:{service.port}"]
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    yield service
    service.close()


@pytest.fixture
def world(tenant, internal):
    """acme's operator subscribed a URL with a token and sent a test event; the internal service answered."""
    _, operator = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    _, carol = tenant_create(name=tenant.name, username="carol", password="pw")
    carol.is_staff = True
    carol.save(update_fields=["is_staff"])
    carol.user_permissions.add(*Permission.objects.filter(codename__in=["view_webhooksubscription", "view_delivery"]))
    op = token_client(operator)
    created = op.post(
        "/api/webhooks/",
        {"url": f"http://127.0.0.1:{internal.port}/internal/api?token={TOKEN}", "event_types": ["run.completed"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    sub = WebhookSubscription.objects.get(id=created.json()["id"])
    delivery = send_test(user=operator, subscription_id=sub.id)
    assert deliver(delivery.id) == "retry"
    row = Delivery.objects.get(id=delivery.id)
    assert row.last_status_code == 401 and ANSWER in row.last_error  # stored as it came, for the operator
    alice = get_user_model().objects.get(username="alice")
    return {"operator": operator, "carol": carol, "alice": alice, "sub": sub, "delivery": row, "port": internal.port}


def rest_reads(user, sub) -> str:
    client = token_client(user)
    bodies = []
    for path in ("/api/webhooks/", f"/api/webhooks/{sub.id}/", f"/api/webhooks/{sub.id}/deliveries/"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.content)
        bodies.append(response.content.decode())
    return "\n".join(bodies)


def admin_pages(user, sub, delivery) -> str:
    client = Client()
    client.force_login(user)
    pages = []
    for path in (
        "/admin/webhooks/webhooksubscription/",
        f"/admin/webhooks/webhooksubscription/{sub.id}/change/",
        f"/admin/webhooks/webhooksubscription/{sub.id}/history/",
        "/admin/webhooks/delivery/",
        f"/admin/webhooks/delivery/{delivery.id}/change/",
    ):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        pages.append(response.content.decode())
    return "\n".join(pages)


@pytest.mark.parametrize("reader", ["alice", "carol"])
def test_a_member_or_view_only_staff_reads_neither_the_answer_nor_the_token_on_rest(world, reader):
    text = rest_reads(world[reader], world["sub"])
    assert "CANARY" not in text
    deliveries = token_client(world[reader]).get(f"/api/webhooks/{world['sub'].id}/deliveries/").json()["results"]
    (delivery,) = deliveries
    assert delivery["last_status_code"] == 401
    assert delivery["last_error"] == "HTTP 401: [answer hidden: operators only]"
    listed = token_client(world[reader]).get(f"/api/webhooks/{world['sub'].id}/").json()
    assert listed["url"] == f"http://127.0.0.1:{world['port']}/…"  # the origin only


def test_view_only_staff_reads_neither_in_the_admin(world):
    text = admin_pages(world["carol"], world["sub"], world["delivery"])
    assert "CANARY" not in text
    assert "[answer hidden: operators only]" in text and "HTTP 401" in text


def test_the_operator_reads_both_as_stored(world):
    text = rest_reads(world["operator"], world["sub"])
    assert TOKEN in text and "CANARY-answer" in text
    admin = admin_pages(world["operator"], world["sub"], world["delivery"])
    assert TOKEN in admin and "CANARY-answer" in admin


def test_credentials_in_a_stored_url_are_masked_too(world):
    # Saving a URL with credentials is refused; a row that has them anyway (written before, or by hand) is masked.
    WebhookSubscription.objects.filter(id=world["sub"].id).update(url="https://hook:CANARYpassword@hooks.example.com/")
    assert "CANARY" not in rest_reads(world["alice"], world["sub"])
    assert "CANARY" not in admin_pages(world["carol"], world["sub"], world["delivery"])
    assert str(WebhookSubscription.objects.get(id=world["sub"].id)) == "https://hooks.example.com/…"
