"""WebSocket authentication for non-browser clients: `Authorization: Token …`
in the handshake, checked by django-rest-knox exactly as the REST API checks
it (hashed, expiring tokens). Browsers use the session cookie through
AuthMiddlewareStack; tokens never go in the query string (they leak to logs).

The consumers re-check the credential a socket was opened with on every poll
(`credential_still_valid`): a logout, a revoked or expired token, a
deactivated user closes the socket within one poll period."""

from __future__ import annotations

from importlib import import_module

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare
from knox.models import AuthToken
from rest_framework.exceptions import AuthenticationFailed

from runs.api.auth import TokenAuthentication
from runs.clock import CLOCK


def _authenticate(key: str):

    try:
        user, token = TokenAuthentication().authenticate_credentials(key.encode("utf-8"))
    except (AuthenticationFailed, UnicodeError, ValueError):
        return None, None
    return user, token.digest


_user_for = database_sync_to_async(_authenticate)


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("token "):
            user, digest = await _user_for(auth[6:].strip())
            if user is not None:
                scope = dict(scope, user=user, auth_token_digest=digest)
            else:  # never the session beside a bad token; the consumer refuses, saying why (never the token)
                scope = dict(scope, user=AnonymousUser(), auth_refusal="the token is not valid (unknown or expired)")
        return await super().__call__(scope, receive, send)


def TokenAuthMiddlewareStack(inner):
    # The session stack runs first and sets scope["user"]; a token header overrides it.
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))


def anonymous_reason(scope) -> str:
    """Why a socket has no user, for the refusal's log line."""
    return scope.get("auth_refusal") or "not signed in (no valid session cookie, no `Authorization: Token ...`)"


def credential_of(scope) -> tuple[str, str | None]:
    """What a socket was authenticated with: ("token", digest) or ("session", key)."""
    if scope.get("auth_token_digest"):
        return "token", scope["auth_token_digest"]
    session = scope.get("session")
    return "session", getattr(session, "session_key", None)


def credential_still_valid(kind: str, key: str | None, user) -> bool:
    """Synchronous (call through database_sync_to_async), one query: is the
    credential still live for this (freshly read, active) user?"""

    if user is None or not user.is_active or not key:
        return False
    if kind == "token":
        token = AuthToken.objects.filter(digest=key, user_id=user.pk).only("expiry").first()
        return token is not None and (token.expiry is None or token.expiry > CLOCK.now())

    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    stored = data.get(HASH_SESSION_KEY)
    return bool(stored) and constant_time_compare(stored, user.get_session_auth_hash())
