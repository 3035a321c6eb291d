"""Issue 10 item 8: limits a hostile member cannot exceed (sleep, throttles
shared across processes). The sockets' caps are in test_websockets.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from runs.models import Event, ToolInvocation
from runs.runtime.executor import run_drive
from tests.conftest import ROOT, subprocess_env


def _sleep_run(load_agent, submit, seconds):
    load_agent(
        turns=[{"tool_calls": [{"name": "sleep", "arguments": {"seconds": seconds}}]}, {"text": "done"}],
        tools=("sleep",),
    )
    run = submit()
    run_drive(run_id=run.id)
    run.refresh_from_db()
    return run, ToolInvocation.objects.filter(run=run, tool_name="sleep")


@pytest.mark.django_db
def test_a_sleep_of_an_hour_is_refused_not_slept(load_agent, submit):
    from runs.tools.registry import REGISTRY

    assert REGISTRY.spec("sleep").parameters["properties"]["seconds"]["maximum"] == 60  # what the model is told
    assert REGISTRY.spec("sleep").timeout_seconds <= 90
    run, invocations = _sleep_run(load_agent, submit, 3600)
    assert run.status == "COMPLETED"
    # Refused before it ran: no invocation was executed, the model got an error result.
    assert not invocations.filter(status__in=["succeeded", "running"]).exists()
    messages = str(list(Event.objects.filter(run=run).values_list("payload", flat=True)))
    assert "schema_invalid" in messages and "60" in messages


@pytest.mark.django_db
def test_the_runtime_check_follows_a_lowered_limit(load_agent, submit, settings):
    settings.AGENTRT_MAX_SLEEP_SECONDS = 0.2
    run, invocations = _sleep_run(load_agent, submit, 30)  # within the schema's 60, above the live setting
    assert run.status == "COMPLETED"
    (invocation,) = invocations
    assert invocation.status != "succeeded"
    assert "AGENTRT_MAX_SLEEP_SECONDS" in str(invocation.result)


SETUP = "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agentrt_site.settings'); django.setup()\n"


def django_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SETUP + code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


THROTTLE = """
from rest_framework.throttling import SimpleRateThrottle
class T(SimpleRateThrottle):
    rate = "2/min"
    def get_cache_key(self, request, view):
        return "throttle_security_test_{key}"
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
cache = caches["default"]
print("RedisCache" if isinstance(cache, RedisCache) else type(cache).__name__, T().allow_request(None, None))
"""


@pytest.mark.django_db(transaction=True)
def test_throttles_count_across_processes_on_redis():
    """DRF throttles use Django's default cache: with REDIS_URL it is Redis, so
    three separate processes share one count (the third is throttled)."""
    key = uuid.uuid4().hex
    env = subprocess_env(REDIS_URL="redis://127.0.0.1:6379/0")
    results = [django_python(THROTTLE.format(key=key), env) for _ in range(3)]
    assert [r.stdout.split() for r in results] == [
        ["RedisCache", "True"],
        ["RedisCache", "True"],
        ["RedisCache", "False"],
    ], [r.stderr[-500:] for r in results]


def test_without_redis_the_cache_is_local_memory():
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = django_python("from django.core.cache import caches; print(type(caches['default']).__name__)", env)
    assert out.stdout.strip() == "LocMemCache", out.stderr[-500:]
