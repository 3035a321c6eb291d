"""The doorbell on PostgreSQL (runs/runtime/doorbell.py), through a real `qcluster`:
an enqueue wakes an idle pusher through NOTIFY, long before its fallback
poll would have found the task, and a lost listener reconnects."""

from __future__ import annotations

import pytest
from django.db import connection

from runs.models import Run
from runs.runtime.doorbell import CHANNEL
from tests.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# Far longer than any wait below: a run that starts did so because of the doorbell.
FALLBACK = 120


def status(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def listeners() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s AND pid <> pg_backend_pid()",
            [f"LISTEN {CHANNEL}"],
        )
        return [row[0] for row in cursor.fetchall()]


def test_an_idle_pusher_is_woken_by_the_enqueue_not_by_its_poll(cluster, load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "bye"}])
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_Q_FALLBACK_POLL=FALLBACK, AGENTRT_Q_POLL=FALLBACK)
    wait_for(listeners, timeout=30, message=f"the pusher to LISTEN\n{c.output()}")
    for i in range(3):  # each submit finds the pusher waiting on LISTEN again
        run = submit(text=f"run {i}")
        wait_for(
            lambda: status(run.id) == "COMPLETED",
            timeout=FALLBACK / 4,
            message=f"run {i} to be woken by NOTIFY\n{c.output()}",
        )


def test_a_lost_listener_reconnects_and_nothing_is_missed(cluster, load_agent, submit):
    load_agent()
    c = cluster(AGENTRT_LEASE_SECONDS=3, AGENTRT_Q_FALLBACK_POLL=FALLBACK, AGENTRT_Q_POLL=0.05)
    [first] = wait_for(listeners, timeout=30, message=f"the pusher to LISTEN\n{c.output()}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    run = submit()
    wait_for(
        lambda: status(run.id) == "COMPLETED",
        timeout=FALLBACK / 4,
        message=f"the run after the listener was lost\n{c.output()}",
    )
    again = wait_for(listeners, timeout=30, message="the pusher to LISTEN again")
    assert first not in again
    later = submit(text="after reconnecting")
    wait_for(
        lambda: status(later.id) == "COMPLETED",
        timeout=FALLBACK / 4,
        message=f"a run woken by the new listener\n{c.output()}",
    )
