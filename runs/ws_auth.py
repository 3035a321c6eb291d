"""WebSocket authentication for non-browser clients: `Authorization: Token …`
in the handshake (DRF authtoken). Browsers use the session cookie through
AuthMiddlewareStack; tokens never go in the query string (they leak to logs)."""
from __future__ import annotations

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware


@database_sync_to_async
def _user_for(key: str):
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token and token.user.is_active else None


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("token "):
            user = await _user_for(auth[6:].strip())
            if user is not None:
                scope = dict(scope, user=user)
            else:
                from django.contrib.auth.models import AnonymousUser

                scope = dict(scope, user=AnonymousUser())
        return await super().__call__(scope, receive, send)


def TokenAuthMiddlewareStack(inner):
    from channels.auth import AuthMiddlewareStack

    # The session stack runs first and sets scope["user"]; a token header overrides it.
    return AuthMiddlewareStack(TokenAuthMiddleware(inner))
