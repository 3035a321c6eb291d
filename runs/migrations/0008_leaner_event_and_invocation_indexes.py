"""Fewer index entries per step.

- `events (tenant_id, id)` served only the tenant's runs socket, which streams
  status events; it becomes partial over those types, so the six or seven
  events a step writes (none of them a status event) no longer get an entry.
- `tool_invocations.idempotency_key` keeps its unique index (the same one,
  now declared as a constraint) and loses the varchar_pattern_ops index
  PostgreSQL gets for a `unique=True` CharField: no query uses LIKE on it.
  The state changes; on PostgreSQL the database only drops that index.
"""

from django.db import migrations, models

STATUS_TYPES = [
    "run.created",
    "run.claimed",
    "run.started",
    "run.resumed",
    "run.requeued",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.waiting_for_approval",
    "run.waiting_for_user",
    "lease.taken_over",
    "approval.resolved",
]
LIKE_INDEX = "tool_invocations_idempotency_key_df715b4e_like"


def drop_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {LIKE_INDEX}")


def restore_like_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {LIKE_INDEX} ON tool_invocations (idempotency_key varchar_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_run_parent"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="event", name="events_tenant_id_idx"),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("type__in", STATUS_TYPES)), fields=["tenant", "id"], name="events_tenant_status_idx"
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="toolinvocation", name="idempotency_key", field=models.CharField(max_length=300)
                ),
                migrations.AddConstraint(
                    model_name="toolinvocation",
                    # PostgreSQL's name for the unique index `unique=True` made: the index stays as it is.
                    constraint=models.UniqueConstraint(
                        fields=("idempotency_key",), name="tool_invocations_idempotency_key_key"
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_like_index, restore_like_index)],
        ),
    ]
