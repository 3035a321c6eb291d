"""WebSocket streams (DESIGN §14): replay from the table, then live, in order,
exactly once — also across reconnects while events are being written."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection, connections, transaction
from django.test import Client

from agentrt_site.asgi import application
from runs.clock import CLOCK
from runs.domain.writes import EventWrite
from runs.models import Event
from runs.runtime.executor import run_drive
from runs.services import tenant_create
from runs.store.events import append_events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")  # the origin check compares the Origin with the server's own (Host)


def cookie_for(user) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def connect(path, *headers):
    comm = WebsocketCommunicator(application, path, headers=[HOST, ORIGIN, *headers])
    ok, _ = await comm.connect(timeout=5)
    return comm, ok


@pytest.fixture
def finished_run(load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]}, {"text": "done"}])
    run = submit()
    run_drive(run_id=run.id)
    return run


@pytest.fixture
def alice(tenant):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="alice")


async def test_replay_after_n_then_nothing_more(finished_run, alice):
    seqs = await sync_to_async(
        lambda: list(Event.objects.filter(run=finished_run).order_by("sequence").values_list("sequence", flat=True))
    )()
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/?after=3", await sync_to_async(cookie_for)(alice))
    assert ok
    got = [(await comm.receive_json_from(timeout=5))["sequence"] for _ in range(len(seqs) - 3)]
    assert got == [s for s in seqs if s > 3]
    # "nothing more" as a condition, not a quiet interval: write one marker event; the very next frame must be it
    # (a repeated or extra frame after the replay would arrive first)
    marker = await sync_to_async(_append_marker)(finished_run)
    nxt = await comm.receive_json_from(timeout=10)
    assert (nxt["sequence"], nxt["type"]) == (marker, "test.marker") and marker == seqs[-1] + 1
    await comm.disconnect()


def _append_marker(run) -> int:
    with transaction.atomic():
        with connection.cursor() as cur:
            append_events(
                cur,
                tenant_id=run.tenant_id,
                session_id=run.session_id,
                run_id=run.id,
                epoch=0,
                events=[EventWrite("test.marker", {}, CLOCK.now())],
            )
    return Event.objects.filter(run=run, type="test.marker").values_list("sequence", flat=True).get()


async def test_frames_are_the_rest_event_shape(finished_run, alice):
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/", await sync_to_async(cookie_for)(alice))
    frame = await comm.receive_json_from(timeout=5)
    assert set(frame) == {"sequence", "type", "run", "payload", "occurred_at"} and frame["type"] == "run.created"
    await comm.disconnect()


async def test_anonymous_other_tenant_and_foreign_origin_sockets_are_refused(finished_run):
    _, other = await sync_to_async(tenant_create)(name="globex", username="mallory", password="pw")
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/")
    assert not ok
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/", await sync_to_async(cookie_for)(other))
    assert not ok
    comm, ok = await connect("/ws/runs/")
    assert not ok


@pytest.mark.parametrize("credential", ["session cookie", "token"])
async def test_a_foreign_origin_is_refused_even_with_valid_credentials(finished_run, alice, credential):
    """Cross-site WebSocket hijacking: a page on another site opens the socket
    with the victim's credentials. The credentials are valid (the same socket
    from our own origin is accepted), so only the origin check can refuse it."""
    from knox.models import AuthToken

    if credential == "token":
        key = await sync_to_async(lambda: AuthToken.objects.create(user=alice)[1])()
        auth = (b"authorization", f"Token {key}".encode())
    else:
        auth = await sync_to_async(cookie_for)(alice)
    path = f"/ws/runs/{finished_run.id}/?after=0"
    comm, ok = await connect(path, auth)  # our origin: accepted, and it streams
    assert ok
    assert (await comm.receive_json_from(timeout=5))["sequence"] == 1
    await comm.disconnect()
    for origin in (
        b"http://evil.example",
        b"http://localhost.evil.example",
        b"null",
        b"http://localhost:8000",  # the same host, another port (issue 34 item 7c)
        b"https://localhost",  # the same host, another scheme
    ):
        bad = WebsocketCommunicator(application, path, headers=[HOST, (b"origin", origin), auth])
        ok, _ = await bad.connect(timeout=5)
        assert not ok, f"a socket from origin {origin!r} with a valid {credential} was accepted"


async def test_token_authentication_in_the_handshake(finished_run, alice):
    from knox.models import AuthToken

    token = await sync_to_async(lambda: AuthToken.objects.create(user=alice)[1])()
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/?after=0", (b"authorization", f"Token {token}".encode()))
    assert ok
    assert (await comm.receive_json_from(timeout=5))["sequence"] == 1
    await comm.disconnect()
    comm, ok = await connect(f"/ws/runs/{finished_run.id}/", (b"authorization", b"Token not-a-token"))
    assert not ok


def _writer(run, n, started: threading.Event):
    started.set()
    try:
        for i in range(n):
            with transaction.atomic():
                with connection.cursor() as cur:
                    append_events(
                        cur,
                        tenant_id=run.tenant_id,
                        session_id=run.session_id,
                        run_id=run.id,
                        epoch=0,
                        events=[EventWrite("test.tick", {"i": i}, CLOCK.now())],
                    )
    finally:
        connections.close_all()


async def test_a_reconnect_with_the_last_sequence_gets_every_event_exactly_once_while_events_are_written(
    finished_run, alice
):
    cookie = await sync_to_async(cookie_for)(alice)
    base = await sync_to_async(lambda: Event.objects.filter(run=finished_run).count())()
    total = base + 150
    started = threading.Event()
    writer = threading.Thread(target=_writer, args=(finished_run, 150, started))
    received: list[int] = []
    last = 0
    writer.start()
    started.wait()
    rounds = 0
    while len(received) < total and rounds < 50:
        rounds += 1
        comm, ok = await connect(f"/ws/runs/{finished_run.id}/?after={last}", cookie)
        assert ok
        for _ in range(17):  # drop the socket every few frames
            try:
                frame = await comm.receive_json_from(timeout=3)
            except TimeoutError:
                break
            received.append(frame["sequence"])
            last = frame["sequence"]
            if len(received) >= total:
                break
        await comm.disconnect()
    writer.join()
    assert len(received) == total
    assert received == sorted(set(received)) == list(range(1, total + 1))


async def test_the_runs_stream_reports_status_changes_of_the_tenant_only(load_agent, submit, alice):
    await sync_to_async(load_agent)(turns=[{"text": "hi"}])
    comm, ok = await connect("/ws/runs/", await sync_to_async(cookie_for)(alice))
    assert ok
    run = await sync_to_async(submit)()
    frame = await comm.receive_json_from(timeout=5)
    assert frame["type"] == "run.created" and frame["run"] == str(run.id) and frame["run_status"] == "QUEUED"
    await sync_to_async(run_drive)(run_id=run.id)
    types = []
    while "run.completed" not in types:
        types.append((await comm.receive_json_from(timeout=5))["type"])
    assert types[0] == "run.claimed"
    await comm.disconnect()
