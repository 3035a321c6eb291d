"""Issue 10 item 11: login throttling (django-axes) and Django's password
validators; the weak demo operator/operator exists only through the demo."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

from tests.conftest import ROOT

PASSWORD = "correct-Horse-battery-9"


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)


def login(password, ip="127.0.0.1"):
    return Client(REMOTE_ADDR=ip).post("/admin/login/?next=/admin/", {"username": "ops", "password": password})


def test_admin_login_is_locked_after_five_failures_even_with_the_right_password(staff, settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    assert login(PASSWORD).status_code == 302  # works before the attack
    for _ in range(4):
        assert login("wrong-guess").status_code == 200  # the form again, with its error
    assert login("wrong-guess").status_code == 429  # the fifth failure locks
    assert login(PASSWORD).status_code == 429  # and the right password no longer gets in
    # Counted per (username, address): the operator is not locked out from elsewhere.
    assert login(PASSWORD, ip="10.0.0.7").status_code == 302
    from axes.models import AccessAttempt

    assert AccessAttempt.objects.filter(username="ops", ip_address="127.0.0.1", failures_since_start__gte=5).exists()


def test_force_login_used_by_the_suite_still_works(staff):
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/").status_code == 200


def test_password_validators_refuse_weak_passwords(db):
    for weak in ("operator", "pw", "12345678901234", "password1234"):
        with pytest.raises(ValidationError):
            validate_password(weak, get_user_model()(username="operator"))
    validate_password(PASSWORD)


def test_create_tenant_refuses_a_weak_password(db):
    with pytest.raises(CommandError, match="--password"):
        call_command("create_tenant", "acme", "--user", "operator", "--password", "operator")
    assert not get_user_model().objects.filter(username="operator").exists()
    call_command("create_tenant", "acme", "--user", "operator", "--password", PASSWORD)


def test_only_the_demo_creates_operator_operator(tmp_path):
    """`manage.py demo` (what make run starts) sets operator/operator past the
    validators, on the embedded SQLite default, nothing served."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(AGENTRT_SQLITE_PATH=str(tmp_path / "db.sqlite3"), AGENTRT_LOG_LEVEL="WARNING")
    done = subprocess.run(
        [sys.executable, "manage.py", "demo", "--no-serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-1500:]
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agentrt_site.settings'); "
            "django.setup(); from django.contrib.auth import get_user_model; "
            "print(get_user_model().objects.get(username='operator').check_password('operator'))",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "True", check.stderr[-800:]


# -- issue 34 item 6: the client's address behind a proxy, and the address and username limits ------------


def _request(peer, forwarded_for=None):
    from django.test import RequestFactory

    extra = {"REMOTE_ADDR": peer}
    if forwarded_for is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded_for
    return RequestFactory().post("/accounts/login/", **extra)


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(settings):
    from agentrt_site.logins import client_ip

    assert settings.AGENTRT_TRUSTED_PROXIES == []  # the default: never believed
    assert client_ip(_request("127.0.0.1", "198.51.100.7")) == "127.0.0.1"
    settings.AGENTRT_TRUSTED_PROXIES = ["127.0.0.1", "10.1.0.0/16"]
    assert client_ip(_request("192.0.2.5", "198.51.100.7")) == "192.0.2.5"  # a peer that is not the proxy
    assert client_ip(_request("127.0.0.1", "198.51.100.7")) == "198.51.100.7"  # nginx: $remote_addr
    assert client_ip(_request("::ffff:127.0.0.1", "198.51.100.7")) == "198.51.100.7"  # a dual-stack socket's form
    # A proxy that appends ($proxy_add_x_forwarded_for): what the client wrote left of it is never read,
    # and trusted hops (a second proxy) are skipped from the right.
    assert client_ip(_request("127.0.0.1", "203.0.113.1, 198.51.100.7")) == "198.51.100.7"
    assert client_ip(_request("127.0.0.1", "203.0.113.1, 198.51.100.7, 10.1.2.3")) == "198.51.100.7"
    assert client_ip(_request("127.0.0.1", "203.0.113.1, not-an-address")) == "127.0.0.1"
    assert client_ip(_request("127.0.0.1")) == "127.0.0.1"  # no header: the proxy's own host
    assert client_ip(_request("127.0.0.1", "10.1.2.3")) == "127.0.0.1"  # only proxies named


def test_a_trusted_proxy_that_is_not_an_address_is_refused_at_start():
    import os

    env = {**os.environ, "AGENTRT_TRUSTED_PROXIES": "127.0.0.1,nginx.internal"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
            "'agentrt_site.settings'); django.setup()",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: AGENTRT_TRUSTED_PROXIES: 'nginx.internal' is not an IP address or network" in (
        done.stderr
    )


@pytest.fixture
def fast_hashes(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # many failed logins below


def member_login(username, password, ip):
    return Client(REMOTE_ADDR=ip).post("/accounts/login/", {"username": username, "password": password})


def test_guesses_at_one_username_from_many_addresses_lock_it_everywhere(fast_hashes, settings):
    """The per-username limit (the trade-off of README "Production settings"): failures from every address
    count, each address at most the per-pair limit, so at the limit the account is locked from everywhere,
    its owner too, until the cool-off — and a single address can never get it there."""
    settings.AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT = 12
    get_user_model().objects.create_user("ops", password=PASSWORD)
    for _ in range(9):  # one address, past its pair's limit: 5 of these count for the username
        member_login("ops", "wrong-guess", "192.0.2.1")
    assert member_login("ops", PASSWORD, "192.0.2.98").status_code == 302  # 5 < 12: not locked elsewhere
    for address in ("192.0.2.2", "192.0.2.3"):
        for _ in range(3):
            member_login("ops", "wrong-guess", address)
    # 5 + 3 + 3 = 11 counted: one more failure from anywhere reaches 12 and locks ops everywhere.
    assert member_login("ops", "wrong-guess", "192.0.2.4").status_code == 429
    assert member_login("ops", PASSWORD, "192.0.2.97").status_code == 429


def test_a_success_forgives_only_its_own_pair_not_the_addresses_spray(fast_hashes, settings):
    settings.AGENTRT_LOGIN_IP_FAILURE_LIMIT = 6
    model = get_user_model()
    for i in range(6):
        model.objects.create_user(f"user{i}", password=PASSWORD)
    model.objects.create_user("mallory", password=PASSWORD)  # the attacker's own account
    for i in range(5):
        assert member_login(f"user{i}", "Spring-2026-Welcome!", "192.0.2.66").status_code == 200
    assert member_login("mallory", PASSWORD, "192.0.2.66").status_code == 302  # does not reset the address
    assert member_login("user5", "Spring-2026-Welcome!", "192.0.2.66").status_code == 429  # the 6th failure
    assert member_login("user5", PASSWORD, "192.0.2.66").status_code == 429
    assert member_login("user5", PASSWORD, "192.0.2.67").status_code == 302  # another address is not affected


def test_the_rest_api_takes_no_password(db):
    """The two login pages are the only place a password is tried (README, "Production settings"): the API
    authenticates tokens and sessions, never a username and password."""
    user = get_user_model().objects.create_user("ops", password=PASSWORD)
    import base64

    basic = "Basic " + base64.b64encode(f"{user.username}:{PASSWORD}".encode()).decode()
    response = Client().get("/api/runs/", HTTP_AUTHORIZATION=basic)
    assert response.status_code == 401, response.status_code
    assert Client().get("/api-auth/login/").status_code == 404  # DRF's browsable-API login is not mounted
