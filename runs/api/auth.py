"""API token authentication: django-rest-knox's, without its housekeeping on
every request.

knox's check reads every token of the user on each request, to delete the
ones that expired (a round trip on every authenticated request, and one that
grows with the number of tokens the user holds). Here a request checks only
its own token — an expired one is refused and deleted exactly as knox does —
and the maintenance sweep `tokens` deletes the other expired tokens
(maintenance/sweeps/tokens.py). The WebSocket handshake uses the same class."""

from __future__ import annotations

import binascii
from hmac import compare_digest

from django.utils.translation import gettext_lazy as _
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from knox import auth as knox_auth
from knox.crypto import hash_token
from knox.settings import CONSTANTS, knox_settings
from knox.signals import token_expired
from rest_framework import exceptions

from runs.clock import CLOCK
from runs.store.auth import tokens_with_key


class TokenAuthentication(knox_auth.TokenAuthentication):
    def authenticate_credentials(self, token: bytes):
        """knox's check, with the candidate tokens and their users read in one
        prepared statement (runs.store) instead of the ORM's joined read:
        about 1.5 ms of every authenticated request. The same steps: skip
        (and delete) an expired candidate, compare digests in constant time,
        refuse an inactive user; a token that is not UTF-8 is refused too."""
        refused = exceptions.AuthenticationFailed(_("Invalid token."))
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:  # a header byte that is not UTF-8: knox answered 500
            raise refused from None
        for auth_token in tokens_with_key(text[: CONSTANTS.TOKEN_KEY_LENGTH]):
            if self._cleanup_token(auth_token):
                continue
            try:
                digest = hash_token(text)
            except (TypeError, binascii.Error):
                raise refused from None
            if compare_digest(digest, auth_token.digest):
                if knox_settings.AUTO_REFRESH and auth_token.expiry:
                    self.renew_token(auth_token)
                return self.validate_user(auth_token)
        raise refused

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
