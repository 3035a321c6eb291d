"""Drop events_status_idx where an earlier 0002 built it: two branches each
made a partial (tenant_id, id) index over the status events; the one kept is
runs' events_tenant_status_idx (migration 0008), declared on the model. Two
identical indexes cost every status event a second entry and serve nothing."""

from django.db import migrations


def drop(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("DROP INDEX IF EXISTS events_status_idx")


class Migration(migrations.Migration):
    dependencies = [("ops", "0002_flat_read_indexes"), ("runs", "0008_leaner_event_and_invocation_indexes")]

    operations = [migrations.RunPython(drop, migrations.RunPython.noop)]
