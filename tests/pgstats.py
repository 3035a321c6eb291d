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


def entries_read(table: str) -> dict[str, int]:
    """Index entries of `table` read so far, by index, and rows read by
    sequential scans (as "(sequential)")."""
    return dict(
        counts(
            "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = %s"
            " UNION ALL SELECT '(sequential)', seq_tup_read FROM pg_stat_user_tables WHERE relname = %s",
            [table, table],
        )
    )


def read_during(fn, table: str = "runs") -> dict[str, int]:
    """What calling `fn` read of `table`: entries by index, and "(sequential)"
    rows; only what moved."""
    before = entries_read(table)
    fn()
    after = entries_read(table)
    return {name: n - before.get(name, 0) for name, n in after.items() if n - before.get(name, 0)}
