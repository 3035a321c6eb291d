"""API token authentication: django-rest-knox's, without its housekeeping on
every request.

knox's check reads every token of the user on each request, to delete the
ones that expired (a round trip on every authenticated request, and one that
grows with the number of tokens the user holds). Here a request checks only
its own token — an expired one is refused and deleted exactly as knox does —
and the maintenance sweep `tokens` deletes the other expired tokens
(maintenance/sweeps/tokens.py). The WebSocket handshake uses the same class."""

from __future__ import annotations

from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from knox import auth as knox_auth
from knox.signals import token_expired

from runs.clock import CLOCK


class TokenAuthentication(knox_auth.TokenAuthentication):
    def _cleanup_token(self, auth_token) -> bool:
        """True (and the token deleted) when this token has expired."""
        if auth_token.expiry is not None and auth_token.expiry < CLOCK.now():
            username = auth_token.user.get_username()
            auth_token.delete()
            token_expired.send(sender=type(self), username=username, source="auth_token")
            return True
        return False


class TokenScheme(KnoxTokenScheme):
    """The OpenAPI security scheme knox's class gets, for this subclass (drf-spectacular matches exact classes)."""

    target_class = "runs.api.auth.TokenAuthentication"
