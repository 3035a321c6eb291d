"""One round trip per fenced transaction on PostgreSQL.

A step's unit of work becomes a single statement of data-modifying CTEs:
the fenced UPDATE of the run row is the first CTE (`f`), and every other
write reads from `f`, so when the fence matches no row nothing else is
written either. PostgreSQL runs a single statement as its own transaction,
with every row lock (the run row, the session counter) held to its commit,
so commit order still equals event-sequence order. DESIGN §6 measured the
statements one by one at 5.8 ms a step and batched at 3.9 ms; this goes
further and sends no BEGIN and no COMMIT.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from runs.domain.writes import UnitOfWork


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


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
    fence: tuple[str, list],
) -> tuple[str, list]:
    """The statement and its parameters; it returns (fence rows, sequences).
    `fence` is the run row's SET list and its parameters
    (store.fence_assignments, shared with the statement-by-statement path)."""
    ctes: list[str] = []
    params: list[Any] = []
    sets, fence_params = fence
    ctes.append(
        f"f AS (UPDATE runs SET {sets} WHERE id = %s AND lease_owner = %s AND lease_epoch = %s"
        " AND status = 'RUNNING' RETURNING id)"
    )
    params += fence_params + [run_id, owner, epoch]

    if work.model_call_finishes:
        ctes.append(
            "mcf AS (UPDATE model_calls m SET status = x.status, usage = x.usage, stop_reason = x.stop_reason,"
            " stream_had_output = x.sho, error = x.error, prefix_sha256 = x.prefix, finished_at = x.fin"
            " FROM f, jsonb_to_recordset(%s::jsonb) AS x(id uuid, status text, usage jsonb, stop_reason text, sho boolean,"
            " error jsonb, prefix text, fin timestamptz) WHERE m.id = x.id AND m.run_id = f.id RETURNING 1)"
        )
        params.append(
            _j(
                [
                    {
                        "id": str(m.id),
                        "status": m.status,
                        "usage": m.usage,
                        "stop_reason": m.stop_reason,
                        "sho": m.stream_had_output,
                        "error": m.error,
                        "prefix": m.prefix_sha256,
                        "fin": _ts(m.finished_at),
                    }
                    for m in work.model_call_finishes
                ]
            )
        )
    if work.model_call_inserts:
        ctes.append(
            "mci AS (INSERT INTO model_calls (id, tenant_id, run_id, step_number, attempt_number, status, usage,"
            " stream_had_output, lease_epoch, started_at)"
            " SELECT x.id, %s, f.id, x.step, x.attempt, 'started', '{}'::jsonb, false, %s, x.started"
            " FROM f, jsonb_to_recordset(%s::jsonb) AS x(id uuid, step int, attempt int, started timestamptz) RETURNING 1)"
        )
        params += [
            tenant_id,
            epoch,
            _j(
                [
                    {"id": str(m.id), "step": m.step_number, "attempt": m.attempt_number, "started": _ts(m.started_at)}
                    for m in work.model_call_inserts
                ]
            ),
        ]
    if work.invocation_inserts:
        ctes.append(
            "ii AS (INSERT INTO tool_invocations (id, tenant_id, run_id, step_number, call_index, call_id, tool_name, arguments,"
            " raw_arguments, idempotency_key, status, read_only, side_effect, attempt, result, error, suspended_kind, lease_epoch,"
            " created_at, updated_at, outcome)"
            " SELECT x.id, %s, f.id, x.step, x.idx, x.call_id, x.tool, x.args, x.raw, x.key, x.status, x.ro, x.se, 0, x.result,"
            " x.error, x.sk, %s, x.at, x.at, x.outcome"
            " FROM f, jsonb_to_recordset(%s::jsonb) AS x(id uuid, step int, idx int, call_id text, tool text, args jsonb, raw text,"
            " key text, status text, ro boolean, se text, result jsonb, error jsonb, sk text, at timestamptz, outcome text) RETURNING 1)"
        )
        params += [
            tenant_id,
            epoch,
            _j(
                [
                    {
                        "id": str(i.id),
                        "step": i.step_number,
                        "idx": i.call_index,
                        "call_id": i.call_id,
                        "tool": i.tool_name,
                        "args": i.arguments,
                        "raw": i.raw_arguments,
                        "key": i.idempotency_key,
                        "status": i.status,
                        "ro": i.read_only,
                        "se": i.side_effect,
                        "result": i.result,
                        "error": i.error,
                        "sk": i.suspended_kind,
                        "at": _ts(i.created_at),
                        "outcome": i.outcome,
                    }
                    for i in work.invocation_inserts
                ]
            ),
        ]
    if work.invocation_updates:
        ctes.append(
            "iu AS (UPDATE tool_invocations t SET status = x.status, updated_at = x.at, lease_epoch = %s,"
            " result = CASE WHEN x.has_result THEN x.result ELSE t.result END,"
            " error = CASE WHEN x.has_error THEN x.error ELSE t.error END,"
            " attempt = COALESCE(x.attempt, t.attempt),"
            " suspended_kind = CASE WHEN x.has_sk THEN x.sk ELSE t.suspended_kind END,"
            " outcome = COALESCE(x.outcome, t.outcome),"
            " attempts = CASE WHEN x.has_attempts THEN x.attempts ELSE t.attempts END"
            " FROM f, jsonb_to_recordset(%s::jsonb) AS x(id uuid, status text, at timestamptz, has_result boolean, result jsonb,"
            " has_error boolean, error jsonb, attempt int, has_sk boolean, sk text, outcome text, has_attempts boolean, attempts jsonb)"
            " WHERE t.id = x.id AND t.run_id = f.id RETURNING 1)"
        )
        params += [
            epoch,
            _j(
                [
                    {
                        "id": str(u.id),
                        "status": u.status,
                        "at": _ts(u.updated_at),
                        "has_result": u.result is not None,
                        "result": u.result,
                        "has_error": u.error is not None or u.clear_error,
                        "error": u.error,
                        "attempt": u.attempt,
                        "has_sk": u.suspended_kind is not None,
                        "sk": u.suspended_kind,
                        "outcome": u.outcome,
                        "has_attempts": u.attempts is not None,
                        "attempts": u.attempts,
                    }
                    for u in work.invocation_updates
                ]
            ),
        ]
    if work.approval_inserts:
        ctes.append(
            "ai AS (INSERT INTO approvals (id, tenant_id, run_id, invocation_id, kind, request_hash, capability, presentation,"
            " status, reason, expires_at, created_at)"
            " SELECT x.id, %s, f.id, x.inv, x.kind, x.hash, x.cap, x.pres, 'pending', '', x.exp, x.at"
            " FROM f, jsonb_to_recordset(%s::jsonb) AS x(id uuid, inv uuid, kind text, hash text, cap jsonb, pres jsonb,"
            " exp timestamptz, at timestamptz) RETURNING 1)"
        )
        params += [
            tenant_id,
            _j(
                [
                    {
                        "id": str(a.id),
                        "inv": str(a.invocation_id) if a.invocation_id else None,
                        "kind": a.kind,
                        "hash": a.request_hash,
                        "cap": a.capability,
                        "pres": a.presentation,
                        "exp": _ts(a.expires_at),
                        "at": _ts(a.created_at),
                    }
                    for a in work.approval_inserts
                ]
            ),
        ]
    if work.checkpoint is not None:
        c = work.checkpoint
        ctes.append(
            'cp AS (INSERT INTO checkpoints (id, tenant_id, run_id, version, "full", base_version, "trigger", state, code_version,'
            " lease_epoch, created_at) SELECT %s, %s, f.id, %s, %s, %s, %s, %s::jsonb, %s, %s, %s FROM f RETURNING 1)"
        )
        params += [
            checkpoint_id,
            tenant_id,
            c.version,
            c.full,
            c.base_version,
            c.trigger,
            _j(c.state),
            code_version,
            epoch,
            c.created_at,
        ]
    n = len(work.events)
    if n:
        ctes.append(
            "s AS (UPDATE sessions SET event_seq = event_seq + %s WHERE id = %s AND EXISTS (SELECT 1 FROM f) RETURNING event_seq)"
        )
        params += [n, session_id]
        ctes.append(
            "ev AS (INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
            " SELECT %s, %s, s.event_seq - %s + x.o, %s, x.t, x.p, %s, x.a"
            " FROM s, jsonb_to_recordset(%s::jsonb) AS x(o int, t text, p jsonb, a timestamptz) RETURNING sequence)"
        )
        params += [
            tenant_id,
            session_id,
            n,
            run_id,
            epoch,
            _j(
                [
                    {"o": i, "t": e.type, "p": e.payload, "a": _ts(e.occurred_at)}
                    for i, e in enumerate(work.events, start=1)
                ]
            ),
        ]
        tail = "SELECT (SELECT count(*) FROM f), (SELECT array_agg(sequence ORDER BY sequence) FROM ev)"
    else:
        tail = "SELECT (SELECT count(*) FROM f), NULL::bigint[]"
    return "WITH " + ",\n".join(ctes) + "\n" + tail, params


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
    event_payload: dict,
) -> tuple[str, list]:
    """The watermark, alone: the fence, `effect_sent_at`, `tool.call.started`."""
    sql = (
        "WITH f AS (UPDATE runs SET updated_at = %s WHERE id = %s AND lease_owner = %s AND lease_epoch = %s"
        " AND status = 'RUNNING' RETURNING id),"
        " u AS (UPDATE tool_invocations t SET effect_sent_at = %s, status = 'executing', attempt = %s, updated_at = %s, lease_epoch = %s"
        " FROM f WHERE t.id = %s AND t.run_id = f.id RETURNING 1),"
        " s AS (UPDATE sessions SET event_seq = event_seq + 1 WHERE id = %s AND EXISTS (SELECT 1 FROM u) RETURNING event_seq),"
        " ev AS (INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
        " SELECT %s, %s, s.event_seq, %s, 'tool.call.started', %s::jsonb, %s, %s FROM s RETURNING sequence)"
        " SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM u)"
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
        tenant_id,
        session_id,
        run_id,
        _j(event_payload),
        epoch,
        at,
    ]
