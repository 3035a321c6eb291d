"""AGENTRT_WEBHOOK_TIMEOUT_SECONDS bounds a whole attempt, not each read
(webhooks/deadline.py): a receiver that answers only after the sender gave
up, or trickles its answer a byte at a time (each byte far sooner than any
socket timeout), fails the attempt with a timeout, and the delivery is due
again under its backoff. Real PostgreSQL, a real local receiver; outcomes
are asserted, not durations."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from tests.conftest import wait_for
from webhooks.delivery import deliver
from webhooks.models import Delivery

from .conftest import completed_delivery, subscribe
from .receiver import TRICKLE_BYTES, verify

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "answer",
    [
        "slow",  # 200 only after the sender has hung up
        "trickle",  # 200 and its headers at once, then the body one byte at a time
        "trickle-headers",  # the status line, then the headers one byte at a time
    ],
)
def test_an_answer_that_does_not_finish_within_the_timeout_fails_the_attempt_and_is_retried(
    answer, tenant, load_agent, submit, manager, receiver, settings
):
    settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS = 1
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    sub, secret = subscribe(manager, receiver.url, ["run.completed"])
    receiver.script = [answer]
    run, d = completed_delivery(load_agent, submit)

    assert deliver(d.id) == "retry"

    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert row.last_error.startswith("timeout: the attempt took longer than 1s"), row.last_error
    assert row.due_at > row.updated_at  # due again after the backoff: a retry is scheduled
    assert deliver(d.id) == "not_claimed"  # ... and not before
    (request,) = receiver.requests
    assert request["headers"]["x-agentrt-delivery"] == str(d.id)
    assert verify(secret, request["headers"], request["body"])
    # The sender hung up on the receiver, which was still answering (or had not begun).
    wait_for(lambda: request.get("sender_left") is not None, timeout=30, message="the receiver to notice")
    assert request["sender_left"] is True
    if answer.startswith("trickle"):
        assert 0 < request["trickled"] < TRICKLE_BYTES  # it hung up mid-trickle, not at the trickle's end


def test_a_prompt_answer_with_a_body_is_delivered(tenant, load_agent, submit, manager, receiver, settings):
    """The whole answer is read within the deadline: an ordinary 200 with a body is delivered."""
    settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS = 1
    subscribe(manager, receiver.url, ["run.completed"])
    run, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "succeeded"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("succeeded", 1, 200, "")
    assert json.loads(receiver.requests[0]["body"])["id"] == str(d.id)


def test_a_name_server_that_does_not_answer_fails_the_attempt_within_its_timeout(
    tenant, load_agent, submit, manager, receiver, settings, silent_name_server
):
    """getaddrinfo has no timeout of its own: a resolver that never answers
    held the attempt (and its worker) for as long as the system's resolver
    waited, past the delivery's claim. The lookup is now waited for only as
    long as the attempt's deadline leaves (webhooks.deadline.resolve)."""
    settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS = 1
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    subscribe(manager, receiver.url, ["run.completed"])
    run, d = completed_delivery(load_agent, submit)
    lookups = silent_name_server(urlsplit(receiver.url).hostname)
    outcome = deliver(d.id)
    assert lookups.answered == []  # the attempt ended while the lookup was still waiting for its name server
    assert outcome == "retry"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert row.last_error.startswith("timeout: the attempt took longer than 1s (ConnectTimeout)"), row.last_error
    assert lookups.asked == [urlsplit(receiver.url).hostname]
    assert receiver.requests == []  # nothing was sent
