"""Sockets for scripts (issue 38 item 6), against a real daphne: a client
that authenticates with `Authorization: Token …` and sends no Origin (as
the `websockets` library does by default) reads the stream; a session
cookie still needs this server's own Origin; every refusal is logged with
its reason, never with the credential; the docs' client runs as printed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from knox.models import AuthToken
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from runs.runtime.executor import run_drive
from tests.conftest import ROOT, start_daphne, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
CLIENT_PAGE = Path(ROOT) / "docs" / "console.md"  # "Sockets for scripts"


@pytest.fixture
def daphne(tmp_path):
    log_path = tmp_path / "daphne.log"
    with open(log_path, "wb") as log:
        port, proc = start_daphne(subprocess_env(AGENTRT_LOG_LEVEL="INFO"), log)
        yield port, log_path
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def alice(tenant):
    return get_user_model().objects.get(username="alice")


@pytest.fixture
def token(alice):
    return AuthToken.objects.create(user=alice)[1]


@pytest.fixture
def cookie(alice):
    client = Client()
    client.force_login(alice)
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def run(load_agent, submit):
    load_agent(turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"text": "done"}])
    run = submit()
    run_drive(run_id=run.id)
    return run


def url(port: int, run) -> str:
    return f"ws://127.0.0.1:{port}/ws/runs/{run.id}/?after=0"


def refused(port: int, run, **kwargs) -> int:
    with pytest.raises(InvalidStatus) as refusal:
        connect(url(port, run), open_timeout=10, **kwargs)
    return refusal.value.response.status_code


def logged(log_path: Path, text: str) -> str:
    """The daphne log once it holds `text` (a refusal is logged as it is answered)."""
    return wait_for(lambda: text in log_path.read_text() and log_path.read_text(), timeout=10, message=text)


def test_a_token_client_without_an_origin_reads_the_stream(daphne, run, token):
    port, _ = daphne
    with connect(url(port, run), additional_headers={"Authorization": f"Token {token}"}, open_timeout=10) as ws:
        first = json.loads(ws.recv(timeout=10))
    assert (first["sequence"], first["type"]) == (1, "run.created")


def test_a_cookie_still_needs_this_servers_origin_and_each_refusal_says_why(daphne, run, token, cookie):
    port, log_path = daphne
    # The session cookie alone, no Origin: what a script must not be able to ride on (nor a page that hides it).
    assert refused(port, run, additional_headers={"Cookie": cookie}) == 403
    logged(log_path, "no Origin header")
    with connect(url(port, run), origin=f"http://127.0.0.1:{port}", additional_headers={"Cookie": cookie}) as ws:
        assert json.loads(ws.recv(timeout=10))["sequence"] == 1  # the same cookie from our own origin: accepted

    # A token that is not valid is never helped by a cookie beside it, and the log names no credential.
    bogus = "0123456789abcdef" * 4
    assert refused(port, run, additional_headers={"Cookie": cookie, "Authorization": f"Token {bogus}"}) == 403
    text = logged(log_path, "the token is not valid")
    # A token that sends an Origin sends an allowed one, like a browser.
    auth = {"Authorization": f"Token {token}"}
    assert refused(port, run, origin="http://evil.example", additional_headers=auth) == 403
    text = logged(log_path, "'http://evil.example' is neither this server's")
    # Anonymous, with an allowed Origin: refused by the consumer, which says so.
    assert refused(port, run, origin=f"http://127.0.0.1:{port}") == 403
    text = logged(log_path, "not signed in")
    for secret in (bogus, token, cookie.split("=", 1)[1]):
        assert secret not in text


def test_the_docs_ten_line_client_reads_a_run_to_its_end(daphne, run, token):
    port, _ = daphne
    found = re.search(r"<!-- ws-client -->\n\n((?:    .*\n|\n)+?)\n\(", CLIENT_PAGE.read_text())
    block = "".join(line[4:] + "\n" for line in found.group(1).splitlines())
    assert len([line for line in block.splitlines() if line.strip()]) == 10, block
    done = subprocess.run(
        [sys.executable, "-c", block],
        cwd=ROOT,
        env=subprocess_env(AGENTRT_WS=f"ws://127.0.0.1:{port}", AGENTRT_TOKEN=token, RUN_ID=str(run.id)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("1 run.created") and lines[-1].split()[1] == "run.completed"
