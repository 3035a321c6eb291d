"""Indexes that keep a `/metrics` scrape cheap (ops/fleet.py).

The events index is partial: it holds only the rare event types the counters
read, so the hot path's appends (model responses, deltas, checkpoints) never
touch it. They are raw SQL on tables the runs and approvals apps own, so those
apps' migrations (and their numbering) stay untouched.

No index on runs.updated_at: the step's fenced UPDATE writes that column,
and any index on it (even a partial one) turns every step's update of the
run row from a HOT update into one that writes every index of the table.
The queue gauges find QUEUED rows through runs_status_lease_idx instead."""
from django.db import migrations

COUNTED = ("run.cancelled", "run.requeued", "run.failed", "lease.taken_over", "step.interrupted", "context.compacted",
           "tool.call.failed", "run.waiting_for_approval", "run.waiting_for_user")
TYPES = ", ".join(f"'{t}'" for t in COUNTED)


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_hot_path_no_fk_checks"), ("approvals", "0001_initial")]

    operations = [
        migrations.RunSQL(
            f"CREATE INDEX IF NOT EXISTS events_metrics_idx ON events (type, run_id, id) WHERE type IN ({TYPES})",
            "DROP INDEX IF EXISTS events_metrics_idx",
        ),
        migrations.RunSQL(
            "CREATE INDEX IF NOT EXISTS approvals_pending_kind_idx ON approvals (kind, created_at) WHERE status = 'pending'",
            "DROP INDEX IF EXISTS approvals_pending_kind_idx",
        ),
    ]
