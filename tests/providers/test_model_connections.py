"""Connections to model servers are kept between attempts (issue 16, item 4:
a fresh connection per attempt paid a TCP and a TLS handshake before every
model call), and the watchdog still ends a call on a kept connection.

The server here answers as HTTP/1.1 servers do (the connection stays open)
and counts the TCP connections it accepts."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from runs.domain.errors import ModelError
from runs.domain.values import StopReason
from runs.providers.wire import pool
from tests.conftest import wait_for
from tests.providers.conftest import make_request
from tests.providers.fake_openai import FakeOpenAI, chunk, hang, stream, text_stream
from tests.providers.test_openai_provider import RecordingToken, _cancel_after, complete_or_hang


@pytest.fixture
def fake():
    server = FakeOpenAI(keep_alive=True).start()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts with no connection kept from another test's server."""
    pool._forget()
    yield
    pool._forget()


def test_attempts_share_one_connection(fake, make_provider):
    fake.push(text_stream("one"), text_stream("two"), text_stream("three"))
    answers = [make_provider().complete(make_request(), RecordingToken()).text for _ in range(3)]
    assert answers == ["one", "two", "three"]
    assert len(fake.requests) == 3
    assert fake.connections == 1  # three before: one per attempt


def test_a_kept_connection_the_server_closed_is_not_lent(make_provider):
    """A server that closes an idle connection (its idle timeout, a deploy)
    without saying so: the next attempt opens a new one and does not fail a
    try on the closed one first."""
    server = FakeOpenAI(keep_alive=True, drop_after=True).start()
    try:
        server.push(text_stream("one"), text_stream("two"))
        provider = make_provider(base_url=server.base_url)
        assert provider.complete(make_request(), RecordingToken()).text == "one"
        wait_for(lambda: server.closed >= 1, message="the server to close the first connection")
        token = RecordingToken()
        assert provider.complete(make_request(), token).text == "two"
        assert token.waits == [] and len(server.requests) == 2 and server.connections == 2
    finally:
        server.close()


def test_a_server_that_stalls_after_a_whole_answer_costs_the_attempt_neither_its_answer_nor_its_time(
    fake, make_provider
):
    """The end of a finished stream is read so the connection can be kept;
    a server that holds that end back gets a second of it, and the turn
    stands (before keep-alive the attempt returned at the turn's last event)."""
    fake.push(text_stream("whole", stall_at_end=True, stall_for=3600), text_stream("next"))
    provider = make_provider(read_timeout=3600)  # no read timeout to fall back on
    turn = complete_or_hang(provider, RecordingToken())
    assert turn.text == "whole" and turn.stop_reason is not StopReason.CANCELLED
    assert provider.complete(make_request(), RecordingToken()).text == "next"
    assert fake.connections == 2  # the held-back connection was not kept


def test_no_keepalive_opens_a_connection_per_attempt(fake, make_provider, settings):
    settings.AGENTRT_MODEL_KEEPALIVE_SECONDS = 0
    fake.push(text_stream("one"), text_stream("two"))
    for _ in range(2):
        make_provider().complete(make_request(), RecordingToken())
    assert fake.connections == 2


def test_a_cancel_ends_a_silent_answer_on_a_kept_connection(fake, make_provider):
    """The socket of a kept connection was never announced as new (httpcore's
    trace names only connections it opens): the watchdog learns it from the
    request's own writes, so a cancel still ends a read blocked before the
    answer's headers."""
    fake.push(text_stream("warm"), hang(3600))
    provider = make_provider(read_timeout=3600)
    assert provider.complete(make_request(), RecordingToken()).text == "warm"
    token = RecordingToken()
    _cancel_after(token, 0.3)
    turn = complete_or_hang(provider, token)
    assert turn.stop_reason is StopReason.CANCELLED and turn.text is None
    assert fake.connections == 1 and len(fake.requests) == 2  # it was the kept connection that went silent


def test_the_call_limit_ends_a_stalled_stream_on_a_kept_connection(fake, make_provider):
    fake.push(text_stream("warm"), stream([chunk("slow")], stall_after=1, stall_for=3600))
    provider = make_provider(read_timeout=3600)
    provider.complete(make_request(), RecordingToken())
    limited = make_provider(read_timeout=3600, max_call_seconds=1.0)
    with pytest.raises(ModelError) as info:
        complete_or_hang(limited, RecordingToken())
    assert info.value.error_class == "ModelCallTimeout"
    assert fake.connections == 1


def test_a_connection_the_watchdog_shut_is_never_lent_again(fake, make_provider):
    fake.push(text_stream("warm"), hang(3600), text_stream("after"))
    provider = make_provider(read_timeout=3600)
    provider.complete(make_request(), RecordingToken())
    token = RecordingToken()
    _cancel_after(token, 0.3)
    assert complete_or_hang(provider, token).stop_reason is StopReason.CANCELLED
    fresh = RecordingToken()
    assert provider.complete(make_request(), fresh).text == "after"
    assert fresh.waits == []  # no failed try and backoff on the dead connection first
    assert fake.connections == 2


def _child_call(provider, out) -> None:
    out.send(provider.complete(make_request(), RecordingToken()).text)
    out.close()


def test_a_forked_worker_opens_its_own_connection(fake, make_provider):
    """django-q2 forks its workers: a child that wrote on the parent's kept
    socket would interleave two requests on one connection."""
    fake.push(text_stream("parent"), text_stream("child"), text_stream("parent again"))
    provider = make_provider()
    assert provider.complete(make_request(), RecordingToken()).text == "parent"
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child_call, args=(provider, writer))
    child.start()
    assert reader.poll(30), "the child answered nothing"
    assert reader.recv() == "child"
    child.join(30)
    assert child.exitcode == 0
    assert provider.complete(make_request(), RecordingToken()).text == "parent again"
    assert fake.connections == 2  # the parent's, kept across its two calls, and the child's own


def test_every_transport_of_the_client_is_watched(monkeypatch):
    """The wrapper reaches into httpx's transports (`pool.watch`): a direct
    connection and a proxy's both get the watched backend, so an upgrade of
    httpx or httpcore that moves those attributes fails here."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    client = pool.build(15)
    transports = [client._transport, *[t for t in client._mounts.values() if t is not None]]
    assert len(transports) >= 2  # the direct one and the proxy's
    for transport in transports:
        assert isinstance(transport._pool._network_backend, pool._WatchedBackend)
    client.close()


def test_a_watched_stream_names_its_socket_before_each_read_and_write_and_sends_at_once():
    seen: list[socket.socket] = []

    class Learner:
        def learn(self, sock):
            seen.append(sock)

    server = socket.create_server(("127.0.0.1", 0))
    backend = pool._WatchedBackend(__import__("httpcore").SyncBackend())
    stream = backend.connect_tcp("127.0.0.1", server.getsockname()[1])
    peer, _ = server.accept()
    with pool.attached(Learner()):
        stream.write(b"x")
        peer.sendall(b"y")
        assert stream.read(1) == b"y"
    stream.write(b"z")  # detached: nobody is told
    sock = stream.get_extra_info("socket")
    assert len(seen) == 2 and all(s is sock for s in seen)
    # httpcore turns Nagle's algorithm off: a request's head and body are two
    # writes, and with it on the body of every request on a kept connection
    # waits for the server's delayed ACK of the head (~45 ms an attempt here).
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    for s in (peer, server):
        s.close()
    stream.close()


def test_a_model_server_whose_name_never_resolves_fails_the_attempt_within_its_connect_timeout(
    make_provider, silent_name_server
):
    """getaddrinfo has no timeout and, before a socket exists, the attempt's
    watchdog has nothing to shut: a name server that never answered held the
    model call as long as the system's resolver waited (before: the attempt
    ended only once the lookup gave up). The lookup now shares the connect
    timeout (pool._WatchedBackend)."""
    lookups = silent_name_server("slow-model.example")
    provider = make_provider(base_url="http://slow-model.example:8080/v1", connect_timeout=0.5, max_tries=1)
    with pytest.raises(ModelError) as err:
        provider.complete(make_request(), RecordingToken())
    assert lookups.answered == []  # the attempt ended while the lookup still waited for its name server
    assert lookups.asked == ["slow-model.example"]
    assert "could not reach the model server" in str(err.value), err.value  # before anything was sent: retryable
