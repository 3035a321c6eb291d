"""Database timeouts sit below the heartbeat interval, so a dead connection or
a lock wait cannot hang a heartbeat past the lease (RELIABILITY §4)."""

import re
import runpy
from pathlib import Path

import pytest

SETTINGS = Path(__file__).resolve().parents[2] / "agentrt_site" / "settings.py"


@pytest.mark.parametrize("lease", [30, 12, 9])
def test_every_database_timeout_is_shorter_than_the_heartbeat_interval(monkeypatch, lease):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x")
    monkeypatch.setenv("AGENTRT_LEASE_SECONDS", str(lease))
    conf = runpy.run_path(str(SETTINGS))
    options = conf["DATABASES"]["default"]["OPTIONS"]
    heartbeat_ms = lease * 1000 / 3
    timeouts = {k: int(v) for k, v in re.findall(r"-c (\w+)=(\d+)", options["options"])}
    assert set(timeouts) == {"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}
    assert all(0 < ms < heartbeat_ms for ms in timeouts.values()), timeouts
    assert max(2, options["connect_timeout"]) * 1000 < heartbeat_ms  # libpq treats anything under 2 s as 2 s
    assert options["keepalives"] == 1 and options["keepalives_idle"] * 1000 < lease * 1000


def test_the_redis_channel_layer_reads_longer_than_its_blocking_receive(monkeypatch):
    """redis-py 8 reads with a 5 s socket timeout by default; the layer's
    receive blocks up to `brpop_timeout` (5 s) on BZPOPMIN, so with the default
    every quiet live socket was dropped (tests/security/test_live_sockets.py
    shows it against real daphne and Redis)."""
    from channels_redis.core import RedisChannelLayer
    from channels_redis.utils import create_pool

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/3")
    conf = runpy.run_path(str(SETTINGS))
    (host,) = conf["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"]
    pool = create_pool(host)  # what channels_redis builds from the host
    assert pool.connection_kwargs["socket_timeout"] > RedisChannelLayer.brpop_timeout
    assert pool.connection_kwargs["db"] == 3  # the URL is still the address


def test_a_redis_read_timeout_inside_the_blocking_receive_is_refused(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("AGENTRT_REDIS_SOCKET_TIMEOUT", "5")
    with pytest.raises(ImproperlyConfigured, match="AGENTRT_REDIS_SOCKET_TIMEOUT"):
        runpy.run_path(str(SETTINGS))
