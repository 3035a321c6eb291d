"""The signature scheme as the README documents it (issue 17 item 5; scheme
v2, issue 34 item 7g: the delivery id, event type and attempt headers are
signed with the body, so a captured request's headers cannot be swapped)."""

from __future__ import annotations

import hashlib
import hmac
import re
import time

import httpx
import pytest

from tests.docs import page_with
from webhooks.outbound import body_bytes, post, signature

HEADERS = ("X-Agentrt-Delivery", "X-Agentrt-Event", "X-Agentrt-Attempt")


def readme_verifier():
    """The README's verification snippet, executed as written (six lines)."""
    found = re.search(r"<!-- verify-signature -->\n\n((?:    .*\n)+)", page_with("verify-signature"))
    block = "".join(line[4:] + "\n" for line in found.group(1).splitlines())
    assert len(block.strip().splitlines()) == 6, block
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 - our own README's code
    return namespace["verify"]


def signed_request(secret="whsec_abc", at=None, delivery="d1", event="run.completed", attempt=1):
    body = body_bytes({"id": delivery, "type": event, "data": {"run": {"id": "r1"}}})
    at = int(time.time()) if at is None else at
    header = signature(secret, at, body, delivery_id=delivery, event_type=event, attempt=attempt)
    headers = {"X-Agentrt-Signature": header, "X-Agentrt-Delivery": delivery, "X-Agentrt-Event": event}
    headers["X-Agentrt-Attempt"] = str(attempt)
    return httpx.Headers(headers), body  # looked up case-insensitively, as a framework's request.headers


def test_the_readme_snippet_verifies_our_signature_and_refuses_a_forgery():
    verify = readme_verifier()
    headers, body = signed_request()
    assert re.fullmatch(r"t=\d+,v2=[0-9a-f]{64}", headers["X-Agentrt-Signature"])
    assert verify("whsec_abc", headers, body)
    assert not verify("whsec_other", headers, body)
    assert not verify("whsec_abc", headers, body + b" ")
    stale, _ = signed_request(at=int(time.time()) - 3600)
    assert not verify("whsec_abc", stale, body)  # a replay an hour later
    t = headers["X-Agentrt-Signature"].split(",")[0][2:]
    expected = hmac.new(b"whsec_abc", f"{t}\nd1\nrun.completed\n1\n".encode() + body, hashlib.sha256).hexdigest()
    assert headers["X-Agentrt-Signature"] == f"t={t},v2={expected}"


@pytest.mark.parametrize(
    "header, swapped",
    [
        ("X-Agentrt-Event", "run.failed"),  # a completed run presented as a failure (or the reverse)
        ("X-Agentrt-Event", "approval.requested"),
        ("X-Agentrt-Delivery", "d2"),  # another delivery id: past the receiver's dedupe
        ("X-Agentrt-Attempt", "2"),
    ],
)
def test_a_captured_request_with_a_swapped_header_fails_the_documented_verification(header, swapped):
    verify = readme_verifier()
    headers, body = signed_request()
    assert verify("whsec_abc", headers, body)
    headers[header] = swapped
    assert not verify("whsec_abc", headers, body), header


def test_the_body_only_scheme_of_v1_is_not_sent_and_not_accepted():
    verify = readme_verifier()
    headers, body = signed_request()
    t = headers["X-Agentrt-Signature"].split(",")[0][2:]
    v1 = hmac.new(b"whsec_abc", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert "v1=" not in headers["X-Agentrt-Signature"]
    headers["X-Agentrt-Signature"] = f"t={t},v1={v1}"  # a signature over the body only
    with pytest.raises(KeyError):
        verify("whsec_abc", headers, body)  # no v2: a receiver that verifies refuses it


def test_a_real_attempt_verifies_the_documented_way_and_its_headers_cannot_be_swapped(settings, receiver):
    settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS = 10
    answer = post(
        url=receiver.url,
        secret="whsec_real",
        payload={"id": "d-real", "type": "run.completed", "data": {}},
        delivery_id="d-real",
        event_type="run.completed",
        attempt=3,
    )
    assert answer.ok, answer.error
    (request,) = receiver.requests
    verify = readme_verifier()
    headers = httpx.Headers(request["headers"])  # as the receiver's framework hands them over
    assert {h: headers[h] for h in HEADERS} == {
        "X-Agentrt-Delivery": "d-real",
        "X-Agentrt-Event": "run.completed",
        "X-Agentrt-Attempt": "3",
    }
    assert verify("whsec_real", headers, request["body"])
    headers["X-Agentrt-Event"] = "run.failed"
    assert not verify("whsec_real", headers, request["body"])
