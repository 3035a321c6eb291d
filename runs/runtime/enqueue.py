"""Ring the doorbell: the `drive_run` task for a run that became runnable."""

from __future__ import annotations

from uuid import UUID

from django_q.tasks import async_task


def enqueue_drive(run_id: UUID) -> None:
    """Ring the doorbell. With the ORM broker on the default database this
    joins the caller's transaction."""
    async_task("runs.tasks.drive_run", str(run_id), task_name=f"drive_run {run_id}", ack_failure=True)
