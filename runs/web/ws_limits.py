"""Open WebSockets per user, capped at AGENTRT_WS_MAX_PER_USER.

With REDIS_URL the count is shared by every web process: one sorted set per
user in Redis, a member per socket (its channel name) scored by a lease
expiry that the socket renews while open, so a process that dies without
closing its sockets frees their slots after WS_LEASE_SECONDS. Without Redis
(the embedded default: one web process) the count is this process's own.
"""

from __future__ import annotations

import asyncio
import os

from django.conf import settings

from runs.clock import CLOCK

WS_LEASE_SECONDS = 60.0
RENEW_EVERY_SECONDS = 15.0

# Atomic admit: drop expired leases, refuse at the cap, else add this socket.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) == false and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

_local: dict[str, dict[str, float]] = {}
_clients: dict[int, object] = {}


def _redis_url() -> str:
    return settings.AGENTRT_REDIS_URL


def _client():
    """One client per event loop (a redis.asyncio connection belongs to its loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        import redis.asyncio

        _clients.clear()  # daphne runs one loop; an old loop's client is dead
        client = _clients[id(loop)] = redis.asyncio.Redis.from_url(_redis_url())
    return client


def _key(user_id) -> str:
    # Deployments (or test databases) sharing one Redis keep their counts apart.
    prefix = os.environ.get("AGENTRT_CACHE_PREFIX") or f"agentrt:{settings.DATABASES['default']['NAME']}"
    return f"{prefix}:ws:user:{user_id}"


async def ws_admit(user_id, socket: str) -> bool:
    """Take a slot for this socket; False when the user is at the cap."""
    cap = settings.AGENTRT_WS_MAX_PER_USER
    now = CLOCK.now().timestamp()
    if _redis_url():
        ok = await _client().eval(
            _ADMIT, 1, _key(user_id), now, cap, socket, now + WS_LEASE_SECONDS, int(WS_LEASE_SECONDS) + 1
        )
        return bool(ok)
    mine = _local.setdefault(str(user_id), {})
    if socket not in mine and len(mine) >= cap:
        return False
    mine[socket] = now + WS_LEASE_SECONDS
    return True


async def ws_renew(user_id, socket: str) -> None:
    if _redis_url():
        await _client().zadd(_key(user_id), {socket: CLOCK.now().timestamp() + WS_LEASE_SECONDS}, xx=True)


async def ws_release(user_id, socket: str) -> None:
    if _redis_url():
        await _client().zrem(_key(user_id), socket)
        return
    mine = _local.get(str(user_id))
    if mine is not None:
        mine.pop(socket, None)
        if not mine:
            _local.pop(str(user_id), None)
