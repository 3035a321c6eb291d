"""The run queue: claim a QUEUED run under a new lease epoch, and heartbeat.

Lease expiry is database time (`now() + lease` in SQL on PostgreSQL). The
lease is released only by `finalize` (runs/runtime/executor.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from runs.clock import CLOCK
from runs.domain.writes import EventWrite
from runs.store.repository import append_events, is_pg, sql_dt, sql_uuid


@dataclass(frozen=True)
class Claim:
    run_id: UUID
    tenant_id: UUID
    session_id: UUID
    owner: str
    epoch: int


@dataclass(frozen=True)
class Heartbeat:
    alive: bool
    cancel_requested: bool = False
    deadline_passed: bool = False


def _as_uuid(value) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _lease_seconds() -> float:
    return float(settings.AGENTRT_LEASE_SECONDS)


CLAIM_SET = (
    "status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1, "
    "lease_expires_at = {expires}, attempts = attempts + 1, updated_at = {now}"
)


def _claim_sql(where: str, from_: str = "") -> tuple[str, bool]:
    if is_pg():
        sets = CLAIM_SET.format(expires="now() + make_interval(secs => %s)", now="now()")
    else:
        sets = CLAIM_SET.format(expires="%s", now="%s")
    return (
        f"UPDATE runs SET {sets} {from_} WHERE {where} RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id",
        is_pg(),
    )


def _claim_params(owner: str) -> list:
    if is_pg():
        return [owner, _lease_seconds()]
    now = CLOCK.now()
    return [owner, sql_dt(now + timedelta(seconds=_lease_seconds())), sql_dt(now)]


def run_claim(*, run_id: UUID, owner: str) -> Claim | None:
    """One guarded UPDATE on a QUEUED run, and `run.claimed` in the same
    transaction; None when the run was not QUEUED (a duplicate doorbell)."""
    sql, _ = _claim_sql("id = %s AND status = 'QUEUED'")
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(sql, _claim_params(owner) + [sql_uuid(run_id)])
            row = cursor.fetchone()
            if row is None:
                return None
            return _claimed(cursor, row, owner)


def run_claim_next(*, owner: str) -> Claim | None:
    """Claim the next runnable run (FOR UPDATE SKIP LOCKED on PostgreSQL)."""
    if is_pg():
        sql, _ = _claim_sql(
            "runs.id = c.id",
            from_="FROM (SELECT id FROM runs WHERE status = 'QUEUED' AND (scheduled_for IS NULL OR scheduled_for <= now())"
            " ORDER BY priority, created_at FOR UPDATE SKIP LOCKED LIMIT 1) AS c",
        )
        params = _claim_params(owner)
    else:
        sql, _ = _claim_sql(
            "id = (SELECT id FROM runs WHERE status = 'QUEUED' ORDER BY priority, created_at LIMIT 1) AND status = 'QUEUED'"
        )
        params = _claim_params(owner)
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
            if row is None:
                return None
            return _claimed(cursor, row, owner)


def _claimed(cursor, row, owner: str) -> Claim:
    claim = Claim(
        run_id=_as_uuid(row[0]), epoch=row[1], tenant_id=_as_uuid(row[2]), session_id=_as_uuid(row[3]), owner=owner
    )
    append_events(
        cursor,
        tenant_id=claim.tenant_id,
        session_id=claim.session_id,
        run_id=claim.run_id,
        epoch=claim.epoch,
        events=[EventWrite("run.claimed", {"lease_owner": owner, "lease_epoch": claim.epoch}, CLOCK.now())],
    )
    return claim


def run_heartbeat(*, run_id: UUID, owner: str, epoch: int) -> Heartbeat:
    """Extend our lease; `alive` is False when the lease is no longer ours.
    The same query reports a cancel request and a passed deadline."""
    if is_pg():
        sql = (
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s)"
            " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND status = 'RUNNING'"
            " RETURNING cancel_requested_at IS NOT NULL, deadline_at IS NOT NULL AND deadline_at <= now()"
        )
        params = [_lease_seconds(), run_id, owner, epoch]
    else:
        now = CLOCK.now()
        sql = (
            "UPDATE runs SET lease_expires_at = %s"
            " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND status = 'RUNNING'"
            " RETURNING cancel_requested_at IS NOT NULL, deadline_at IS NOT NULL AND deadline_at <= %s"
        )
        params = [sql_dt(now + timedelta(seconds=_lease_seconds())), run_id.hex, owner, epoch, sql_dt(now)]
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        return Heartbeat(alive=False)
    return Heartbeat(alive=True, cancel_requested=bool(row[0]), deadline_passed=bool(row[1]))


def db_now() -> datetime:
    """The database's clock (PostgreSQL) or the host's (SQLite, same machine)."""
    if is_pg():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0]
    return CLOCK.now()
