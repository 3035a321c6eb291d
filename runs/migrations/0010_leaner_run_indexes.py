"""Fewer index entries when a run's status or lease changes.

An update of a run row that changes an indexed column is not a HOT update: it
adds an entry to every index of `runs` (eleven before this migration). Such
updates are the claim, each wait and each end, and, because the lease's expiry
was indexed, every heartbeat. After it, a claim writes 8 entries into `runs`'s
indexes instead of 10 and a heartbeat none instead of 10 (bench/RESULTS.md,
bench/RESULTS.md).

- `runs_tenant_id_...`, the index Django gives a ForeignKey, is dropped:
  `runs_tenant_created_idx (tenant_id, created_at DESC)` starts with the same
  column and serves every lookup by tenant (the lists, the cascade of a
  tenant's deletion).
- `runs_parent_id_...` becomes `runs_parent_idx`, partial over the runs that
  have a parent: a lookup of a run's children (`parent_id = ...`, the
  cascade) implies `parent_id IS NOT NULL`, and the runs that are not a
  child, most of them, no longer get an entry.
- `runs_status_lease_idx (status, lease_expires_at)` becomes
  `runs_status_queue_idx (status, priority, created_at)`: a heartbeat sets
  only `lease_expires_at`, so it stays a HOT update; the queue's claim walks
  QUEUED runs in the order it takes them (priority, then age) and stops at
  the first it can lock, instead of reading every queued run to sort them;
  the reclaim sweep and the fleet's gauges read the RUNNING runs (as many as
  the workers hold) and filter on the lease there.

On PostgreSQL the new indexes are built CONCURRENTLY before the old ones are
dropped (a runs table of millions must not block submits and steps while an
index builds), without the migrating connection's statement and lock
timeouts; SQLite, the embedded default, builds them plainly.
"""

from django.db import migrations, models

NEW = {
    "runs_parent_idx": "runs (parent_id) WHERE parent_id IS NOT NULL",
    "runs_status_queue_idx": "runs (status, priority, created_at)",
}
OLD = {
    "runs_tenant_id_9b96210b": "runs (tenant_id)",
    "runs_parent_id_759f9f1a": "runs (parent_id)",
    "runs_status_lease_idx": "runs (status, lease_expires_at)",
}


def _swap(schema_editor, build: dict[str, str], drop: dict[str, str]) -> None:
    pg = schema_editor.connection.vendor == "postgresql"
    concurrently = " CONCURRENTLY" if pg else ""
    with schema_editor.connection.cursor() as cur:
        if pg:
            cur.execute("SET statement_timeout = 0")
            cur.execute("SET lock_timeout = 0")
        for name, definition in build.items():
            if pg:  # an index an earlier attempt left invalid is dropped first
                cur.execute(
                    "SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                    " WHERE i.relname = %s AND NOT x.indisvalid",
                    [name],
                )
                if cur.fetchone():
                    cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            cur.execute(f"CREATE INDEX{concurrently} IF NOT EXISTS {name} ON {definition}")
        for name in drop:
            cur.execute(f"DROP INDEX{concurrently} IF EXISTS {name}")
        if pg:
            cur.execute("RESET statement_timeout")
            cur.execute("RESET lock_timeout")


def forward(apps, schema_editor):
    _swap(schema_editor, NEW, OLD)


def backward(apps, schema_editor):
    _swap(schema_editor, OLD, NEW)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction
    dependencies = [
        ("runs", "0009_run_principal"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="tenant",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE, to="runs.tenant"),
                ),
                migrations.AlterField(
                    model_name="run",
                    name="parent",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        editable=False,
                        null=True,
                        on_delete=models.deletion.CASCADE,
                        related_name="children",
                        to="runs.run",
                    ),
                ),
                migrations.RemoveIndex(model_name="run", name="runs_status_lease_idx"),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(fields=["status", "priority", "created_at"], name="runs_status_queue_idx"),
                ),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(
                        condition=models.Q(("parent__isnull", False)), fields=["parent"], name="runs_parent_idx"
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
