"""Issue 10 items 7 and 12: production settings from the environment, no
start without a secret key, `check --deploy` clean under the environment the
README documents, the demo's key and hook only under `make run`, loopback-only
hosts by default."""

from __future__ import annotations

import os
import re
import secrets
import stat
import subprocess
import sys

import pytest
from django.test import Client

from tests.conftest import ROOT
from tests.docs import page_with

SETUP = "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agentrt_site.settings'); django.setup()\n"


def base_env(**overrides) -> dict:
    """This environment without any of the settings under test."""
    drop = (
        "DJANGO_SECRET_KEY",
        "DJANGO_DEBUG",
        "DJANGO_ALLOWED_HOSTS",
        "AGENTRT_DEMO",
        "AGENTRT_SECURE_COOKIES",
        "AGENTRT_SSL_REDIRECT",
        "AGENTRT_HSTS_SECONDS",
        "AGENTRT_HSTS_PRELOAD",
        "AGENTRT_PROXY_SSL_HEADER",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(overrides)
    return env


def run(args, env, **kw):
    return subprocess.run(args, cwd=kw.pop("cwd", ROOT), env=env, capture_output=True, text=True, timeout=120, **kw)


def documented_production_env() -> dict:
    """The block between the `production-env` markers of the operations page (docs/operations.md)."""
    text = page_with("production-env")
    block = re.search(r"<!-- production-env -->\s*```\w*\n(.*?)```", text, re.S)
    assert block, "the production-env block is not a fenced block"
    env = {}
    for line in block.group(1).splitlines():
        name, _, value = line.strip().partition("=")
        if name and not name.startswith("#"):
            env[name] = value
    return env


@pytest.mark.parametrize(
    "argv",
    [
        ["manage.py", "check"],
        ["manage.py", "qcluster"],
        ["-c", "import agentrt_site.asgi"],  # what daphne loads
    ],
)
def test_debug_off_without_a_secret_key_refuses_to_start(argv):
    out = run([sys.executable, *argv], base_env())
    assert out.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in out.stderr
    if argv[0] == "manage.py":
        assert out.stderr.startswith("agentrt: DJANGO_SECRET_KEY is not set")  # the message, no traceback


def test_debug_on_may_start_without_a_key():
    assert run([sys.executable, "manage.py", "check"], base_env(DJANGO_DEBUG="1")).returncode == 0


def test_check_deploy_is_clean_under_the_documented_production_environment():
    documented = documented_production_env()
    assert {
        "AGENTRT_SECURE_COOKIES",
        "AGENTRT_HSTS_SECONDS",
        "AGENTRT_SSL_REDIRECT",
        "AGENTRT_PROXY_SSL_HEADER",
    } <= set(documented)
    documented["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)  # the README shows a placeholder
    out = run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], base_env(**documented))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout
    shown = run(
        [
            sys.executable,
            "-c",
            SETUP + "from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER, "
            "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0)",
        ],
        base_env(**documented),
    )
    assert shown.stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https') True True True True", shown.stderr[-800:]


def test_check_deploy_is_not_clean_without_it():
    out = run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        base_env(DJANGO_SECRET_KEY=secrets.token_urlsafe(50)),
    )
    assert out.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in out.stderr + out.stdout


def test_make_run_keeps_its_own_owner_only_key(tmp_path):
    make = ["make", "-s", "-f", str(ROOT / "Makefile"), f"PYTHON={sys.executable}", "var/secret_key"]
    assert run(make, base_env(), cwd=tmp_path).returncode == 0
    key_file = tmp_path / "var" / "secret_key"
    key = key_file.read_text().strip()
    assert len(key) >= 50 and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert run(make, base_env(), cwd=tmp_path).returncode == 0
    assert key_file.read_text().strip() == key  # created once, kept
    recipe = run(["make", "-n", "-f", str(ROOT / "Makefile"), "run"], base_env(), cwd=ROOT).stdout
    assert 'DJANGO_SECRET_KEY="$(cat var/secret_key)" AGENTRT_DEMO=1' in recipe and "manage.py demo" in recipe


@pytest.mark.django_db
def test_demo_hook_is_404_outside_the_demo():
    assert Client().post("/demo/hook", data="{}", content_type="application/json").status_code == 404


def test_demo_hook_is_mounted_under_the_demo():
    code = SETUP + "from django.urls import resolve; print(resolve('/demo/hook').func.__name__)"
    out = run([sys.executable, "-c", code], base_env(DJANGO_SECRET_KEY="k" * 50, AGENTRT_DEMO="1"))
    assert out.stdout.strip() == "demo_hook", out.stderr[-800:]


@pytest.mark.django_db
def test_a_foreign_host_header_is_refused():
    assert Client().get("/healthz", HTTP_HOST="evil.example").status_code == 400
    assert Client().get("/healthz", HTTP_HOST="localhost").status_code == 200


def test_allowed_hosts_default_to_loopback_names_and_come_from_the_environment():
    code = SETUP + "from django.conf import settings; print(settings.ALLOWED_HOSTS)"
    out = run([sys.executable, "-c", code], base_env(DJANGO_SECRET_KEY="k" * 50))
    assert out.stdout.strip() == "['localhost', '127.0.0.1', '[::1]']", out.stderr[-800:]
    out = run(
        [sys.executable, "-c", code], base_env(DJANGO_SECRET_KEY="k" * 50, DJANGO_ALLOWED_HOSTS="agentrt.example.com")
    )
    assert out.stdout.strip() == "['agentrt.example.com']"
