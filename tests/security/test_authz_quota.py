"""Issue 10 item 8 (quota): a tenant's active runs are capped by
`Tenant.max_active_runs` (else AGENTRT_MAX_ACTIVE_RUNS). Beyond it: REST
429 `quota_exceeded`, the service raises QuotaExceeded, the CLI prints an
error. Concurrent submits at the limit cannot both pass: the submit locks
the tenant row."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from runs.errors import QuotaExceeded
from runs.models import Run
from runs.runtime.executor import run_drive
from runs.services import agent_load, run_submit, tenant_configure, tenant_get
from tests.api.conftest import token_client
from tests.security.authz_world import user

pytestmark = pytest.mark.django_db(transaction=True)
BOT = {
    "name": "bot",
    "instructions": "x",
    "model": {"provider": "scripted", "turns": [{"text": "done"}]},
    "tools": ["echo"],
}


@pytest.fixture
def acme(db):
    user("acme", "alice")
    tenant = tenant_get(name="acme")
    agent_load(tenant=tenant, definition=BOT)
    return tenant


def test_a_submit_beyond_the_quota_is_429_and_creates_nothing(acme):
    tenant_configure(tenant=acme, max_active_runs=2)
    api = token_client(user("acme", "alice"))
    first = api.post("/api/runs/", {"agent": "bot", "input": "1"}, format="json")
    api.post("/api/runs/", {"agent": "bot", "input": "2"}, format="json")
    third = api.post("/api/runs/", {"agent": "bot", "input": "3"}, format="json")
    assert third.status_code == 429 and third.json()["code"] == "quota_exceeded", third.content
    assert Run.objects.filter(tenant=acme).count() == 2
    with pytest.raises(QuotaExceeded):
        run_submit(tenant=acme, agent="bot", input="4")
    with pytest.raises(CommandError, match="quota"):
        call_command("submit_run", "--agent", "bot", "--input", "5", "--tenant", "acme")
    run_drive(run_id=first.json()["id"])  # a finished run frees its place
    assert api.post("/api/runs/", {"agent": "bot", "input": "6"}, format="json").status_code == 201


def test_the_setting_is_the_default_and_a_replay_is_not_a_new_run(acme, settings):
    settings.AGENTRT_MAX_ACTIVE_RUNS = 1
    run, created = run_submit(tenant=acme, agent="bot", input="x", idempotency_key="k")
    assert created
    again, created = run_submit(tenant=acme, agent="bot", input="x", idempotency_key="k")
    assert again.id == run.id and not created  # the idempotent replay is answered, not counted
    with pytest.raises(QuotaExceeded):
        run_submit(tenant=acme, agent="bot", input="y")


def test_concurrent_submits_at_the_limit_cannot_both_pass(acme):
    tenant_configure(tenant=acme, max_active_runs=3)
    run_submit(tenant=acme, agent="bot", input="already active")
    workers = 6
    barrier = threading.Barrier(workers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def submit(i):
        try:
            barrier.wait(timeout=30)
            run_submit(tenant=acme, agent="bot", input=f"racer {i}")
            result = "created"
        except QuotaExceeded:
            result = "refused"
        finally:
            connection.close()  # each thread had its own connection
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["created", "created"] + ["refused"] * (workers - 2)
    assert Run.objects.filter(tenant=acme).exclude(status__in=["COMPLETED", "FAILED", "CANCELLED"]).count() == 3
