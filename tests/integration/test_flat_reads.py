"""The reads users and the sweeps make stay index-bound as the tables grow
(issue 16 item 5): on tables with thousands of finished runs and their
events, ANALYZEd, the planner reads each through an index condition, never a
whole table. The statements are the product's own, captured as the real code
paths run them (the REST events page, the sockets' reads, submit, the
sweeps), then EXPLAINed. bench/bigtable.py measures the same on 10 million
events."""

from __future__ import annotations

import importlib
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from checkpoints.models import Checkpoint
from maintenance.sweeps import prune
from maintenance.sweeps.expiry import sweep_expiry
from ops import fleet
from runs.domain.events import STATUS_EVENTS
from runs.models import Run
from runs.runtime.executor import run_drive
from runs.web.consumers import RunEventsConsumer, RunsConsumer

pytestmark = pytest.mark.django_db(transaction=True)

FINISHED = 3000  # finished runs cloned from one real run, each with its events
BIG = ("events", "runs", "checkpoints", "approvals")


def migration():
    return importlib.import_module("ops.migrations.0002_flat_read_indexes")


@pytest.fixture
def history(load_agent, submit, tenant):
    """One real finished run, FINISHED clones of its rows (runs, sessions,
    events; its final checkpoint; a decided approval each), ANALYZEd."""
    load_agent(
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]} for i in range(4)] + [{"text": "ok"}]
    )
    run = submit(text="the template")
    assert run_drive(run_id=run.id).kind.value == "completed"
    prune.reset_marks()
    with connection.cursor() as cur:
        cur.execute("SET statement_timeout = 0")  # the set-up's bulk writes, not the runtime's statements
        cur.execute(
            """
            CREATE TEMP TABLE g AS
            SELECT n, gen_random_uuid() AS run_id, gen_random_uuid() AS session_id,
                   make_interval(secs => n) - interval '2 days' AS shift
            FROM generate_series(1, %s) AS n
            """,
            [FINISHED],
        )
        cur.execute(
            "INSERT INTO sessions (id, tenant_id, agent_id, event_seq, created_at)"
            " SELECT g.session_id, s.tenant_id, s.agent_id, s.event_seq, s.created_at + g.shift"
            " FROM g, sessions s WHERE s.id = %s",
            [run.session_id],
        )
        cols = [
            f'"{c.column}"'
            for c in Run._meta.concrete_fields
            if c.column not in ("id", "session_id", "idempotency_key")
        ]
        cur.execute(
            f"INSERT INTO runs (id, session_id, {', '.join(cols)})"
            f" SELECT g.run_id, g.session_id, {', '.join('r.' + c for c in cols)} FROM g, runs r WHERE r.id = %s",
            [run.id],
        )
        cur.execute(
            "INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
            " SELECT e.tenant_id, g.session_id, e.sequence, g.run_id, e.type, e.payload, e.lease_epoch,"
            " e.occurred_at + g.shift FROM g, events e WHERE e.run_id = %s ORDER BY g.n, e.sequence",
            [run.id],
        )
        cols = [f'"{c.column}"' for c in Checkpoint._meta.concrete_fields if c.column not in ("id", "run_id")]
        cur.execute(  # the final snapshot only: pruned history
            f"INSERT INTO checkpoints (id, run_id, {', '.join(cols)})"
            f" SELECT gen_random_uuid(), g.run_id, {', '.join('c.' + c for c in cols)}"
            " FROM g, checkpoints c WHERE c.run_id = %s"
            " AND c.version = (SELECT max(version) FROM checkpoints WHERE run_id = %s)",
            [run.id, run.id],
        )
        cur.execute(
            "INSERT INTO approvals (id, tenant_id, run_id, kind, request_hash, capability, presentation, status,"
            " reason, expires_at, created_at, decided_at)"
            " SELECT gen_random_uuid(), %s, g.run_id, 'policy', 'h', '{}', '{}', 'approved', '',"
            " now() - g.shift, now() + g.shift, now() + g.shift FROM g",
            [run.tenant_id],
        )
        cur.execute("DROP TABLE g")
        cur.execute("ANALYZE events; ANALYZE runs; ANALYZE sessions; ANALYZE checkpoints; ANALYZE approvals")
        cur.execute("RESET statement_timeout")
    return run


class Captured:
    """The SELECTs a code path sends, with their parameters."""

    def __init__(self):
        self.reads: list[tuple[str, object]] = []

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("SELECT") and not many:
            self.reads.append((sql, params))
        return execute(sql, params, many, context)


def reads_of(fn) -> list[tuple[str, str]]:
    """(sql, plan) of every SELECT that `fn` sends to the events, runs, checkpoints or approvals tables."""
    cap = Captured()
    with connection.execute_wrapper(cap):
        fn()
    out = []
    with connection.cursor() as cur:
        # Whether an index can serve each read, not what the planner picks at
        # this size: with a few thousand small rows (a pruned run keeps one
        # snapshot of a few hundred bytes) a whole-table read of a handful of
        # pages is cheaper than 50 index probes, and would be chosen. A read no
        # index can serve still plans as a Seq Scan with seqscan off.
        cur.execute("SET enable_seqscan = off")
        for sql, params in cap.reads:
            if not re.search(r'\bFROM "?(' + "|".join(BIG) + r')"?\b', sql):
                continue
            cur.execute(f"EXPLAIN {sql}", params)
            out.append((sql, "\n".join(row[0] for row in cur.fetchall())))
        cur.execute("RESET enable_seqscan")
    assert out, "the code path read none of the big tables"
    return out


def partial_indexes() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT indexname FROM pg_indexes WHERE indexdef LIKE '%% WHERE %%'")
        return {name for (name,) in cur.fetchall()}


def whole_reads(plan: str) -> list[str]:
    """The big tables a plan reads whole: a Seq Scan, or (seqscan being off)
    a whole-table index walked end to end, with no Index Cond to bound it. A
    partial index walked is bounded by its predicate (the pending approvals,
    the runs not ended, one ending a run)."""
    partial = partial_indexes()
    out = []
    for node in re.split(r"\n\s*->\s*", plan):
        head = node.split("\n", 1)[0]
        m = re.search(r"(Seq Scan|Index Scan|Index Only Scan)(?: Backward)?(?: using (\w+))? on (\w+)", head)
        if not m or m.group(3) not in BIG:
            continue
        if m.group(1) == "Seq Scan" or (m.group(2) not in partial and "Index Cond" not in node):
            out.append(m.group(3))
    return out


def assert_index_bound(reads, *, uses: str | None = None) -> None:
    for sql, plan in reads:
        scans = whole_reads(plan)
        assert not scans, f"a whole-table read of {scans}:\n{sql[:300]}\n{plan[:1500]}"
    if uses is not None:
        assert any(uses in plan for _, plan in reads), f"no read uses {uses}:\n" + "\n\n".join(p for _, p in reads)


def test_the_rest_events_page_reads_the_runs_events_through_their_index(history, tenant):
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    reads = reads_of(lambda: client.get(f"/api/runs/{history.id}/events/?after=3&limit=20"))
    assert_index_bound(reads, uses="events_run_sequence_idx")


def test_the_run_socket_replays_through_the_runs_events_index(history):
    consumer = RunEventsConsumer()
    consumer.run_id, consumer.cursor = history.id, 0
    assert_index_bound(reads_of(lambda: async_to_sync(consumer._fetch)()), uses="events_run_sequence_idx")


def test_the_runs_socket_reads_only_the_tenants_status_events_past_its_cursor(history, tenant):
    consumer = RunsConsumer()
    consumer.tenant_id, consumer.cursor = tenant.id, 0
    reads = reads_of(lambda: async_to_sync(consumer._fetch)())
    assert_index_bound(reads, uses="events_tenant_status_idx")


def test_a_submit_counts_only_the_tenants_active_runs(history, tenant, submit):
    assert_index_bound(reads_of(lambda: submit(text="one more")), uses="runs_active_tenant_idx")


def test_the_prune_walks_the_endings_index(history, monkeypatch):
    # batches small against the tables, as 1,000 runs are against millions (here the tables hold thousands)
    monkeypatch.setattr(prune, "SCAN_BATCH", 50)
    assert_index_bound(reads_of(prune.sweep_prune), uses="events_ended_idx")


def test_the_expiry_sweep_reads_pending_approvals_by_expiry(history):
    assert_index_bound(reads_of(sweep_expiry), uses="approvals_pending_expiry_idx")


def test_a_scrape_reads_the_live_runs_from_their_partial_index_alone(history, submit):
    """`/metrics` and the fleet page count the runs not ended by status and
    read their ids (ops.fleet): from `runs_active_tenant_idx` alone, whose
    entries are the live runs, not by walking `runs_status_lease_idx`, whose
    entries are every run ever made (ops migration 0006)."""
    submit(text="one live run")
    assert fleet.fold(10_000, 0) == FINISHED + 1  # the history folded, as the metrics sweep keeps it
    with connection.cursor() as cur:  # what autovacuum keeps: the visibility map, the tables' statistics
        cur.execute("VACUUM ANALYZE runs")
        cur.execute("VACUUM ANALYZE metric_unfolded_runs")
    reads = reads_of(fleet.fleet_snapshot) + reads_of(fleet.deployment_counters)
    assert_index_bound(reads)
    live = [(sql, plan) for sql, plan in reads if re.search(r"FROM runs WHERE status NOT IN", sql)]
    assert len(live) == 2, [sql for sql, _ in reads]  # the count by status and the ids not folded yet
    for sql, plan in live:
        assert "Index Only Scan using runs_active_tenant_idx" in plan, f"{sql[:300]}\n{plan}"


def test_a_runs_children_are_found_through_the_partial_parent_index(history):
    """Only child runs have an entry in `runs_parent_idx` (runs migration 0010);
    the lookups of a run's children, the children's join and the cascade of a
    deletion, still go through it."""
    child_of = Run.objects.filter(parent_id=history.id)
    reads = reads_of(lambda: (child_of.exclude(status__in=("COMPLETED",)).exists(), list(child_of.values("id"))))
    assert_index_bound(reads, uses="runs_parent_idx")
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        (runs,) = cur.fetchone()
        cur.execute("SELECT pg_relation_size('runs_parent_idx'), pg_relation_size('runs_tenant_created_idx')")
        parent_size, tenant_size = cur.fetchone()
    assert runs > FINISHED and parent_size < tenant_size / 4  # the runs without a parent are not in it


def test_the_partial_indexes_name_the_types_the_code_reads():
    """A partial index serves a query only if the query's type list is within
    its predicate: a status event added to the code and not to the index
    would quietly send `ws/runs/` back to reading every event."""
    m = migration()
    status = importlib.import_module("runs.migrations.0008_leaner_event_and_invocation_indexes").STATUS_TYPES
    assert set(status) == {t.value for t in STATUS_EVENTS}
    assert set(re.findall(r"'([^']+)'", m.ENDED)) == set(prune.ENDED)
