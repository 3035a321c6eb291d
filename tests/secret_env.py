"""Loaded with `-p tests.secret_env` (pytest.ini) before Django's settings:
outside DEBUG the settings refuse to start without DJANGO_SECRET_KEY, so the
suite, and every process it starts, gets a throw-away key for the session."""

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", "test-" + secrets.token_urlsafe(50))
