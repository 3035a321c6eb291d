"""The deployment selectors against events in the shapes the runtime writes
(runs/runtime/resume.py's takeover, finalize's waits, the uncertain tool outcome):
each counter's label comes from the right place, and a series counts only
what it names."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from ops import fleet
from runs.clock import CLOCK
from runs.domain.writes import EventWrite
from runs.store.events import append_events

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(load_agent, submit):
    load_agent(name="bot")
    return submit(agent="bot")


def append(run, *events, epoch=1):
    with transaction.atomic(), connection.cursor() as cursor:
        append_events(
            cursor, tenant_id=run.tenant_id, session_id=run.session_id, run_id=run.id, epoch=epoch, events=list(events)
        )


def ev(type_, at=None, **payload):
    return EventWrite(type_, payload, at or CLOCK.now())


def test_a_takeover_is_labelled_by_the_worst_step_it_interrupted(run):
    append(run, ev("lease.taken_over", via="sweep"), epoch=2)  # nothing in flight
    append(run, ev("lease.taken_over"), ev("step.interrupted", step=1, attempt=1, phase="deciding"), epoch=3)
    append(
        run,
        ev("lease.taken_over"),
        ev("step.interrupted", step=2, phase="executing", read_only=True, outcome="interrupted"),
        epoch=4,
    )
    append(
        run,
        ev("lease.taken_over"),
        ev("step.interrupted", step=3, phase="executing", read_only=True, outcome="interrupted"),
        ev("step.interrupted", step=3, phase="executing", read_only=False, outcome="unknown"),
        epoch=5,
    )
    assert fleet.fleet_series("leases_lost") == {"idle": 1, "deciding": 1, "executing": 1, "side_effect": 1}


def test_waiting_seconds_pair_each_wait_with_what_ended_it(run):
    t0 = CLOCK.now()
    append(
        run,
        ev("run.waiting_for_approval", t0, kind="approval"),
        ev("run.requeued", t0 + timedelta(seconds=40), reason="approval"),
    )
    append(
        run,
        ev("run.waiting_for_user", t0 + timedelta(seconds=50), kind="user"),
        ev("run.cancelled", t0 + timedelta(seconds=53), by="alice", direct=True),
    )
    append(run, ev("run.waiting_for_approval", t0 + timedelta(seconds=60), kind="approval"))  # still open: not observed
    waits = fleet.fleet_series("waiting")
    assert set(waits) == {"approval", "user"}
    assert waits["approval"].count == 1 and waits["approval"].total == pytest.approx(40)
    assert dict(waits["approval"].buckets)[30.0] == 0 and dict(waits["approval"].buckets)[60.0] == 1
    assert waits["user"].count == 1 and waits["user"].total == pytest.approx(3)


def test_uncertain_tool_calls_count_by_tool_and_nothing_else(run):
    append(
        run,
        ev("tool.call.failed", tool="http_post", outcome="uncertain"),
        ev("tool.call.failed", tool="http_post", outcome="uncertain"),
        ev("tool.call.failed", tool="http_get", outcome="uncertain"),
        ev("tool.call.failed", tool="http_post", outcome="failed"),
        ev("tool.call.failed", tool="echo"),
    )
    assert fleet.fleet_series("tool_uncertain") == {"http_post": 2, "http_get": 1}


def test_counters_read_their_reasons_and_known_labels_start_at_zero(run):
    append(
        run,
        ev("run.requeued", reason="slice_end"),
        ev("run.requeued", reason="slice_end"),
        ev("run.requeued", reason="input"),
        ev("context.compacted", reason="pressure", step=3),
        ev("context.compacted", step=4),
        ev("run.cancelled", by="x", direct=True),
    )
    c = fleet.fleet_counters()
    assert c["requeued"] == {"slice_end": 2, "drain": 0, "resume": 0, "approval": 0, "input": 1, "child_run": 0}
    assert c["compactions"] == {"pressure": 2}
    assert c["cancelled"] == {"requested": 1}
    assert c["leases_lost"] == {"side_effect": 0, "executing": 0, "deciding": 0, "idle": 0}
    assert set(c["run_steps"]) == {"completed", "failed", "cancelled"} and c["run_steps"]["completed"].count == 0
    assert set(c["waiting"]) == {"approval", "user", "child_run"}
    # every registered tool has its uncertain-outcome series from the first scrape
    assert {"echo", "http_get", "http_post", "sleep"} <= set(c["tool_uncertain"])
    assert all(n == 0 for n in c["tool_uncertain"].values())


def test_the_first_scrape_exposes_every_documented_series_with_its_known_labels_at_zero(db):
    """An alert on rate(agent_tool_uncertain_total[5m]) > 0, or on a status or an approval kind, has its series
    before the first event: a scrape of an empty deployment already lists them."""
    from prometheus_client import generate_latest

    from ops.collector import deployment_registry

    text = generate_latest(deployment_registry()).decode()
    assert 'agent_tool_uncertain_total{tool="http_post"} 0.0' in text
    assert 'agent_runs_cancelled_total{reason="requested"} 0.0' in text
    assert 'agent_run_leases_lost_total{phase="side_effect"} 0.0' in text
    for status in ("QUEUED", "RUNNING", "WAITING_FOR_APPROVAL", "WAITING_FOR_USER", "COMPLETED", "FAILED", "CANCELLED"):
        assert f'agent_runs{{status="{status}"}} 0.0' in text
    for kind in ("policy", "interrupted_side_effect", "uncertain_side_effect", "reconcile"):
        assert f'agent_approvals_pending{{kind="{kind}"}} 0.0' in text
    assert 'agent_run_waiting_seconds_count{kind="child_run"} 0.0' in text


def test_the_snapshot_counts_a_worker_once_however_many_leases_it_renews(run, load_agent, submit):
    load_agent(name="other")
    second = submit(agent="other", text="again")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_expires_at = now() + interval '30 seconds'"
            " WHERE id = %s",
            ["host-a:101:aaaa1111", run.id],
        )
        cursor.execute(
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_expires_at = now() + interval '30 seconds'"
            " WHERE id = %s",
            ["host-a:101:bbbb2222", second.id],
        )
    s = fleet.fleet_snapshot()
    assert s["live_workers"] == 1 and s["leased_runs"] == 2 and s["runs_by_status"]["RUNNING"] == 2
    with connection.cursor() as cursor:  # an expired lease is not a heartbeat
        cursor.execute(
            "UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id IN (%s, %s)", [run.id, second.id]
        )
    assert fleet.fleet_snapshot()["live_workers"] == 0
