"""The lifecycle service: transitions of runs that hold no lease (DESIGN §4):
cancel of a QUEUED or waiting run, and the cancel request of a RUNNING one."""

from __future__ import annotations

from django.db import connection, transaction

from runs.clock import CLOCK
from runs.domain.pipeline import UNKNOWN_OUTCOME
from runs.domain.writes import EventWrite
from runs.errors import RunTerminal
from runs.models import Run
from runs.store.repository import append_events, jp, sql_dt, sql_json, sql_uuid

WAITING = ("WAITING_FOR_APPROVAL", "WAITING_FOR_USER")


def run_cancel(*, run: Run, by: str = "") -> str:
    """Cancel a run. A QUEUED or waiting run ends CANCELLED at once; a RUNNING
    one gets `cancel_requested_at` and its worker stops at the next
    observation point. Return the status the run is in afterwards."""
    now = CLOCK.now()
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE runs SET status = 'CANCELLED', cancel_requested_at = COALESCE(cancel_requested_at, %s), updated_at = %s"
                " WHERE id = %s AND status IN ('QUEUED', 'WAITING_FOR_APPROVAL', 'WAITING_FOR_USER') AND lease_owner IS NULL",
                [sql_dt(now), sql_dt(now), sql_uuid(run.id)],
            )
            if cursor.rowcount == 1:
                cursor.execute(
                    "UPDATE approvals SET status = 'cancelled', decided_at = %s WHERE run_id = %s AND status = 'pending'",
                    [sql_dt(now), sql_uuid(run.id)],
                )
                # A granted re-run that never ran keeps its first attempt's record: outcome unknown (I6).
                cursor.execute(
                    f"UPDATE tool_invocations SET status = 'interrupted', error = {jp()}, updated_at = %s"
                    " WHERE run_id = %s AND effect_sent_at IS NOT NULL AND result IS NULL AND status IN ('authorized', 'executing')",
                    [sql_json(UNKNOWN_OUTCOME), sql_dt(now), sql_uuid(run.id)],
                )
                append_events(
                    cursor,
                    tenant_id=run.tenant_id,
                    session_id=run.session_id,
                    run_id=run.id,
                    epoch=run.lease_epoch,
                    events=[EventWrite("run.cancelled", {"by": by, "direct": True}, now)],
                )
                return "CANCELLED"
            cursor.execute(
                "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, %s), updated_at = %s WHERE id = %s AND status = 'RUNNING'",
                [sql_dt(now), sql_dt(now), sql_uuid(run.id)],
            )
            if cursor.rowcount == 1:
                return "RUNNING"
    raise RunTerminal("the run has already ended")


def fail_waiting(cursor, *, run_id, failure: dict, now) -> bool:
    """WAITING_* -> FAILED inside the caller's transaction (a rejected
    interrupted side effect, an expired approval, a passed deadline); its
    pending approvals become cancelled. True when the transition landed."""
    cursor.execute(
        f"UPDATE runs SET status = 'FAILED', failure = {jp()}, updated_at = %s"
        " WHERE id = %s AND status IN ('WAITING_FOR_APPROVAL', 'WAITING_FOR_USER') AND lease_owner IS NULL",
        [sql_json(failure), sql_dt(now), sql_uuid(run_id)],
    )
    if cursor.rowcount != 1:
        return False
    cursor.execute(
        "UPDATE approvals SET status = 'cancelled', decided_at = %s WHERE run_id = %s AND status = 'pending'",
        [sql_dt(now), sql_uuid(run_id)],
    )
    return True
