"""The web server keeps its connections (issue 16 item 4, submit latency).

Under ASGI Django keeps database connections and cache clients per request
context, so with persistent connections (CONN_MAX_AGE) and Django's own
RedisCache a real daphne opened a new PostgreSQL connection and a new Redis
connection for every request (the throttle reads and writes the cache on
each write) — on a quiet host about a third of a REST submit's time before
its transaction. The web process now takes PostgreSQL connections from a
pool (agentrt_site/serving.py) and shares one Redis client
(agentrt_site/redis_cache.py). Counted from the servers' side:
`pg_stat_database.sessions` of the test's own database, and the connections
a relay in front of Redis accepts (Redis's own counter is the whole
server's: another test's processes, on another xdist worker, connect to it
meanwhile)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
import uuid

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection
from knox.models import AuthToken

from tests.conftest import start_daphne, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
REDIS = "redis://127.0.0.1:6379/0"
REQUESTS = 20
POOL = 2


def _sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _web_backends(app: str) -> int:
    """The web process's backends: its connections carry PGAPPNAME as their application_name."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [app],
        )
        return cursor.fetchone()[0]


def _web_env(**extra) -> tuple[dict, str]:
    app = f"agentrt-web-test-{uuid.uuid4().hex[:12]}"
    return subprocess_env(PGAPPNAME=app, AGENTRT_DB_POOL_SIZE=POOL, **extra), app


class CountingRelay:
    """A TCP relay to Redis that counts the connections made through it."""

    def __init__(self, target=("127.0.0.1", 6379)):
        self.target = target
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def _post(port: int, token: str, i: int) -> int:
    body = json.dumps({"agent": "bot", "input": f"request {i}"}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/runs/",
        data=body,
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def test_the_web_process_reuses_its_postgresql_and_redis_connections(tenant, load_agent, tmp_path):
    load_agent()
    token = AuthToken.objects.create(user=get_user_model().objects.get(username="alice"))[1]
    prefix = f"agentrt-test-{uuid.uuid4().hex}"
    relay = CountingRelay()
    sessions_before = _sessions()

    env, app = _web_env(REDIS_URL=relay.url, AGENTRT_CACHE_PREFIX=prefix)
    with open(tmp_path / "daphne.log", "wb") as log:
        port, proc = start_daphne(env, log)
        try:
            statuses = [_post(port, token, i) for i in range(REQUESTS)]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            relay.close()
    assert statuses == [201] * REQUESTS  # every write went through the throttle, so through the cache
    # Each backend reports its session by the time it exits: wait for daphne's to go.
    wait_for(lambda: _web_backends(app) == 0, timeout=30, message="daphne's backends to exit")
    opened = _sessions() - sessions_before
    redis_opened = relay.accepted
    r = redis.Redis.from_url(REDIS)
    for key in r.scan_iter(f"{prefix}:*"):
        r.delete(key)

    # One per request before (20 and more); now at most the pool's size (+1: this test's own
    # connection may report its session late, inside the window). Counted for the database,
    # so a process another test left connected must not connect anew meanwhile: none does.
    assert 1 <= opened <= POOL + 1, f"daphne opened {opened} PostgreSQL connections for {REQUESTS} requests"
    assert 1 <= redis_opened <= 2, f"daphne opened {redis_opened} Redis connections for {REQUESTS} requests"


def _get(port: int, token: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/runs/", headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_pooled_connection_the_server_dropped_costs_no_request_an_error(tenant, tmp_path):
    """The pool checks a connection before lending it: after the server ends
    every backend of the web process (a restart, an operator's
    pg_terminate_backend, a failover), the next requests still answer."""
    token = AuthToken.objects.create(user=get_user_model().objects.get(username="alice"))[1]
    env, app = _web_env()
    with open(tmp_path / "daphne.log", "wb") as log:
        port, proc = start_daphne(env, log)
        try:
            assert [_get(port, token) for _ in range(3)] == [200] * 3
            wait_for(lambda: _web_backends(app) >= 1, timeout=10, message="the pool's connection")
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    [app],
                )
                assert cursor.fetchone()[0] >= 1
            wait_for(lambda: _web_backends(app) == 0, timeout=10, message="the terminated backends to go")
            assert [_get(port, token) for _ in range(POOL + 1)] == [200] * (POOL + 1)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
