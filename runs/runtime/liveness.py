"""A lease owner's process is alive while PostgreSQL holds its session.

Every process that takes a lease (a worker claiming a run, a resume taking
one over) first holds a session-level advisory lock keyed by its
`<host>:<pid>` — the lease owner's form without its per-lease tail — on a
direct connection of its own, kept for the life of the process. When the
process dies its session ends and PostgreSQL releases the lock at once, so
the dead-owner sweep (`dead_processes`, run by maintenance about once a
second) finds the lock free for a run whose lease has not expired yet and
takes the run over then, not a lease later. A stalled (SIGSTOP) or
partitioned process keeps its session and its lock: its runs wait for the
lease rule. The epoch fence stays the authority: a takeover is guarded by
the epoch and the owner it probed, so a false "dead" verdict (the lock's
connection cut while its process lives) costs at most a fenced zombie, and
what that zombie had in flight is asked about, never sent again.

PostgreSQL only; with `AGENTRT_DEAD_OWNER_PROBE_SECONDS=0` nothing here
connects and takeovers wait for the lease.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Iterable
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, connections

log = logging.getLogger("agentrt.liveness")

KEY = "hashtextextended('agentrt.owner:' || {}, 0)"  # the lock's 64-bit key, from the `<host>:<pid>` text


def enabled() -> bool:
    return float(settings.AGENTRT_DEAD_OWNER_PROBE_SECONDS) > 0 and connection.vendor == "postgresql"


def process_of(owner: str) -> str:
    """`<host>:<pid>` of a lease owner `<host>:<pid>:<id>`."""
    return owner.rsplit(":", 1)[0]


class _Liveness:
    """The process's lock and its connection (one per process; a forked
    child starts without its parent's, which stays the parent's)."""

    def __init__(self) -> None:
        self._conn: Any = None
        self._pid: int | None = None
        self._guard = threading.Lock()

    def ensure(self, owner: str, *, check: bool = False) -> bool:
        """Hold this process's lock before a lease is taken; `check` (the
        heartbeat's) also asks the server that the session is still there.
        False when it could not be held: the process's leases then follow
        the lease rule alone (a probe sees the lock free and may take them
        over early: a fenced zombie at worst)."""
        if not enabled():
            return False
        with self._guard:
            if self._pid != os.getpid():
                self._conn = None  # the parent's session: never ours to use or close
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken and not _hung_up(conn):
                if not check:
                    return True
                try:
                    conn.execute("SELECT 1")
                    return True
                except psycopg.Error:
                    self._drop()
            return self._lock(process_of(owner))

    def _lock(self, process: str) -> bool:
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("prepare_threshold", None)
        try:
            conn = psycopg.connect(**params, autocommit=True)
        except psycopg.Error as exc:
            log.warning("liveness: could not connect (%s); this process's leases follow the lease rule", exc)
            return False
        try:
            for _ in range(3):  # a probe holds the key for the instant of one statement
                row = conn.execute(f"SELECT pg_try_advisory_lock({KEY.format('%s')})", [process]).fetchone()
                if row and row[0]:
                    self._conn, self._pid = conn, os.getpid()
                    return True
            log.warning("liveness: the lock of %s is held by another session; leases follow the lease rule", process)
        except psycopg.Error as exc:
            log.warning("liveness: could not take the lock (%s)", exc)
        conn.close()
        return False

    def _drop(self) -> None:
        try:
            self._conn.close()
        except psycopg.Error:
            pass
        self._conn = None

    def release(self) -> None:
        """Close the lock's session (tests; a process's exit does the same)."""
        with self._guard:
            if self._conn is not None and self._pid == os.getpid():
                self._drop()
            self._conn = None


def _hung_up(conn: Any) -> bool:
    """Whether the server has spoken on an idle session we never asked anything: a terminated backend's
    last error, or the close of a restart. One poll of the socket, no round trip, so a claim right after
    its lock's session was cut takes the lock again instead of leading the probe to a false "dead"."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


LIVENESS = _Liveness()


def dead_processes(processes: Iterable[str]) -> set[str]:
    """Which of these `<host>:<pid>` hold no lock: one statement on the
    caller's own connection (never a process's lock session, where its own
    key would look free), each key taken and released in the same
    statement, so a transaction pooler cannot leave one held."""
    wanted = sorted(set(processes))
    if not wanted:
        return set()
    key = KEY.format("p")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT p, CASE WHEN pg_try_advisory_lock({key}) THEN pg_advisory_unlock({key}) ELSE false END"
            " FROM unnest(%s::text[]) AS p",
            [wanted],
        )
        return {p for p, dead in cursor.fetchall() if dead}
