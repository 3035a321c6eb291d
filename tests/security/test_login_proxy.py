"""Issue 34 item 6: logins are throttled in the documented deployment.

The security review (N1) found the lockout gone behind the documented proxy:
the web unit ran daphne with `--proxy-headers` and the nginx example passed
the client's own `X-Forwarded-For` through, so a client rotating that header
guessed without limit; and one password sprayed over many usernames was never
throttled. These tests run Debian's nginx with `deploy/nginx/agentrt.conf`
(only its upstream servers and its listen/TLS lines replaced) in front of a
real daphne started with the flags of `deploy/systemd/agentrt-web@.service`
and the `AGENTRT_TRUSTED_PROXIES` of `deploy/systemd/agentrt.env.example`.
Each client connects from its own loopback address (127.0.0.0/8), so nginx
sees a different `$remote_addr` for the attacker and for the legitimate user.
"""

from __future__ import annotations

import http.client
import re
import shlex
import shutil
import socket
import subprocess
import urllib.parse

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password

from tests.conftest import ROOT, free_port, start_daphne, subprocess_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DEPLOY = ROOT / "deploy"
HOST = "agentrt.example.com"  # the documented server_name; the daphne below allows it
PASSWORD = "correct-Horse-battery-9"
ATTACKER = "127.0.0.66"
LEGITIMATE = "127.0.0.77"


# -- the documented deployment ---------------------------------------------------------------------------


def documented_daphne_flags() -> tuple[str, ...]:
    """The daphne flags of the web unit's ExecStart, without its bind address, port and application."""
    line = next(
        x for x in (DEPLOY / "systemd/agentrt-web@.service").read_text().splitlines() if x.startswith("ExecStart=")
    )
    argv = shlex.split(line.partition("=")[2])
    argv = argv[argv.index("daphne") + 1 : -1]  # between `-m daphne` and `agentrt_site.asgi:application`
    flags, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-b", "-p"):
            skip = True
        else:
            flags.append(arg)
    return tuple(flags)


def documented_env() -> dict[str, str]:
    """The settings of agentrt.env.example that decide whose address a login comes from and how the
    proxy's requests are read (HTTPS behind it: the login form's CSRF check then wants the Origin)."""
    env = {}
    for line in (DEPLOY / "systemd/agentrt.env.example").read_text().splitlines():
        name, _, value = line.partition("=")
        if name in ("AGENTRT_TRUSTED_PROXIES", "AGENTRT_PROXY_SSL_HEADER", "AGENTRT_SECURE_COOKIES"):
            env[name] = value
    return env


def documented_nginx_conf(upstream_port: int, listen_port: int) -> str:
    """deploy/nginx/agentrt.conf with one upstream server (the test's daphne) and a plain-http listen on
    loopback instead of 443 with its certificates; every other line as documented."""
    text = (DEPLOY / "nginx/agentrt.conf").read_text()
    upstream = re.search(r"upstream agentrt \{(.*?)\}", text, re.S)
    assert upstream, "deploy/nginx/agentrt.conf has no `upstream agentrt` block"
    servers = re.findall(r"\bserver\s+(\S+)([^;]*);", upstream.group(1))
    assert servers, "the upstream names no server"
    replaced = f"\n    server 127.0.0.1:{upstream_port}{servers[0][1]};\n"
    text = text[: upstream.start(1)] + replaced + text[upstream.end(1) :]
    text, listens = re.subn(r"^\s*listen\s+443\s+ssl\s*;", f"    listen 127.0.0.1:{listen_port};", text, flags=re.M)
    assert listens == 1, "deploy/nginx/agentrt.conf should listen on 443 ssl, once"
    return re.sub(r"^\s*ssl_certificate(_key)?\s.*$\n", "", text, flags=re.M)


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    assert found, "these tests run Debian's nginx: apt-get install -y nginx (.ci/run installs it)"
    return found


@pytest.fixture(scope="module")
def web_node(django_db_setup, django_db_blocker, tmp_path_factory):
    """A real daphne, started as the systemd unit starts it, on the test database."""
    with django_db_blocker.unblock():
        env = subprocess_env(**documented_env(), DJANGO_ALLOWED_HOSTS=HOST)
    log_path = tmp_path_factory.mktemp("web") / "daphne.log"
    with open(log_path, "wb") as log:
        port, proc = start_daphne(env, log, flags=documented_daphne_flags())
        yield port
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="module")
def proxy(web_node, tmp_path_factory):
    """Debian's nginx running the documented config in front of the web node; returns its port."""
    prefix = tmp_path_factory.mktemp("nginx")
    port = free_port()
    (prefix / "agentrt.conf").write_text(documented_nginx_conf(web_node, port))
    (prefix / "nginx.conf").write_text(
        f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    proxy_max_temp_file_size 0;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/agentrt.conf;
}}
"""
    )
    binary = nginx_binary()
    checked = subprocess.run(
        [binary, "-t", "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    proc = subprocess.Popen(
        [binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return proc.poll() is not None  # exited: fail below, not after the timeout

    wait_for(up, timeout=30, message="nginx to listen")
    assert proc.poll() is None, (prefix / "error.log").read_text()
    yield port
    proc.terminate()  # nginx's fast shutdown; the master stops its worker
    proc.wait(timeout=15)


# -- a browser from one address --------------------------------------------------------------------------


class Browser:
    """Logs in at /accounts/login/ from `source` (a loopback address), carrying its cookies and the form's
    CSRF token, optionally with an X-Forwarded-For header of the client's choosing. Through the proxy it
    sends the Origin and Referer a browser on https://agentrt.example.com sends (nginx says X-Forwarded-Proto
    https, so Django checks them); to the web node directly, plain HTTP, neither."""

    def __init__(self, port: int, source: str, via_proxy: bool = True):
        self.port, self.source, self.via_proxy = port, source, via_proxy
        self.cookies: dict[str, str] = {}
        self.csrf: str | None = None

    def request(self, method: str, path: str, body: str | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60, source_address=(self.source, 0))
        try:
            sent = {"Host": HOST, **(headers or {})}
            if self.via_proxy:
                sent.update(Origin=f"https://{HOST}", Referer=f"https://{HOST}{path}")
            if self.cookies:
                sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
            for header in response.headers.get_all("Set-Cookie") or []:
                name, _, rest = header.partition("=")
                self.cookies[name.strip()] = rest.split(";", 1)[0]
            return response.status, text
        finally:
            conn.close()

    def login(self, username: str, password: str, forwarded_for: str | None = None, path="/accounts/login/") -> int:
        if self.csrf is None:
            status, page = self.request("GET", path)
            assert status == 200, (status, page[:500])
            found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
            assert found, page[:500]
            self.csrf = found.group(1)
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if forwarded_for is not None:
            headers["X-Forwarded-For"] = forwarded_for
        form = urllib.parse.urlencode({"csrfmiddlewaretoken": self.csrf, "username": username, "password": password})
        status, _ = self.request("POST", path, body=form, headers=headers)
        return status


def spoofed(i: int) -> str:
    """A header the client writes itself: a new address each time, every other time also naming the proxy
    right-most (what `$proxy_add_x_forwarded_for` would have appended)."""
    return f"198.51.100.{i}" if i % 2 else f"198.51.100.{i}, 127.0.0.1"


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob", password=PASSWORD, is_staff=True)


def recorded_addresses(username: str | None = None) -> set[str]:
    from axes.models import AccessAttempt

    rows = AccessAttempt.objects.all() if username is None else AccessAttempt.objects.filter(username=username)
    return set(rows.values_list("ip_address", flat=True))


# -- attack 1: one username, X-Forwarded-For rotated ------------------------------------------------------


def test_rotating_x_forwarded_for_through_the_documented_proxy_is_locked_after_the_limit(proxy, bob):
    limit = settings.AXES_FAILURE_LIMIT
    attacker = Browser(proxy, ATTACKER)
    statuses = [attacker.login("bob", "wrong-guess-0000", forwarded_for=spoofed(i)) for i in range(limit + 7)]
    # The form again for the first limit-1 failures; the limit-th locks; nothing after it is even checked.
    assert statuses == [200] * (limit - 1) + [429] * 8, statuses
    assert attacker.login("bob", PASSWORD, forwarded_for=spoofed(99)) == 429  # the right password: still locked
    # Every failure was counted against the attacker's own address, never one it wrote.
    assert recorded_addresses("bob") == {ATTACKER}


def test_a_spoofed_header_sent_to_the_web_node_directly_is_ignored(web_node, bob):
    """A client that reaches daphne without the proxy (another host on the internal network): its peer is
    not a trusted proxy, so what it writes in X-Forwarded-For is not believed."""
    limit = settings.AXES_FAILURE_LIMIT
    direct = Browser(web_node, ATTACKER, via_proxy=False)
    statuses = [direct.login("bob", "wrong-guess-0000", forwarded_for=spoofed(i)) for i in range(limit + 2)]
    assert statuses == [200] * (limit - 1) + [429] * 3, statuses
    assert direct.login("bob", PASSWORD, forwarded_for="203.0.113.9") == 429
    assert recorded_addresses("bob") == {ATTACKER}


def test_attack_one_does_not_lock_the_user_out_from_another_address(proxy, bob):
    """Locking is per (username, address), and one address adds at most that limit to the username's
    count: however long the attacker keeps going, bob still logs in from his own address."""
    attempts = settings.AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT + 5  # past the per-username limit, from one client
    attacker = Browser(proxy, ATTACKER)
    statuses = [attacker.login("bob", f"wrong-guess-{i:04}", forwarded_for=spoofed(i)) for i in range(attempts)]
    assert statuses[-1] == 429 and statuses.count(200) == settings.AXES_FAILURE_LIMIT - 1, statuses
    assert Browser(proxy, LEGITIMATE).login("bob", PASSWORD) == 302  # logged in
    assert attacker.login("bob", PASSWORD) == 429  # the attacker's pair stays locked


# -- attack 2: one password, many usernames ---------------------------------------------------------------


def test_one_password_sprayed_over_many_usernames_is_throttled_after_the_limit(proxy):
    limit = settings.AGENTRT_LOGIN_IP_FAILURE_LIMIT
    sprayed = "Spring-2026-Welcome!"
    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"user{i:02}", password=make_password(PASSWORD)) for i in range(limit + 3)
    )
    lucky = get_user_model().objects.create_user("lucky", password=sprayed)  # the spray would find this one
    attacker = Browser(proxy, ATTACKER)
    statuses = [attacker.login(user.username, sprayed) for user in users]
    # One failure per username (each far below the per-pair limit); the address's limit-th failure locks it.
    assert statuses == [200] * (limit - 1) + [429] * 4, statuses
    assert attacker.login(lucky.username, sprayed) == 429  # the guess that was right is refused too
    assert attacker.login(lucky.username, sprayed, path="/admin/login/?next=/admin/") == 429  # the admin's login
    # Another client is not affected.
    assert Browser(proxy, LEGITIMATE).login(lucky.username, sprayed) == 302
    assert recorded_addresses() == {ATTACKER}


def test_the_nginx_block_in_deploy_readme_is_the_file():
    """The block deploy/README.md shows carries every proxy_set_header line of deploy/nginx/agentrt.conf."""
    shown = (DEPLOY / "README.md").read_text()
    lines = re.findall(r"proxy_set_header [^;]+;", (DEPLOY / "nginx/agentrt.conf").read_text())
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in lines
    assert [x for x in lines if x not in shown] == []
