"""`events_mcp_calls_idx`: the results of MCP tool calls, for `agent_mcp_calls_total` (ops/fleet.py).

Partial: only `tool.call.completed` / `tool.call.failed` events whose tool is an `mcp__<server>__<tool>`, so
no other tool's result, and nothing else the hot path appends, ever writes to it. Its predicate is
ops.fleet.MCP_CALLS' (the same text: PostgreSQL uses a partial index only for a query that implies it). On
PostgreSQL it is built CONCURRENTLY (an events table of any size keeps taking appends while it builds), without
the migrating connection's statement and lock timeouts; SQLite, the embedded default, builds it plainly."""

from django.db import migrations

NAME = "events_mcp_calls_idx"
DEFINITION = (
    "events (run_id, id) WHERE type IN ('tool.call.completed', 'tool.call.failed')"
    " AND payload->>'tool' LIKE 'mcp\\_\\_%' ESCAPE '\\'"
)


def forward(apps, schema_editor):
    pg = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cur:
        if pg:
            cur.execute("SET statement_timeout = 0")
            cur.execute("SET lock_timeout = 0")
            cur.execute(
                "SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE i.relname = %s AND NOT x.indisvalid",
                [NAME],
            )
            if cur.fetchone():  # an index an earlier attempt left invalid
                cur.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
        cur.execute(f"CREATE INDEX{' CONCURRENTLY' if pg else ''} IF NOT EXISTS {NAME} ON {DEFINITION}")
        if pg:
            cur.execute("RESET statement_timeout")
            cur.execute("RESET lock_timeout")


def backward(apps, schema_editor):
    pg = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"DROP INDEX{' CONCURRENTLY' if pg else ''} IF EXISTS {NAME}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction
    dependencies = [("ops", "0007_tenant_leases")]

    operations = [migrations.RunPython(forward, backward)]
