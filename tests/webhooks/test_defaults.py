"""The delivery defaults the README states, pinned: a 10 s webhook timeout,
retries for at most 86400 s, a backoff of 10 s doubling up to 6 h apart, a
60 s claim; and a process whose claim is not longer than the timeout refuses
to start (else a second worker could send a delivery still in flight).

The settings are read by a fresh interpreter with none of these variables
set, as a deployment without them reads them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, subprocess_env
from webhooks.delivery import BACKOFF_CAP_SECONDS, backoff

NAMES = (
    "AGENTRT_WEBHOOK_TIMEOUT_SECONDS",
    "AGENTRT_DELIVERY_BACKOFF_SECONDS",
    "AGENTRT_DELIVERY_MAX_AGE_SECONDS",
    "AGENTRT_DELIVERY_CLAIM_SECONDS",
)
READ = f"import json, agentrt_site.settings as s; print(json.dumps({{n: getattr(s, n) for n in {NAMES!r}}}))"


def load_settings(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in subprocess_env().items() if k not in NAMES}
    clean.update({k: str(v) for k, v in env.items()})
    return subprocess.run(
        [sys.executable, "-c", READ], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120
    )


def test_the_defaults():
    done = load_settings()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "AGENTRT_WEBHOOK_TIMEOUT_SECONDS": 10,
        "AGENTRT_DELIVERY_BACKOFF_SECONDS": 10,
        "AGENTRT_DELIVERY_MAX_AGE_SECONDS": 86400,
        "AGENTRT_DELIVERY_CLAIM_SECONDS": 60,
    }


def test_the_backoff_doubles_from_its_base_up_to_six_hours_apart(settings):
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 10
    assert BACKOFF_CAP_SECONDS == 6 * 3600
    assert [backoff(n) for n in (1, 2, 3, 12)] == [10, 20, 40, 20480]
    assert backoff(13) == backoff(14) == backoff(100) == 6 * 3600  # 10 × 2^12 would be 40960


@pytest.mark.parametrize(
    "env",
    [
        {"AGENTRT_DELIVERY_CLAIM_SECONDS": 10},  # equal to the default timeout
        {"AGENTRT_DELIVERY_CLAIM_SECONDS": 5},
        {"AGENTRT_WEBHOOK_TIMEOUT_SECONDS": 90},  # beyond the default claim
    ],
)
def test_a_claim_not_longer_than_the_timeout_refuses_to_start(env):
    done = load_settings(**env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert "AGENTRT_DELIVERY_CLAIM_SECONDS must be longer than AGENTRT_WEBHOOK_TIMEOUT_SECONDS" in done.stderr


def test_a_claim_just_longer_than_the_timeout_is_accepted():
    done = load_settings(AGENTRT_DELIVERY_CLAIM_SECONDS=10.5)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["AGENTRT_DELIVERY_CLAIM_SECONDS"] == 10.5
