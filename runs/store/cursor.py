"""The store's connection: the dialect, how values are bound, the prepared-statement cursor, keyed
plans for a slice and psycopg's pipeline mode."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.db.backends.postgresql.base import ServerBindingCursor

from runs.store.json_text import compact_or_null

# A database cursor (Django's CursorWrapper; the project has no Django stubs).
Cursor = Any


def is_pg() -> bool:
    return bool(connection.vendor == "postgresql")


def _db() -> Any:
    """This thread's default connection itself: `django.db.connection` is a
    proxy that looks the thread's connection up again on every attribute
    (a few microseconds each, a few dozen times a step on the hot path)."""
    return connections[DEFAULT_DB_ALIAS]


def sql_uuid(value: UUID | None) -> UUID | str | None:
    if value is None:
        return None
    return value if is_pg() else value.hex


sql_json = compact_or_null  # the JSON parameter of a nullable column (lease, webhooks.outbox import it too)


def sql_dt(value: datetime | None) -> Any:
    if value is None:
        return None
    return connection.ops.adapt_datetimefield_value(value)


def jp() -> str:
    """Placeholder for a JSON parameter."""
    return "%s::jsonb" if is_pg() else "%s"


def statement_cursor(alias: str = DEFAULT_DB_ALIAS) -> Cursor:
    """A cursor for the runtime's own single-statement transactions.

    Django's cursor binds parameters on the client, so PostgreSQL plans every
    execution anew; the fenced statements are a handful of shapes whose
    planning cost about as much as running them. On PostgreSQL with
    `prepare_threshold` set (settings: on unless AGENTRT_PG_PREPARE=0) this is
    a server-binding cursor, and psycopg prepares each shape once per
    connection. It goes through Django's wrappers (error translation,
    execute_wrapper, query logging) like any other cursor. With the query log
    on (DEBUG, or a test capturing queries) it is Django's own cursor, so the
    log shows each statement's text: psycopg keeps none for a prepared one."""
    db = connections[alias]
    if db.vendor == "postgresql" and not db.queries_logged:
        db.ensure_connection()
        raw = db.connection
        if raw.prepare_threshold is not None:
            with db.wrap_database_errors:
                return db._prepare_cursor(ServerBindingCursor(raw))
    return db.cursor()


@contextlib.contextmanager
def keyed_plans() -> Any:
    """A run's slice with the sequential scan off on this connection
    (PostgreSQL; elsewhere a plain block).

    Every statement of a slice finds its rows by a key, and the fenced
    statements are prepared once per connection, so each keeps the plan it
    got when first prepared. On a table whose statistics say it is nearly
    empty (a new database, analyzed while it was), that plan can be a
    sequential scan, which then reads the whole table at every step as it
    grows, until the next ANALYZE: in bench/RESULTS.md, runs
    driven one after another went from 1.07 to 1.45 ms a step, then 1.44 to
    2.08, reading 2.5 M tool-call rows for 1,600 steps. With the sequential
    scan off, a key's index is used whatever the statistics say; a statement
    no index serves still scans. Set back when the slice ends, so a caller
    driving a run in-process gets its connection back as it was."""
    db = _db()
    if db.vendor != "postgresql":
        yield
        return
    with db.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
    try:
        yield
    finally:
        raw = db.connection
        # A transaction that failed inside (a caller's, in-process) undoes the SET when it rolls back.
        if raw is not None and not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
            try:
                with db.cursor() as cursor:
                    cursor.execute("RESET enable_seqscan")
            except DatabaseError:
                # The slice's outcome is already written; a connection that cannot take the RESET is not kept
                # with the setting on: the next statement opens another (and meets whatever broke this one).
                db.close()


@contextlib.contextmanager
def pipelined() -> Any:
    """Statements whose results nobody reads (INSERTs without RETURNING, the
    ORM's `create` of a model whose key the caller set) are sent without
    waiting for each answer; the answers are read together when the block
    ends (psycopg's pipeline mode). Inside the caller's transaction: a failed
    statement raises by the block's end at the latest, as Django's own error
    class (an IntegrityError stays one), the server skips the rest of the
    block, and the transaction rolls back as usual. Elsewhere than
    PostgreSQL, a plain block."""
    db = _db()
    if db.vendor != "postgresql":
        yield
        return
    db.ensure_connection()
    with db.wrap_database_errors, db.connection.pipeline():
        yield
