"""Indexes for the runs list's filters (runs.services.run_list).

- `runs_agent_id_4ba1aa45 (agent_id)`, the index Django gives a ForeignKey,
  becomes `runs_agent_created_idx (agent_id, created_at DESC)`: the same
  entries (one per row version, as before), and an agent's runs are read
  newest first in order, a page at a time, instead of all of them sorted.
- `runs_tenant_ended_badly_idx (tenant_id, status, created_at DESC)`, partial
  over the FAILED and CANCELLED runs: a tenant's failures, a page at a time,
  without walking every completed run. Only a run's end (to one of those two)
  writes an entry; a claim or a wait does not.

On PostgreSQL they are built CONCURRENTLY before the old index is dropped
(as in 0010), without the migrating connection's statement and lock
timeouts; SQLite, the embedded default, builds them plainly.
"""

from django.db import migrations, models

NEW = {
    "runs_agent_created_idx": "runs (agent_id, created_at DESC)",
    "runs_tenant_ended_badly_idx": "runs (tenant_id, status, created_at DESC) WHERE status IN ('FAILED', 'CANCELLED')",
}
OLD = {
    "runs_agent_id_4ba1aa45": "runs (agent_id)",
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
        ("runs", "0012_tenant_allow_lists"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="run",
                    name="agent",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.PROTECT, to="runs.agent"),
                ),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(fields=["agent", "-created_at"], name="runs_agent_created_idx"),
                ),
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(
                        condition=models.Q(("status__in", ["FAILED", "CANCELLED"])),
                        fields=["tenant", "status", "-created_at"],
                        name="runs_tenant_ended_badly_idx",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
