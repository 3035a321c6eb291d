"""django-q2's ORM broker with a real doorbell on PostgreSQL.

The stock ORM broker polls its queue table every `poll` seconds: at the 0.02 s
a run needs to start promptly, that is 50 queries and commits a second per
idle cluster, on the same cores as the workers. Here `enqueue` also sends
`NOTIFY` in the enqueueing transaction (PostgreSQL delivers it at commit, so
a pusher never wakes for a task it cannot see yet), and an empty `dequeue`
waits on `LISTEN` for up to `AGENTRT_Q_FALLBACK_POLL` seconds instead of
sleeping. The fallback still finds what no notification announces: a task
whose `retry` lock lapsed, or one enqueued while the listener reconnected.

On SQLite, or with AGENTRT_Q_DOORBELL=0, it is the stock broker polling
every `AGENTRT_Q_POLL` seconds.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ

from runs.clock import CLOCK
from runs.runtime.backoff import Backoff
from runs.store.cursor import statement_cursor

log = logging.getLogger("agentrt.doorbell")

CHANNEL = "agentrt_q"
LISTEN_RETRY_SECONDS = 5.0


def enabled() -> bool:
    return settings.AGENTRT_Q_DOORBELL and connections[Conf.ORM].vendor == "postgresql"


def listen_connection(channel: str = CHANNEL) -> psycopg.Connection:
    """A connection of its own (autocommit, outside Django's), listening on
    `channel` (the doorbell's, or the cancel doorbell's: runs/runtime/cancel_bell.py)."""
    params = connections[Conf.ORM].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(f"LISTEN {channel}")
    return listener


class DoorbellORM(ORM):
    clock = CLOCK  # the Clock port (runs/clock.py); a test injects a fake one

    def __init__(self, list_key: str | None = None):
        super().__init__(list_key=list_key)
        self._backoff = Backoff(min(1.0, settings.AGENTRT_Q_FALLBACK_POLL))
        self._listener: Any = None  # a psycopg connection, connected in the pusher process, on its first dequeue
        self._retry_at = 0.0  # after a failed LISTEN: poll until then, then try again
        self._failing = False  # the queue could not be read: reconnecting

    def enqueue(self, task):
        """The stock enqueue's row (due at once) and the `NOTIFY` in one
        statement: one round trip inside the submit's transaction instead of
        two. The notification is delivered when that transaction commits."""
        if not enabled():
            return super().enqueue(task)
        self.get_connection()  # the stock broker's close_old_connections outside a transaction
        with connections[Conf.ORM].cursor() as cursor:
            cursor.execute(
                f"WITH q AS (INSERT INTO {OrmQ._meta.db_table} (key, payload, lock) VALUES (%s, %s, %s) RETURNING id)"
                " SELECT id, pg_notify(%s, '') FROM q",
                [self.list_key or Conf.CLUSTER_NAME, task, CLOCK.now(), CHANNEL],
            )
            return cursor.fetchone()[0]

    def dequeue(self):
        if not enabled():
            return super().dequeue()
        # LISTEN before reading: whatever commits after this read is announced.
        listener = self._listen()
        try:
            tasks = self._take()
        except Exception as exc:
            # Our backend was terminated or the server restarted: a fresh
            # connection next time, instead of the stock pusher's exit (and
            # its 10 s sleep) with the task queue's writer half-way.
            if not self._failing:  # once per outage, not twice a second
                log.warning("doorbell: cannot read the queue (%s); reconnecting", type(exc).__name__)
            self._failing = True
            self._drop_connection()
            self.clock.sleep(self._backoff.failed())  # longer each time, up to 30 s: no spinning in an outage
            return None
        self._backoff.succeeded()
        if self._failing:
            log.info("doorbell: reading the queue again")
            self._failing = False
        if tasks:
            return tasks
        if listener is None:
            self.clock.sleep(Conf.POLL)  # no listener: the stock poll until it reconnects
        else:
            self._wait(listener, settings.AGENTRT_Q_FALLBACK_POLL)
        return None

    def _take(self):
        """Claim up to BULK due tasks in one statement: what the stock dequeue
        does in a read and an update per task (a round trip and a commit
        each, between a run's submit and its claim). A task is due when its
        lock has lapsed; taking it moves the lock `retry` seconds ahead.
        SKIP LOCKED and the re-check of `lock < now` on the row it locks
        give each task to one pusher, however many clusters read the queue."""
        self.get_connection()  # the stock broker's close_old_connections before it reads
        now = CLOCK.now()
        with statement_cursor(Conf.ORM) as cursor:  # prepared once per connection: no planning per take
            cursor.execute(
                f"UPDATE {OrmQ._meta.db_table} SET lock = %s WHERE id IN ("
                f"SELECT id FROM {OrmQ._meta.db_table} WHERE key = %s AND lock < %s"
                " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload",
                [now + timedelta(seconds=Conf.RETRY), self.list_key, now, Conf.BULK],
            )
            return sorted(cursor.fetchall())

    @staticmethod
    def _drop_connection() -> None:
        try:
            connections[Conf.ORM].close()
        except Exception:
            pass

    def _listen(self):
        if self._listener is not None and not self._listener.closed:
            return self._listener
        if CLOCK.monotonic() < self._retry_at:
            return None
        try:
            self._listener = listen_connection()
        except Exception as exc:
            log.warning("doorbell: cannot LISTEN (%s); polling for %.0f s", exc, LISTEN_RETRY_SECONDS)
            self._close()
            self._retry_at = CLOCK.monotonic() + LISTEN_RETRY_SECONDS
        return self._listener

    def _wait(self, listener, seconds: float) -> None:
        """Block until a NOTIFY arrives or `seconds` pass. Notifications that
        arrived since LISTEN wait in the socket: none is missed."""
        try:
            for _ in listener.notifies(timeout=seconds, stop_after=1):
                break
            for _ in listener.notifies(timeout=0):  # several enqueues: one wake-up
                pass
        except Exception as exc:  # reconnects on the next dequeue
            log.warning("doorbell: listener lost (%s)", exc)
            self._close()

    def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:
                pass
