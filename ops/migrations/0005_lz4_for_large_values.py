"""lz4 for the JSON columns that carry what tools return and what the model
said (a tool's result is written twice a step: its row and its
`tool.call.completed` event). PostgreSQL compresses a value over ~2 KB before
storing it, with pglz by default; lz4 compresses several times faster (a
step whose tool returns 8 KiB: bench/RESULTS.md). Applies to
values written from now on; those already stored stay readable as they are.
Only where the server was built with lz4 (`default_toast_compression` offers
it); SQLite has no such setting."""

from django.db import migrations

COLUMNS = (
    ("events", "payload"),
    ("tool_invocations", "result"),
    ("tool_invocations", "arguments"),
    ("checkpoints", "state"),
)


def lz4(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cur:
        cur.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        row = cur.fetchone()
        if not (row and row[0]):
            return
        for table, column in COLUMNS:
            cur.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


def pglz(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cur:
        for table, column in COLUMNS:
            cur.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION pglz")


class Migration(migrations.Migration):
    dependencies = [("ops", "0004_metric_totals"), ("checkpoints", "0003_hot_path_no_fk_checks")]

    operations = [migrations.RunPython(lz4, pglz)]
