"""The operations routes outside /api/: `/metrics` (bearer token when
configured), `/healthz`, `/readyz` (database reachable, migrations applied),
and `manage.py agentrt_status`. None needs a session and none shows tenant
data."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client

from approvals.models import Approval
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.django_db

TOKEN = "t0ken-for-scrapers"


@pytest.fixture
def queued_run(load_agent, submit):
    load_agent(name="bot")
    return submit(agent="bot", text="private words of acme")


def test_metrics_with_a_token_set_refuses_a_scrape_without_it_or_with_a_wrong_one(settings, queued_run):
    settings.AGENTRT_METRICS_TOKEN = TOKEN
    client = Client()
    for headers in (
        {},
        {"HTTP_AUTHORIZATION": "Bearer nope"},
        {"HTTP_AUTHORIZATION": f"Token {TOKEN}"},
        {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"},
        {"HTTP_AUTHORIZATION": "Bearer "},
    ):
        response = client.get("/metrics", **headers)
        assert response.status_code == 401, headers
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert response.json()["code"] == "not_authenticated"
    ok = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain; version=")
    body = ok.content.decode()
    assert 'agent_runs{status="QUEUED"} 1.0' in body and "agent_queue_depth 1.0" in body
    # Aggregates only: no tenant, run, session or input in a label or a value.
    for private in ("acme", str(queued_run.id), str(queued_run.session_id), "private words"):
        assert private not in body


def test_metrics_without_a_token_is_open_and_check_deploy_says_so(settings):
    settings.AGENTRT_METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 200
    assert "agentrt.W001" in {m.id for m in run_checks(include_deployment_checks=True)}
    settings.AGENTRT_METRICS_TOKEN = TOKEN
    assert "agentrt.W001" not in {m.id for m in run_checks(include_deployment_checks=True)}


def test_metrics_takes_only_get():
    assert Client().post("/metrics").status_code == 405


def test_healthz_and_readyz_answer_without_a_session():
    client = Client()
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.content
    assert ready.json() == {"ready": True, "status": "ready"}  # anonymous: ready or not, nothing more


def staff_client(tenant) -> Client:
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="pw", operator=True)  # staff
    client = Client()
    client.force_login(get_user_model().objects.get(pk=user.pk))
    return client


def test_readyz_is_503_while_a_migration_is_unapplied_and_names_it_only_to_staff_or_the_token(settings, tenant):
    from django.db.migrations.loader import MigrationLoader

    # the ops app's newest migration: an older one with an applied successor is not in the plan
    (latest,) = [name for app, name in MigrationLoader(connection).graph.leaf_nodes() if app == "ops"]
    settings.AGENTRT_METRICS_TOKEN = TOKEN
    member = Client()
    member.force_login(get_user_model().objects.get(username="alice"))  # a member, not staff
    recorder = MigrationRecorder(connection)
    recorder.record_unapplied("ops", latest)
    try:
        # Issue 34 item 7f: anyone, a member and a wrong token learn that the node is not ready, not why.
        for client, headers in ((Client(), {}), (member, {}), (Client(), {"HTTP_AUTHORIZATION": "Bearer nope"})):
            response = client.get("/readyz", **headers)
            assert response.status_code == 503
            assert response.json() == {"ready": False, "status": "unavailable"}, headers
            assert latest not in response.content.decode()
        for client, headers in ((staff_client(tenant), {}), (Client(), {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"})):
            response = client.get("/readyz", **headers)
            assert response.status_code == 503
            body = response.json()
            assert body["ready"] is False and body["checks"]["migrations"] == {"unapplied": [f"ops.{latest}"]}
    finally:
        recorder.record_applied("ops", latest)
    assert Client().get("/readyz").status_code == 200


def test_readyz_without_a_metrics_token_shows_details_to_staff_only(settings, tenant):
    settings.AGENTRT_METRICS_TOKEN = ""
    assert "checks" not in Client().get("/readyz", HTTP_AUTHORIZATION="Bearer ").json()
    assert staff_client(tenant).get("/readyz").json()["checks"] == {"database": "ok", "migrations": "ok"}


PROBE = """
import json, os
import django
os.environ["DJANGO_SETTINGS_MODULE"] = "agentrt_site.settings"
django.setup()
from django.test import Client
c = Client(raise_request_exception=False, HTTP_HOST="127.0.0.1")
auth = {"HTTP_AUTHORIZATION": "Bearer " + os.environ["AGENTRT_METRICS_TOKEN"]}
out = {}
for name, path, headers in (
    ("/healthz", "/healthz", {}),
    ("/readyz", "/readyz", {}),
    ("/readyz with the token", "/readyz", auth),
    ("/metrics", "/metrics", auth),
):
    r = c.get(path, **headers)
    out[name] = [r.status_code, json.loads(r.content)]
print(json.dumps(out))
"""


def test_readyz_is_503_when_the_database_is_unreachable():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = subprocess_env(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{dead}/agentrt",
        AGENTRT_LOG_LEVEL="CRITICAL",
        AGENTRT_METRICS_TOKEN=TOKEN,
    )
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["/healthz"] == [200, {"ok": True, "status": "ok"}]  # the process is up: no database needed
    status, body = out["/readyz"]
    assert status == 503 and body == {"ready": False, "status": "unavailable"}  # anonymous: not why
    status, body = out["/readyz with the token"]
    assert status == 503 and body["ready"] is False and body["checks"]["database"].startswith("unreachable")
    assert out["/metrics"][0] == 503 and out["/metrics"][1]["code"] == "database_unavailable"


def test_agentrt_status_prints_the_fleet(queued_run, capsys):
    Approval.objects.create(tenant_id=queued_run.tenant_id, run_id=queued_run.id, kind="policy", request_hash="h")
    call_command("agentrt_status")
    text = capsys.readouterr().out
    assert "queue            1 queued, oldest " in text
    assert "live workers     0" in text
    assert "QUEUED 1" in text and "COMPLETED 0" in text
    assert "approvals        1 pending: " in text and "policy 1 (oldest " in text
    call_command("agentrt_status", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["queue"]["depth"] == 1 and data["queue"]["oldest_age_seconds"] >= 0
    assert data["runs_by_status"]["QUEUED"] == 1 and data["live_workers"] == 0
    assert data["approvals"]["policy"]["pending"] == 1
    assert data["oldest_pending_approval_seconds"] >= 0


def test_probes_and_scrapes_are_not_redirected_to_https(settings):
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    for path in ("/healthz", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200, path
    assert client.get("/runs/").status_code == 301
