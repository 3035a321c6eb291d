"""The watchdog of one HTTP model attempt: it shuts the attempt's socket down
when the run's token is set or the call's deadline passes, so a read blocked
on a silent server returns at once."""

from __future__ import annotations

import socket
import threading

from runs.clock import CLOCK


class Watchdog:
    """Shuts the attempt's socket down when the token is set or the call's
    deadline passes, so a read blocked on a silent server returns at once.

    The socket is learnt from httpcore's `trace` extension. `stop()` is called
    before the client closes the socket, under the same lock as a shutdown, so
    a shutdown never reaches a closed (or reused) descriptor.
    """

    def __init__(self, token, deadline: float | None, poll: float = 0.05, name: str = "agentrt-model-watchdog"):
        self.token = token
        self.deadline = deadline
        self.poll = poll
        self.fired: str | None = None  # "cancel" | "deadline"
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def trace(self, name: str, info: dict) -> None:
        if not (name.endswith("connect_tcp.complete") or name.endswith("start_tls.complete")):
            return
        stream = (info or {}).get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            if self._finished.is_set():
                return
            self._sock = sock
            if self.fired:
                self._shutdown(sock)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._finished.wait(self.poll):
            if self.token.reason is not None:
                self._fire("cancel")
                return
            if self.deadline is not None and CLOCK.monotonic() >= self.deadline:
                self._fire("deadline")
                return

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._finished.is_set():
                return
            self.fired = why
            if self._sock is not None:
                self._shutdown(self._sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:  # the base method: for a TLS socket, leave the SSL object alone
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self) -> None:
        with self._lock:
            self._finished.set()
