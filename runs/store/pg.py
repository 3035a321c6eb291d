"""One round trip per fenced transaction on PostgreSQL.

A step's unit of work becomes a single statement of data-modifying CTEs:
the fenced UPDATE of the run row is the first CTE (`fenced_run`), and every
other write reads from it, so when the fence matches no row nothing else is
written either. PostgreSQL runs a single statement as its own transaction,
with every row lock (the run row, the session counter) held to its commit,
so commit order still equals event-sequence order. bench/RESULTS.md measures the
statements one by one at 5.8 ms a step and batched at 3.9 ms; this goes
further and sends no BEGIN and no COMMIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from runs.domain import stored_form
from runs.domain.writes import EventWrite, UnitOfWork
from runs.store import live
from runs.store.json_text import compact as _j


def _ts(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def can_batch(work: UnitOfWork) -> bool:
    """CTEs do not see each other's rows: a unit that updates a row it also
    inserts is written statement by statement instead."""
    inserted = {i.id for i in work.invocation_inserts}
    if work.approval_invalidations or any(u.id in inserted for u in work.invocation_updates):
        return False  # an invalidation is rare: statement by statement
    started = {m.id for m in work.model_call_inserts}
    return not any(f.id in started for f in work.model_call_finishes)


# The statement `unit_statement` builds, one CTE per kind of row the unit
# carries (absent kinds are left out), each reading the fenced run row so that
# a fence that matches nothing writes nothing:
#
#   WITH fenced_run              UPDATE runs ... WHERE <fence> RETURNING id      (always)
#        finished_model_calls_N  UPDATE model_calls FROM fenced_run, <json row>  (model_call_finishes, one each)
#        started_model_calls     INSERT INTO model_calls SELECT ... FROM fenced_run (model_call_inserts)
#        new_invocations         INSERT INTO tool_invocations ...                (invocation_inserts)
#        changed_invocations_N   UPDATE tool_invocations FROM fenced_run, ...    (invocation_updates, one each)
#        new_approvals           INSERT INTO approvals ...                       (approval_inserts)
#        session_counter         UPDATE sessions SET event_seq += n, if fenced_run (events)
#        appended_events         INSERT INTO events ... FROM session_counter     (events)
#        new_checkpoint          INSERT INTO checkpoints ... FROM fenced_run     (checkpoint; its stored form
#                                may name the unit's events: events_from reads session_counter)
#   SELECT <rows fenced_run matched>, <the events' sequences, ascending>
#
# Inserted rows travel as one JSON array per CTE, unpacked by
# jsonb_to_recordset into a record named `given` whose fields are the target
# columns' names; an updated row as one JSON object through jsonb_to_record
# (`_BY_KEY`).


Cte = tuple[str, list[Any]]


@dataclass(frozen=True)
class Prior:
    """The unit sent just before this one and not answered yet: its events
    (which this unit's checkpoint may name by ordinal) and the version of
    the checkpoint it writes (whose `events_from` locates them)."""

    events: list[EventWrite]
    checkpoint_version: int


def unit_statement(
    work: UnitOfWork,
    *,
    run_id: UUID,
    tenant_id: UUID,
    session_id: UUID,
    owner: str,
    epoch: int,
    code_version: str,
    checkpoint_id: UUID | None,
    fence: tuple[str, list[Any]],
    read_floor: bool = False,
    prior: Prior | None = None,
) -> tuple[str, list[Any]]:
    """The statement and its parameters; it returns (fence rows, sequences,
    the tenant's policy floor or NULL). `fence` is the fenced UPDATE of the
    run row and its parameters (`runs.store.fence.fence_statement`, shared
    with the statement-by-statement path). `owner` is part of `fence`; it is
    named here for the caller's sake. With `read_floor` the statement also
    reads the tenant's policy floor, in the same transaction: the floor a step
    is decided under comes with the commit that starts its model request,
    not from a transaction of its own. `prior`: the unit sent just before
    this one on the same connection and not answered yet, whose events the
    checkpoint may name (`_new_checkpoint`)."""
    fence_sql, fence_params = fence
    ctes: list[Cte] = [("fenced_run AS (" + fence_sql + " RETURNING id)", list(fence_params))]
    if work.model_call_finishes:
        ctes += _finished_model_calls(work)
    if work.model_call_inserts:
        ctes.append(_started_model_calls(work, tenant_id=tenant_id, epoch=epoch))
    if work.invocation_inserts:
        ctes.append(_new_invocations(work, tenant_id=tenant_id, epoch=epoch))
    if work.invocation_updates:
        ctes += _changed_invocations(work, epoch=epoch)
    if work.approval_inserts:
        ctes.append(_new_approvals(work, tenant_id=tenant_id))
    if work.events:
        ctes += _appended_events(work, run_id=run_id, tenant_id=tenant_id, session_id=session_id, epoch=epoch)
    if work.checkpoint is not None:
        ctes.append(
            _new_checkpoint(
                work,
                checkpoint_id=checkpoint_id,
                tenant_id=tenant_id,
                epoch=epoch,
                code_version=code_version,
                prior=prior,
            )
        )
    if work.events:
        tail = (
            "SELECT (SELECT count(*) FROM fenced_run),"
            " (SELECT array_agg(sequence ORDER BY sequence) FROM appended_events)"
        )
    else:
        tail = "SELECT (SELECT count(*) FROM fenced_run), NULL::bigint[]"
    params: list[Any] = []
    for _, cte_params in ctes:
        params += cte_params
    if read_floor:
        tail += ", (SELECT policy_floor FROM tenants WHERE id = %s)"
        params.append(tenant_id)
    else:
        tail += ", NULL::jsonb"
    return "WITH " + ",\n".join(sql for sql, _ in ctes) + "\n" + tail, params


# An UPDATE of a row the unit names (a model call finished, a tool call's
# outcome) is one CTE per row, reading that row's values through
# `jsonb_to_record`, which the planner knows returns one row: the target is
# found by primary key. The run is checked with `IS NOT DISTINCT FROM`, which
# no index serves: with `=` (and an array of rows through
# `jsonb_to_recordset`, estimated at 100 rows) the planner walked the run's
# (run_id, ...) unique index and read every row the run had written so far,
# so a step's cost grew with the run's length.
_BY_KEY = "WHERE {alias}.id = given.id AND {alias}.run_id IS NOT DISTINCT FROM fenced_run.id RETURNING 1)"


def _finished_model_calls(work: UnitOfWork) -> list[Cte]:
    sql = (
        "finished_model_calls_{n} AS (UPDATE model_calls AS model_call SET status = given.status, usage = given.usage,"
        " stop_reason = given.stop_reason, stream_had_output = given.stream_had_output, error = given.error,"
        " prefix_sha256 = given.prefix_sha256, finished_at = given.finished_at"
        " FROM fenced_run, jsonb_to_record(%s::jsonb) AS given(id uuid, status text, usage jsonb,"
        " stop_reason text, stream_had_output boolean, error jsonb, prefix_sha256 text, finished_at timestamptz) "
        + _BY_KEY.format(alias="model_call")
    )
    return [
        (
            sql.format(n=n),
            [
                _j(
                    {
                        "id": str(m.id),
                        "status": m.status,
                        "usage": m.usage,
                        "stop_reason": m.stop_reason,
                        "stream_had_output": m.stream_had_output,
                        "error": m.error,
                        "prefix_sha256": m.prefix_sha256,
                        "finished_at": _ts(m.finished_at),
                    }
                )
            ],
        )
        for n, m in enumerate(work.model_call_finishes)
    ]


def _started_model_calls(work: UnitOfWork, *, tenant_id: UUID, epoch: int) -> Cte:
    sql = (
        "started_model_calls AS (INSERT INTO model_calls (id, tenant_id, run_id, step_number, attempt_number, status,"
        " usage, stream_had_output, lease_epoch, started_at)"
        " SELECT given.id, %s, fenced_run.id, given.step_number, given.attempt_number, 'started', '{}'::jsonb, false,"
        " %s, given.started_at"
        " FROM fenced_run, jsonb_to_recordset(%s::jsonb)"
        " AS given(id uuid, step_number int, attempt_number int, started_at timestamptz) RETURNING 1)"
    )
    rows = [
        {
            "id": str(m.id),
            "step_number": m.step_number,
            "attempt_number": m.attempt_number,
            "started_at": _ts(m.started_at),
        }
        for m in work.model_call_inserts
    ]
    return sql, [tenant_id, epoch, _j(rows)]


def _new_invocations(work: UnitOfWork, *, tenant_id: UUID, epoch: int) -> Cte:
    sql = (
        "new_invocations AS (INSERT INTO tool_invocations (id, tenant_id, run_id, step_number, call_index, call_id,"
        " tool_name, arguments, raw_arguments, idempotency_key, status, read_only, side_effect, attempt, result, error,"
        " suspended_kind, lease_epoch, created_at, updated_at, outcome)"
        " SELECT given.id, %s, fenced_run.id, given.step_number, given.call_index, given.call_id, given.tool_name,"
        " given.arguments, given.raw_arguments, given.idempotency_key, given.status, given.read_only,"
        " given.side_effect, 0, given.result, given.error, given.suspended_kind, %s, given.created_at,"
        " given.created_at, given.outcome"
        " FROM fenced_run, jsonb_to_recordset(%s::jsonb) AS given(id uuid, step_number int, call_index int,"
        " call_id text, tool_name text, arguments jsonb, raw_arguments text, idempotency_key text, status text,"
        " read_only boolean, side_effect text, result jsonb, error jsonb, suspended_kind text,"
        " created_at timestamptz, outcome text) RETURNING 1)"
    )
    rows = [
        {
            "id": str(i.id),
            "step_number": i.step_number,
            "call_index": i.call_index,
            "call_id": i.call_id,
            "tool_name": i.tool_name,
            "arguments": i.arguments,
            "raw_arguments": i.raw_arguments,
            "idempotency_key": i.idempotency_key,
            "status": i.status,
            "read_only": i.read_only,
            "side_effect": i.side_effect,
            "result": i.result,
            "error": i.error,
            "suspended_kind": i.suspended_kind,
            "created_at": _ts(i.created_at),
            "outcome": i.outcome,
        }
        for i in work.invocation_inserts
    ]
    return sql, [tenant_id, epoch, _j(rows)]


def _changed_invocations(work: UnitOfWork, *, epoch: int) -> list[Cte]:
    """Each update carries only the columns it changes: a `has_<column>` flag
    says whether a NULL means "leave it" or "set NULL" (result, error,
    suspended kind, attempts); attempt and outcome are never set to NULL."""
    sql = (
        "changed_invocations_{n} AS (UPDATE tool_invocations AS invocation"
        " SET status = given.status, updated_at = given.updated_at, lease_epoch = %s,"
        " result = CASE WHEN given.has_result THEN given.result ELSE invocation.result END,"
        " error = CASE WHEN given.has_error THEN given.error ELSE invocation.error END,"
        " attempt = COALESCE(given.attempt, invocation.attempt),"
        " suspended_kind = CASE WHEN given.has_suspended_kind THEN given.suspended_kind"
        " ELSE invocation.suspended_kind END,"
        " outcome = COALESCE(given.outcome, invocation.outcome),"
        " attempts = CASE WHEN given.has_attempts THEN given.attempts ELSE invocation.attempts END"
        " FROM fenced_run, jsonb_to_record(%s::jsonb) AS given(id uuid, status text, updated_at timestamptz,"
        " has_result boolean, result jsonb, has_error boolean, error jsonb, attempt int, has_suspended_kind boolean,"
        " suspended_kind text, outcome text, has_attempts boolean, attempts jsonb) "
        + _BY_KEY.format(alias="invocation")
    )
    return [
        (
            sql.format(n=n),
            [
                epoch,
                _j(
                    {
                        "id": str(u.id),
                        "status": u.status,
                        "updated_at": _ts(u.updated_at),
                        "has_result": u.result is not None,
                        "result": u.result,
                        "has_error": u.error is not None or u.clear_error,
                        "error": u.error,
                        "attempt": u.attempt,
                        "has_suspended_kind": u.suspended_kind is not None,
                        "suspended_kind": u.suspended_kind,
                        "outcome": u.outcome,
                        "has_attempts": u.attempts is not None,
                        "attempts": u.attempts,
                    }
                ),
            ],
        )
        for n, u in enumerate(work.invocation_updates)
    ]


def _new_approvals(work: UnitOfWork, *, tenant_id: UUID) -> Cte:
    sql = (
        "new_approvals AS (INSERT INTO approvals (id, tenant_id, run_id, invocation_id, kind, request_hash, capability,"
        " presentation, status, reason, expires_at, created_at)"
        " SELECT given.id, %s, fenced_run.id, given.invocation_id, given.kind, given.request_hash, given.capability,"
        " given.presentation, 'pending', '', given.expires_at, given.created_at"
        " FROM fenced_run, jsonb_to_recordset(%s::jsonb) AS given(id uuid, invocation_id uuid, kind text,"
        " request_hash text, capability jsonb, presentation jsonb, expires_at timestamptz, created_at timestamptz)"
        " RETURNING 1)"
    )
    rows = [
        {
            "id": str(a.id),
            "invocation_id": str(a.invocation_id) if a.invocation_id else None,
            "kind": a.kind,
            "request_hash": a.request_hash,
            "capability": a.capability,
            "presentation": a.presentation,
            "expires_at": _ts(a.expires_at),
            "created_at": _ts(a.created_at),
        }
        for a in work.approval_inserts
    ]
    return sql, [tenant_id, _j(rows)]


def _new_checkpoint(
    work: UnitOfWork,
    *,
    checkpoint_id: UUID | None,
    tenant_id: UUID,
    epoch: int,
    code_version: str,
    prior: Prior | None = None,
) -> Cte:
    """The row in its stored form (runs.domain.stored_form). When its unit
    has events, `events_from` — the sequence before the unit's first event,
    which its `{"u": ...}` references count from — comes from the session
    counter this statement moved (written whether or not this row names them:
    the unit after this one may, through `prior_from`). When
    it names events of the unit before (`prior`, in flight when this one was
    built: a full row of commit 2), `prior_from` is that unit's own
    `events_from`, read from the checkpoint row it wrote: PostgreSQL runs
    this statement after that unit committed (the fence requires it)."""
    checkpoint = work.checkpoint
    assert checkpoint is not None
    state = stored_form.encode(checkpoint, work.events, prior.events if prior is not None else None)
    value = "%s::jsonb"
    params: list[Any] = [_j(state)]
    if work.events:
        value = "%s::jsonb || jsonb_build_object('events_from', (SELECT event_seq FROM session_counter) - %s)"
        params.append(len(work.events))
    if prior is not None and stored_form.names_prior(state):
        value += (
            " || jsonb_build_object('prior_from', (SELECT (prior.state ->> 'events_from')::bigint"
            " FROM checkpoints AS prior WHERE prior.run_id = fenced_run.id AND prior.version = %s))"
        )
        params.append(prior.checkpoint_version)
    sql = (
        'new_checkpoint AS (INSERT INTO checkpoints (id, tenant_id, run_id, version, "full", base_version, "trigger",'
        f" state, code_version, lease_epoch, created_at)"
        f" SELECT %s, %s, fenced_run.id, %s, %s, %s, %s, {value}, %s, %s, %s FROM fenced_run RETURNING 1)"
    )
    return sql, [
        checkpoint_id,
        tenant_id,
        checkpoint.version,
        checkpoint.full,
        checkpoint.base_version,
        checkpoint.trigger,
        *params,
        code_version,
        epoch,
        checkpoint.created_at,
    ]


def _appended_events(work: UnitOfWork, *, run_id: UUID, tenant_id: UUID, session_id: UUID, epoch: int) -> list[Cte]:
    """The session counter moves by the number of events (only when the fence
    matched), and the events take the sequences it hands out, in order."""
    count = len(work.events)
    wake, wake_params = live.returning(run_id, tenant_id)  # the live pages' NOTIFY, if the counter moved
    counter = (
        "session_counter AS (UPDATE sessions SET event_seq = event_seq + %s"
        " WHERE id = %s AND EXISTS (SELECT 1 FROM fenced_run) RETURNING event_seq" + wake + ")"
    )
    events = (
        "appended_events AS (INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch,"
        " occurred_at)"
        " SELECT %s, %s, session_counter.event_seq - %s + given.ordinal, %s, given.type, given.payload, %s,"
        " given.occurred_at"
        " FROM session_counter, jsonb_to_recordset(%s::jsonb)"
        " AS given(ordinal int, type text, payload jsonb, occurred_at timestamptz) RETURNING sequence)"
    )
    rows = [
        {"ordinal": i, "type": e.type, "payload": e.payload, "occurred_at": _ts(e.occurred_at)}
        for i, e in enumerate(work.events, start=1)
    ]
    return [
        (counter, [count, session_id, *wake_params]),
        (events, [tenant_id, session_id, count, run_id, epoch, _j(rows)]),
    ]


def watermark_statement(
    *,
    run_id: UUID,
    session_id: UUID,
    tenant_id: UUID,
    owner: str,
    epoch: int,
    invocation_id: UUID,
    attempt: int,
    at: datetime,
    event_payload: dict[str, Any],
) -> tuple[str, list[Any]]:
    """The watermark, alone: the fence, `effect_sent_at`, `tool.call.started`."""
    wake, wake_params = live.returning(run_id, tenant_id)  # the live pages' NOTIFY, if the counter moved
    sql = (
        "WITH fenced_run AS (UPDATE runs SET updated_at = %s WHERE id = %s AND lease_owner = %s AND lease_epoch = %s"
        " AND (status || '') = 'RUNNING' RETURNING id),"
        " watermarked AS (UPDATE tool_invocations AS invocation SET effect_sent_at = %s, status = 'executing',"
        " attempt = %s, updated_at = %s, lease_epoch = %s"
        " FROM fenced_run WHERE invocation.id = %s AND invocation.run_id IS NOT DISTINCT FROM fenced_run.id"
        " RETURNING 1),"
        " session_counter AS (UPDATE sessions SET event_seq = event_seq + 1"
        " WHERE id = %s AND EXISTS (SELECT 1 FROM watermarked) RETURNING event_seq" + wake + "),"
        " appended_events AS (INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch,"
        " occurred_at)"
        " SELECT %s, %s, session_counter.event_seq, %s, 'tool.call.started', %s::jsonb, %s, %s"
        " FROM session_counter RETURNING sequence)"
        " SELECT (SELECT count(*) FROM fenced_run), (SELECT count(*) FROM watermarked)"
    )
    return sql, [
        at,
        run_id,
        owner,
        epoch,
        at,
        attempt,
        at,
        epoch,
        invocation_id,
        session_id,
        *wake_params,
        tenant_id,
        session_id,
        run_id,
        _j(event_payload),
        epoch,
        at,
    ]
