"""Live sockets woken by PostgreSQL alone (no Redis, in-memory channel layer):
the statement that appends a run's events sends NOTIFY agentrt_live, and
each web process LISTENs on one connection of its own (runs/web/live_bell.py).

Every daphne here polls the events table only every 60 s
(AGENTRT_LIVE_POLL_SECONDS): a socket reads once when it opens, so a frame
that arrives well inside those 60 s was woken by a notification. A frame is
awaited for at most WITHIN seconds in all, far below the poll."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from websockets.sync.client import connect

from runs.clock import CLOCK
from runs.domain.writes import EventWrite
from runs.services import run_submit, tenant_create
from runs.services.lifecycle import run_cancel
from runs.store.events import record_events
from runs.store.live import CHANNEL, payload
from tests.conftest import start_daphne, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
POLL = 60
WITHIN = 40.0  # seconds a test waits for a frame in all: a 60 s poll cannot have delivered it
NO_REDIS = {"REDIS_URL": "", "AGENTRT_LIVE_PG_NOTIFY": "1"}


class Web:
    def __init__(self, tmp_path):
        env = subprocess_env(
            **NO_REDIS,
            AGENTRT_LIVE_POLL_SECONDS=POLL,
            AGENTRT_LOG_LEVEL="INFO",
            DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        )
        self.log_path = tmp_path / "daphne.log"
        self.log = open(self.log_path, "wb")
        self.port, self.proc = start_daphne(env, self.log)
        self.started = time.monotonic()

    def socket(self, cookie: str, path: str = "/ws/runs/"):
        return connect(
            f"ws://127.0.0.1:{self.port}{path}",
            origin=f"http://127.0.0.1:{self.port}",
            additional_headers={"Cookie": cookie},
            open_timeout=10,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def listener_backend(self) -> int | None:
        """The pid of the backend of this daphne's listener, once its LISTEN has run."""
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
                " AND (query LIKE 'LISTEN%%' OR query = 'SELECT 1')",
                [f"agentrt-live:{self.proc.pid}"],
            )
            row = cur.fetchone()
        return row[0] if row else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def web(settings, tmp_path):
    settings.AGENTRT_LIVE_PG_NOTIFY = True  # this process's commits notify, as a worker's and a web node's do
    w = Web(tmp_path)
    yield w
    w.stop()


def cookie_of(username: str) -> str:
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return f"sessionid={client.cookies['sessionid'].value}"


class Frames:
    """Frames read from one socket, each within what is left of WITHIN seconds."""

    def __init__(self, ws):
        self.ws = ws
        self.deadline = time.monotonic() + WITHIN

    def next(self) -> dict:
        left = self.deadline - time.monotonic()
        assert left > 0, "no frame within the time a notification takes (the poll is 60 s)"
        return json.loads(self.ws.recv(timeout=left))

    def until(self, pred) -> list[dict]:
        seen = []
        while True:
            frame = self.next()
            seen.append(frame)
            if pred(frame):
                return seen


def marker(run, name: str = "test.marker") -> int:
    with transaction.atomic(durable=True):
        (seq,) = record_events(
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            run_id=run.id,
            epoch=run.lease_epoch,
            events=[EventWrite(name, {}, CLOCK.now())],
        )
    return seq


def test_a_workers_commits_reach_the_run_socket_by_notify(web, cluster, load_agent, tenant):
    load_agent(
        turns=[
            {"tool_calls": [{"name": "echo", "arguments": {"text": "one"}}], "delay_ms": 200},
            {"tool_calls": [{"name": "echo", "arguments": {"text": "two"}}], "delay_ms": 200},
            {"text": "done"},
        ]
    )
    run, _ = run_submit(tenant=tenant, agent="bot", input="hello")  # queued: no worker yet
    with web.socket(cookie_of("alice"), f"/ws/runs/{run.id}/") as ws:
        frames = Frames(ws)
        assert frames.next()["type"] == "run.created"  # the read at open
        cluster(**NO_REDIS)  # a real qcluster (its own processes) drives the run now
        seen = frames.until(lambda f: f["type"] == "run.completed")
    types = [f["type"] for f in seen]
    assert types[0] == "run.claimed" and "tool.call.completed" in types, types
    sequences = [f["sequence"] for f in seen]
    assert sequences == list(range(2, 2 + len(seen)))  # every event once, in order


def test_the_listener_reconnects_after_its_backend_is_terminated(web, load_agent, submit):
    load_agent()
    run = submit()  # queued: nothing drives it, so the socket sees only what this test commits
    with web.socket(cookie_of("alice"), f"/ws/runs/{run.id}/") as ws:
        frames = Frames(ws)
        assert frames.next()["type"] == "run.created"
        first = wait_for(web.listener_backend, timeout=15, message="the listener's LISTEN")
        seq = marker(run)
        assert frames.next()["sequence"] == seq
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [first])
            assert cur.fetchone()[0] is True
        again = wait_for(
            lambda: (pid := web.listener_backend()) not in (None, first) and pid,
            timeout=20,
            message="a new listener backend",
        )
        assert again != first
        frames = Frames(ws)  # a fresh WITHIN: the wake-up after reconnecting, then a notification
        seq = marker(run)
        got = frames.next()
    assert got["sequence"] == seq
    assert "live listener: connection lost" in web.output() and "listening again" in web.output()


def test_a_tenants_list_socket_is_woken_for_each_status_change(web, cluster, load_agent, tenant):
    load_agent(turns=[{"text": "done", "delay_ms": 100}])
    with web.socket(cookie_of("alice")) as ws:
        frames = Frames(ws)
        run, _ = run_submit(tenant=tenant, agent="bot", input="hello")
        created = frames.next()
        assert (created["type"], created["run"], created["run_status"]) == ("run.created", str(run.id), "QUEUED")
        cluster(**NO_REDIS)
        seen = frames.until(lambda f: f["type"] == "run.completed")
    assert {f["run"] for f in seen} == {str(run.id)}
    assert seen[-1]["run_status"] == "COMPLETED"
    assert [f["type"] for f in seen][0] == "run.claimed"


def test_a_notification_naming_another_tenant_wakes_nothing_of_its_data(web, load_agent, tenant):
    """Bob's sockets are woken by a forged notification naming his tenant and
    his run while Alice's events are committed: they read the table under
    Bob's scope and send nothing of Alice's. Alice's own socket gets hers."""
    from runs.services import agent_load

    other, _ = tenant_create(name="globex", username="bob", password="pw")
    load_agent()
    agent_load(
        tenant=other,
        definition={
            "name": "bot",
            "instructions": "test agent",
            "model": {"provider": "scripted", "turns": [{"text": "done"}]},
            "tools": ["echo"],
        },
    )
    bobs, _ = run_submit(tenant=other, agent="bot", input="bob's")
    alice, bob = cookie_of("alice"), cookie_of("bob")
    with web.socket(alice) as alice_list, web.socket(bob) as bob_list:
        with web.socket(bob, f"/ws/runs/{bobs.id}/") as bob_run:
            bob_run_frames = Frames(bob_run)
            assert bob_run_frames.next()["type"] == "run.created"
            alices, _ = run_submit(tenant=tenant, agent="bot", input="alice's")
            with transaction.atomic(durable=True):  # the alice run's marker, notified as Bob's groups
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload(bobs.id, other.id)])
                    cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{other.id.hex}:{alices.id.hex}"])
                (marker_seq,) = record_events(
                    tenant_id=alices.tenant_id,
                    session_id=alices.session_id,
                    run_id=alices.id,
                    epoch=0,
                    events=[EventWrite("test.marker", {}, CLOCK.now())],
                )
            got = Frames(alice_list).next()
            assert (got["type"], got["run"]) == ("run.created", str(alices.id))  # notifications flow
            run_cancel(run=bobs, by="bob")  # Bob's own status change, after Alice's commits
            bob_first = Frames(bob_list).next()
            bob_next = bob_run_frames.next()
    # had a socket of Bob's read Alice's events, one of them would have come first
    assert (bob_first["run"], bob_first["type"]) == (str(bobs.id), "run.cancelled")
    assert bob_next["run"] == str(bobs.id) and bob_next["type"] != "test.marker", (bob_next, marker_seq)
