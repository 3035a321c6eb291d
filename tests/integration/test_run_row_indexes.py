"""What a change of a run row writes into the indexes of `runs` (runs migration
0010): an update that changes an indexed column adds an entry to every index
whose predicate holds, so each index there is paid for by every claim, wait
and end. Counted from the server's own write-ahead log (pg_walinspect): the
B-tree records of this database between two LSNs, by index."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from runs.models import Run
from runs.store import lease

pytestmark = pytest.mark.django_db(transaction=True)


def _lsn() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_wal_flush_lsn()")  # each statement below commits: flushed before it returns
        return str(cur.fetchone()[0])


def index_entries(fn) -> dict[str, int]:
    """B-tree entries `fn` wrote, by index name."""
    with connection.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cur.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        (oid,) = cur.fetchone()
    start = _lsn()
    fn()
    end = _lsn()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(i.relname, w.block_ref), count(*) FROM pg_get_wal_records_info(%s, %s) w"
            " LEFT JOIN pg_class i ON i.relfilenode = substring(w.block_ref from '/(\\d+) fork')::oid"
            " WHERE w.resource_manager = 'Btree' AND w.record_type LIKE 'INSERT%%' AND w.block_ref LIKE %s"
            " GROUP BY 1",
            [start, end, f"%/{oid}/%"],
        )
        return dict(cur.fetchall())


def runs_indexes() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'runs'")
        return {name for (name,) in cur.fetchall()}


def test_a_heartbeat_writes_no_index_entry(load_agent, submit):
    """A heartbeat moves only the lease's expiry, which no index holds: a HOT
    update (it wrote an entry into each of the eleven indexes of `runs`)."""
    load_agent()
    run = submit(text="beat")
    leased = lease.claim(run_id=run.id, owner="w1", lease_seconds=30)
    assert leased is not None
    for _ in range(3):
        wrote = index_entries(lambda: lease.renew(run_id=run.id, owner="w1", epoch=leased.epoch, lease_seconds=30))
        assert wrote == {}, wrote
    assert Run.objects.get(id=run.id).lease_expires_at is not None


def test_a_claim_writes_into_the_runs_indexes_it_needs_only(load_agent, submit):
    """A claim changes the status: a new version of the row, an entry in each
    index whose predicate holds. Not in an index of the tenant alone (the
    (tenant, created) index serves those lookups) nor in the parent's (the
    run has none)."""
    load_agent()
    run = submit(text="claim")
    names = runs_indexes()
    assert "runs_parent_idx" in names and "runs_status_queue_idx" in names
    wrote = index_entries(lambda: lease.claim(run_id=run.id, owner="w1", lease_seconds=30))
    into_runs = {name: n for name, n in wrote.items() if name in names}
    assert "runs_parent_idx" not in into_runs
    assert set(into_runs) == {
        "runs_pkey",
        "runs_status_queue_idx",
        "runs_tenant_created_idx",
        "runs_session_id_d6689c7b",
        "runs_agent_created_idx",
        "runs_live_deadline_idx",
        "one_active_run_per_session",
        "runs_active_tenant_idx",
    }, into_runs


def test_the_queue_takes_its_next_run_in_order_from_the_index(load_agent, submit):
    """The claim of the next run walks QUEUED runs in the order it takes them
    (priority, then age) and stops at the first it can lock: no sort of every
    queued run."""
    load_agent()
    for i in range(5):
        submit(text=f"queued {i}")
    with connection.cursor() as cur:
        cur.execute("ANALYZE runs")
        cur.execute("SET enable_seqscan = off")
        cur.execute("EXPLAIN " + lease._claim_next_sql(), lease._claim_params("w1", 30))
        plan = "\n".join(row[0] for row in cur.fetchall())
        # Under a share (fair workers): the tenant of the next run, among those under their share, ...
        cur.execute("EXPLAIN " + lease._next_tenant_sql(), [1])
        tenant_plan = "\n".join(row[0] for row in cur.fetchall())
        # ... then that tenant's next run.
        cur.execute("EXPLAIN " + lease._claim_next_sql(shared=True), [*lease._claim_params("w1", 30), uuid.uuid4(), 1])
        shared_plan = "\n".join(row[0] for row in cur.fetchall())
        cur.execute("RESET enable_seqscan")
    assert "runs_status_queue_idx" in plan and "Sort" not in plan, plan
    # (The tenants at their share are grouped from the RUNNING runs, as many as there are workers: that
    # sort is theirs. The queue itself is walked in order.)
    assert "runs_status_queue_idx" in tenant_plan and "priority" not in tenant_plan, tenant_plan
    assert "runs_active_tenant_idx" in shared_plan, shared_plan
