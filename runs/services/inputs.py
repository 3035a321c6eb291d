"""The input service: deliver the user's answer to a run WAITING_FOR_USER
and requeue it, in one transaction (DESIGN §4, §8)."""

from __future__ import annotations

from django.db import connection, transaction

from runs.clock import CLOCK
from runs.domain.scrub import scrub_text
from runs.domain.writes import EventWrite
from runs.errors import RunError
from runs.models import Run, ToolInvocation
from runs.services.validation import check_text
from runs.store.repository import append_events, jp, sql_dt, sql_json, sql_uuid


class RunNotWaitingForUser(RunError):
    """Input goes only to a run that waits for the user."""

    code = "run_not_waiting_for_input"
    status = 409


def run_input(*, run: Run, text: str, by: str = "") -> Run:
    """Answer the run's pending question; the run goes back to QUEUED."""
    check_text(text, "text", max_length=100_000)
    text = scrub_text(text)  # the answer is persisted (invocation result, event, checkpoints): secrets never
    now = CLOCK.now()
    question = (
        ToolInvocation.objects.filter(run_id=run.id, status="awaiting_approval", suspended_kind="user")
        .order_by("-step_number")
        .first()
    )
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE runs SET status = 'QUEUED', updated_at = %s WHERE id = %s AND status = 'WAITING_FOR_USER' AND lease_owner IS NULL",
                [sql_dt(now), sql_uuid(run.id)],
            )
            if cursor.rowcount != 1:
                raise RunNotWaitingForUser("the run is not waiting for input")
            if question is not None:
                answer = {"answer": text}
                cursor.execute(
                    f"UPDATE tool_invocations SET status = 'completed', result = {jp()}, suspended_kind = NULL, updated_at = %s"
                    " WHERE id = %s AND status = 'awaiting_approval'",
                    [sql_json(answer), sql_dt(now), sql_uuid(question.id)],
                )
            append_events(
                cursor,
                tenant_id=run.tenant_id,
                session_id=run.session_id,
                run_id=run.id,
                epoch=run.lease_epoch,
                events=[
                    EventWrite(
                        "run.input_received",
                        {"text": text[:4000], "by": by, "invocation": str(question.id) if question else None},
                        now,
                    ),
                    EventWrite("run.requeued", {"reason": "input"}, now),
                ],
            )
            from runs.runtime.executor import enqueue_drive

            enqueue_drive(run.id)
    return Run.objects.get(id=run.id)
