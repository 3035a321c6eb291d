"""Issue 34 item 7c: the WebSocket handshake's Origin must be this server's
own origin — scheme, host and port — against a real daphne.

The review (N8) logged an operator in on :18000, then opened a page served
from another port of the same host that ran `new WebSocket("ws://127.0.0.1:
18000/ws/runs/<id>/")`: the browser sent the operator's cookie (another port
is the same site) and the page read nine events, tool arguments included,
because AllowedHostsOriginValidator compared the Origin's host only. Here the
page is played by a WebSocket client that sends exactly what the browser
sends: the page's Origin and the operator's cookie."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from runs.runtime.executor import run_drive
from tests.conftest import start_daphne, subprocess_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TRUSTED = "https://agentrt.example.com"  # a TLS proxy's public origin, as the production settings list it


@pytest.fixture
def daphne(tmp_path):
    env = subprocess_env(DJANGO_CSRF_TRUSTED_ORIGINS=TRUSTED, AGENTRT_PROXY_SSL_HEADER="X-Forwarded-Proto=https")
    with open(tmp_path / "daphne.log", "wb") as log:
        port, proc = start_daphne(env, log)
        yield port
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def operator_cookie(tenant):
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def run_path(load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "secret-ish"}}]}, {"text": "done"}])
    run = submit()
    run_drive(run_id=run.id)
    return f"/ws/runs/{run.id}/?after=0"


def open_socket(port: int, path: str, origin: str, cookie: str, **headers):
    return connect(
        f"ws://127.0.0.1:{port}{path}",
        origin=origin,
        additional_headers={"Cookie": cookie, **headers},
        open_timeout=10,
    )


def test_a_page_of_our_own_origin_reads_the_stream(daphne, operator_cookie, run_path):
    with open_socket(daphne, run_path, f"http://127.0.0.1:{daphne}", operator_cookie) as ws:
        assert json.loads(ws.recv(timeout=10))["sequence"] == 1


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:{other}",  # another port of the same host: the review's attack page
        "http://127.0.0.1:9",
        "http://127.0.0.1",  # port 80
        "https://127.0.0.1:{port}",  # the same host and port, another scheme
        "http://localhost:{port}",  # another allowed host name
        "http://127.0.0.1:{port}/page",  # not an origin at all
        "null",
    ],
)
def test_a_page_of_another_origin_on_the_same_host_is_refused(daphne, operator_cookie, run_path, origin):
    origin = origin.format(port=daphne, other=daphne + 1)
    with pytest.raises(InvalidStatus) as refused:
        open_socket(daphne, run_path, origin, operator_cookie)
    assert refused.value.response.status_code == 403, origin


def test_the_scheme_is_the_connections_or_the_trusted_proxys(daphne, operator_cookie, run_path):
    # Behind a TLS-terminating proxy the page is https while the proxy speaks ws to daphne: the proxy's header
    # (AGENTRT_PROXY_SSL_HEADER) makes the server's own origin https, and then only https matches.
    proto = {"X-Forwarded-Proto": "https"}
    with open_socket(daphne, run_path, f"https://127.0.0.1:{daphne}", operator_cookie, **proto) as ws:
        assert json.loads(ws.recv(timeout=10))["sequence"] == 1
    with pytest.raises(InvalidStatus) as refused:
        open_socket(daphne, run_path, f"http://127.0.0.1:{daphne}", operator_cookie, **proto)
    assert refused.value.response.status_code == 403


def test_an_origin_the_operator_trusts_is_accepted_exactly(daphne, operator_cookie, run_path):
    with open_socket(daphne, run_path, TRUSTED, operator_cookie) as ws:
        assert json.loads(ws.recv(timeout=10))["sequence"] == 1
    for near in ("http://agentrt.example.com", "https://agentrt.example.com:8443", "https://evil.agentrt.example.com"):
        with pytest.raises(InvalidStatus) as refused:
            open_socket(daphne, run_path, near, operator_cookie)
        assert refused.value.response.status_code == 403, near
