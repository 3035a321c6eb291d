"""The hot path: a step's fenced transactions as hand-written SQL on Django's
connection. Everything else uses the ORM; the schema is owned by
the models and this module is tested against them.

Every transaction starts with the fenced UPDATE of the run row
(`WHERE id AND lease_owner AND lease_epoch AND status = 'RUNNING'`), which
also locks the row to commit; zero rows means fenced: roll back and raise
`WorkerFenced`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.backends.postgresql.base import ServerBindingCursor
from psycopg import Pipeline
from psycopg.generators import fetch_many
from psycopg.generators import send as send_pending

from runs.domain import stored_form
from runs.domain.errors import PolicyChanged, WorkerFenced
from runs.domain.records import InvocationRecord
from runs.domain.writes import EventWrite, Intent, JoinParent, Transition, UnitOfWork
from runs.models import ToolInvocation
from runs.store import intents
from runs.store.cursor import (
    Cursor,
    _db,
    is_pg,
    jp,
    sql_dt,
    sql_json,
    sql_uuid,
    statement_cursor,
)
from runs.store.events import _committed, _deliveries, _notify, append_event_unfenced, append_events
from runs.store.family import lock_parent
from runs.store.fence import fence_statement
from runs.store.json_text import parsed
from runs.store.pg import Prior, can_batch, unit_statement, watermark_statement

# Besides the unit of work's own names, re-exported until the two modules that still import them from
# here (runs.store.lease, runs.runtime.finalize) import them from runs.store.cursor and runs.store.events.
__all__ = [
    "DjangoRunStore",
    "append_event_unfenced",
    "append_events",
    "is_pg",
    "sql_dt",
    "sql_json",
    "sql_uuid",
    "statement_cursor",
]


class _Fenced(Exception):
    pass


def _first(cursor: Cursor, work: UnitOfWork) -> list[Intent]:
    """Ahead of the fence: a child's end (`JoinParent`) locks its parent's row
    before its own, the family's lock order (runs/store/family.py). Return
    the intents to run last: all of them but the join of a run that has no
    parent."""
    last = []
    for intent in work.intents:
        if isinstance(intent, JoinParent) and lock_parent(cursor, intent.run_id) is None:
            continue  # no parent: nothing to join
        last.append(intent)
    return last


def _last(cursor: Cursor, pending: list[Intent]) -> None:
    """The unit's intents, last in its transaction, in order (runs.store.intents)."""
    for intent in pending:
        intents.run(cursor, intent)


class DjangoRunStore:
    """`RunStore` for one execution of one run under one lease."""

    def __init__(
        self, *, run_id: UUID, tenant_id: UUID, session_id: UUID, owner: str, epoch: int, code_version: str = ""
    ) -> None:
        self.run_id = run_id
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.owner = owner
        self.epoch = epoch
        self.code_version = code_version
        self.commits = 0
        # (step, policy floor) read by the commit that started that step's model
        # request: the floor the step's calls are decided under, without a
        # transaction of its own (runs.runtime.wiring.tenant_floor).
        self.floor_seen: tuple[int, Any] | None = None
        self._in_flight: _InFlight | None = None  # a unit `send` left unanswered

    def settle(self) -> None:
        """Wait for the unit `send` left in flight, if any (every other call
        of the store does this first)."""
        if self._in_flight is not None:
            self._in_flight.wait()

    # -- the fence ---------------------------------------------------------
    def _fence(
        self, cursor: Cursor, work: UnitOfWork | None, at: datetime, transition: Transition | None = None
    ) -> None:
        sql, params = fence_statement(
            work, at, transition, run_id=sql_uuid(self.run_id), owner=self.owner, epoch=self.epoch
        )
        cursor.execute(sql, params)
        if cursor.rowcount != 1:
            raise _Fenced()

    def commit(self, work: UnitOfWork) -> list[int]:
        """Commit `work` in one fenced transaction. `work.transition` is the
        run row's change only `finalize` makes (the terminal writer);
        `work.intents` run last inside the transaction (a doorbell, children
        started, a child's join), and a child's join first locks its parent's
        row, ahead of the fence (the lock order of the join)."""
        at = work.events[0].occurred_at if work.events else None
        starts = work.model_call_inserts[-1].step_number if work.model_call_inserts else None
        transition = work.transition
        if is_pg() and can_batch(work):
            built = self._built_before_settling(work, at or _latest(work), transition, starts)
            return self._commit_one_statement(work, at or _latest(work), transition, starts, built)
        self.settle()
        floor: Any = None
        try:
            with transaction.atomic(durable=True):
                with connection.cursor() as cursor:
                    pending = _first(cursor, work)
                    self._fence(cursor, work, at or _latest(work), transition)
                    self._apply(cursor, work)
                    seqs = append_events(
                        cursor,
                        tenant_id=self.tenant_id,
                        session_id=self.session_id,
                        run_id=self.run_id,
                        epoch=self.epoch,
                        events=work.events,
                    )
                    if work.checkpoint is not None:
                        self._insert_checkpoint(cursor, work, seqs)
                    if starts is not None:
                        cursor.execute("SELECT policy_floor FROM tenants WHERE id = %s", [sql_uuid(self.tenant_id)])
                        row = cursor.fetchone()
                        floor = row[0] if row else None
                    _last(cursor, pending)
        except _Fenced:
            raise WorkerFenced("the fenced update affected zero rows") from None
        self.commits += 1
        _committed(work, seqs)
        self._saw_floor(starts, floor)
        return seqs

    def _saw_floor(self, step: int | None, floor: Any) -> None:
        if step is None:
            return
        self.floor_seen = (step, parsed(floor) or {})

    def _unit_sql(
        self,
        work: UnitOfWork,
        at: datetime,
        transition: Transition | None,
        starts: int | None,
        after: UUID | None = None,
        prior: Prior | None = None,
    ) -> tuple[str, list[Any]]:
        return unit_statement(
            work,
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            session_id=self.session_id,
            owner=self.owner,
            epoch=self.epoch,
            code_version=self.code_version,
            checkpoint_id=_checkpoint_id(self.run_id, work.checkpoint.version) if work.checkpoint is not None else None,
            fence=fence_statement(
                work, at, transition, run_id=self.run_id, owner=self.owner, epoch=self.epoch, after=after
            ),
            read_floor=starts is not None,
            prior=prior,
        )

    def _commit_one_statement(
        self,
        work: UnitOfWork,
        at: datetime,
        transition: Transition | None,
        starts: int | None,
        built: tuple[str, list[Any]] | None = None,
    ) -> list[int]:
        sql, params = built or self._unit_sql(work, at, transition, starts)
        if _alone(work, _db()):
            with statement_cursor() as cursor:  # the statement is its own transaction
                cursor.execute(sql, params)
                fenced_rows, seqs, floor = cursor.fetchone()
            if fenced_rows != 1:
                raise WorkerFenced("the fenced update affected zero rows")
        else:
            try:
                with transaction.atomic(durable=True):
                    with connection.cursor() as cursor:
                        pending = _first(cursor, work)
                        cursor.execute(sql, params)
                        fenced_rows, seqs, floor = cursor.fetchone()
                        if fenced_rows != 1:
                            raise _Fenced()
                        _deliveries(cursor, self.tenant_id, self.run_id, work.events, list(seqs or []))
                        _last(cursor, pending)
            except _Fenced:
                raise WorkerFenced("the fenced update affected zero rows") from None
        return self._record_committed(work, list(seqs or []), floor, starts)

    def _record_committed(self, work: UnitOfWork, seqs: list[int], floor: Any, starts: int | None) -> list[int]:
        if work.events and settings.AGENTRT_NOTIFY_LIVE:
            _notify(self.run_id, self.tenant_id)
        self.commits += 1
        _committed(work, seqs)
        self._saw_floor(starts, floor)
        return seqs

    def send(self, work: UnitOfWork) -> _Sent | _InFlight:
        """`commit(work)`, split at the network: the unit's one statement is
        sent and this returns while PostgreSQL executes and flushes it; the
        caller runs its read-only tools meanwhile and calls `wait()` before
        anything that needs the unit durable (the step's commit 1, then the
        read-only calls: only their results wait for it). The connection is
        the caller's thread's, held (its lock) until `wait()`; a Django query
        on it in between raises instead of waiting on itself.

        Where the unit is not one statement of its own (SQLite, a unit that
        announces to webhooks, an open transaction) or something watches the
        connection's queries (an execute_wrapper, query logging), this is
        `commit(work)` and a settled handle."""
        starts = work.model_call_inserts[-1].step_number if work.model_call_inserts else None
        db = _db()
        if (
            db.vendor != "postgresql"
            or not can_batch(work)
            or not _alone(work, db)
            or any(w is not _busy for w in db.execute_wrappers)  # (_busy: the unit before this one, in flight)
            or db.queries_logged
        ):
            return _Sent(self.commit(work))
        at = work.events[0].occurred_at if work.events else None
        before = self._in_flight
        after = _pipelined_after(before, work)
        if before is not None and after is not None:
            # Sent behind the unit still in flight, before its answer: its
            # fence requires a row that unit inserted (STEP_FENCE_AFTER), and
            # its checkpoint names that unit's events by ordinal (`Prior`).
            prior = None
            if before.work.checkpoint is not None:
                prior = Prior(events=before.work.events, checkpoint_version=before.work.checkpoint.version)
            sql, params = self._unit_sql(work, at or _latest(work), None, starts, after=after, prior=prior)
            unit = _InFlight(self, before.pipe, work, starts, sql, params)
            try:
                before.wait()
            except BaseException:
                # The unit before failed: this one wrote nothing. Read its
                # answer (the connection leaves pipeline mode after it) and
                # raise what the one before raised, as `commit` would have.
                with contextlib.suppress(Exception):
                    unit.wait()
                raise
            self._in_flight = unit
            return unit
        built = self._built_before_settling(work, at or _latest(work), None, starts)
        sql, params = built or self._unit_sql(work, at or _latest(work), None, starts)
        self._in_flight = _InFlight(self, _Pipe(db), work, starts, sql, params)
        return self._in_flight

    def _built_before_settling(
        self, work: UnitOfWork, at: datetime, transition: Transition | None, starts: int | None
    ) -> tuple[str, list[Any]] | None:
        """With a unit still in flight, build this one's statement first and
        then wait for the answer: a delta checkpoint names only this unit's
        events. A full one names the earlier unit's by the sequences the
        answer brings, so it is built after it (None)."""
        if self._in_flight is None:
            return None
        built = None
        if work.checkpoint is None or not work.checkpoint.full:
            built = self._unit_sql(work, at, transition, starts)
        self._in_flight.wait()
        return built

    def invocations_for_step(self, step_number: int) -> list[InvocationRecord]:
        """Read the invocation rows of one step (to re-enter an open batch)."""
        self.settle()

        return [
            InvocationRecord(**row)
            for row in ToolInvocation.objects.filter(run_id=self.run_id, step_number=step_number)
            .order_by("call_index")
            .values(
                "id",
                "call_id",
                "call_index",
                "tool_name",
                "arguments",
                "status",
                "result",
                "effect_sent_at",
                "attempt",
                "read_only",
                "idempotency_key",
                "suspended_kind",
                "attempts",
            )
        ]

    def mark_effect_sent(
        self,
        invocation_id: UUID,
        attempt: int,
        event_payload: dict[str, Any],
        at: datetime,
        *,
        before: UnitOfWork | None = None,
        policy_check: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        """The watermark (the port's docstring). Alone it is one statement; with
        the batch's earlier results (`before`) or a policy re-check it is one
        transaction of several statements — still one commit."""
        self.settle()
        if before is not None and before.is_empty():
            before = None
        if before is not None or policy_check is not None or not (is_pg() and connection.get_autocommit()):
            self._watermark_with(invocation_id, attempt, event_payload, at, before, policy_check)
            return
        sql, params = watermark_statement(
            run_id=self.run_id,
            session_id=self.session_id,
            tenant_id=self.tenant_id,
            owner=self.owner,
            epoch=self.epoch,
            invocation_id=invocation_id,
            attempt=attempt,
            at=at,
            event_payload=event_payload,
        )
        with statement_cursor() as cursor:  # alone, in its own one-statement transaction
            cursor.execute(sql, params)
            fenced_rows, updated = cursor.fetchone()
        if fenced_rows != 1 or updated != 1:
            raise WorkerFenced("the watermark's fenced update affected zero rows")
        if settings.AGENTRT_NOTIFY_LIVE:
            _notify(self.run_id, self.tenant_id)
        self.commits += 1

    def _watermark_with(
        self,
        invocation_id: UUID,
        attempt: int,
        event_payload: dict[str, Any],
        at: datetime,
        before: UnitOfWork | None,
        policy_check: Callable[[dict[str, Any]], str] | None,
    ) -> None:
        """The fence, the policy floor read and judged (FOR SHARE: a floor
        changed concurrently waits for this commit, or is seen), the earlier
        calls' results, then the watermark and `tool.call.started` after their
        events."""
        earlier = before if before is not None else UnitOfWork()
        started = EventWrite("tool.call.started", event_payload, at)
        try:
            with transaction.atomic(durable=True):
                with connection.cursor() as cursor:
                    self._fence(cursor, earlier, at)
                    if policy_check is not None:
                        cursor.execute(
                            "SELECT policy_floor FROM tenants WHERE id = %s" + (" FOR SHARE" if is_pg() else ""),
                            [sql_uuid(self.tenant_id)],
                        )
                        row = cursor.fetchone()
                        decision = policy_check(parsed(row[0]) if row else {})
                        if decision not in ("allow", "require_approval"):
                            raise PolicyChanged(decision)
                    self._apply(cursor, earlier)
                    cursor.execute(
                        "UPDATE tool_invocations SET effect_sent_at = %s, status = 'executing', attempt = %s,"
                        " updated_at = %s, lease_epoch = %s"
                        " WHERE id = %s AND run_id = %s",
                        [sql_dt(at), attempt, sql_dt(at), self.epoch, sql_uuid(invocation_id), sql_uuid(self.run_id)],
                    )
                    if cursor.rowcount != 1:
                        raise _Fenced()
                    seqs = append_events(
                        cursor,
                        tenant_id=self.tenant_id,
                        session_id=self.session_id,
                        run_id=self.run_id,
                        epoch=self.epoch,
                        events=[*earlier.events, started],
                    )
        except _Fenced:
            raise WorkerFenced("the watermark's fenced update affected zero rows") from None
        self.commits += 1
        _committed(earlier, seqs)

    # -- the writes of a unit ---------------------------------------------
    def _apply(self, cursor: Cursor, work: UnitOfWork) -> None:  # noqa: C901 - one statement per kind of write, in order
        run, tenant, epoch = sql_uuid(self.run_id), sql_uuid(self.tenant_id), self.epoch
        if work.model_call_finishes:
            for f in work.model_call_finishes:
                cursor.execute(
                    f"UPDATE model_calls SET status = %s, usage = {jp()}, stop_reason = %s, stream_had_output ="
                    f" %s, error = {jp()},"
                    " prefix_sha256 = %s, finished_at = %s WHERE id = %s AND run_id = %s",
                    [
                        f.status,
                        sql_json(f.usage),
                        f.stop_reason,
                        f.stream_had_output,
                        sql_json(f.error),
                        f.prefix_sha256,
                        sql_dt(f.finished_at),
                        sql_uuid(f.id),
                        run,
                    ],
                )
        if work.model_call_inserts:
            rows = []
            params: list[Any] = []
            for m in work.model_call_inserts:
                rows.append(f"(%s, %s, %s, %s, %s, 'started', {jp()}, false, %s, %s)")
                params += [
                    sql_uuid(m.id),
                    tenant,
                    run,
                    m.step_number,
                    m.attempt_number,
                    "{}",
                    epoch,
                    sql_dt(m.started_at),
                ]
            cursor.execute(
                "INSERT INTO model_calls (id, tenant_id, run_id, step_number, attempt_number, status, usage,"
                " stream_had_output, lease_epoch, started_at)"
                f" VALUES {', '.join(rows)}",
                params,
            )
        if work.invocation_inserts:
            rows = []
            params = []
            for i in work.invocation_inserts:
                rows.append(
                    f"(%s, %s, %s, %s, %s, %s, %s, {jp()}, %s, %s, %s, %s, %s, 0, {jp()}, {jp()}, %s, %s, %s, %s, %s)"
                )
                params += [
                    sql_uuid(i.id),
                    tenant,
                    run,
                    i.step_number,
                    i.call_index,
                    i.call_id,
                    i.tool_name,
                    sql_json(i.arguments),
                    i.raw_arguments,
                    i.idempotency_key,
                    i.status,
                    i.read_only,
                    i.side_effect,
                    sql_json(i.result),
                    sql_json(i.error),
                    i.suspended_kind,
                    epoch,
                    sql_dt(i.created_at),
                    sql_dt(i.created_at),
                    i.outcome,
                ]
            cursor.execute(
                "INSERT INTO tool_invocations (id, tenant_id, run_id, step_number, call_index, call_id,"
                " tool_name, arguments,"
                " raw_arguments, idempotency_key, status, read_only, side_effect, attempt, result, error,"
                " suspended_kind, lease_epoch,"
                " created_at, updated_at, outcome)"
                f" VALUES {', '.join(rows)}",
                params,
            )
        for u in work.invocation_updates:
            sets = ["status = %s", "updated_at = %s", "lease_epoch = %s"]
            params = [u.status, sql_dt(u.updated_at), epoch]
            if u.result is not None:
                sets.append(f"result = {jp()}")
                params.append(sql_json(u.result))
            if u.error is not None:
                sets.append(f"error = {jp()}")
                params.append(sql_json(u.error))
            elif u.clear_error:
                sets.append("error = NULL")
            if u.outcome is not None:
                sets.append("outcome = %s")
                params.append(u.outcome)
            if u.attempts is not None:
                sets.append(f"attempts = {jp()}")
                params.append(sql_json(u.attempts))
            if u.attempt is not None:
                sets.append("attempt = %s")
                params.append(u.attempt)
            if u.suspended_kind is not None:
                sets.append("suspended_kind = %s")
                params.append(u.suspended_kind)
            cursor.execute(
                f"UPDATE tool_invocations SET {', '.join(sets)} WHERE id = %s AND run_id = %s",
                params + [sql_uuid(u.id), run],
            )
        for a in work.approval_inserts:
            cursor.execute(
                "INSERT INTO approvals (id, tenant_id, run_id, invocation_id, kind, request_hash, capability,"
                " presentation, status,"
                f" reason, expires_at, created_at) VALUES (%s, %s, %s, %s, %s, %s, {jp()}, {jp()}, 'pending', '',"
                " %s, %s)",
                [
                    sql_uuid(a.id),
                    tenant,
                    run,
                    sql_uuid(a.invocation_id),
                    a.kind,
                    a.request_hash,
                    sql_json(a.capability),
                    sql_json(a.presentation),
                    sql_dt(a.expires_at),
                    sql_dt(a.created_at),
                ],
            )
        for approval_id in work.approval_invalidations:
            cursor.execute(
                "UPDATE approvals SET status = 'invalidated' WHERE id = %s AND run_id = %s AND status = 'approved'",
                [sql_uuid(approval_id), run],
            )

    def _insert_checkpoint(self, cursor: Cursor, work: UnitOfWork, seqs: list[int]) -> None:
        """The checkpoint row in its stored form, after the unit's events (whose
        sequences it may name: `events_from` is the one before the first)."""
        c = work.checkpoint
        assert c is not None
        state = stored_form.encode(c, work.events)
        if seqs:  # as the one-statement path: always, so the unit after may name these events (pg.Prior)
            state["events_from"] = seqs[0] - 1
        cursor.execute(
            'INSERT INTO checkpoints (id, tenant_id, run_id, version, "full", base_version, "trigger", state,'
            " code_version, lease_epoch, created_at)"
            f" VALUES (%s, %s, %s, %s, %s, %s, %s, {jp()}, %s, %s, %s)",
            [
                sql_uuid(_checkpoint_id(self.run_id, c.version)),
                sql_uuid(self.tenant_id),
                sql_uuid(self.run_id),
                c.version,
                c.full,
                c.base_version,
                c.trigger,
                sql_json(state),
                self.code_version,
                self.epoch,
                sql_dt(c.created_at),
            ],
        )


def _alone(work: UnitOfWork, db: Any) -> bool:
    """The unit commits as one statement in a transaction of its own: no
    transaction is open, it carries no intent and writes no deliveries."""
    return bool(db.get_autocommit()) and not work.intents and not intents.announces(work.events)


class _Sent:
    """A unit committed before `send` returned."""

    def __init__(self, seqs: list[int]) -> None:
        self.seqs = seqs

    def wait(self) -> list[int]:
        return self.seqs

    def on_answer(self, fn: Callable[[], None]) -> None:
        fn()


def _busy(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
    raise RuntimeError("this connection has a unit in flight: wait() for it before the next query")


def _pipelined_after(before: _InFlight | None, work: UnitOfWork) -> UUID | None:
    """The tool call row `work`'s fence may require of the unit still in
    flight (`STEP_FENCE_AFTER`), if `work` may be sent behind it: that unit
    inserted one, and, when `work`'s checkpoint is full (it may name that
    unit's events), that unit wrote a checkpoint too (whose `events_from`
    locates them: `Prior`)."""
    if before is None or before.answered or not before.work.invocation_inserts:
        return None
    if work.checkpoint is not None and work.checkpoint.full and before.work.checkpoint is None:
        return None
    return before.work.invocation_inserts[0].id


class _Pipe:
    """This thread's connection in libpq's pipeline mode while units are in
    flight on it. Each unit is followed by a Sync, so it is a transaction of
    its own, and PostgreSQL runs the units in the order they were sent; a
    unit can be sent before the one ahead of it is answered. From the first
    unit sent until the last is answered the connection's lock is held and
    Django queries on the connection raise (`_busy`) instead of waiting on
    themselves; then the connection leaves pipeline mode."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.conn = db.connection
        self.queued = 0  # psycopg result-queue items appended by the units sent
        self.fetched = 0  # ... and read back
        self.open = 0  # units sent and not yet answered
        self.conn.lock.acquire()
        db.execute_wrappers.append(_busy)
        try:
            with db.wrap_database_errors:
                self.pipeline = Pipeline(self.conn, _no_lock=True)  # the lock is ours already
                self.conn._pipeline = self.pipeline
                self.conn.wait(self.pipeline._enter_gen())
        except BaseException:
            self._release()
            raise

    def cursor(self) -> Any:
        """A psycopg cursor of the connection for one unit (its answer lands
        in it): server-binding, as `statement_cursor`'s, without Django's
        wrapper — the pipe does the error translation, and nothing else may
        use the connection while a unit is in flight."""
        if self.conn.prepare_threshold is None:
            return self.conn.cursor()
        return ServerBindingCursor(self.conn)

    def send(self, raw: Any, sql: str, params: list[Any]) -> int:
        """Send one statement and a Sync on `raw` (a cursor from `cursor()`)
        without reading anything; return the count of result-queue items
        read once its answer is in."""
        queue = self.pipeline.result_queue
        size = len(queue)  # nothing is read from the queue but by `read_through`
        with self.db.wrap_database_errors:
            self.conn.wait(raw._start_query(sql))
            query = raw._convert_query(sql, params)
            self.conn.wait(raw._maybe_prepare_gen(query))  # in pipeline mode: queued, not sent
            raw._last_query = sql
            self.pipeline._enqueue_sync()
            self.queued += len(queue) - size
            commands = self.pipeline.command_queue
            while commands:
                commands.popleft()()
            self.conn.wait(send_pending(self.conn.pgconn))
        return self.queued

    def read_through(self, upto: int) -> None:
        """Read the answers, in order, up to the `upto`th result-queue item;
        raise the first error among them (after reading all of them)."""
        first: BaseException | None = None
        queue = self.pipeline.result_queue
        while self.fetched < upto:
            results = self.conn.wait(fetch_many(self.conn.pgconn))
            if not results:
                raise psycopg.OperationalError("the pipeline ended before its answers")
            queued = queue.popleft()
            self.fetched += 1
            try:
                self.pipeline._process_results(queued, results)
            except psycopg.Error as exc:
                first = first or exc
        if first is not None:
            raise first

    def answered(self) -> None:
        """One unit answered (or failed); after the last, leave pipeline mode.
        A connection left with unread answers or unsent commands (a unit that
        failed half-sent) cannot be used again: it is closed."""
        self.open -= 1
        if self.open > 0:
            return
        pipeline = self.pipeline
        try:
            if self.fetched == self.queued and not pipeline.result_queue and not pipeline.command_queue:
                with self.db.wrap_database_errors:
                    pipeline._exit(None)  # left alone on a broken connection
            else:
                self.conn.close()
        except BaseException:
            self.conn.close()
            raise
        finally:
            self._release()

    def _release(self) -> None:
        if self.conn._pipeline is getattr(self, "pipeline", None):
            self.conn._pipeline = None
        self.db.execute_wrappers.remove(_busy)
        self.conn.lock.release()


class _InFlight:
    """A unit's statement sent on this thread's connection (`_Pipe`) and not
    yet answered; `wait()` reads its answer."""

    def __init__(
        self, store: DjangoRunStore, pipe: _Pipe, work: UnitOfWork, starts: int | None, sql: str, params: list[Any]
    ):
        self.store, self.pipe, self.work, self.starts = store, pipe, work, starts
        self.seqs: list[int] | None = None
        self.error: BaseException | None = None
        self.answered = False
        self._on_answer: list[Callable[[], None]] = []
        self._cursor: Any = None
        pipe.open += 1
        try:
            self._cursor = pipe.cursor()
            self._upto = pipe.send(self._cursor, sql, params)
        except BaseException:
            self.answered = True
            if self._cursor is not None:
                self._cursor.close()
            pipe.answered()
            raise

    def on_answer(self, fn: Callable[[], None]) -> None:
        """Call `fn` once the answer is in (or now): ops.instrument times and
        traces a unit in flight with it."""
        if self.answered:
            fn()
        else:
            self._on_answer.append(fn)

    def wait(self) -> list[int]:
        """The unit's sequences once PostgreSQL has answered; raise what
        `commit` would have (every later call raises it again)."""
        if self.answered:
            if self.error is not None:
                raise self.error
            return self.seqs or []
        try:
            try:
                with self.pipe.db.wrap_database_errors:
                    self.pipe.read_through(self._upto)
                    fenced_rows, seqs, floor = self._cursor.fetchone()
            finally:
                self.answered = True
                if self.store._in_flight is self:
                    self.store._in_flight = None
                self._cursor.close()
                self.pipe.answered()
                for fn in self._on_answer:
                    fn()
            if fenced_rows != 1:
                raise WorkerFenced("the fenced update affected zero rows")
        except BaseException as exc:
            self.error = exc
            raise
        self.seqs = self.store._record_committed(self.work, list(seqs or []), floor, self.starts)
        return self.seqs


def _checkpoint_id(run_id: UUID, version: int) -> UUID:
    """Deterministic: a checkpoint is named by (run, version). A UUIDv8
    (RFC 9562) whose first 64 bits are the run id's — so a run's checkpoints
    sit together in the primary-key index, and with time-ordered run ids
    (`runs.clock`) new runs' at its right edge — and whose other 62 bits are
    a hash of the run id and the version (uuid5 scattered every checkpoint
    over the whole index)."""
    digest = int.from_bytes(hashlib.sha256(b"checkpoint:%d:" % version + run_id.bytes).digest()[:8], "big")
    high = (run_id.int >> 64) & ~(0xF << 12) | (0x8 << 12)  # version 8 in bits 48-51
    low = digest & ((1 << 62) - 1) | (0b10 << 62)  # the RFC variant
    return UUID(int=(high << 64) | low)


def _latest(work: UnitOfWork) -> datetime:
    for started in work.model_call_inserts:
        return started.started_at
    for finished in work.model_call_finishes:
        return finished.finished_at
    if work.checkpoint is not None:
        return work.checkpoint.created_at
    raise ValueError("a unit of work with no timestamp")
