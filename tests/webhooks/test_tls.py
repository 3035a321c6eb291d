"""Webhooks over HTTPS verify the receiver: its certificate must chain to a
trusted CA (the system's and certifi's, or SSL_CERT_FILE's) and name the
URL's host; otherwise nothing is sent — not the body, not the signature —
and the attempt fails, due again under its backoff. A real TLS receiver on
loopback with certificates from a throwaway CA (trustme)."""

from __future__ import annotations

import ssl

import pytest
import trustme

from webhooks.delivery import deliver
from webhooks.models import Delivery
from webhooks.outbound import tls_context

from .conftest import completed_delivery, subscribe
from .receiver import Receiver, verify

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ca():
    return trustme.CA()


def https_receiver(settings, ca, name: str) -> Receiver:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(name).configure_cert(context)
    receiver = Receiver(tls=context)
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = [receiver.host]
    return receiver


@pytest.fixture
def trusting(ca, tmp_path, monkeypatch):
    """This process trusts the throwaway CA, as an operator with a private CA
    would configure it (SSL_CERT_FILE); the client context is built again."""
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    tls_context.cache_clear()
    yield
    monkeypatch.delenv("SSL_CERT_FILE")
    tls_context.cache_clear()


def attempt(manager, load_agent, submit, receiver) -> tuple[str, Delivery, str]:
    _, secret = subscribe(manager, receiver.url, ["run.completed"])
    _, d = completed_delivery(load_agent, submit)
    outcome = deliver(d.id)
    return outcome, Delivery.objects.get(id=d.id), secret


def test_a_receiver_whose_certificate_no_trusted_ca_signed_gets_nothing(
    ca, tenant, load_agent, submit, manager, settings
):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    receiver = https_receiver(settings, ca, "127.0.0.1")
    try:
        outcome, row, _ = attempt(manager, load_agent, submit, receiver)
        assert outcome == "retry"
        assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
        assert "CERTIFICATE_VERIFY_FAILED" in row.last_error, row.last_error
        assert receiver.requests == []
    finally:
        receiver.close()


def test_a_receiver_whose_certificate_names_another_host_gets_nothing(
    ca, trusting, tenant, load_agent, submit, manager, settings
):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    receiver = https_receiver(settings, ca, "receiver.example")  # a trusted CA, but not this host's certificate
    try:
        outcome, row, _ = attempt(manager, load_agent, submit, receiver)
        assert outcome == "retry"
        assert "CERTIFICATE_VERIFY_FAILED" in row.last_error and "127.0.0.1" in row.last_error, row.last_error
        assert receiver.requests == []
    finally:
        receiver.close()


def test_a_receiver_with_a_trusted_certificate_for_its_host_gets_the_signed_event(
    ca, trusting, tenant, load_agent, submit, manager, settings
):
    receiver = https_receiver(settings, ca, "127.0.0.1")
    try:
        outcome, row, secret = attempt(manager, load_agent, submit, receiver)
        assert outcome == "succeeded", row.last_error
        assert (row.status, row.last_status_code) == ("succeeded", 200)
        (request,) = receiver.requests
        assert verify(secret, request["headers"], request["body"])
    finally:
        receiver.close()
