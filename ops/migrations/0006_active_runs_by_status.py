"""`runs_active_tenant_idx` carries the status (and, on PostgreSQL, the id).

The index holds only the runs that have not ended. A `/metrics` scrape and the
fleet page count those runs by status, and the scrape reads their ids (the
runs whose figures are not folded yet, ops/fleet.py); with the tenant alone in
the index, the count walked `runs_status_lease_idx`, whose entries are every
run ever made (110 k of them for 10 k live runs on the big-table bench), and
the ids needed the table. With (tenant_id, status) INCLUDE (id) both are read
from the partial index alone, so they follow the live runs, not the history.
The submit's quota (a tenant's live runs) reads the same index as before.

Rebuilt under a new name then renamed, CONCURRENTLY on PostgreSQL (a runs
table of millions must not block submits while it builds). No entry more per
write: every update that puts a run into this index (a change of status) is
already not a HOT update.
"""

from django.db import migrations

TERMINAL = "'COMPLETED', 'FAILED', 'CANCELLED'"
NAME = "runs_active_tenant_idx"
WHERE = f"WHERE status NOT IN ({TERMINAL})"


def _rebuild(schema_editor, columns: str, include: str) -> None:
    pg = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cur:
        if not pg:
            cur.execute(f"DROP INDEX IF EXISTS {NAME}")
            cur.execute(f"CREATE INDEX {NAME} ON runs ({columns}) {WHERE}")
            return
        cur.execute("SET statement_timeout = 0")
        cur.execute("SET lock_timeout = 0")
        cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}_new")  # left by an attempt that failed
        cur.execute(f"CREATE INDEX CONCURRENTLY {NAME}_new ON runs ({columns}) {include} {WHERE}")
        cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        cur.execute(f"ALTER INDEX {NAME}_new RENAME TO {NAME}")
        cur.execute("RESET statement_timeout")
        cur.execute("RESET lock_timeout")


def forward(apps, schema_editor):
    _rebuild(schema_editor, "tenant_id, status", "INCLUDE (id)")


def backward(apps, schema_editor):
    _rebuild(schema_editor, "tenant_id", "")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction
    dependencies = [("ops", "0005_lz4_for_large_values")]

    operations = [migrations.RunPython(forward, backward)]
