"""Name resolution with a bound. `socket.getaddrinfo` has no timeout of its
own: it waits as long as the system's resolver does (its timeout times its
attempts times the name servers: half a minute and more when they do not
answer), and a socket timeout does not apply to it. The outbound paths that
promise a bound — the HTTP tools (a call that outlives its timeout becomes an
unknown outcome, though a lookup that never finished sent nothing) and the
webhook attempt (one deadline) — resolve here: the lookup runs on a daemon
thread of its own and the caller waits only as long as it may; the thread
ends when the system's resolver gives up, holding no connection.

Where a tenant or a model picks the URL (the HTTP tools, webhooks) the host
must be on an operator's allow-list, but a *name* on it answers with whatever
addresses its owner publishes, at each lookup (DNS rebinding): `routable`
drops the link-local ones — where the cloud metadata services answer with the
machine's credentials (169.254.169.254) — and the unspecified, multicast and
reserved ones, none of them a place a request to a named host belongs. An IP
literal on the list is the operator's own choice and is left as it is."""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

from runs.errors import AddressRefused


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


def _never_sent_to(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def routable(host: str, addresses: list[tuple]) -> list[tuple]:
    """`addresses` (getaddrinfo's tuples) that a request to `host` may go to:
    all of them for an IP literal; for a name, those that are not link-local,
    unspecified, multicast or reserved. AddressRefused when none is left."""
    if is_literal(host):
        return addresses
    kept = [a for a in addresses if not _never_sent_to(str(a[4][0]))]
    if not kept:
        shown = ", ".join(sorted({str(a[4][0]) for a in addresses}))
        raise AddressRefused(
            f"{host!r} resolves only to addresses requests are never sent to ({shown}: link-local, unspecified, "
            "multicast or reserved)"
        )
    return kept


def create_connection(
    address: tuple[str, int], timeout: float, source_address: tuple[str, int] | None = None, *, resolve_for: float
) -> socket.socket:
    """socket.create_connection, the lookup bounded by `resolve_for` seconds
    and its answer narrowed to `routable` addresses: each is then a literal,
    which create_connection resolves no further (http.client's
    `_create_connection` hook takes this)."""
    host, port = address
    last: OSError | None = None
    for *_, sockaddr in routable(host, resolve_within(host, port, resolve_for)):
        try:
            return socket.create_connection((sockaddr[0], port), timeout, source_address)
        except OSError as exc:
            last = exc
    raise last or OSError(f"no address for {host!r}")
