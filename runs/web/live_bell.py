"""The web process's one LISTEN for the live pages, on PostgreSQL alone.

Writers send `NOTIFY agentrt_live, '<tenant hex>:<run hex>'` in the
transaction that appends a run's events (runs/store/live.py); PostgreSQL
delivers it at commit. Here one asyncio task per event loop (daphne runs
one loop per process) holds a connection of its own (autocommit, outside
Django's, `application_name` `agentrt-live:<pid>`), LISTENs on the channel
with psycopg's AsyncConnection and sets the wake-up of every local socket
subscribed to that run's group or that tenant's group. A socket then reads
the events table past its cursor under its own scope: a notification
names groups to wake, never data, so a payload naming another tenant's
groups (or a malformed one) can at most cause a read that finds nothing.

The task starts with the first subscribed socket and ends with the last.
When its connection dies (the backend terminated, the server restarted)
it reconnects with backoff; each time LISTEN is (re)established it wakes
every local socket, since what committed meanwhile was announced to no
one. A lost notification costs a socket its poll interval
(AGENTRT_LIVE_POLL_SECONDS), never an event: the events table is the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import weakref
from typing import Any

import psycopg
from django.db import connections

from runs.runtime.backoff import Backoff
from runs.store import live

log = logging.getLogger("agentrt.live")

IDLE_CHECK_SECONDS = 10.0  # how often an idle listener asks its connection whether it is alive
RETRY_BASE_SECONDS = 0.2
RETRY_CAP_SECONDS = 10.0
_HEX = re.compile(r"[0-9a-f]{32}")


def application_name() -> str:
    return f"agentrt-live:{os.getpid()}"


def _connection_params() -> dict[str, Any]:
    params = dict(connections["default"].get_connection_params())
    for key in ("cursor_factory", "prepare_threshold", "context"):  # Django's own, for its sync connection
        params.pop(key, None)
    params["application_name"] = application_name()
    return params


class LiveBell:
    """The subscriptions of one event loop's sockets and their listener."""

    def __init__(self) -> None:
        self._groups: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task | None = None
        self.listening = False  # LISTEN is in place (for tests and diagnostics)
        self.connects = 0  # times LISTEN was established
        self.woken = 0  # socket wake-ups set by a notification

    def subscribe(self, group: str, wake: asyncio.Event) -> None:
        self._groups.setdefault(group, set()).add(wake)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._serve(), name="agentrt-live-listener")

    def unsubscribe(self, group: str, wake: asyncio.Event) -> None:
        waiting = self._groups.get(group)
        if waiting is not None:
            waiting.discard(wake)
            if not waiting:
                del self._groups[group]
        if not self._groups and self._task is not None:
            self._task.cancel()  # no socket left in this process: no connection held for none
            self._task = None

    def dispatch(self, payload: str) -> None:
        """Wake the sockets of the groups a notification names; anything else is ignored."""
        tenant, _, run = payload.partition(":")
        groups = []
        if _HEX.fullmatch(tenant):
            groups.append(f"tenant.{tenant}")
        if _HEX.fullmatch(run):
            groups.append(f"run.{run}")
        for group in groups:
            for wake in self._groups.get(group, ()):
                wake.set()
                self.woken += 1

    def _wake_all(self) -> None:
        for waiting in self._groups.values():
            for wake in waiting:
                wake.set()

    async def _serve(self) -> None:
        backoff = Backoff(RETRY_BASE_SECONDS, cap=RETRY_CAP_SECONDS)
        failing = False
        while True:
            conn = None
            try:
                conn = await psycopg.AsyncConnection.connect(**_connection_params(), autocommit=True)
                await conn.execute(f"LISTEN {live.CHANNEL}")
                self.listening = True
                self.connects += 1
                backoff.succeeded()
                if failing:
                    log.info("live listener: listening again")
                    failing = False
                self._wake_all()  # whatever committed while no LISTEN was in place
                while True:
                    async for note in conn.notifies(timeout=IDLE_CHECK_SECONDS):
                        self.dispatch(note.payload)
                    await conn.execute("SELECT 1")  # a connection that died quietly is noticed here
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:  # once per outage
                    log.warning(
                        "live listener: connection lost (%s); sockets poll every few tenths of a second"
                        " meanwhile, reconnecting",
                        type(exc).__name__,
                    )
                failing = True
            finally:
                self.listening = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(backoff.failed())


_bells: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveBell] = weakref.WeakKeyDictionary()


def bell() -> LiveBell:
    """The running loop's bell (one per web process under daphne)."""
    loop = asyncio.get_running_loop()
    found = _bells.get(loop)
    if found is None:
        found = _bells[loop] = LiveBell()
    return found
