"""Login throttling behind a proxy: whose address a login
comes from, and when django-axes locks it.

**The client's address.** The web nodes run daphne without `--proxy-headers`
(deploy/systemd/agentrt-web@.service), so `REMOTE_ADDR` is the TCP peer.
`X-Forwarded-For` is believed only when that peer is one of
`AGENTRT_TRUSTED_PROXIES` (addresses or networks, comma-separated; empty by
default: the header is never believed). Then the client is the right-most
hop that is not itself a trusted proxy: the documented nginx overwrites the
header with `$remote_addr` (one hop), and a proxy that appends
(`$proxy_add_x_forwarded_for`) puts the real peer right-most too, so what a
client wrote to the left of it is never read.

**When a login is refused** (`LoginThrottle`, axes' database handler with
three limits instead of one; failures are counted per (username, address)
row as before, within `AGENTRT_LOGIN_COOLOFF_HOURS`):

- the pair: `AGENTRT_LOGIN_FAILURE_LIMIT` (5) failures for one username from
  one address lock that pair (unchanged);
- the address: `AGENTRT_LOGIN_IP_FAILURE_LIMIT` (20) failures from one
  address, over any usernames, lock that address — one password sprayed
  over many usernames;
- the username: `AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT` (50) failures for one
  username, each address counting at most the pair limit, lock that
  username everywhere — guesses spread over many addresses. One client
  alone never locks a user out from elsewhere (while this limit is above
  the pair's): it adds at most the pair limit to the username's count, so
  it needs limit ÷ pair limit addresses.

0 turns the address or the username limit off.

A successful login forgives its own pair's failures only (axes'
`AXES_RESET_ON_SUCCESS` over `AXES_LOCKOUT_PARAMETERS`, the pair), so an
attacker who logs in to an account of its own does not reset its address's
count.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum, Value
from django.db.models.functions import Least

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str | None) -> Address | None:
    try:
        address = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped  # a dual-stack socket's ::ffff:a.b.c.d is a.b.c.d
    return address


@lru_cache(maxsize=8)
def _trusted_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)  # checked by the settings


def _is_trusted(address: Address) -> bool:
    return any(address in network for network in _trusted_networks(tuple(settings.AGENTRT_TRUSTED_PROXIES)))


def client_ip(request) -> str | None:
    """The login's client address (`AXES_CLIENT_IP_CALLABLE`): the TCP peer, or,
    when the peer is a trusted proxy, the right-most untrusted hop of its
    `X-Forwarded-For` (the peer itself when the header names no valid one)."""
    peer = _address(request.META.get("REMOTE_ADDR"))
    if peer is None:
        return None
    if not _is_trusted(peer):
        return str(peer)
    hops = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return str(peer)  # a hop the proxy did not write as an address: believe nothing left of it
        if not _is_trusted(address):
            return str(address)
    return str(peer)  # only trusted proxies (or no header): the login comes from the proxy's own host


class LoginThrottle(AxesDatabaseHandler):
    """axes' database handler, locked by the pair, the address or the username (see the module)."""

    def get_failures(self, request, credentials: dict | None = None) -> int:
        pair_limit = get_failure_limit(request, credentials)
        pair = super().get_failures(request, credentials)  # AXES_LOCKOUT_PARAMETERS: (username, address)
        if pair >= pair_limit:
            return pair
        attempts = AccessAttempt.objects.all()
        if settings.AXES_COOLOFF_TIME is not None:
            attempts = attempts.filter(attempt_time__gte=get_cool_off_threshold(request))
        address = getattr(request, "axes_ip_address", None)
        address_limit = settings.AGENTRT_LOGIN_IP_FAILURE_LIMIT
        if address is not None and address_limit > 0:
            total = attempts.filter(ip_address=address).aggregate(n=Sum("failures_since_start"))["n"] or 0
            if total >= address_limit:
                return pair_limit
        username = get_client_username(request, credentials)
        username_limit = settings.AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT
        if username is not None and username_limit > 0:
            per_address = (
                attempts.filter(username=username)
                .values("ip_address")
                .annotate(n=Least(Sum("failures_since_start"), Value(pair_limit)))
            )
            total = per_address.aggregate(total=Sum("n"))["total"] or 0
            if total >= username_limit:
                return pair_limit
        return pair
