"""Row locks of a run's family (child runs and the join).

The lock order is ancestor before descendant, everywhere: a child's terminal
transaction locks its parent's row before its own (the fence), and cancelling a
parent locks the parent, then its children. Two siblings ending at the same
moment therefore queue on the parent's row, and the second one to get it sees
the first one's end (READ COMMITTED: each statement reads what committed before
it began), so exactly one of them is the last.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import connection

Cursor = Any


def lock_parent(cursor: Cursor, run_id: UUID) -> UUID | None:
    """Lock the row of `run_id`'s parent for the rest of the transaction and
    return the parent's id (None for a run with no parent: nothing locked).
    On SQLite the write transaction already excludes every other writer."""
    lock = " FOR UPDATE OF p" if connection.vendor == "postgresql" else ""
    cursor.execute(
        f"SELECT p.id FROM runs c JOIN runs p ON p.id = c.parent_id WHERE c.id = %s{lock}",
        [run_id if connection.vendor == "postgresql" else run_id.hex],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    return row[0] if isinstance(row[0], UUID) else UUID(str(row[0]))


def lock_family(cursor: Cursor, run_id: UUID) -> UUID | None:
    """Lock `run_id`'s parent (if any), then `run_id`'s own row, for the rest
    of the transaction; return the parent's id. A transaction that changes a
    waiting run's approvals takes these first, in the order a cancel takes
    them by its updates (parent, run, then the run's approvals): a decision
    holding its approval row while it waits for the run's would deadlock with
    a cancel holding the run while it waits for the approval."""
    parent = lock_parent(cursor, run_id)
    if connection.vendor == "postgresql":
        cursor.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", [run_id])
    return parent
