"""Issue 10 item 8, sockets: at most AGENTRT_WS_MAX_PER_USER per user (the
21st is refused; counted in Redis across processes when REDIS_URL is set), a
socket closes within a poll period of logout, token revocation or losing the
membership, and inbound frames are bounded and depth-limited without a
traceback."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from agentrt_site.asgi import application
from runs.models import Membership
from runs.web import ws_limits
from tests.conftest import ROOT, subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")  # the origin check compares the Origin with the server's own (Host)


def logged_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def cookie(client: Client) -> tuple[bytes, bytes]:
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def connect(*headers, path="/ws/runs/"):
    comm = WebsocketCommunicator(application, path, headers=[HOST, ORIGIN, *headers])
    ok, code = await comm.connect(timeout=5)
    return comm, ok, code


async def closed_with(comm, timeout=3.0):
    """The next output is the server closing the socket: return its code."""
    while True:
        message = await comm.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message.get("code")


@pytest.fixture
def alice(tenant):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="alice")


async def test_the_21st_socket_of_a_user_is_refused_and_a_closed_one_frees_its_slot(alice, settings):
    assert settings.AGENTRT_WS_MAX_PER_USER == 20
    header = cookie(await sync_to_async(logged_in_client)(alice))
    open_ = []
    for _ in range(20):
        comm, ok, _ = await connect(header)
        assert ok
        open_.append(comm)
    extra, ok, code = await connect(header)
    assert not ok and code == 4429
    await open_.pop().disconnect()
    again, ok, _ = await connect(header)
    assert ok
    for comm in [*open_, again]:
        await comm.disconnect()


async def test_in_redis_the_cap_is_shared_by_every_web_process(alice, settings):
    """With REDIS_URL each socket holds a lease in one sorted set per user: 20
    taken here leave none for another process."""
    settings.AGENTRT_REDIS_URL = "redis://127.0.0.1:6379/0"
    sockets = [f"test-socket-{i}" for i in range(20)]
    try:
        for name in sockets:
            assert await ws_limits.ws_admit(alice.pk, name)
        assert not await ws_limits.ws_admit(alice.pk, "one-too-many")
        other = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-c",
                "import asyncio, os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
                "'agentrt_site.settings'); django.setup(); from runs.web.ws_limits import ws_admit; "
                f"print(asyncio.run(ws_admit({alice.pk}, 'from-another-process')))",
            ],
            cwd=ROOT,
            env=subprocess_env(
                REDIS_URL="redis://127.0.0.1:6379/0", AGENTRT_CACHE_PREFIX=ws_limits._key(alice.pk).split(":ws:")[0]
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.stdout.strip() == "False", other.stderr[-800:]
        await ws_limits.ws_release(alice.pk, sockets[0])
        assert await ws_limits.ws_admit(alice.pk, "after-release")
    finally:
        client = ws_limits._client()
        await client.delete(ws_limits._key(alice.pk))
        await client.aclose()
        ws_limits._clients.clear()


async def test_a_logged_out_sessions_socket_is_closed(alice):
    client = await sync_to_async(logged_in_client)(alice)
    comm, ok, _ = await connect(cookie(client))
    assert ok
    assert await comm.receive_nothing(timeout=0.7)  # stays open while the session is live
    await sync_to_async(client.logout)()
    assert await closed_with(comm) == 4401


async def test_a_revoked_or_expired_tokens_socket_is_closed(alice):
    from django.utils import timezone
    from knox.models import AuthToken

    for revoke in (
        lambda row: row.delete(),
        lambda row: AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now()),
    ):
        row, token = await sync_to_async(AuthToken.objects.create)(user=alice)
        comm, ok, _ = await connect((b"authorization", f"Token {token}".encode()))
        assert ok
        assert await comm.receive_nothing(timeout=0.7)
        await sync_to_async(revoke)(row)
        assert await closed_with(comm) == 4401
        _, ok, _ = await connect((b"authorization", f"Token {token}".encode()))
        assert not ok  # and the handshake refuses it from now on


async def test_losing_the_membership_or_deactivation_closes_the_socket(alice, tenant):
    from django.contrib.auth import get_user_model

    header = cookie(await sync_to_async(logged_in_client)(alice))
    comm, ok, _ = await connect(header)
    assert ok
    await sync_to_async(lambda: Membership.objects.filter(user=alice).delete())()
    assert await closed_with(comm) == 4401
    await sync_to_async(lambda: Membership.objects.create(user=alice, tenant=tenant))()
    comm, ok, _ = await connect(header)
    assert ok
    await sync_to_async(lambda: get_user_model().objects.filter(pk=alice.pk).update(is_active=False))()
    assert await closed_with(comm) == 4401


async def test_deep_or_oversized_json_gets_an_error_frame_and_a_close_without_a_traceback(alice, caplog):
    header = cookie(await sync_to_async(logged_in_client)(alice))
    caplog.set_level(logging.DEBUG)
    frames = [
        "[" * 2000 + "]" * 2000,  # deep enough for a RecursionError in json.loads
        "[" * 40 + "]" * 40,  # past the API's nesting limit (32)
        '{"a": "' + "x" * 10_000 + '"}',  # larger than any ping
        "not json",
    ]
    for text in frames:
        comm, ok, _ = await connect(header)
        assert ok
        await comm.send_to(text_data=text)
        error = await comm.receive_json_from(timeout=3)
        assert error["code"] == "invalid_frame" and error["message"]
        assert await closed_with(comm) == 4400
    comm, ok, _ = await connect(header)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert (await comm.receive_json_from(timeout=3))["code"] == "invalid_frame"
    assert await closed_with(comm) == 4400
    # A ping is still fine.
    comm, ok, _ = await connect(header)
    await comm.send_json_to({"type": "ping"})
    assert await comm.receive_nothing(timeout=0.7)
    await comm.disconnect()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text[-2000:]
