"""Name resolution with a bound. `socket.getaddrinfo` has no timeout of its
own: it waits as long as the system's resolver does (its timeout times its
attempts times the name servers: half a minute and more when they do not
answer), and a socket timeout does not apply to it. The outbound paths that
promise a bound — the HTTP tools (a call that outlives its timeout becomes an
unknown outcome, though a lookup that never finished sent nothing) and the
webhook attempt (one deadline) — resolve here: the lookup runs on a daemon
thread of its own and the caller waits only as long as it may; the thread
ends when the system's resolver gives up, holding no connection."""

from __future__ import annotations

import socket
import threading
from typing import Any


def resolve_within(host: str, port: int | None, seconds: float) -> list[tuple]:
    """getaddrinfo(host, port) for TCP, waited for at most `seconds`.

    Raises socket.gaierror as getaddrinfo does, and a gaierror EAI_AGAIN (the
    system's own word for a name server that did not answer in time) once
    `seconds` have passed without an answer."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def lookup() -> None:
        try:
            outcome["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=lookup, name="resolve", daemon=True).start()
    if not done.wait(max(0.0, seconds)):
        raise socket.gaierror(socket.EAI_AGAIN, f"resolving {host!r} took longer than {seconds:.3g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["addresses"]


def create_connection(
    address: tuple[str, int], timeout: float, source_address: tuple[str, int] | None = None, *, resolve_for: float
) -> socket.socket:
    """socket.create_connection, the lookup bounded by `resolve_for` seconds:
    each resolved address is then a literal, which create_connection resolves
    no further (http.client's `_create_connection` hook takes this)."""
    host, port = address
    last: OSError | None = None
    for *_, sockaddr in resolve_within(host, port, resolve_for):
        try:
            return socket.create_connection((sockaddr[0], port), timeout, source_address)
        except OSError as exc:
            last = exc
    raise last or OSError(f"no address for {host!r}")
