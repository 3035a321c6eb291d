"""The worker process's HTTP connections to model servers, kept open between
attempts.

A fresh connection per model attempt costs a TCP handshake and, against a
real provider, a TLS handshake before every call: a round trip or two and
the certificate checks, each step. Here one `httpx.Client` per process keeps
up to `MAX_IDLE` idle connections for `AGENTRT_MODEL_KEEPALIVE_SECONDS`
(0: a fresh connection per attempt, as before).

The attempt's watchdog (`watchdog.Watchdog`) must still be able to shut the
socket of whichever connection the attempt is using, new or reused, before
any byte of the answer came: every connection's network stream is wrapped
(`_Watched`), and each read and write tells the watchdog attached to the
calling thread (`attached`) which socket it is on. A watchdog is stopped
before its attempt's response is closed, so it never touches a connection
after it went back to the pool; a connection it did shut down reads as
closed and the pool drops it instead of lending it again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
from django.conf import settings

from runs.clock import CLOCK
from runs.net import resolve_within

MAX_IDLE = 8  # idle connections kept per process, across every model server
RESOLVE_WITHOUT_TIMEOUT = 30.0  # the lookup's bound when a connection is opened with no connect timeout

_here = threading.local()
_lock = threading.Lock()
_client: httpx.Client | None = None
_client_expiry: float | None = None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS client context for model calls. `httpx.Client()`
    builds a new one unless it is given one, loading the whole CA bundle each
    time: 20-50 ms of CPU. A client context can be shared by every connection
    and thread; each connection still verifies its server's certificate.
    Built as httpx builds it (SSL_CERT_FILE / SSL_CERT_DIR, else certifi),
    once, at the first call."""
    return httpx.create_ssl_context()


@contextlib.contextmanager
def attached(watchdog: Any) -> Iterator[None]:
    """Tell `watchdog` the socket of every read and write this thread makes on
    a model connection until the block ends."""
    _here.watchdog = watchdog
    try:
        yield
    finally:
        _here.watchdog = None


def _tell(stream: httpcore.NetworkStream) -> None:
    watchdog = getattr(_here, "watchdog", None)
    if watchdog is not None:
        watchdog.learn(stream.get_extra_info("socket"))


class _Watched(httpcore.NetworkStream):
    """A connection's network stream that names its socket to the calling
    thread's watchdog before each read and write."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        _tell(self._inner)
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _tell(self._inner)
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        _tell(self._inner)  # the handshake reads and writes on this socket
        return _Watched(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _WatchedBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        """The lookup shares the connect timeout (runs.net: getaddrinfo has
        none, and no socket exists yet for the watchdog to shut); each
        resolved address is then connected to as a literal, with what is left."""
        bound = RESOLVE_WITHOUT_TIMEOUT if timeout is None else timeout
        started = CLOCK.monotonic()
        try:
            addresses = resolve_within(host, port, bound)
        except OSError as exc:
            if CLOCK.monotonic() - started >= bound:
                raise httpcore.ConnectTimeout(f"resolving {host!r} took longer than {bound:g} s") from exc
            raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        last: Exception | None = None
        for *_, address in addresses:
            left = None if timeout is None else timeout - (CLOCK.monotonic() - started)
            if left is not None and left <= 0:
                raise httpcore.ConnectTimeout(f"connecting to {host!r} took longer than {timeout:g} s")
            try:
                inner = self._inner.connect_tcp(str(address[0]), port, left, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
            else:
                return _Watched(inner)
        raise last or httpcore.ConnectError(f"no address for {host!r}")

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _Watched(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def watch(transport: Any) -> None:
    """Wrap the network backend of an httpx transport's connection pool (a
    direct one or a proxy's: httpx 0.28 keeps it in `_pool`, httpcore 1.0
    reads `_network_backend` whenever it opens a connection). Raises if
    either is missing, so an upgrade that moves them fails loudly here
    rather than leaving a connection the watchdog cannot reach."""
    pool = transport._pool
    backend = pool._network_backend
    if not isinstance(backend, _WatchedBackend):
        pool._network_backend = _WatchedBackend(backend)


def build(keepalive_seconds: float) -> httpx.Client:
    """A client whose every transport (the direct one and any proxy from the
    environment) is watched."""
    client = httpx.Client(
        verify=tls_context(),
        limits=httpx.Limits(
            max_keepalive_connections=MAX_IDLE if keepalive_seconds > 0 else 0,
            keepalive_expiry=keepalive_seconds if keepalive_seconds > 0 else None,
        ),
        follow_redirects=False,
    )
    for transport in (client._transport, *client._mounts.values()):
        if transport is not None:
            watch(transport)
    return client


def client() -> httpx.Client:
    """The process's client for model calls (built at first use, and again if
    the keep-alive setting changed)."""
    global _client, _client_expiry
    expiry = float(settings.AGENTRT_MODEL_KEEPALIVE_SECONDS)
    with _lock:
        if _client is None or _client_expiry != expiry:
            old, _client, _client_expiry = _client, build(expiry), expiry
            if old is not None:
                old.close()
        return _client


def _forget() -> None:
    """In a forked child (django-q2 forks its workers): the parent's
    connections are the parent's; the child opens its own."""
    global _client, _lock
    _client = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget)
