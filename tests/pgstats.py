"""The server's own counts of what a test's statements read
(pg_stat_user_indexes, pg_stat_user_tables), for the tests that pin plans."""

from __future__ import annotations

from typing import Any

from django.db import connection


def counts(sql: str, params: Any = ()) -> list[tuple]:
    """`sql` over the statistics views once this backend's pending counts are
    flushed (PostgreSQL 15 reports them only when the backend goes idle)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()
