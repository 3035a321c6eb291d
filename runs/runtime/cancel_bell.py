"""The cancel doorbell: a cancel request reaches the
worker that runs the run at once, not at its next heartbeat.

`ring(run_id)`, in the transaction that records the request of a RUNNING
run (runs.services.lifecycle.run_cancel, a parent's cascade), sends
`NOTIFY agentrt_cancel, '<run id>'`; PostgreSQL delivers it when that
transaction commits, so no worker hears of a request that did not commit.
Each worker process has one listener, `BELL`: a daemon thread LISTENing on
the channel on a connection of its own (runs.runtime.doorbell's
`listen_connection`, the queue doorbell's). An execution `watching` its run
registers its token first; a notification for a watched run sets it
(`CancelReason.REQUESTED`) as soon as it arrives, and the loop stops at its
next observation point (one of the loop's six; a model call or a `sleep` waiting
on the token returns at once).

Nothing is lost when a notification is: the claim reads
`cancel_requested_at` after the token is watched (wiring.build_context),
the listener reads it for every watched run each time its LISTEN is (re)
established, and the heartbeat still reports it every lease/3 (the
fallback poller). On SQLite or with AGENTRT_Q_DOORBELL=0 only
the claim and the heartbeat tell the worker.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

from runs.clock import CLOCK
from runs.domain.values import CancelReason
from runs.runtime import doorbell
from runs.runtime.backoff import Backoff

log = logging.getLogger("agentrt.cancel")

CHANNEL = "agentrt_cancel"
IDLE_CHECK_SECONDS = 1.0  # how often the listener looks up from its socket (a lost connection is seen by then)


def enabled() -> bool:
    return doorbell.enabled()


def ring(run_id: Any) -> None:
    """In the caller's transaction: tell the worker running `run_id` that a
    cancel was requested (delivered at commit; nothing without the doorbell)."""
    if not enabled():
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(run_id)])


class CancelBell:
    """The process's listener and the tokens of the runs it executes."""

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)  # the thread does not survive a fork

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, list[Any]] = {}  # run id -> the tokens of its executions in this process
        self._wanted = threading.Event()  # something is watched: the listener should be connected
        self._thread: threading.Thread | None = None
        self.listening = False  # LISTEN is in place (for tests and diagnostics)
        self.rung = 0  # tokens set by a notification or a sweep

    @contextmanager
    def watching(self, run_id: Any, token: Any) -> Iterator[None]:
        """For the duration of an execution: a cancel request of `run_id`
        sets `token`. Enter before the claim's read of the run."""
        if not enabled():
            yield
            return
        key = str(run_id)
        with self._lock:
            self._watched.setdefault(key, []).append(token)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="agentrt-cancel-bell", daemon=True)
                self._thread.start()
        self._wanted.set()
        try:
            yield
        finally:
            with self._lock:
                tokens = self._watched.get(key, [])
                if token in tokens:
                    tokens.remove(token)
                if not tokens:
                    self._watched.pop(key, None)

    def _ring(self, run_id: str, why: str) -> None:
        with self._lock:
            tokens = list(self._watched.get(run_id, ()))
        for token in tokens:
            if token.reason is None:
                token.cancel(CancelReason.REQUESTED)
                self.rung += 1
                log.info(
                    "run %s: cancel requested (%s); its execution stops at the next observation point", run_id, why
                )

    def _serve(self) -> None:
        backoff = Backoff(0.5)
        while True:
            self._wanted.wait()
            try:
                listener = doorbell.listen_connection(CHANNEL)
            except Exception as exc:
                log.warning("cancel doorbell: cannot LISTEN (%s); the heartbeat reports cancels meanwhile", exc)
                CLOCK.sleep(backoff.failed())
                continue
            try:
                self.listening = True
                self._sweep(listener)  # whatever was requested before LISTEN was in place
                while True:
                    for note in listener.notifies(timeout=IDLE_CHECK_SECONDS):
                        self._ring(note.payload, "doorbell")
                    backoff.succeeded()
                    with self._lock:
                        if not self._watched:
                            self._wanted.clear()  # idle: stay connected, but reconnect only when needed
            except Exception as exc:  # the connection was lost: reconnect once something is watched
                with self._lock:
                    busy = bool(self._watched)
                if busy:
                    log.warning("cancel doorbell: listener lost (%s); reconnecting", type(exc).__name__)
                    CLOCK.sleep(backoff.failed())
            finally:
                self.listening = False
                try:
                    listener.close()
                except Exception:
                    pass

    def _sweep(self, listener) -> None:
        with self._lock:
            ids = list(self._watched)
        if not ids:
            return
        rows = listener.execute(
            "SELECT id::text FROM runs WHERE id = ANY(%s::uuid[]) AND cancel_requested_at IS NOT NULL", [ids]
        ).fetchall()
        for (run_id,) in rows:
            self._ring(run_id, "read at LISTEN")


BELL = CancelBell()
