"""One deadline for a whole webhook attempt (AGENTRT_WEBHOOK_TIMEOUT_SECONDS).

A socket timeout bounds one wait for bytes, not an attempt: a receiver that
trickles its answer a byte at a time never lets one read time out, and could
keep an attempt going past its delivery's claim (AGENTRT_DELIVERY_CLAIM_SECONDS),
when another worker may take the delivery and send it again while the first
is still in flight. So the attempt's network I/O goes through this backend
for httpcore (the engine under httpx): every connect, TLS handshake, read and
write gets as timeout what is left of one deadline taken when the attempt
starts, and fails with httpcore's own timeout error once nothing is left.
Each of those calls waits at most the time left (a write is split into
pieces a socket accepts in one send), so the attempt ends by the deadline.
Name resolution has no timeout in the standard library (getaddrinfo waits as
long as the system's resolver does: tens of seconds for a name server that
does not answer); it runs on a daemon thread of its own, and the attempt
waits for it only as long as the deadline leaves (`resolve`). The claim is
still longer than the timeout, with room to spare.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpcore
from django.conf import settings

from runs.clock import CLOCK
from runs.errors import AddressRefused
from runs.net import resolve_within, routable

# At most this many bytes per send(): a socket reported writable has at least this much room (Linux: half its
# send buffer, whose minimum is 4608 bytes), so each send() completes in the one wait the time left allows.
WRITE_PIECE = 2048


class Deadline:
    """`seconds` from now, on the monotonic clock."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = CLOCK.monotonic() + seconds

    def left(self, error: type[Exception] = httpcore.ReadTimeout, asked: float | None = None) -> float:
        """What is left (at most `asked`); `error` once nothing is."""
        left = self.at - CLOCK.monotonic()
        if left <= 0:
            raise error(f"the attempt's {self.seconds:g} s ran out")
        return left if asked is None else min(asked, left)

    def passed(self) -> bool:
        return CLOCK.monotonic() >= self.at

    def timeouts(self) -> dict[str, float]:
        """httpcore's per-request timeouts: none larger than what is left."""
        left = self.left(httpcore.PoolTimeout)
        return {"connect": left, "read": left, "write": left, "pool": left}


def resolve(host: str, port: int, deadline: Deadline, asked: float | None = None) -> list:
    """getaddrinfo(host, port) for TCP, waited for at most what `deadline`
    leaves, and only the addresses a request may go to (runs.net.routable):
    httpcore's ConnectTimeout after that, ConnectError when the name does not
    resolve or only to addresses it may not go to."""
    try:
        addresses = resolve_within(host, port, deadline.left(httpcore.ConnectTimeout, asked))
        return routable(host, addresses, internal_names=settings.AGENTRT_OUTBOUND_INTERNAL_NAMES)
    except AddressRefused as exc:
        raise httpcore.ConnectError(str(exc)) from exc
    except OSError as exc:
        if deadline.passed():
            raise httpcore.ConnectTimeout(
                f"resolving {host!r} took longer than the attempt's {deadline.seconds:g} s"
            ) from exc
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc


class DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline):
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(httpcore.ReadTimeout, timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        for start in range(0, len(view), WRITE_PIECE):
            self._inner.write(
                bytes(view[start : start + WRITE_PIECE]), self._deadline.left(httpcore.WriteTimeout, timeout)
            )

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        # The handshake is one call of the ssl module, bounded as a whole by the socket timeout it is given.
        left = self._deadline.left(httpcore.ConnectTimeout, timeout)
        return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's synchronous backend, every wait bounded by `deadline`."""

    def __init__(self, deadline: Deadline):
        self._deadline = deadline
        self._sync = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        # socket.create_connection would give each resolved address the whole timeout; here they share the deadline.
        addresses = resolve(host, port, self._deadline, timeout)
        last: Exception | None = None
        for *_, address in addresses:  # each address a literal: create_connection resolves nothing more
            left = self._deadline.left(httpcore.ConnectTimeout, timeout)
            try:
                stream = self._sync.connect_tcp(str(address[0]), port, left, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
            else:
                return DeadlineStream(stream, self._deadline)
        raise last or httpcore.ConnectError(f"no address for {host!r}")

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None):
        raise httpcore.ConnectError("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:
        self._sync.sleep(seconds)
