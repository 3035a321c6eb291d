"""Issue 34 item 7e: CVE-2024-7592 (quadratic unquoting in http.cookies,
fixed in Python 3.11.10) is reachable without a login on 3.11.7 through
Django's cookie parser; the review measured a 15 KB `Cookie: a="\\\\…"`
at 0.44 s against 0.003 s for a plain request to /healthz.

The Cookie header is now bounded before anything parses it
(agentrt_site/cookie_limit.py): 8 KiB in all and 64 backslashes. The attack
is sent to a real daphne, as the review sent it, and refused 400 with a code
that names the reason; in-process, the vulnerable function
(`http.cookies._unquote`) is shown never to be called for it. Nothing here
measures time: the answer, and who was called, are the evidence."""

from __future__ import annotations

import http.client
import http.cookies
import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import start_daphne, subprocess_env

MAX_COOKIE_BYTES, MAX_COOKIE_BACKSLASHES = 8 * 1024, 64  # the documented bound (README, agentrt_site/cookie_limit.py)

ATTACK = 'a="' + "\\\\" * 7500 + '"'  # the review's 15 KB header
ESCAPES_WITHIN_LENGTH = 'a="' + "\\\\" * 2000 + '"'  # 4 KB: short enough, but every character an escape


def browser_like_cookies(session: str) -> str:
    """What a busy browser sends a site: the session and CSRF cookies and a
    few large ones (analytics, a consent record, preferences) — 7.6 KiB."""
    big = [f"pref{i}=" + "v" * 1800 for i in range(4)]
    return "; ".join([f"sessionid={session}", "csrftoken=" + "c" * 32, *big])


@pytest.fixture
def daphne(tmp_path, db):
    with open(tmp_path / "daphne.log", "wb") as log:
        port, proc = start_daphne(subprocess_env(), log)
        yield port
        proc.terminate()
        proc.wait(timeout=10)


def get(port: int, path: str, cookie: str) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Cookie": cookie})
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_attack_header_is_refused_by_the_web_server_before_it_is_parsed(daphne):
    status, body, headers = get(daphne, "/healthz", ATTACK)
    assert status == 400, body
    answer = json.loads(body)
    assert answer["code"] == "cookie_too_large" and str(len(ATTACK)) in answer["message"]
    assert "content-security-policy" in headers  # refused like any other response, with its headers
    status, body, _ = get(daphne, "/healthz", ESCAPES_WITHIN_LENGTH)
    assert status == 400 and json.loads(body)["code"] == "cookie_invalid", body
    status, body, _ = get(daphne, "/healthz", "sessionid=abc")
    assert status == 200, body


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_busy_browsers_cookies_still_log_in(daphne, tenant):
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    cookie = browser_like_cookies(client.cookies["sessionid"].value)
    assert MAX_COOKIE_BYTES - 1024 < len(cookie) <= MAX_COOKIE_BYTES
    status, body, _ = get(daphne, "/runs/", cookie)
    assert status == 200, body  # the session was read: not redirected to the login page


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_websocket_handshake_with_the_attack_header_is_refused(daphne, tenant):
    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    session = f"sessionid={client.cookies['sessionid'].value}"
    url, origin = f"ws://127.0.0.1:{daphne}/ws/runs/", f"http://127.0.0.1:{daphne}"
    with connect(url, origin=origin, additional_headers={"Cookie": session}, open_timeout=10):
        pass  # the same handshake with a plain cookie opens
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin=origin, additional_headers={"Cookie": f"{session}; {ATTACK}"}, open_timeout=10)
    assert refused.value.response.status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize(
    "cookie, code",
    [
        (ATTACK, "cookie_too_large"),
        ("x=" + "y" * MAX_COOKIE_BYTES, "cookie_too_large"),
        (ESCAPES_WITHIN_LENGTH, "cookie_invalid"),
        ('a="' + "\\" * (MAX_COOKIE_BACKSLASHES + 1) + '"', "cookie_invalid"),
    ],
    ids=["the attack", "long plain", "escapes within the length", "one backslash too many"],
)
def test_the_vulnerable_parser_is_never_called_for_a_header_beyond_the_bound(monkeypatch, cookie, code):
    calls: list[str] = []
    unquote = http.cookies._unquote

    def watched(value):
        calls.append(value)
        return unquote(value)

    monkeypatch.setattr(http.cookies, "_unquote", watched)
    response = Client().get("/healthz", HTTP_COOKIE=cookie)
    assert response.status_code == 400 and response.json()["code"] == code
    assert calls == []
    # the edge: exactly at the bound is parsed (and the watch sees it)
    Client().get("/healthz", HTTP_COOKIE='a="' + "\\" * MAX_COOKIE_BACKSLASHES + '"')
    assert calls
