"""Retention: `Run.detail_removed_at` (null on every existing run: nothing
has been removed) and `runs_detail_kept_idx (tenant_id, created_at)`, partial
over the ended runs that still hold their detail — the candidates of the
retention sweep and of `manage.py purge_runs`, a tenant's oldest first. Only
a run's end (a status change, which no HOT update carries anyway) writes an
entry; the removal of its detail takes it out.

The column is nullable without a default: PostgreSQL adds it without
rewriting the table. The index is built CONCURRENTLY on PostgreSQL (as in
0013), without the migrating connection's statement and lock timeouts;
SQLite, the embedded default, builds it plainly."""

from django.db import migrations, models

NAME = "runs_detail_kept_idx"
DEFINITION = (
    "runs (tenant_id, created_at) WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED') AND detail_removed_at IS NULL"
)


def forward(apps, schema_editor):
    pg = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cur:
        if not pg:
            cur.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON {DEFINITION}")
            return
        cur.execute("SET statement_timeout = 0")
        cur.execute("SET lock_timeout = 0")
        cur.execute(
            "SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE i.relname = %s AND NOT x.indisvalid",
            [NAME],
        )
        if cur.fetchone():  # an index an earlier attempt left invalid
            cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        cur.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {NAME} ON {DEFINITION}")
        cur.execute("RESET statement_timeout")
        cur.execute("RESET lock_timeout")


def backward(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"DROP INDEX{concurrently} IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction
    dependencies = [
        ("runs", "0014_run_lineage"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="detail_removed_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="run",
                    index=models.Index(
                        condition=models.Q(
                            ("detail_removed_at__isnull", True), ("status__in", ["COMPLETED", "FAILED", "CANCELLED"])
                        ),
                        fields=["tenant", "created_at"],
                        name=NAME,
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
