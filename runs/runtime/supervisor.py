"""The heartbeat supervisor: one thread per executing run, independent of
what the loop is doing. Every lease/3 it renews the lease and, in the same
query, learns of a cancel request or a passed deadline; it sets the run's
cancellation token (`fenced`, `deadline`, `requested`)."""

from __future__ import annotations

import logging
import threading

from django.db import connection

from runs.domain.values import CancelReason
from runs.runtime.liveness import LIVENESS
from runs.runtime.queue import run_heartbeat

log = logging.getLogger("agentrt.supervisor")


class Supervisor:
    """Also the `LeaseMonitor` the pipeline asks right before a side effect."""

    def __init__(self, *, run_id, owner: str, epoch: int, token, clock, lease_seconds: float, heartbeat=run_heartbeat):
        self.run_id = run_id
        self.owner = owner
        self.epoch = epoch
        self.token = token
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        self.heartbeat = heartbeat
        self.last_ok = clock.monotonic()  # the claim itself set the lease
        self.beats = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{run_id}", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # never started (the context could not be built): nothing to join
            self._thread.join(timeout=self.lease_seconds)

    def may_start_effect(self) -> bool:
        if not self._thread.is_alive() and not self._stop.is_set():
            return False  # a dead supervisor renews nothing: self-fence
        return self.clock.monotonic() - self.last_ok <= self.lease_seconds - self.interval

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    beat = self.heartbeat(run_id=self.run_id, owner=self.owner, epoch=self.epoch)
                except Exception as exc:  # a miss; the self-fence bounds what follows
                    self.failures += 1
                    log.warning("heartbeat failed for run %s: %s", self.run_id, type(exc).__name__)
                    try:
                        connection.close()
                    except Exception:
                        pass
                    if self.clock.monotonic() - self.last_ok > self.lease_seconds:
                        self.token.cancel(CancelReason.FENCED)
                        return
                    continue
                if not beat.alive:
                    self.token.cancel(CancelReason.FENCED)
                    return
                self.last_ok = self.clock.monotonic()
                self.beats += 1
                # The process's liveness lock: its session asked, and taken again if it was lost.
                LIVENESS.ensure(self.owner, check=True)
                # Keep renewing after a cancel or a deadline: a call already past
                # its watermark runs to completion and its result must be kept.
                if beat.deadline_passed:
                    self.token.cancel(CancelReason.DEADLINE)
                if beat.cancel_requested:
                    self.token.cancel(CancelReason.REQUESTED)
        finally:
            connection.close()
