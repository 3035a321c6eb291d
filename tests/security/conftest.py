"""Fixtures of the security tests (issue 10): an attacker's listener that
records every connection, token clients, endpoint settings."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.providers.fake_openai import FakeOpenAI


class Listener:
    """A TCP listener on loopback that accepts and records every connection
    (and the first bytes sent on it). "Received nothing" means no connection."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(0.5)
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            self.received.append(data)
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def attacker():
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture
def fake():
    server = FakeOpenAI().start()
    yield server
    server.close()


@pytest.fixture
def member(tenant):
    """A tenant member allowed to publish agents (when that permission exists)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.get(username="alice")
    user.user_permissions.add(*Permission.objects.filter(codename="publish_agent"))
    return get_user_model().objects.get(pk=user.pk)


def token_client(user):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    client = APIClient()
    _, token = AuthToken.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()
