"""One cancellation token per execution (six observation points)."""

from __future__ import annotations

import threading

from runs.domain.errors import RunCancelled
from runs.domain.values import CancelReason


class Token:
    """`CancellationToken` set by the supervisor; first reason wins, never cleared."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason: CancelReason | None = None
        self._lock = threading.Lock()

    @property
    def reason(self) -> CancelReason | None:
        return self._reason

    def cancel(self, reason: CancelReason) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
                self._event.set()

    def raise_if_cancelled(self) -> None:
        if self._reason is not None:
            raise RunCancelled(self._reason)

    def wait(self, timeout: float | None = None) -> CancelReason | None:
        self._event.wait(timeout)
        return self._reason
