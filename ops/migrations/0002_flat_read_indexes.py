"""Indexes that keep reads flat in the size of the tables (the plans before
and after are in bench/RESULTS.md, `bench/bigtable.py explain`).

Raw SQL on the runs and approvals apps' tables, as 0001 is, and for its
reasons. All are partial: a step's appends and its update of the run row
never touch them (no step writes a status event, and the run row's status
and tenant are already indexed or never change, so its HOT updates stay HOT).

- events_ended_idx: the events that end a run, by id, with the run and the
  time (read from the index alone): the checkpoint prune walks them a batch
  at a time (maintenance/sweeps/prune.py) instead of joining every terminal
  run to its checkpoints at each sweep. One entry a run.
- (a tenant's status events for `ws/runs/` are runs' events_tenant_status_idx,
  runs migration 0008: one index, declared on the model.)
- runs_active_tenant_idx: a tenant's runs that have not ended: the active-run
  quota of every submit counted them through the tenant's whole history.
- approvals_pending_expiry_idx: pending approvals by expiry, for the expiry
  sweep every 5 s (it read the whole approvals table)."""

from django.db import migrations

ENDED = "'run.completed', 'run.failed', 'run.cancelled'"
TERMINAL = "'COMPLETED', 'FAILED', 'CANCELLED'"

INDEXES = {
    # INCLUDE is PostgreSQL's (an index-only walk); SQLite, the embedded default, gets the key alone.
    "events_ended_idx": f"events (id) {{include}} WHERE type IN ({ENDED})",
    "runs_active_tenant_idx": f"runs (tenant_id) WHERE status NOT IN ({TERMINAL})",
    "approvals_pending_expiry_idx": "approvals (expires_at) WHERE status = 'pending'",
}


def create(apps, schema_editor):
    """On PostgreSQL, CONCURRENTLY (a plain CREATE INDEX on a table of
    millions of events would block every step's writes while it builds) and
    without the runtime's 5 s statement and lock timeouts, which the
    migrating connection carries too (the build outlasts them); an index a
    failed earlier attempt left invalid is dropped first."""
    pg = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cur:
        if pg:
            cur.execute("SET statement_timeout = 0")
            cur.execute("SET lock_timeout = 0")
        for name, definition in INDEXES.items():
            if pg:
                cur.execute(
                    "SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                    " WHERE i.relname = %s AND NOT x.indisvalid",
                    [name],
                )
                if cur.fetchone():
                    cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                definition = definition.format(include="INCLUDE (run_id, occurred_at)")
                cur.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {definition}")
            else:
                cur.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition.format(include='')}")
        if pg:
            cur.execute("RESET statement_timeout")
            cur.execute("RESET lock_timeout")


def drop(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        for name in INDEXES:
            cur.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction
    dependencies = [("ops", "0001_metrics_indexes")]

    operations = [migrations.RunPython(create, drop)]
