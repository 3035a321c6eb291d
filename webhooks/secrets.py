"""Signing secrets at rest: encrypted, not hashed.

A receiver checks `HMAC-SHA256(secret, "<t>.<body>")`, so every attempt must
compute it with the secret itself: a hash of the secret cannot sign. The
secret is stored encrypted (Fernet: AES-128-CBC + HMAC-SHA256, authenticated)
under a key that is not in the database, so a database dump or backup does
not reveal it.

The key: `AGENTRT_WEBHOOK_SECRET_KEYS` (comma-separated Fernet keys; the
first encrypts, all decrypt — rotate by putting a new key first), or else a
key derived from `SECRET_KEY` with HKDF-SHA256 (own salt and purpose, so it
is not the key Django signs cookies with). Keys derived from
`SECRET_KEY_FALLBACKS`, and from `SECRET_KEY` when dedicated keys are set,
still decrypt, so rotating either does not orphan existing subscriptions.
"""

from __future__ import annotations

import base64
import secrets as _random

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

PREFIX = "whsec_"


class SecretUnreadable(Exception):
    """The stored secret cannot be decrypted with any configured key."""


def new_secret() -> str:
    return PREFIX + _random.token_urlsafe(32)


def _derived(secret_key: str) -> Fernet:
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"agentrt.webhooks.secrets", info=b"webhook signing secrets at rest"
    ).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def _keys() -> MultiFernet:
    dedicated = [Fernet(k.encode()) for k in settings.AGENTRT_WEBHOOK_SECRET_KEYS]
    derived = [_derived(settings.SECRET_KEY)] + [_derived(k) for k in getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet(dedicated + derived)


def encrypt(secret: str) -> str:
    return _keys().encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _keys().decrypt(token.encode()).decode()
    except (InvalidToken, ValueError):
        raise SecretUnreadable("the subscription's secret cannot be decrypted with the configured keys") from None
