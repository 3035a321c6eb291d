"""A dead worker's run is taken over at once, a stalled one's only after its lease.

A lease owner's process holds a session-level advisory lock for as long as
it lives (runs/runtime/liveness.py); maintenance probes the owners of live
leases about once a second. Real processes: a `qcluster` node and
`run_maintenance` on the test database, a 30 s lease (the production
default). SIGKILL ends the worker's session, so its run is taken over long
before the lease would have expired; SIGSTOP keeps the session, so the run
waits for the lease rule. The fence stays the authority either way."""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from runs.models import Event, Run
from runs.runtime import liveness
from tests.conftest import wait_for

pytestmark = [pytest.mark.fault, pytest.mark.django_db(transaction=True)]

LEASE = 30  # the production default: the takeover must not wait for it


def raw_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


def hold(process: str) -> psycopg.Connection:
    conn = raw_connection()
    got = conn.execute(f"SELECT pg_try_advisory_lock({liveness.KEY.format('%s')})", [process]).fetchone()
    assert got == (True,)
    return conn


def test_the_probe_sees_a_held_lock_as_alive_a_closed_session_as_dead_and_leaves_no_lock_behind():
    """Separate connections: a 'worker' session holding its lock, a probe on Django's own."""
    alive = hold("host-a:101")
    gone = hold("host-b:202")
    gone.close()  # the process died: PostgreSQL ends the session and its lock with it

    assert liveness.dead_processes(["host-a:101", "host-b:202", "host-c:303"]) == {"host-b:202", "host-c:303"}
    # The probe released what it took: another session can hold host-b's key now, and the probe sees it alive.
    again = hold("host-b:202")
    assert liveness.dead_processes(["host-b:202"]) == set()
    alive.close()
    again.close()


def test_two_probes_and_a_worker_taking_its_lock_behind_a_barrier_never_see_a_live_worker_dead():
    """The worker's lock and two probes at once, each on its own connection: whatever the order, a probe that
    ran after the worker held its lock says alive, and the worker always ends up holding it."""
    barrier = threading.Barrier(3)
    out: dict[str, object] = {}
    worker = raw_connection()
    probes = [raw_connection(), raw_connection()]
    key = liveness.KEY.format("%s")

    def take():
        barrier.wait()
        for _ in range(50):  # a probe holds the key for one statement
            if worker.execute(f"SELECT pg_try_advisory_lock({key})", ["host-r:1"]).fetchone()[0]:
                out["worker"] = True
                return
        out["worker"] = False

    def probe(i):
        barrier.wait()
        k = liveness.KEY.format("p")
        out[f"probe{i}"] = (
            probes[i]
            .execute(
                f"SELECT CASE WHEN pg_try_advisory_lock({k}) THEN pg_advisory_unlock({k}) ELSE false END"
                " FROM (SELECT %s::text AS p) AS t",
                ["host-r:1"],
            )
            .fetchone()[0]
        )

    threads = [threading.Thread(target=take), *(threading.Thread(target=probe, args=(i,)) for i in range(2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out["worker"] is True
    assert liveness.dead_processes(["host-r:1"]) == set()  # held now: alive
    for c in (worker, *probes):
        c.close()


def slow_run(load_agent, submit):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "echo", "arguments": {"text": "slow"}}], "delay_ms": 4000},
            {"text": "done"},
        ]
    )
    return submit()


def leased(run):
    row = Run.objects.filter(id=run.id).values("status", "lease_owner", "lease_expires_at", "lease_epoch").get()
    return row if row["status"] == "RUNNING" and row["lease_owner"] else None


def takeovers(run):
    return list(Event.objects.filter(run=run, type="lease.taken_over").order_by("sequence"))


def test_a_sigkilled_workers_run_is_taken_over_before_its_lease_would_have_expired(cluster, procs, load_agent, submit):
    env = {"AGENTRT_LEASE_SECONDS": LEASE, "AGENTRT_WORKERS": 1, "AGENTRT_DEAD_OWNER_PROBE_SECONDS": 1}
    node = cluster(**env)
    procs(["manage.py", "run_maintenance"], "maintenance", **env)
    run = slow_run(load_agent, submit)
    wait_for(lambda: leased(run), timeout=60, message=f"a worker to lease the run\n{node.output()[-2000:]}")
    held = leased(run)
    pid = int(held["lease_owner"].split(":")[1])

    os.kill(pid, signal.SIGKILL)  # the worker process itself, mid-step

    wait_for(lambda: takeovers(run), timeout=LEASE, message="the dead owner's run to be taken over")
    taken = takeovers(run)[0]
    assert taken.payload["previous_owner"] == held["lease_owner"]
    assert taken.payload["previous_epoch"] == held["lease_epoch"]
    # Before the lease the dead worker held would have expired — not a lease later.
    assert taken.occurred_at < held["lease_expires_at"] - timedelta(seconds=LEASE / 2), (
        taken.occurred_at,
        held["lease_expires_at"],
    )
    wait_for(
        lambda: Run.objects.get(id=run.id).status == "COMPLETED",
        timeout=90,
        message=f"the run to complete on the restarted worker\n{node.output()[-3000:]}",
    )


def test_a_sigstopped_workers_run_is_not_taken_over_before_its_lease_expires(cluster, procs, load_agent, submit):
    """A stalled process keeps its session and its lock: the lease rule decides."""
    lease = 6  # the rule is the same at any length; a short one keeps the test short
    env = {"AGENTRT_LEASE_SECONDS": lease, "AGENTRT_WORKERS": 1, "AGENTRT_DEAD_OWNER_PROBE_SECONDS": 1}
    node = cluster(**env)
    procs(["manage.py", "run_maintenance"], "maintenance", **env)
    run = slow_run(load_agent, submit)
    wait_for(lambda: leased(run), timeout=60, message=f"a worker to lease the run\n{node.output()[-2000:]}")
    pid = int(leased(run)["lease_owner"].split(":")[1])

    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = leased(run)  # read while it is stopped: its last renewal is final
        wait_for(lambda: takeovers(run), timeout=lease * 6, message="the stalled owner's run to be taken over")
        taken = takeovers(run)[0]
        assert taken.payload["previous_owner"] == frozen["lease_owner"]
        assert taken.occurred_at >= frozen["lease_expires_at"], (taken.occurred_at, frozen["lease_expires_at"])
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: Run.objects.get(id=run.id).status == "COMPLETED",
        timeout=90,
        message=f"the run to complete\n{node.output()[-3000:]}",
    )


def test_a_lock_whose_session_was_cut_is_taken_again_at_the_next_claim_not_left_for_the_probe():
    """The lock's own connection terminated (a failover, a pooler restart, pg_terminate_backend) while its
    process lives: the next `ensure` before a claim sees the server hung up and takes the lock again at once,
    so the probe does not find a live worker's runs ownerless (a fenced zombie for nothing)."""
    owner = "host-cut:4242:abcd"
    try:
        assert liveness.LIVENESS.ensure(owner)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            pids = [row[0] for row in cursor.fetchall()]
            assert len(pids) == 1
            cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])

        def gone():
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pids[0]])
                return cursor.fetchone()[0] == 0

        wait_for(gone, timeout=10, message="the lock's backend to end")
        assert liveness.dead_processes(["host-cut:4242"]) == {"host-cut:4242"}  # nobody holds it now

        assert liveness.LIVENESS.ensure(owner)  # before the next claim: no check asked for, none needed

        assert liveness.dead_processes(["host-cut:4242"]) == set()  # held again
    finally:
        liveness.LIVENESS.release()
