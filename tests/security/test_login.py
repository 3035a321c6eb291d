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
