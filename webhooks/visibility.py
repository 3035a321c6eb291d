"""What of a subscription's URL and of a delivery's error a reader sees.

Two things a subscription's reads carried to every member of its tenant
(review N7): the receiver's answer to a failed attempt (its first 200 bytes,
kept in `last_error` as `HTTP <code>: <answer>`) — with an allow-listed host
a read primitive against internal HTTP services for whoever may set a URL,
readable by the whole tenant — and the secrets a receiver's URL carries
(`?token=...`, `user:password@`, or a token in the path, as Slack's and
Discord's incoming webhooks have it).

Operators — users with `webhooks.manage_webhooks`, who set URLs and see
what they set — read both as stored. Everyone else (members, view-only
staff, on REST, in the admin, in an object's name anywhere) reads:

- a URL as its origin only: `https://hooks.example.com/…` (`…` when there is
  anything after the host: a path, a query, credentials);
- an HTTP answer as `HTTP <code>: [answer hidden: operators only]`; the
  status code itself stays (`last_status_code`), and errors of our own
  making (a timeout, a refused connection, a URL off the allow-list) are
  shown as they are.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MANAGE = "webhooks.manage_webhooks"
ANSWER_HIDDEN = "[answer hidden: operators only]"
_ANSWER = re.compile(r"(HTTP \d{3}): .*", re.S)  # webhooks.outbound.post's `HTTP {code}: <first 200 bytes>`


def can_manage(user) -> bool:
    """Whether `user` is an operator: creates, changes, deletes and tests subscriptions."""
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(MANAGE))


def sees_secrets(user) -> bool:
    """Whether `user` reads URLs and answers as stored."""
    return can_manage(user)


def masked_url(url: str) -> str:
    """`url` reduced to its origin, `…` standing for whatever followed it."""
    parts = urlsplit(url or "")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    origin = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    more = parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc
    return origin + ("/…" if more else "/")


def masked_error(text: str) -> str:
    """`text` with a receiver's answer replaced (the status code kept)."""
    return _ANSWER.sub(rf"\1: {ANSWER_HIDDEN}", text or "")


def url_for(user, url: str) -> str:
    return url if sees_secrets(user) else masked_url(url)


def error_for(user, text: str) -> str:
    return text if sees_secrets(user) else masked_error(text)
