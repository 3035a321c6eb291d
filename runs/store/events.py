"""The event log: appending a session's events (sequences from its counter, in the caller's
transaction), the hooks' and webhooks' deliveries written with them (`EnqueueDeliveries`), and
the live pages' wake-up once they commit (`Wake`): intents, run by their handlers (runs.store.intents)."""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from runs.domain.writes import EnqueueDeliveries, EventWrite, UnitOfWork, Wake
from runs.store import intents, live
from runs.store.cursor import Cursor, is_pg, sql_dt, sql_json, sql_uuid


def _notify(run_id: UUID | None, tenant_id: UUID) -> None:
    """Wake live sockets after commit (a hint only: consumers read the table);
    its handler hands it to a thread, never on the step's path."""
    intents.run(None, Wake(run_id, tenant_id))


def append_events(
    cursor: Cursor, *, tenant_id: UUID, session_id: UUID, run_id: UUID | None, epoch: int, events: Iterable[EventWrite]
) -> list[int]:
    """Append events with sequences from the session counter, inside the
    caller's transaction: the counter row lock is held to commit, so commit
    order equals sequence order. Return the sequences."""
    events = list(events)
    if not events:
        return []
    if settings.AGENTRT_NOTIFY_LIVE:
        transaction.on_commit(lambda: _notify(run_id, tenant_id))
    n = len(events)
    if is_pg():
        rows = [
            {"o": i, "t": e.type, "p": e.payload, "a": e.occurred_at.isoformat()} for i, e in enumerate(events, start=1)
        ]
        wake, wake_params = live.returning(run_id, tenant_id)  # the live pages' NOTIFY, delivered at commit
        cursor.execute(
            """
            WITH s AS (
                UPDATE sessions SET event_seq = event_seq + %s WHERE id = %s RETURNING event_seq"""
            + wake
            + """
            )
            INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)
            SELECT %s, %s, s.event_seq - %s + x.o, %s, x.t, x.p, %s, x.a
            FROM s, jsonb_to_recordset(%s::jsonb) AS x(o int, t text, p jsonb, a timestamptz)
            RETURNING sequence
            """,
            [n, session_id, *wake_params, tenant_id, session_id, n, run_id, epoch, sql_json(rows)],
        )
        seqs = sorted(r[0] for r in cursor.fetchall())
        _deliveries(cursor, tenant_id, run_id, events, seqs)
        return seqs
    cursor.execute(
        "UPDATE sessions SET event_seq = event_seq + %s WHERE id = %s RETURNING event_seq",
        [n, sql_uuid(session_id)],
    )
    last = cursor.fetchone()[0]
    first = last - n + 1
    cursor.executemany(
        "INSERT INTO events (tenant_id, session_id, sequence, run_id, type, payload, lease_epoch, occurred_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        [
            (
                sql_uuid(tenant_id),
                sql_uuid(session_id),
                first + i,
                sql_uuid(run_id),
                e.type,
                sql_json(e.payload),
                epoch,
                sql_dt(e.occurred_at),
            )
            for i, e in enumerate(events)
        ],
    )
    seqs = list(range(first, last + 1))
    _deliveries(cursor, tenant_id, run_id, events, seqs)
    return seqs


def _deliveries(
    cursor: Cursor, tenant_id: UUID, run_id: UUID | None, events: list[EventWrite], seqs: list[int]
) -> None:
    """Hooks and webhooks for these events, written in their transaction."""
    if intents.announces(events):
        intents.run(cursor, EnqueueDeliveries(tenant_id, run_id, tuple(events), tuple(seqs)))


def _committed(work: UnitOfWork, seqs: list[int]) -> None:
    """Give each event of a committed unit its sequence (in order: the unit's
    events take consecutive sequences), so later checkpoints can name it."""
    for event, seq in zip(work.events, seqs, strict=False):
        event.sequence = seq


def record_events(
    *, tenant_id: UUID, session_id: UUID, run_id: UUID | None, epoch: int, events: Iterable[EventWrite]
) -> list[int]:
    """`append_events` on the connection's own cursor, for the ORM writes of
    the cold paths (cancel, input, decisions, expiry): call it inside their
    `transaction.atomic()` so the events commit with the rows."""
    with connection.cursor() as cursor:
        return append_events(
            cursor, tenant_id=tenant_id, session_id=session_id, run_id=run_id, epoch=epoch, events=events
        )


def append_event_unfenced(
    *, tenant_id: UUID, session_id: UUID, run_id: UUID | None, epoch: int, event: EventWrite
) -> int:
    """Append one event outside any fence: `run.fenced` is guarded by the
    session sequence, not by the lease."""
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            return append_events(
                cursor, tenant_id=tenant_id, session_id=session_id, run_id=run_id, epoch=epoch, events=[event]
            )[0]
