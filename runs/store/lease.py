"""The lease's statements: claim a QUEUED run, renew the lease (heartbeat),
take over a RUNNING run whose lease expired, and read the database clock.

Lease expiry is database time on PostgreSQL (`now() + lease`); SQLite, on
the same machine, uses the host's clock. Each statement is guarded on the
run's status (and, for a take-over, the epoch that was read and an expired
lease), so two workers racing for a run cannot both win. The lease is
released only by finalize's `Transition` (runs/store/fence.py).

Fair workers: with a share (settings.AGENTRT_TENANT_MAX_RUNNING), a claim
also requires that the run's tenant holds fewer than `share` RUNNING runs;
a run over its tenant's share stays QUEUED, and `next_for_tenant` finds it
when a run of that tenant releases its lease. On PostgreSQL a count alone
is not enough: under READ COMMITTED a statement counts in the snapshot it
started with, so two claims of one tenant would each count before the
other commits. So a claim first takes a transaction-scoped advisory lock on
its tenant (held to its commit), and counts in a snapshot taken once the
lock is held, which sees every claim of that tenant that committed before:
the claim by id calls `agentrt_tenant_leases(tenant)` in its guard, a
VOLATILE function (ops/migrations/0007) that takes the lock and then counts
(each query of a VOLATILE function takes a snapshot of its own), so the
claim stays one prepared statement, its round trips those of a claim
without a share; claim-next and a release's look do the same. The two-key
lock (SHARE_LOCK, the tenant's hash) has a key space of its own, apart from
the sweeps' one-key locks (runs/store/locks.py). SQLite runs one write
transaction at a time (BEGIN IMMEDIATE), so its count is already alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from runs.clock import CLOCK
from runs.domain.writes import EventWrite
from runs.store.cursor import is_pg, sql_dt, sql_json, sql_uuid, statement_cursor
from runs.store.events import append_events


@dataclass(frozen=True)
class Leased:
    """A run row the statement leased: who it belongs to and the new epoch."""

    run_id: UUID
    tenant_id: UUID
    session_id: UUID
    epoch: int


@dataclass(frozen=True)
class Beat:
    """A heartbeat's answer: None from `renew` when the lease is not ours."""

    cancel_requested: bool
    deadline_passed: bool


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


# The tenant lock's first key: crc32("agentrt.tenant_share") & 0x7fffffff; the second is the tenant's hash
# (ops/migrations/0007 writes the same number into agentrt_tenant_leases).
SHARE_LOCK = 1096884023

# A claim's share check: the run's tenant holds fewer than %s RUNNING runs (read from runs_active_tenant_idx),
# counted in the statement's snapshot: on PostgreSQL only once the tenant's lock is held (claim-next), or ...
_UNDER_SHARE = (
    " AND (SELECT count(*) FROM runs held WHERE held.tenant_id = runs.tenant_id AND held.status = 'RUNNING') < %s"
)
# ... by agentrt_tenant_leases, which takes the lock and then counts in a snapshot of its own (the claim by id).
_UNDER_SHARE_LOCKED = " AND agentrt_tenant_leases(runs.tenant_id) < %s"
# The tenants that hold their share (%s): claim-next passes over their runs.
_FULL_TENANTS = "SELECT tenant_id FROM runs WHERE status = 'RUNNING' GROUP BY tenant_id HAVING count(*) >= %s"


def _claim_queued_sql(shared: bool = False) -> str:
    if is_pg():
        return (
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1, updated_at = now()"
            " WHERE id = %s AND (status || '') = 'QUEUED'"
            f"{_UNDER_SHARE_LOCKED if shared else ''}"
            " RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id"
        )
    return (
        "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
        " lease_expires_at = %s, attempts = attempts + 1, updated_at = %s"
        " WHERE id = %s AND (status || '') = 'QUEUED'"
        f"{_UNDER_SHARE if shared else ''}"
        " RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id"
    )


def _claim_next_sql(shared: bool = False) -> str:
    """The next runnable run. With a share on PostgreSQL: the next one of the
    tenant `_next_tenant_sql` chose and locked (its first parameter after the
    lease's), under the share check."""
    if is_pg() and shared:
        return (
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1, updated_at = now()"
            " FROM (SELECT id FROM runs WHERE tenant_id = %s AND status = 'QUEUED'"
            " AND (scheduled_for IS NULL OR scheduled_for <= now())"
            " ORDER BY priority, created_at FOR UPDATE SKIP LOCKED LIMIT 1) AS next_run"
            f" WHERE runs.id = next_run.id{_UNDER_SHARE}"
            " RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id"
        )
    if is_pg():
        return (
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1, updated_at = now()"
            " FROM (SELECT id FROM runs WHERE status = 'QUEUED' AND (scheduled_for IS NULL OR scheduled_for <= now())"
            " ORDER BY priority, created_at FOR UPDATE SKIP LOCKED LIMIT 1) AS next_run"
            " WHERE runs.id = next_run.id"
            " RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id"
        )
    not_full = f" AND tenant_id NOT IN ({_FULL_TENANTS})" if shared else ""
    return (
        "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
        " lease_expires_at = %s, attempts = attempts + 1, updated_at = %s"
        f" WHERE id = (SELECT id FROM runs WHERE status = 'QUEUED'{not_full} ORDER BY priority, created_at LIMIT 1)"
        " AND status = 'QUEUED'"
        " RETURNING runs.id, runs.lease_epoch, runs.tenant_id, runs.session_id"
    )


def _next_tenant_sql() -> str:
    """PostgreSQL: the tenant of the next runnable run, among tenants under their share, locked (before any
    row lock: the claim by id takes the tenant's lock, then its run's row; so does claim-next)."""
    return (
        f"SELECT tenant_id, pg_advisory_xact_lock({SHARE_LOCK}, hashtext(tenant_id::text)) FROM ("
        "SELECT tenant_id FROM runs WHERE status = 'QUEUED' AND (scheduled_for IS NULL OR scheduled_for <= now())"
        f" AND tenant_id NOT IN ({_FULL_TENANTS}) ORDER BY priority, created_at LIMIT 1) AS next_run"
    )


def _claim_params(owner: str, lease_seconds: float) -> list[Any]:
    if is_pg():
        return [owner, lease_seconds]
    now = CLOCK.now()
    return [owner, sql_dt(now + timedelta(seconds=lease_seconds)), sql_dt(now)]


def claim(*, run_id: UUID | None, owner: str, lease_seconds: float, share: int = 0) -> Leased | None:
    """One guarded UPDATE — the QUEUED run `run_id`, or with None the next
    runnable one (FOR UPDATE SKIP LOCKED on PostgreSQL) — and `run.claimed`
    in the same transaction; None when there was no QUEUED run to claim, or
    (`share` > 0) when its tenant already holds `share` RUNNING runs: the run
    stays QUEUED."""
    shared = share > 0
    lease_params = _claim_params(owner, lease_seconds)
    with transaction.atomic(durable=True):
        with statement_cursor() as cursor:  # prepared once per connection: no planning per claim
            if not shared:
                if run_id is not None:
                    cursor.execute(_claim_queued_sql(), [*lease_params, sql_uuid(run_id)])
                else:
                    cursor.execute(_claim_next_sql(), lease_params)
            elif run_id is not None:
                cursor.execute(_claim_queued_sql(True), [*lease_params, sql_uuid(run_id), share])
            elif not is_pg():
                cursor.execute(_claim_next_sql(True), [*lease_params, share])
            else:
                cursor.execute(_next_tenant_sql(), [share])
                tenant = cursor.fetchone()
                if tenant is None:
                    return None
                cursor.execute(_claim_next_sql(True), [*lease_params, tenant[0], share])
            row = cursor.fetchone()
            if row is None:
                return None
            leased = Leased(run_id=_uuid(row[0]), epoch=row[1], tenant_id=_uuid(row[2]), session_id=_uuid(row[3]))
            append_events(
                cursor,
                tenant_id=leased.tenant_id,
                session_id=leased.session_id,
                run_id=leased.run_id,
                epoch=leased.epoch,
                events=[EventWrite("run.claimed", {"lease_owner": owner, "lease_epoch": leased.epoch}, CLOCK.now())],
            )
    return leased


def next_for_tenant(*, tenant_id: UUID, released: UUID, share: int) -> UUID | None:
    """After a run of `tenant_id` released its lease (committed): the
    tenant's oldest QUEUED run but `released`, when the tenant holds fewer
    than `share` RUNNING runs now; else None.

    On PostgreSQL the count is agentrt_tenant_leases's, once, before the scan
    (an InitPlan): it waits for the tenant's lock (autocommit: let go with
    the statement), so every claim of the tenant that was between its count
    and its commit has committed before this count; a claim that left a run
    queued because the released run still counted is seen here, and its run
    found (it was QUEUED before the statement began).

    Read from runs_active_tenant_idx alone (tenant, status, and the id it
    includes): run ids are time-ordered (UUIDv7), and the order is the id's
    text so that no index's order can lead the planner to walk the whole
    queue, or the tenant's history, for the first match. What it reads is
    the tenant's queued runs, never more than its active-run quota."""
    tenant = sql_uuid(tenant_id)
    with statement_cursor() as cursor:
        if is_pg():
            cursor.execute(
                "SELECT id FROM runs WHERE tenant_id = %s AND status = 'QUEUED' AND id <> %s"
                " AND (SELECT agentrt_tenant_leases(%s)) < %s ORDER BY id::text LIMIT 1",
                [tenant, released, tenant, share],
            )
        else:
            cursor.execute(
                "SELECT id FROM runs WHERE tenant_id = %s AND status = 'QUEUED' AND id <> %s"
                " AND (SELECT count(*) FROM runs held WHERE held.tenant_id = %s AND held.status = 'RUNNING') < %s"
                " ORDER BY id LIMIT 1",
                [tenant, sql_uuid(released), tenant, share],
            )
        row = cursor.fetchone()
    return _uuid(row[0]) if row else None


def renew(*, run_id: UUID, owner: str, epoch: int, lease_seconds: float) -> Beat | None:
    """Extend our lease; None when it is no longer ours. The same statement
    reports a cancel request and a passed deadline."""
    if is_pg():
        sql = (
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s)"
            " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND (status || '') = 'RUNNING'"
            " RETURNING cancel_requested_at IS NOT NULL, deadline_at IS NOT NULL AND deadline_at <= now()"
        )
        params: list[Any] = [lease_seconds, run_id, owner, epoch]
    else:
        now = CLOCK.now()
        sql = (
            "UPDATE runs SET lease_expires_at = %s"
            " WHERE id = %s AND lease_owner = %s AND lease_epoch = %s AND (status || '') = 'RUNNING'"
            " RETURNING cancel_requested_at IS NOT NULL, deadline_at IS NOT NULL AND deadline_at <= %s"
        )
        params = [sql_dt(now + timedelta(seconds=lease_seconds)), run_id.hex, owner, epoch, sql_dt(now)]
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        return None
    return Beat(cancel_requested=bool(row[0]), deadline_passed=bool(row[1]))


def db_now() -> datetime:
    """The database's clock (PostgreSQL) or the host's (SQLite, same machine)."""
    if is_pg():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            now: datetime = cursor.fetchone()[0]
            return now
    return CLOCK.now()


# -- take-over -----------------------------------------------------------------------


@dataclass(frozen=True)
class InterruptedCall:
    invocation: UUID
    step: int
    call_id: str
    tool: str


@dataclass(frozen=True)
class TakenOver:
    """What one take-over transaction changed: the new lease, the owner it
    replaced, and the in-flight rows it marked interrupted."""

    leased: Leased
    previous_owner: str | None
    lease_expirations: int
    model_calls: list[tuple[int, int]] = field(default_factory=list)  # (step, attempt)
    reads: list[InterruptedCall] = field(default_factory=list)  # read-only calls: interrupted, may run again
    effects: list[InterruptedCall] = field(default_factory=list)  # side effects: outcome unknown


def _take_over_sql(dead_owner: bool = False) -> str:
    if is_pg():
        # A dead owner's run (its process's session gone: runs/runtime/liveness.py) is taken before its lease
        # expires, still guarded by the epoch and by that very owner.
        expired = "lease_expires_at IS NULL OR lease_expires_at < now()" + (
            " OR lease_owner = %s" if dead_owner else ""
        )
        return (
            "UPDATE runs SET lease_owner = %s, lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + make_interval(secs => %s),"
            " attempts = attempts + 1, lease_expirations = lease_expirations + 1, updated_at = now()"
            " WHERE id = %s AND (status || '') = 'RUNNING' AND lease_epoch = %s"
            f" AND ({expired})"
            " RETURNING lease_epoch, tenant_id, session_id, lease_expirations"
        )
    return (
        "UPDATE runs SET lease_owner = %s, lease_epoch = lease_epoch + 1, lease_expires_at = %s,"
        " attempts = attempts + 1, lease_expirations = lease_expirations + 1, updated_at = %s"
        " WHERE id = %s AND (status || '') = 'RUNNING' AND lease_epoch = %s AND (lease_expires_at IS NULL OR"
        " lease_expires_at < %s)"
        " RETURNING lease_epoch, tenant_id, session_id, lease_expirations"
    )


def _take_over_params(
    *, run_id: UUID, owner: str, seen_epoch: int, lease_seconds: float, now: datetime, dead_owner: str | None = None
) -> list[Any]:
    if is_pg():
        return [owner, lease_seconds, run_id, seen_epoch] + ([dead_owner] if dead_owner else [])
    return [owner, sql_dt(now + timedelta(seconds=lease_seconds)), sql_dt(now), run_id.hex, seen_epoch, sql_dt(now)]


def take_over(
    *,
    run_id: UUID,
    owner: str,
    seen_epoch: int,
    lease_seconds: float,
    now: datetime,
    read_observation: dict[str, Any],
    unknown_outcome: dict[str, Any],
    events: Callable[[TakenOver], list[EventWrite]],
    dead_owner: str | None = None,
) -> TakenOver | None:
    """One transaction: a new epoch (guarded by the epoch read, the expired
    lease — or, with `dead_owner`, that owner still holding it — and the
    status); every in-flight model call and read-only call marked
    interrupted (a read-only call gets `read_observation` as its result),
    every executing side effect interrupted with `unknown_outcome`;
    then `events(taken)` appended. None when the guard matched no row."""
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            # The owner only changes with the epoch, which the UPDATE guards.
            cursor.execute(
                "SELECT lease_owner FROM runs WHERE id = %s AND lease_epoch = %s", [sql_uuid(run_id), seen_epoch]
            )
            previous = cursor.fetchone()
            dead = dead_owner if is_pg() else None
            cursor.execute(
                _take_over_sql(dead_owner=dead is not None),
                _take_over_params(
                    run_id=run_id,
                    owner=owner,
                    seen_epoch=seen_epoch,
                    lease_seconds=lease_seconds,
                    now=now,
                    dead_owner=dead,
                ),
            )
            got = cursor.fetchone()
            if got is None:
                return None
            epoch, tenant_id, session_id, expirations = got
            leased = Leased(run_id=run_id, tenant_id=_uuid(tenant_id), session_id=_uuid(session_id), epoch=epoch)
            model_calls, reads, effects = _interrupt_in_flight(
                cursor, run_id, epoch, now, read_observation, unknown_outcome
            )
            taken = TakenOver(
                leased=leased,
                previous_owner=previous[0] if previous else None,
                lease_expirations=expirations,
                model_calls=model_calls,
                reads=reads,
                effects=effects,
            )
            append_events(
                cursor,
                tenant_id=leased.tenant_id,
                session_id=leased.session_id,
                run_id=run_id,
                epoch=epoch,
                events=events(taken),
            )
    return taken


def _interrupt_in_flight(
    cursor: Any,
    run_id: UUID,
    epoch: int,
    now: datetime,
    read_observation: dict[str, Any],
    unknown_outcome: dict[str, Any],
) -> tuple[list[tuple[int, int]], list[InterruptedCall], list[InterruptedCall]]:
    """Every in-flight row of the run marked interrupted, in the caller's
    transaction (a take-over's, a retry's): model calls, read-only calls (with
    `read_observation` as their result: they may run again), executing side
    effects (with `unknown_outcome`: someone decides)."""
    cursor.execute(
        "UPDATE model_calls SET status = 'interrupted', finished_at = %s WHERE run_id = %s AND status ="
        " 'started'"
        " RETURNING step_number, attempt_number",
        [sql_dt(now), sql_uuid(run_id)],
    )
    model_calls = [(step, attempt) for step, attempt in cursor.fetchall()]
    cursor.execute(
        "UPDATE tool_invocations SET status = 'interrupted', result = %s, error = %s, updated_at = %s,"
        " lease_epoch = %s"
        " WHERE run_id = %s AND status = 'authorized' AND read_only = %s"
        " RETURNING id, step_number, call_id, tool_name",
        [sql_json(read_observation), sql_json(read_observation), sql_dt(now), epoch, sql_uuid(run_id), True],
    )
    reads = [InterruptedCall(_uuid(inv), step, call_id, tool) for inv, step, call_id, tool in cursor.fetchall()]
    cursor.execute(
        "UPDATE tool_invocations SET status = 'interrupted', error = %s, updated_at = %s, lease_epoch = %s"
        " WHERE run_id = %s AND status = 'executing' RETURNING id, step_number, call_id, tool_name",
        [sql_json(unknown_outcome), sql_dt(now), epoch, sql_uuid(run_id)],
    )
    effects = [InterruptedCall(_uuid(inv), step, call_id, tool) for inv, step, call_id, tool in cursor.fetchall()]
    return model_calls, reads, effects


# -- retry -----------------------------------------------------------------------------


def _reopen_sql() -> str:
    """A FAILED run leased again under a new epoch, its failure cleared (it
    stays in `run.failed` and `run.retried`), a fresh allowance of lost leases,
    no cancel pending. Guarded by the status and no lease held."""
    if is_pg():
        return (
            "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1,"
            " lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1, lease_expirations = 0,"
            " failure = NULL, cancel_requested_at = NULL, updated_at = now()"
            " WHERE id = %s AND (status || '') = 'FAILED' AND lease_owner IS NULL"
            " RETURNING lease_epoch, tenant_id, session_id"
        )
    return (
        "UPDATE runs SET status = 'RUNNING', lease_owner = %s, lease_epoch = lease_epoch + 1, lease_expires_at = %s,"
        " attempts = attempts + 1, lease_expirations = 0, failure = NULL, cancel_requested_at = NULL, updated_at = %s"
        " WHERE id = %s AND (status || '') = 'FAILED' AND lease_owner IS NULL"
        " RETURNING lease_epoch, tenant_id, session_id"
    )


def reopen(
    cursor: Any,
    *,
    run_id: UUID,
    owner: str,
    lease_seconds: float,
    now: datetime,
    read_observation: dict[str, Any],
    unknown_outcome: dict[str, Any],
    events: Callable[[TakenOver], list[EventWrite]],
) -> TakenOver | None:
    """In the caller's transaction (runs.runtime.retry, which has checked the
    run under its lock): the FAILED run leased by `owner` under a new epoch
    (`_reopen_sql`), whatever its failed execution left in flight marked
    interrupted as a take-over marks it, then `events(taken)` appended. None
    when the run was not FAILED (or held a lease)."""
    if is_pg():
        params: list[Any] = [owner, lease_seconds, run_id]
    else:
        params = [owner, sql_dt(now + timedelta(seconds=lease_seconds)), sql_dt(now), run_id.hex]
    cursor.execute(_reopen_sql(), params)
    got = cursor.fetchone()
    if got is None:
        return None
    epoch, tenant_id, session_id = got
    leased = Leased(run_id=run_id, tenant_id=_uuid(tenant_id), session_id=_uuid(session_id), epoch=epoch)
    model_calls, reads, effects = _interrupt_in_flight(cursor, run_id, epoch, now, read_observation, unknown_outcome)
    taken = TakenOver(
        leased=leased,
        previous_owner=None,
        lease_expirations=0,
        model_calls=model_calls,
        reads=reads,
        effects=effects,
    )
    append_events(
        cursor,
        tenant_id=leased.tenant_id,
        session_id=leased.session_id,
        run_id=run_id,
        epoch=epoch,
        events=events(taken),
    )
    return taken
