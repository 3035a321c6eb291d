"""Outbound addresses: which hosts the allow-lists name, which addresses a
request may go to, and name resolution with a bound.

**Allow-list entries.** `AGENTRT_HTTP_TOOL_ALLOWED_HOSTS` and
`AGENTRT_WEBHOOK_ALLOWED_HOSTS` hold `host` or `host:port` entries (an IPv6
literal in brackets: `[2001:db8::1]:8443`). `host:port` admits that port
only; a bare `host` admits ports 80 and 443 only (a URL without a port has its
scheme's). `listed` decides; `parse_entry` refuses an entry it cannot read
(settings name it at start).

**Addresses** (`address_class`). Every address, however it is written, falls
in one of three classes:

- *never*: link-local (`169.254.0.0/16`, `fe80::/10` — where the cloud
  metadata services answer with the machine's credentials), the metadata
  services outside it (`fd00:ec2::254` AWS over IPv6, `100.100.100.200`
  Alibaba, `192.0.0.192` Oracle), unspecified, multicast, reserved and
  broadcast. No request goes there, even to an IP literal the operator
  listed.
- *internal*: loopback, private (RFC 1918, ULA `fc00::/7`, site-local),
  shared (CGNAT `100.64.0.0/10`) and anything else not globally routable.
  A request goes there only when the allow-list names it explicitly: the
  URL's host is an IP literal (it matched a literal entry), or a name listed
  in `AGENTRT_OUTBOUND_INTERNAL_NAMES` as well (the operator's statement that
  this name is meant to reach an internal service).
- *public*: everything else.

An IPv6 address that carries an IPv4 one is judged by it too, the stricter
class winning: IPv4-mapped (`::ffff:169.254.169.254`), NAT64
(`64:ff9b::a9fe:a9fe`; the local-use `64:ff9b:1::/48` is internal at
least), 6to4 (`2002:a9fe:a9fe::`) and Teredo (both embedded addresses).

**Rebinding.** A *name* on an allow-list answers with whatever addresses its
owner publishes, at each lookup: `routable` keeps only those a request may go
to, before any connection opens, and each is then connected to as a literal.

**Bounded lookups.** `socket.getaddrinfo` has no timeout of its own: it waits
as long as the system's resolver does (its timeout times its attempts times
the name servers: half a minute and more when they do not answer), and a
socket timeout does not apply to it. The outbound paths that promise a bound
— the HTTP tools (a call that outlives its timeout becomes an unknown outcome,
though a lookup that never finished sent nothing) and the webhook attempt
(one deadline) — resolve here: the lookup runs on a daemon thread of its own
and the caller waits only as long as it may; the thread ends when the
system's resolver gives up, holding no connection."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterable
from typing import Any

from runs.errors import AddressRefused

NEVER, INTERNAL, PUBLIC = "never", "internal", "public"
_STRICTNESS = {PUBLIC: 0, INTERNAL: 1, NEVER: 2}
_REASON = {
    NEVER: "link-local, metadata, unspecified, multicast or reserved",
    INTERNAL: "loopback or private, and the name is not in AGENTRT_OUTBOUND_INTERNAL_NAMES",
}

METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT: not global, not "private" to the ipaddress module
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
DEFAULT_PORTS = (80, 443)  # what a bare `host` entry admits


def _own_class(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if ip in METADATA or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return NEVER
    if ip.is_loopback:  # before is_reserved: ::1 lies in the reserved ::/8
        return INTERNAL
    if ip.is_reserved or (isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255")):
        return NEVER
    if ip.is_private or not ip.is_global or ip in _SHARED:
        return INTERNAL
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return INTERNAL
    return PUBLIC


def _strictest(*classes: str) -> str:
    return max(classes, key=_STRICTNESS.__getitem__)


def address_class(address: str) -> str:
    """NEVER, INTERNAL or PUBLIC (see the module's docstring) for an address
    as getaddrinfo or a URL writes it (an IPv6 zone `%eth0` is ignored)."""
    ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        return _own_class(ip)
    if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d, sent over an IPv6 socket
        return _own_class(ip.ipv4_mapped)
    last32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:  # the translator sends it to a.b.c.d
        return _own_class(last32)
    classes = [_own_class(ip)]
    if ip in _NAT64_LOCAL:
        classes += [INTERNAL, _own_class(last32)]
    if ip.sixtofour is not None:
        classes.append(_own_class(ip.sixtofour))
    if ip.teredo is not None:
        classes += [_own_class(embedded) for embedded in ip.teredo]
    return _strictest(*classes)


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _normal_host(host: str) -> str:
    host = host.strip().lower()
    if is_literal(host):
        return ipaddress.ip_address(host.strip("[]")).compressed
    return host


def parse_entry(entry: str) -> tuple[str, int | None]:
    """An allow-list entry as (host, port or None). ValueError, naming the
    entry, when it is not `host`, `host:port`, `[v6]` or `[v6]:port`."""
    text = entry.strip()
    port_text: str | None = None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")) or not is_literal(host):
            raise ValueError(f"allow-list entry {entry!r}: an IPv6 literal is written [address] or [address]:port")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:  # a bare IPv6 literal: no port
        host = text
        if not is_literal(host):
            raise ValueError(f"allow-list entry {entry!r} is not a host, host:port or [IPv6]:port")
    else:
        host, sep, port_text_ = text.partition(":")
        port_text = port_text_ if sep else None
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(f"allow-list entry {entry!r} is not a host, host:port or [IPv6]:port")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"allow-list entry {entry!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    return _normal_host(host), port


def default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def listed(host: str, port: int, entries: Iterable[str]) -> bool:
    """Whether `host` (a URL's hostname) on `port` (its port, or its scheme's
    default) is admitted by one of `entries`: `host:port` for that port, a
    bare `host` for 80 and 443 only. An entry that does not parse admits
    nothing (the settings refuse it at start)."""
    host = _normal_host(host)
    for entry in entries:
        try:
            name, allowed_port = parse_entry(entry)
        except ValueError:
            continue
        if name == host and (port == allowed_port if allowed_port is not None else port in DEFAULT_PORTS):
            return True
    return False


def shown(host: str, port: int) -> str:
    """host:port as a message shows it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def refuse_literal(host: str) -> None:
    """AddressRefused when `host` is an IP literal no request goes to, even
    listed (link-local, metadata, unspecified, multicast, reserved)."""
    if is_literal(host) and address_class(host) == NEVER:
        raise AddressRefused(f"{host!r} is an address requests are never sent to ({_REASON[NEVER]})")


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


def routable(host: str, addresses: list[tuple], *, internal_names: Iterable[str] = ()) -> list[tuple]:
    """`addresses` (getaddrinfo's tuples for `host`, which an allow-list
    admitted) that a request may go to: never a *never* address; an
    *internal* one only when `host` is an IP literal (listed as written) or a
    name in `internal_names` (AGENTRT_OUTBOUND_INTERNAL_NAMES); every public
    one. AddressRefused, naming what was dropped and why, when none is left."""
    internal_ok = is_literal(host) or _normal_host(host) in {_normal_host(n) for n in internal_names}
    kept, dropped = [], []
    for a in addresses:
        address = str(a[4][0])
        cls = address_class(address)
        if cls == PUBLIC or (cls == INTERNAL and internal_ok):
            kept.append(a)
        else:
            dropped.append(f"{address}: {_REASON[cls]}")
    if not kept:
        raise AddressRefused(
            f"{host!r} resolves only to addresses requests are never sent to ({'; '.join(sorted(set(dropped)))})"
        )
    return kept


def create_connection(
    address: tuple[str, int],
    timeout: float,
    source_address: tuple[str, int] | None = None,
    *,
    resolve_for: float,
    internal_names: Iterable[str] = (),
) -> socket.socket:
    """socket.create_connection, the lookup bounded by `resolve_for` seconds
    and its answer narrowed to `routable` addresses: each is then a literal,
    which create_connection resolves no further (http.client's
    `_create_connection` hook takes this)."""
    host, port = address
    last: OSError | None = None
    for *_, sockaddr in routable(host, resolve_within(host, port, resolve_for), internal_names=internal_names):
        try:
            return socket.create_connection((sockaddr[0], port), timeout, source_address)
        except OSError as exc:
            last = exc
    raise last or OSError(f"no address for {host!r}")
