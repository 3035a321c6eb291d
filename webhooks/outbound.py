"""Outbound HTTP for webhooks: the allow-list, the signature, the POST.

A URL is checked against AGENTRT_WEBHOOK_ALLOWED_HOSTS (`host:port`, or a
bare `host` for ports 80 and 443; runs.net.listed, like the HTTP tools' list)
when a subscription is saved and again before every attempt, and its host's
addresses are narrowed by runs.net.routable when it is resolved; redirects
are never followed (a 3xx is a failed attempt, and its Location is never
requested). The POST is made with no
database transaction open (checked) and outside any run's step (it runs in
its own django-q2 task).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import ssl
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings
from django.db import connection

from runs import net
from runs.clock import CLOCK
from runs.errors import AddressRefused

from .deadline import Deadline, DeadlineBackend

USER_AGENT = "agentrt-webhooks/1"
MAX_ERROR = 500
MAX_ANSWER_BYTES = 64 * 1024  # read of an answer at most; its first 200 bytes are kept for the operator


class UrlRefused(Exception):
    """The URL is not one a webhook may be sent to."""


def check_url(url: str) -> str:
    """`url` if a webhook may be sent there; UrlRefused (with the reason) otherwise."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(c.isspace() or ord(c) < 32 for c in url):
        raise UrlRefused("must be an http or https URL of at most 2000 characters")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UrlRefused("the port is not valid") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("only http and https URLs with a host are allowed")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("credentials in the URL are not allowed (the URL is shown in reads; use the signature)")
    if parts.fragment:
        raise UrlRefused("a fragment is not allowed")
    host = parts.hostname
    port = port or net.default_port(parts.scheme)
    if not net.listed(host, port, settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS):
        raise UrlRefused(
            f"{net.shown(host, port)!r} is not in AGENTRT_WEBHOOK_ALLOWED_HOSTS "
            "(a bare host there admits ports 80 and 443 only)"
        )
    try:
        net.refuse_literal(host)
    except AddressRefused as exc:
        raise UrlRefused(str(exc)) from None
    return url


def body_bytes(payload: dict) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


SIGNATURE_VERSION = "v2"


def signed_bytes(timestamp: int, delivery_id: str, event_type: str, attempt: int, body: bytes) -> bytes:
    """What v2 signs: `t`, the X-Agentrt-Delivery, X-Agentrt-Event and
    X-Agentrt-Attempt values, each followed by a newline (no header value can
    hold one, so no two requests sign the same bytes), then the body. v1
    signed `"<t>." + body` only, which left a captured request's event type
    and delivery id free to change; it is no longer sent."""
    return f"{timestamp}\n{delivery_id}\n{event_type}\n{attempt}\n".encode() + body


def signature(secret: str, timestamp: int, body: bytes, *, delivery_id: str, event_type: str, attempt: int) -> str:
    """The `X-Agentrt-Signature` value: `t=<unix>,v2=<hex HMAC-SHA256 of signed_bytes(...)>`."""
    signed = signed_bytes(timestamp, delivery_id, event_type, attempt, body)
    mac = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},{SIGNATURE_VERSION}={mac}"


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One client context per process (certifi's CA bundle, loaded once); each connection still verifies."""
    return httpcore.default_ssl_context()


class Answer:
    def __init__(self, ok: bool, error: str = "", status: int | None = None, retry: bool = True):
        self.ok, self.error, self.status, self.retry = ok, error, status, retry


def post(*, url: str, secret: str, payload: dict, delivery_id: str, event_type: str, attempt: int) -> Answer:
    """One attempt. 2xx is delivered; anything else (3xx included) is a failed attempt.

    The whole attempt — connecting, sending, and reading the answer to its
    end — is bounded by one deadline of AGENTRT_WEBHOOK_TIMEOUT_SECONDS
    (webhooks.deadline): a receiver that answers late, or trickles its
    answer, fails the attempt at the deadline.
    """
    if connection.in_atomic_block:
        raise RuntimeError("a webhook is never sent inside a database transaction")
    try:
        check_url(url)
    except UrlRefused as exc:
        return Answer(False, f"refused: {exc}", retry=False)
    body = body_bytes(payload)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Agentrt-Signature": signature(
            secret,
            int(CLOCK.now().timestamp()),
            body,
            delivery_id=delivery_id,
            event_type=event_type,
            attempt=attempt,
        ),
        "X-Agentrt-Delivery": delivery_id,
        "X-Agentrt-Event": event_type,
        "X-Agentrt-Attempt": str(attempt),
    }
    deadline = Deadline(float(settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS))
    parsed = httpx.URL(url)  # IDNA and percent-encoding as httpx does them
    target = httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path)
    try:
        # No redirects (httpcore follows none), no proxy from the environment, one connection, no retry.
        with httpcore.ConnectionPool(
            ssl_context=tls_context(), network_backend=DeadlineBackend(deadline), max_connections=1, retries=0
        ) as pool:
            with pool.stream(
                "POST", target, headers=list(headers.items()), content=body, extensions={"timeout": deadline.timeouts()}
            ) as response:
                code = response.status
                head, read = b"", 0
                for chunk in response.iter_stream():  # the answer to its end: it too must come within the deadline
                    if len(head) < 200:
                        head += chunk[: 200 - len(head)]
                    read += len(chunk)
                    if read >= MAX_ANSWER_BYTES:  # enough: the status is known, the rest is not read
                        break
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
        if isinstance(exc, httpcore.TimeoutException) or deadline.passed():
            return Answer(False, f"timeout: the attempt took longer than {deadline.seconds:g}s ({type(exc).__name__})")
        return Answer(False, f"{type(exc).__name__}: {str(exc)[:MAX_ERROR]}")
    if 200 <= code < 300:
        return Answer(True, status=code)
    if 300 <= code < 400:
        return Answer(False, f"HTTP {code}: redirects are not followed", status=code)
    return Answer(False, f"HTTP {code}: {head.decode('utf-8', 'replace')}", status=code)
