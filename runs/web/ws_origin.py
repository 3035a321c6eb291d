"""The WebSocket handshake's Origin check: the page that opens a live socket
must be of this server's own origin — scheme, host and port, as a browser
compares origins — or of one the operator trusts in CSRF_TRUSTED_ORIGINS.

Channels' AllowedHostsOriginValidator compared the Origin's host with
ALLOWED_HOSTS and nothing else, so a page served from another port of the same
host (`http://127.0.0.1:9`, another service on the machine) or over plain http
opened a socket with the operator's cookie (SameSite=Lax: another port is
the same site) and read every event the operator may see.

The server's own origin is Django's, computed as Django computes it for the
CSRF check of a POST: the scheme from the connection (`wss` is https) or
the trusted proxy header (SECURE_PROXY_SSL_HEADER), the host and port from
`Host` (validated against ALLOWED_HOSTS; a missing or disallowed one refuses
the socket). A handshake with `null`, or with any other origin, is refused
before any consumer runs (HTTP 403), and so is one without an Origin — unless
it authenticates with `Authorization: Token …`: a browser
always sends an Origin and cannot put that header on a WebSocket, so such a
handshake is a script's, and the token, checked next (ws_auth), is its only
credential (the session cookie is never used beside it: a token that is not
valid leaves the socket anonymous, refused by the consumer). A token
handshake that does send an Origin must send an allowed one, like a browser.
Every refusal is logged (logger `agentrt.live`, INFO) with its reason and
the path, never a credential."""

from __future__ import annotations

import io
import logging
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.utils.http import is_same_domain

log = logging.getLogger("agentrt.live")

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in; None
    for anything that is not an http(s) origin."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin1")
    return None


def own_origin(scope) -> tuple[str, str, int] | None:
    """This server's origin as the handshake's page should have it; None when
    its Host is missing or not in ALLOWED_HOSTS."""
    secure = scope.get("scheme") == "wss"
    request = ASGIRequest({**scope, "method": "GET", "scheme": "https" if secure else "http"}, io.BytesIO())
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    return _origin("https" if request.is_secure() else "http", host)


def token_handshake(scope) -> bool:
    """The handshake authenticates with `Authorization: Token …` (valid or not: ws_auth decides)."""
    return (_header(scope, b"authorization") or "").lower().startswith("token ")


def origin_refusal(scope) -> str | None:
    """Why the handshake's Origin refuses the socket, or None when it may go on."""
    given = _header(scope, b"origin")
    if given is None:
        if token_handshake(scope):
            return None  # a script authenticating with its token (module docstring)
        return "no Origin header (a browser always sends one; a script authenticates with `Authorization: Token ...`)"
    shown = repr(given[:100])
    if "://" not in given:
        return f"the Origin {shown} is not an http(s) origin"
    scheme, _, netloc = given.partition("://")
    if any(c in netloc for c in "/?#@\\"):  # an origin is scheme://host[:port], nothing more
        return f"the Origin {shown} is not an origin (scheme://host[:port])"
    origin = _origin(scheme.lower(), netloc)
    own = own_origin(scope)
    if own is None:
        return "the handshake's Host is missing or not in ALLOWED_HOSTS"
    if origin is None:
        return f"the Origin {shown} is not an http(s) origin"
    if origin == own:
        return None
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        t_scheme, _, t_netloc = trusted.partition("://")
        if "*" in t_netloc:  # https://*.example.com, as Django's CSRF check reads it
            if t_scheme.lower() == origin[0] and is_same_domain(netloc.lower(), t_netloc[1:].lower()):
                return None
        elif _origin(t_scheme.lower(), t_netloc) == origin:
            return None
    own_text = f"{own[0]}://{own[1]}:{own[2]}"
    return f"the Origin {shown} is neither this server's ({own_text}) nor in CSRF_TRUSTED_ORIGINS"


def origin_allowed(scope) -> bool:
    return origin_refusal(scope) is None


class SameOriginValidator:
    """ASGI middleware for the WebSocket routes: a handshake whose Origin is
    not allowed (`origin_allowed`) is denied (HTTP 403) before the inner
    application sees it."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            why = origin_refusal(scope)
            if why is not None:
                log.info("websocket refused (403) %s: %s", scope.get("path", "")[:200], why)
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
