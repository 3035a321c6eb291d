"""Outbound HTTP for webhooks: the allow-list, the signature, the POST.

A URL is checked against AGENTRT_WEBHOOK_ALLOWED_HOSTS (`host` or
`host:port`, like the HTTP tools' list) when a subscription is saved and
again before every attempt; redirects are never followed (a 3xx is a failed
attempt, and its Location is never requested). The POST is made with no
database transaction open (checked) and outside any run's step (it runs in
its own django-q2 task).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection

from runs.clock import CLOCK

USER_AGENT = "agentrt-webhooks/1"
MAX_ERROR = 500


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
    hostport = f"{host}:{port}" if port else host
    allowed = settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS
    if host not in allowed and hostport not in allowed:
        raise UrlRefused(f"host {hostport!r} is not in AGENTRT_WEBHOOK_ALLOWED_HOSTS")
    return url


def body_bytes(payload: dict) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Agentrt-Signature` value: `t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


class Answer:
    def __init__(self, ok: bool, error: str = "", status: int | None = None, retry: bool = True):
        self.ok, self.error, self.status, self.retry = ok, error, status, retry


def post(*, url: str, secret: str, payload: dict, delivery_id: str, event_type: str, attempt: int) -> Answer:
    """One attempt. 2xx is delivered; anything else (3xx included) is a failed attempt."""
    import httpx

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
        "X-Agentrt-Signature": signature(secret, int(CLOCK.now().timestamp()), body),
        "X-Agentrt-Delivery": delivery_id,
        "X-Agentrt-Event": event_type,
        "X-Agentrt-Attempt": str(attempt),
    }
    timeout = float(settings.AGENTRT_WEBHOOK_TIMEOUT_SECONDS)
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False) as client:
            with client.stream("POST", url, content=body, headers=headers) as response:
                code = response.status_code
                head = b""
                if not 200 <= code < 300:  # keep a little of the answer for the operator; never the whole of it
                    for chunk in response.iter_bytes():
                        head += chunk
                        if len(head) >= 200:
                            break
    except httpx.TimeoutException as exc:
        return Answer(False, f"timeout after {timeout:g}s ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        return Answer(False, f"{type(exc).__name__}: {str(exc)[:MAX_ERROR]}")
    if 200 <= code < 300:
        return Answer(True, status=code)
    if 300 <= code < 400:
        return Answer(False, f"HTTP {code}: redirects are not followed", status=code)
    return Answer(False, f"HTTP {code}: {head[:200].decode('utf-8', 'replace')}", status=code)
