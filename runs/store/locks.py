"""Advisory locks for the maintenance sweeps: `pg_try_advisory_xact_lock` on
PostgreSQL, so the lock ends with the transaction and a sweep that misses it
skips. On SQLite a write transaction (IMMEDIATE) already excludes every other
writer."""

from __future__ import annotations

import zlib

from django.db import connection


def try_transaction_lock(name: str) -> bool:
    """Call inside `transaction.atomic()`; True when this transaction holds
    the lock named `name` (always on SQLite)."""
    if connection.vendor != "postgresql":
        return True  # BEGIN IMMEDIATE (settings) already holds SQLite's write lock
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [zlib.crc32(f"agentrt.{name}".encode())])
        return bool(cursor.fetchone()[0])
