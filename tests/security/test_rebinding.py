"""A host *name* on an operator's allow-list answers with whatever addresses
its owner publishes, at each lookup. A tenant that owns an allowed name (its
own webhook receiver's, say) could point it at the cloud metadata service
(169.254.169.254, link-local), and the worker would POST there with the
machine's network identity; a webhook's failed answer is even kept (its
first 200 bytes) where the tenant reads it. The HTTP tools and the webhook
sender now drop link-local, unspecified, multicast and reserved addresses of
a name (runs.net.routable) before any connection opens (loopback and private
ones too, unless the operator lists the name for them: issue 34,
tests/security/test_outbound_filter.py); a loopback or private IP literal on
the list stays the operator's choice.

The name's owner is played by the system's resolver (outside the project,
the one thing replaced); a real listener on 127.0.0.1 stands in for the
place the request must not reach or must reach."""

from __future__ import annotations

import socket

import pytest

from runs.domain.errors import ToolFailure
from runs.services import tenant_create
from runs.tools import builtin
from tests.integration.test_uncertain import context
from tests.webhooks.conftest import completed_delivery, subscribe
from webhooks.delivery import deliver
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

METADATA = "169.254.169.254"


@pytest.fixture
def owned_name(monkeypatch):
    """`rebound.example` resolves to what the test puts in `answers`."""
    answers: list[str] = []
    asked: list[str] = []
    system_resolver = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        if host != "rebound.example":
            return system_resolver(host, port, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in answers]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return answers, asked


def test_an_http_tool_call_to_a_name_pointed_at_the_metadata_service_is_refused_unsent(settings, sink, owned_name):
    answers, asked = owned_name
    answers[:] = [METADATA]
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"rebound.example:{sink.port}"]
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": f"http://rebound.example:{sink.port}/effect", "json": {}}, context())
    assert err.value.code == "address_not_allowed" and err.value.uncertain is False, err.value
    assert METADATA in str(err.value) and "not sent" in str(err.value)
    assert asked == ["rebound.example"]


def test_a_name_that_also_answers_a_routable_address_reaches_that_one_only(settings, sink, owned_name):
    answers, _ = owned_name
    answers[:] = [METADATA, "0.0.0.0", "127.0.0.1"]  # link-local and unspecified first: skipped, not tried
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"rebound.example:{sink.port}"]
    # The sink is on loopback, which a name reaches only with the operator's word (test_outbound_filter.py).
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["rebound.example"]
    answer = builtin.http_post({"url": f"http://rebound.example:{sink.port}/effect", "json": {"n": 1}}, context())
    assert answer["status"] == 200 and sink.count() == 1


def test_an_ip_literal_the_operator_listed_is_left_as_it_is(settings, sink):
    # The sink's own literal (127.0.0.1): what the operator wrote is what it gets.
    assert builtin.http_post({"url": sink.url, "json": {}}, context())["status"] == 200


def test_a_webhook_to_a_name_pointed_at_the_metadata_service_is_not_sent(
    tenant, load_agent, submit, settings, owned_name
):
    answers, asked = owned_name
    answers[:] = [METADATA]
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["rebound.example:8080"]
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    _, manager = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    subscribe(manager, "http://rebound.example:8080/hook", ["run.completed"])
    _, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert METADATA in row.last_error and "never sent to" in row.last_error, row.last_error
    assert asked == ["rebound.example"]
