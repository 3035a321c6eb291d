"""Folded metric totals (ops/models.py). On PostgreSQL a trigger on `runs`
notes every run that reaches a terminal status, whoever writes it (finalize,
the lifecycle service, a child's join), in the writer's own transaction; the
runs that had already ended are noted here, to be folded by the `metrics`
sweep; and `events_metrics_run_idx` finds a run's counted events in one
index descent (a scrape reads them run by run for the runs not folded yet).
SQLite keeps reading the tables whole (ops/fleet.py).

Not atomic: the trigger is created first and committed (its lock on `runs`
is brief), then the ended runs are noted (ON CONFLICT: a run the trigger
noted meanwhile is noted once), then the index is built CONCURRENTLY; the
migrating connection's 5 s statement timeout is lifted for those two, which
outlast it on a large table."""

from django.db import migrations, models

TERMINAL = "('COMPLETED', 'FAILED', 'CANCELLED')"

COUNTED = (
    "'run.cancelled', 'run.requeued', 'run.failed', 'lease.taken_over', 'step.interrupted', 'context.compacted',"
    " 'tool.call.failed', 'run.waiting_for_approval', 'run.waiting_for_user'"
)

TRIGGER = f"""
CREATE OR REPLACE FUNCTION agentrt_note_ended_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_unfolded_runs (run_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER runs_ended_on_update AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.status IN {TERMINAL} AND OLD.status NOT IN {TERMINAL}) EXECUTE FUNCTION agentrt_note_ended_run();
CREATE OR REPLACE TRIGGER runs_ended_on_insert AFTER INSERT ON runs FOR EACH ROW
    WHEN (NEW.status IN {TERMINAL}) EXECUTE FUNCTION agentrt_note_ended_run();
"""
BACKFILL = (
    f"INSERT INTO metric_unfolded_runs (run_id) SELECT id FROM runs WHERE status IN {TERMINAL} ON CONFLICT DO NOTHING"
)
INDEX = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS events_metrics_run_idx ON events (run_id, id) WHERE type IN ({COUNTED})"
)

BACKWARD = """
DROP INDEX IF EXISTS events_metrics_run_idx;
DROP TRIGGER IF EXISTS runs_ended_on_update ON runs;
DROP TRIGGER IF EXISTS runs_ended_on_insert ON runs;
DROP FUNCTION IF EXISTS agentrt_note_ended_run();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cur:
        cur.execute(TRIGGER)
        cur.execute("SET statement_timeout = 0")
        cur.execute(BACKFILL)
        cur.execute(
            "SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE i.relname = 'events_metrics_run_idx' AND NOT x.indisvalid"
        )
        if cur.fetchone():  # left invalid by an attempt that failed
            cur.execute("DROP INDEX CONCURRENTLY IF EXISTS events_metrics_run_idx")
        cur.execute(INDEX)
        cur.execute("RESET statement_timeout")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    atomic = False  # the trigger committed before the backfill; CREATE INDEX CONCURRENTLY
    dependencies = [("ops", "0003_drop_duplicate_status_index"), ("runs", "0009_run_principal")]

    operations = [
        migrations.CreateModel(
            name="MetricTotal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("series", models.CharField(max_length=40)),
                ("label", models.CharField(max_length=200)),
                ("bucket", models.CharField(default="", max_length=20)),
                ("value", models.FloatField(default=0)),
            ],
            options={"db_table": "metric_totals"},
        ),
        migrations.AddConstraint(
            model_name="metrictotal",
            constraint=models.UniqueConstraint(fields=("series", "label", "bucket"), name="metric_total_unique"),
        ),
        migrations.CreateModel(
            name="UnfoldedRun",
            fields=[("run_id", models.UUIDField(primary_key=True, serialize=False))],
            options={"db_table": "metric_unfolded_runs"},
        ),
        migrations.RunPython(forward, backward),
    ]
