"""Issue 10 item 9: API tokens are stored hashed (django-rest-knox), expire,
and are revocable in the admin; `drf_create_token` keeps its interface; the
same token works for REST and WebSockets; old plaintext authtoken rows are
converted and their table dropped."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from tests.conftest import ROOT, subprocess_env


@pytest.fixture
def alice(tenant):
    return get_user_model().objects.get(username="alice")


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def all_token_columns() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM knox_authtoken")
        return repr(cur.fetchall())


@pytest.mark.django_db(transaction=True)
def test_drf_create_token_prints_a_working_token_that_is_not_stored(alice):
    out = subprocess.run(
        [sys.executable, "manage.py", "drf_create_token", "alice"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[:2] == ["Generated", "token"] and words[3:] == ["for", "user", "alice"]
    token = words[2]
    assert api(token).get("/api/runs/").status_code == 200
    row = AuthToken.objects.get(user=alice)
    assert token not in all_token_columns()  # no plaintext at rest: only a digest and a 15-char lookup prefix
    assert row.digest == hashlib.sha512(token.encode()).hexdigest()
    assert timedelta(days=89) < row.expiry - timezone.now() <= timedelta(days=90)  # AGENTRT_TOKEN_TTL_DAYS


@pytest.mark.django_db
def test_an_expired_token_is_refused(alice):
    row, token = AuthToken.objects.create(user=alice)
    assert api(token).get("/api/runs/").status_code == 200
    AuthToken.objects.filter(pk=row.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    response = api(token).get("/api/runs/")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"


@pytest.mark.django_db
def test_a_forged_token_with_a_real_key_and_an_inactive_users_token_are_refused(alice):
    """The token's first characters only select candidates: the rest must
    match the stored digest; a deactivated user's valid token is refused."""
    _, token = AuthToken.objects.create(user=alice)
    assert api(token).get("/api/runs/").status_code == 200
    flipped = "0" if token[-1] != "0" else "1"
    for forged in (token[:-1] + flipped, token[:8], token + "00", token[:8] + "\u00e9" * 10):
        response = api(forged).get("/api/runs/")
        assert response.status_code == 401 and response.json()["code"] == "authentication_failed", forged
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    response = api(token).get("/api/runs/")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"


@pytest.mark.django_db
def test_a_token_revoked_in_the_admin_is_refused(alice):
    row, token = AuthToken.objects.create(user=alice)
    assert api(token).get("/api/runs/").status_code == 200
    admin = APIClient()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "x" * 20))
    listing = admin.get("/admin/knox/authtoken/")
    assert listing.status_code == 200 and token not in listing.content.decode()
    response = admin.post(f"/admin/knox/authtoken/{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    response = api(token).get("/api/runs/")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"


@pytest.mark.django_db
def test_the_ttl_comes_from_the_environment():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agentrt_site.settings'); "
            "django.setup(); from knox.settings import knox_settings; print(knox_settings.TOKEN_TTL.days, "
            "knox_settings.AUTH_HEADER_PREFIX)",
        ],
        cwd=ROOT,
        env=subprocess_env(AGENTRT_TOKEN_TTL_DAYS="7"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["7", "Token"], out.stderr[-800:]


@pytest.mark.django_db(transaction=True)
def test_old_plaintext_authtoken_rows_become_knox_tokens_and_the_table_is_dropped(alice):
    from django.apps import apps

    migration = importlib.import_module("runs.migrations.0004_authtoken_to_knox")
    old_key = "0123456789abcdef0123456789abcdef01234567"  # DRF's shape: 40 hex characters
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz NOT NULL, "
            "user_id integer NOT NULL)"
        )
        cur.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [old_key, alice.pk])
        cur.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('authtoken', '0001_initial', now())")
    with connection.schema_editor() as editor:
        migration.authtoken_to_knox(apps, editor)
    assert "authtoken_token" not in connection.introspection.table_names()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
        assert cur.fetchone()[0] == 0
    assert old_key not in all_token_columns()
    assert api(old_key).get("/api/runs/").status_code == 200  # clients keep working until the TTL
    assert AuthToken.objects.get(user=alice).expiry is not None


@pytest.mark.django_db
def test_a_request_reads_its_own_token_only_however_many_the_user_holds(alice):
    """knox read every token of the user on each request (to delete expired
    ones): one more round trip per request, growing with the user's tokens.
    Now one read finds the request's token; an expired token of the same
    user is left to the maintenance sweep."""
    from django.test.utils import CaptureQueriesContext

    for _ in range(30):
        AuthToken.objects.create(user=alice)
    stale, _ = AuthToken.objects.create(user=alice)
    AuthToken.objects.filter(pk=stale.pk).update(expiry=timezone.now() - timedelta(seconds=1))
    _, token = AuthToken.objects.create(user=alice)
    with CaptureQueriesContext(connection) as q:
        assert api(token).get("/api/runs/").status_code == 200
    token_reads = [x["sql"] for x in q.captured_queries if "knox_authtoken" in x["sql"]]
    assert len(token_reads) == 1 and "token_key" in token_reads[0], token_reads
    assert AuthToken.objects.filter(pk=stale.pk).exists()  # not this request's business


@pytest.mark.django_db
def test_an_expired_token_used_is_deleted_and_the_sweep_deletes_the_others(alice, tenant):
    from django.dispatch import receiver
    from knox.signals import token_expired

    from maintenance.sweeps.tokens import sweep_tokens

    heard: list[str] = []

    @receiver(token_expired)
    def note(sender, username, source, **kwargs):
        heard.append(f"{username}:{source}")

    try:
        used, used_token = AuthToken.objects.create(user=alice)
        stale, _ = AuthToken.objects.create(user=alice)
        live, _ = AuthToken.objects.create(user=alice)
        forever, _ = AuthToken.objects.create(user=alice, expiry=None)
        past = timezone.now() - timedelta(seconds=1)
        AuthToken.objects.filter(pk__in=[used.pk, stale.pk]).update(expiry=past)
        assert api(used_token).get("/api/runs/").status_code == 401
        assert not AuthToken.objects.filter(pk=used.pk).exists()  # refused and deleted, as knox does
        assert heard == ["alice:auth_token"]
        assert sweep_tokens() == {"deleted_tokens": 1}
        assert set(AuthToken.objects.filter(user=alice).values_list("pk", flat=True)) == {live.pk, forever.pk}
        assert heard == ["alice:auth_token", "alice:other_token"]
        assert sweep_tokens() == {"deleted_tokens": 0}
    finally:
        token_expired.disconnect(note)


@pytest.mark.django_db
def test_the_schema_still_declares_the_token_scheme(operator):
    client = APIClient()
    client.force_authenticate(operator)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert "knoxApiToken" in schema["components"]["securitySchemes"]
    assert {"knoxApiToken": []} in schema["paths"]["/api/runs/"]["post"]["security"]
