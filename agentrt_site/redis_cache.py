"""Django's Redis cache with one client per process instead of one per request.

Django keeps cache objects per execution context (asgiref's Local). Under
ASGI every request runs in a new context, so `RedisCache` built a new client
with its own connection pool for each request: a fresh TCP connection to
Redis for every throttled write (two round trips became a connect and two
round trips), left open until the garbage collector found the pool. Here the
client — and with it redis-py's thread-safe connection pool — is shared by
every `RedisCache` of the process with the same servers and options.
"""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache
from django.utils.functional import cached_property

_clients: dict[tuple, object] = {}
_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    @cached_property
    def _cache(self):
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
            return client
