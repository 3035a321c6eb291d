"""`agentrt_tenant_leases(tenant)`: a tenant's RUNNING runs, counted under its
lock (fair workers; runs/store/lease.py).

A claim may take a tenant's last slot only if no other claim of that tenant
is taking it at the same moment. Under READ COMMITTED a statement counts in
the snapshot it started with, so the guard of one UPDATE cannot both wait
for a concurrent claim and see its commit. This function can: it takes the
tenant's transaction-scoped advisory lock (held to the caller's commit; the
two-key form, first key runs.store.lease.SHARE_LOCK, second the tenant's
hash), then counts in a query of its own, and a VOLATILE function's query
takes a new snapshot, which sees every claim of the tenant that committed
while it waited. So the claim by id stays one prepared statement whose
guard calls it. PostgreSQL only: SQLite runs one write transaction at a
time. The old code never calls it, so it can be created ahead of a rolling
deploy's new code (deploy/README.md)."""

from django.db import migrations

SHARE_LOCK = 1096884023  # runs.store.lease.SHARE_LOCK: crc32("agentrt.tenant_share") & 0x7fffffff

FUNCTION = f"""
CREATE OR REPLACE FUNCTION agentrt_tenant_leases(p_tenant uuid) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({SHARE_LOCK}, hashtext(p_tenant::text));
    RETURN (SELECT count(*) FROM runs WHERE tenant_id = p_tenant AND status = 'RUNNING');
END $$
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS agentrt_tenant_leases(uuid)")


class Migration(migrations.Migration):
    dependencies = [("ops", "0006_active_runs_by_status"), ("runs", "0012_tenant_allow_lists")]

    operations = [migrations.RunPython(forward, backward)]
