"""The fenced UPDATE of the run row, the first write of every leased
transaction, and the parameters of finalize's transition
(`Transition`, a value of runs.domain.writes).

Both write paths of a step — statement by statement and the one-statement
CTE on PostgreSQL — send one of the two statements below, with the same
parameters: `STEP_FENCE` for a step's unit (it writes `updated_at` and the
usage and step count the unit carries), `TRANSITION_FENCE` for finalize's
unit (the same, plus the run's new status, the lease released and the
terminal columns). Both are fixed text: no column list is assembled at run
time, so the writer gate reads exactly what each statement may write, and
PostgreSQL prepares each shape once per connection.

JSON parameters are plain `%s`: PostgreSQL infers `jsonb` from the column
(an untyped literal or an `unknown` parameter), SQLite stores the text.

A statement that names its run by id checks the run's status as
`(status || '') = 'RUNNING'`, a form no index serves, so the primary key is
the only index the planner can take (here, and in the watermark, the
heartbeat, the claim by id and the take-over). With `status = 'RUNNING'` it
may take an index that holds the status (`runs_active_tenant_idx`, over the
live runs, or `runs_status_queue_idx`) when the statistics say few runs have
that status — a table analyzed before they did, or never analyzed — and then
read every run with that status at each statement until the next ANALYZE: a
step's cost grew with the number of running runs (2,265 index entries read
for a 6-step run among 150 running ones; tests/integration/test_run_row_plans.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection

from runs.domain.writes import Transition, UnitOfWork
from runs.store.json_text import compact_or_null as _json

# The guard every leased write carries: the run row, under our lease, RUNNING.
# A worker that lost its lease matches no row and writes nothing.
STEP_FENCE = (
    "UPDATE runs SET updated_at = %s, usage = COALESCE(%s, usage), step_count = COALESCE(%s, step_count)"
    " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND (status || '') = 'RUNNING'"
)

# The step fence of a unit sent while the unit before it is still in flight
# on the same connection (pipelined): it also requires a tool call row that
# unit inserted, so it matches no row, and writes nothing, unless that unit
# committed. PostgreSQL runs the two in the order sent, each in its own
# transaction: the earlier one has committed or failed when this one starts.
STEP_FENCE_AFTER = STEP_FENCE + " AND EXISTS (SELECT 1 FROM tool_invocations WHERE id = %s)"


def transition_fence() -> str:
    """finalize's fenced UPDATE: the step fence's columns, then the
    `Transition`'s. The only statement outside the lease module that writes
    a run's status or releases its lease (the writer gate lists it)."""
    return (
        "UPDATE runs SET updated_at = %s, usage = COALESCE(%s, usage), step_count = COALESCE(%s, step_count),"
        " status = %s,"
        " lease_owner = CASE WHEN %s THEN NULL ELSE lease_owner END,"
        " lease_expires_at = CASE WHEN %s THEN NULL ELSE lease_expires_at END,"
        " final_message = COALESCE(%s, final_message), failure = COALESCE(%s, failure), result = COALESCE(%s, result)"
        " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND (status || '') = 'RUNNING'"
    )


def transition_parameters(transition: Transition) -> list[Any]:
    """The values of `transition_fence()`'s transition columns, in order."""
    return [
        transition.status,
        transition.release_lease,
        transition.release_lease,
        transition.final_message,
        _json(transition.failure),
        _json(transition.result),
    ]


def sql_time(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def fence_statement(
    work: UnitOfWork | None,
    at: datetime,
    transition: Transition | None,
    *,
    run_id: UUID | str | None,
    owner: str,
    epoch: int,
    after: UUID | None = None,
) -> tuple[str, list[Any]]:
    """The fenced UPDATE (without RETURNING) and its parameters, for both
    write paths. `run_id` is passed as the dialect stores it (the CTE path:
    a UUID; the statement path: `sql_uuid`). `after` (a step's unit only):
    the id of a tool call the unit before inserted (`STEP_FENCE_AFTER`)."""
    usage = work.usage if work is not None else None
    step_count = work.step_count if work is not None else None
    params: list[Any] = [sql_time(at), _json(usage), step_count]
    if transition is None:
        if after is not None:
            return STEP_FENCE_AFTER, [*params, run_id, owner, epoch, after]
        return STEP_FENCE, [*params, run_id, owner, epoch]
    return transition_fence(), [*params, *transition_parameters(transition), run_id, owner, epoch]
