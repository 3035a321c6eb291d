"""Issue 10 item 8 against real servers: two daphne processes sharing Redis
(REDIS_URL) hold at most AGENTRT_WS_MAX_PER_USER sockets of one user between
them; a logout closes a live socket; a deep JSON frame is answered and closed
with no traceback in the server's log; a socket left quiet longer than the
Redis layer's blocking receive stays open and still gets the next event."""

from __future__ import annotations

import json
import uuid
from contextlib import ExitStack

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import start_daphne, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
REDIS = "redis://127.0.0.1:6379/0"


class Daphne:
    def __init__(self, env: dict, log_path):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.port, self.proc = start_daphne(env, self.log)

    def socket(self, cookie: str, path: str = "/ws/runs/"):
        try:
            return connect(
                f"ws://127.0.0.1:{self.port}{path}",
                origin=f"http://127.0.0.1:{self.port}",
                additional_headers={"Cookie": cookie},
                open_timeout=10,
            )
        except InvalidStatus as refusal:  # a refusal the test did not expect shows why
            refusal.add_note(f"daphne on {self.port}, the end of its log:\n{self.output()[-4000:]}")
            raise

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def servers(tmp_path):
    prefix = f"agentrt-test-{uuid.uuid4().hex}"  # this test's own keys in the shared Redis
    started: list[Daphne] = []

    def start(n: int) -> list[Daphne]:
        env = subprocess_env(REDIS_URL=REDIS, AGENTRT_CACHE_PREFIX=prefix, AGENTRT_LOG_LEVEL="INFO")
        started.extend(Daphne(env, tmp_path / f"daphne-{i}.log") for i in range(n))
        return started

    yield start
    for server in started:
        server.stop()
    import redis

    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.fixture
def session(tenant):
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    return client, f"sessionid={client.cookies['sessionid'].value}"


def refused(server, cookie) -> int:
    with pytest.raises(InvalidStatus) as caught:
        server.socket(cookie)
    return caught.value.response.status_code


def test_two_web_processes_share_one_cap_of_20_sockets_per_user(servers, session):
    a, b = servers(2)
    _, cookie = session
    with ExitStack() as stack:
        first = stack.enter_context(a.socket(cookie))
        for server in [a] * 9 + [b] * 10:
            stack.enter_context(server.socket(cookie))
        assert refused(a, cookie) == 403  # the 21st, on either process
        assert refused(b, cookie) == 403
        for server in (a, b):  # refused for the cap, not for anything else a 403 could mean
            wait_for(
                lambda s=server: "websocket refused (4429)" in s.output(), timeout=10, message="the refusal logged"
            )
        first.close()  # one closed on A frees a slot for B
        wait_for(lambda: _opens(stack, b, cookie), timeout=10, message="a freed slot")


def _opens(stack, server, cookie) -> bool:
    try:
        stack.enter_context(server.socket(cookie))
        return True
    except InvalidStatus:
        return False


def test_a_logout_closes_the_live_socket(servers, session):
    (server,) = servers(1)
    client, cookie = session
    with server.socket(cookie) as ws:
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1)  # open and quiet while the session lives
        client.logout()
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=10)
    assert caught.value.rcvd.code == 4401


def test_deep_json_gets_an_error_frame_and_no_traceback(servers, session):
    (server,) = servers(1)
    _, cookie = session
    with server.socket(cookie) as ws:
        ws.send("[" * 2000 + "]" * 2000)
        assert json.loads(ws.recv(timeout=10))["code"] == "invalid_frame"
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=10)
    assert caught.value.rcvd.code == 4400
    with server.socket(cookie) as ws:  # the server is fine
        ws.send(json.dumps({"type": "ping"}))
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1)
    log = server.output()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


def test_a_quiet_socket_outlives_the_redis_layers_blocking_receive(servers, session, load_agent, submit):
    """The consumer waits on the channel layer's receive, a BZPOPMIN of up to
    5 s; redis-py 8 reads with a 5 s socket timeout unless told otherwise, and
    the consumer died with "Timeout reading from 127.0.0.1:6379" after 5–7 s of
    quiet, closing the socket (reproduced against the plain-URL layer)."""
    from channels_redis.core import RedisChannelLayer
    from django.db import transaction

    from runs.clock import CLOCK
    from runs.domain.writes import EventWrite
    from runs.store.events import record_events

    (server,) = servers(1)
    _, cookie = session
    load_agent(turns=[{"text": "done"}])
    run = submit()  # queued: nothing drives it, so the socket sees only what this test commits
    with server.socket(cookie, f"/ws/runs/{run.id}/") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "run.created"  # the replay
        with pytest.raises(TimeoutError):  # quiet for a whole blocking receive and more, and still open
            ws.recv(timeout=RedisChannelLayer.brpop_timeout + 3)
        with transaction.atomic(durable=True):
            (seq,) = record_events(
                tenant_id=run.tenant_id,
                session_id=run.session_id,
                run_id=run.id,
                epoch=run.lease_epoch,
                events=[EventWrite("test.marker", {}, CLOCK.now())],
            )
        frame = json.loads(ws.recv(timeout=10))
    assert (frame["type"], frame["sequence"]) == ("test.marker", seq)
    assert "Timeout reading" not in server.output(), server.output()[-3000:]
