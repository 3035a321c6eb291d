"""The suite creates and drops its database without the server timeouts
(tests/conftest.py), but every test runs with the ones the runtime's
connections carry in production (agentrt_site/settings.py)."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.db import connection

pytestmark = pytest.mark.django_db


def test_the_tests_run_with_the_runtime_server_timeouts():
    configured = {
        k: int(v) for k, v in re.findall(r"-c (\w+)=(\d+)", settings.DATABASES["default"]["OPTIONS"]["options"])
    }
    assert set(configured) == {"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}
    with connection.cursor() as cur:
        for name, ms in configured.items():
            cur.execute("SELECT setting::int FROM pg_settings WHERE name = %s", [name])
            assert cur.fetchone()[0] == ms, name
