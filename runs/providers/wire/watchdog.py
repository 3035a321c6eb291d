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

    The socket is learnt from the connection's reads and writes (`learn`).
    `stop()` is called before the attempt's response is closed (and its
    connection closed or lent again), under the same lock as a shutdown, so
    a shutdown never reaches a connection another attempt may be using.
    """

    def __init__(self, token, deadline: float | None, poll: float = 0.05, name: str = "agentrt-model-watchdog"):
        self.token = token
        self.deadline = deadline
        self.poll = poll
        self.fired: str | None = None  # "cancel" | "deadline" | "wind_down"
        self._ends_as = "deadline"
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def learn(self, sock: socket.socket | None) -> None:
        """The socket the attempt is reading or writing now (`pool._Watched`
        calls this before each read and write, on a new connection or a
        reused one)."""
        if sock is None or sock is self._sock:
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
                self._fire(self._ends_as)
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

    def wind_down(self, seconds: float) -> None:
        """The answer is whole; what is left (reading its end so the
        connection can be kept) may take `seconds` at most, after which the
        socket is shut as `wind_down`, not as the call's deadline."""
        with self._lock:
            ends = CLOCK.monotonic() + seconds
            if self.deadline is None or ends < self.deadline:
                self.deadline, self._ends_as = ends, "wind_down"

    def stop(self) -> None:
        with self._lock:
            self._finished.set()
