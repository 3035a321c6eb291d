"""The console's pages and the JSON their scripts read (runs.web.console,
runs.web.views.run_summary_view), without a browser: each answers within the
user's tenant only (another tenant's run is 404, its rows and approvals are
never listed), a bad filter is said on the page, and what a tenant member
or a model wrote reaches the HTML escaped."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import Approval
from runs.runtime.executor import run_drive
from runs.services import agent_load, run_submit, tenant_create
from runs.services.run_list import short_id

pytestmark = pytest.mark.django_db

HOSTILE = "<script>window.__pwned=1</script>"
POLICY = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


def payer(tenant, name="payer"):
    agent_load(
        tenant=tenant,
        definition={
            "name": name,
            "instructions": "x",
            "tools": ["http_post"],
            "policy": POLICY,
            "model": {
                "provider": "scripted",
                "turns": [
                    {
                        "tool_calls": [
                            {"name": "http_post", "arguments": {"url": "http://127.0.0.1:9/", "json": {"n": HOSTILE}}}
                        ]
                    },
                    {"text": "paid"},
                ],
            },
        },
    )


def waiting(tenant, text):
    run, _ = run_submit(tenant=tenant, agent="payer", input=text)
    run_drive(run_id=run.id)
    return run


@pytest.fixture
def two(settings):
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["127.0.0.1:9"]
    acme, alice = tenant_create(name="acme", username="alice", password="pw")
    globex, bob = tenant_create(name="globex", username="bob", password="pw")
    _, root = tenant_create(name="acme", username="root", password="pw", superuser=True)
    payer(acme)
    payer(globex)
    return {
        "acme": waiting(acme, "acme " + HOSTILE),
        "globex": waiting(globex, "globex plan"),
        "alice": alice,
        "bob": bob,
        "root": root,
    }


def client(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_the_json_reads_stay_in_the_users_tenant(two):
    acme, globex = two["acme"], two["globex"]
    bob = client(two["bob"])
    rows = bob.get("/runs/rows/", {"run": [str(acme.id), str(globex.id)]}).json()["rows"]
    assert [r["id"] for r in rows] == [str(globex.id)]
    assert bob.get("/runs/rows/", {"run": str(acme.id), "tenant": "acme"}).json()["rows"] == []
    assert bob.get(f"/runs/{acme.id}/summary/").status_code == 404
    summary = bob.get(f"/runs/{globex.id}/summary/").json()
    assert (
        summary["status"] == "WAITING_FOR_APPROVAL" and summary["cancellable"] is True and summary["cost"] == "0.0000"
    )
    assert bob.get("/approvals/count/").json() == {"waiting": 1}
    theirs = [a["run"] for a in bob.get("/approvals/rows/").json()["results"]]
    assert theirs == [str(globex.id)]
    # A member's `tenant` is not honoured on the inbox: only a superuser looks at another tenant's.
    assert [a["run"] for a in bob.get("/approvals/rows/", {"tenant": "acme"}).json()["results"]] == [str(globex.id)]
    root = client(two["root"])
    assert [a["run"] for a in root.get("/approvals/rows/").json()["results"]] == [str(acme.id)]
    assert [a["run"] for a in root.get("/approvals/rows/", {"tenant": "globex"}).json()["results"]] == [str(globex.id)]
    assert root.get("/approvals/count/").json() == {"waiting": 1}  # what the superuser may decide: its own
    assert client(two["bob"]).get("/runs/rows/", {"status": "NOPE"}).status_code == 400
    assert Client().get("/approvals/count/").status_code == 302  # signed in only


def test_the_pages_list_only_the_tenants_runs_and_escape_what_they_show(two):
    acme, globex = two["acme"], two["globex"]
    alice = client(two["alice"])
    html = alice.get("/runs/", {"q": "plan"}).content.decode()
    assert str(globex.id) not in html and "No run matches" in html
    html = alice.get("/runs/").content.decode()
    assert f'<tr data-run="{acme.id}">' in html and str(globex.id) not in html
    assert f">{short_id(acme.id)}</a>" in html and f'data-copy="{acme.id}"' in html
    assert HOSTILE not in html and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert '<span id="waiting-count" class="count some" data-count="1">1 waiting</span>' in html
    bad = alice.get("/runs/", {"waiting_on": "godot"}).content.decode()
    assert 'id="filter-error"' in bad and "waiting_on" in bad
    inbox = alice.get("/approvals/").content.decode()
    assert f'<tr data-approval="{Approval.objects.get(run=acme).id}">' in inbox and HOSTILE not in inbox
    assert "globex" not in inbox
    detail = alice.get(f"/runs/{acme.id}/").content.decode()
    assert 'id="cancel-form" data-can-act="1">' in detail  # a waiting run may be cancelled
    # A superuser looking at another tenant's run: no cancel is drawn (it acts in its own only).
    other = client(two["root"]).get(f"/runs/{globex.id}/").content.decode()
    assert 'data-can-act="0" hidden>' in other


def test_the_run_pages_status_is_never_older_than_the_history_it_replays(two, monkeypatch):
    """The page replays events up to `last_sequence` as history without applying their statuses, and takes the
    status the server drew: a run that ends while the page is being read must not be drawn with its old status
    beside a history that already holds its end (the page would never show it ended). Here the run is cancelled
    just before the history's end is read."""
    import json
    import re

    from runs.models import Event
    from runs.services import run_list
    from runs.services.lifecycle import run_cancel

    run = two["acme"]
    assert run.status != "CANCELLED"
    read = run_list._last_sequence

    def end_then_read(r):
        monkeypatch.setattr(run_list, "_last_sequence", read)  # once
        run_cancel(run=r, by="alice", via="api", reason="meanwhile")
        return read(r)

    monkeypatch.setattr(run_list, "_last_sequence", end_then_read)
    page = client(two["alice"]).get(f"/runs/{run.id}/").content.decode()

    def block(name):
        return json.loads(re.search(rf'<script id="{name}" type="application/json">(.*?)</script>', page, re.S)[1])

    history = block("summary-data")["last_sequence"]
    ended = Event.objects.get(run_id=run.id, type="run.cancelled").sequence
    assert history >= ended  # the end is in the history, so the status drawn must be the end's
    assert block("run-data")["status"] == "CANCELLED" and block("summary-data")["status"] == "CANCELLED"
