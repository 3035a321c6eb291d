"""`GET /api/runs/` filters and search (runs.services.run_list): each filter
narrows, a bad value is 400 naming the parameter, the search reads input
text only within its window, and nothing a member asks reaches another
tenant's runs; the OpenAPI schema documents every parameter."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runs.clock import CLOCK
from runs.models import Run, Session
from runs.services import run_list

pytestmark = pytest.mark.django_db


def ids(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {r["id"] for r in response.json()["results"]}


def more_runs(template: Run, n: int, *, text: str = "crowd", status: str = "COMPLETED", start=None) -> list[Run]:
    """`n` runs beside `template`, one a second back from `start` (now), each in a session of its own."""
    start = start or CLOCK.now()
    sessions = Session.objects.bulk_create(
        [Session(tenant_id=template.tenant_id, agent_id=template.agent_id) for _ in range(n)]
    )
    return Run.objects.bulk_create(
        [
            Run(
                tenant_id=template.tenant_id,
                session=session,
                agent_id=template.agent_id,
                agent_version=template.agent_version,
                status=status,
                input=f"{text} {i}",
                created_at=start - timedelta(seconds=i + 1),
                updated_at=start - timedelta(seconds=i + 1),
            )
            for i, session in enumerate(sessions)
        ]
    )


def test_each_filter_narrows_the_list(world, alice, as_user):
    client = as_user(alice)
    w = world
    assert ids(client.get("/api/runs/", {"status": "COMPLETED"})) == {str(w.done.id)}
    assert ids(client.get("/api/runs/", {"status": "QUEUED,COMPLETED"})) == {
        str(w.queued.id),
        str(w.done.id),
        str(w.child.id),
    }
    assert ids(client.get("/api/runs/?status=QUEUED&status=COMPLETED")) == {
        str(w.queued.id),
        str(w.done.id),
        str(w.child.id),
    }
    assert ids(client.get("/api/runs/", {"agent": "approver"})) == {str(w.waiting.id)}
    assert ids(client.get("/api/runs/", {"agent": "nobody"})) == set()
    assert ids(client.get("/api/runs/", {"waiting_on": "approval"})) == {str(w.waiting.id)}
    assert ids(client.get("/api/runs/", {"waiting_on": "user"})) == {str(w.asking.id)}
    assert ids(client.get("/api/runs/", {"waiting_on": "child_runs"})) == {str(w.delegating.id)}
    assert ids(client.get("/api/runs/", {"waiting_on": "approval", "agent": "bot"})) == set()  # they combine (AND)
    assert ids(client.get("/api/runs/", {"tenant": "acme", "agent": "asker"})) == {str(w.asking.id)}


def test_the_time_range_and_since(world, alice, as_user):
    client = as_user(alice)
    old = more_runs(world.done, 1, text="last week", start=CLOCK.now() - timedelta(days=7))[0]
    everything = ids(client.get("/api/runs/", {"page_size": 200}))
    assert str(old.id) in everything
    recent = ids(client.get("/api/runs/", {"since": "24h", "page_size": 200}))
    assert recent == everything - {str(old.id)}
    day = (CLOCK.now() - timedelta(days=7)).date()
    assert ids(
        client.get(
            "/api/runs/", {"created_after": day.isoformat(), "created_before": (day + timedelta(days=1)).isoformat()}
        )
    ) == {str(old.id)}
    before = (old.created_at + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    assert ids(client.get("/api/runs/", {"created_before": before})) == {str(old.id)}
    assert ids(client.get("/api/runs/", {"created_after": before, "page_size": 200})) == recent


def test_search_finds_an_id_prefix_the_short_id_an_agent_and_input_text(world, alice, as_user):
    client = as_user(alice)
    Run.objects.filter(id=world.queued.id).update(input="Ship release 1.4.2 to eu-west")
    full = str(world.waiting.id)
    assert ids(client.get("/api/runs/", {"q": full})) == {full}
    assert ids(client.get("/api/runs/", {"q": full[:13]})) >= {full}  # a prefix, dash included
    tail = run_list.short_id(world.asking.id)
    assert ids(client.get("/api/runs/", {"q": tail})) == {str(world.asking.id)}
    assert ids(client.get("/api/runs/", {"q": tail.upper()})) == {str(world.asking.id)}
    assert ids(client.get("/api/runs/", {"q": "ASKE"})) == {str(world.asking.id)}  # the agent's name, any case
    assert ids(client.get("/api/runs/", {"q": "release 1.4"})) == {str(world.queued.id)}  # input text, any case
    assert ids(client.get("/api/runs/", {"q": "RELEASE 1.4", "status": "COMPLETED"})) == set()
    assert ids(client.get("/api/runs/", {"q": "no such thing anywhere"})) == set()


def test_input_text_is_searched_only_among_the_most_recent_runs(world, alice, as_user, monkeypatch):
    """The bounded ILIKE: past SEARCH_WINDOW runs (after the other filters) the input is not read; an id
    prefix still finds any run."""
    monkeypatch.setattr(run_list, "SEARCH_WINDOW", 3)
    client = as_user(alice)
    runs = more_runs(world.done, 5, text="needle", start=CLOCK.now() - timedelta(hours=1))
    found = ids(client.get("/api/runs/", {"q": "needle"}))
    assert len(found) <= 3 and str(runs[-1].id) not in found
    # Narrowed first (these runs are the only FAILED ones), the window holds them all.
    Run.objects.filter(id__in=[r.id for r in runs]).update(status="FAILED")
    assert ids(client.get("/api/runs/", {"q": "needle", "status": "FAILED"})) == {str(r.id) for r in runs[:3]}
    assert ids(client.get("/api/runs/", {"q": str(runs[-1].id)})) == {str(runs[-1].id)}


@pytest.mark.parametrize(
    "query, field",
    [
        ({"status": "DONE"}, "status"),
        ({"status": "QUEUED,done"}, "status"),
        ({"waiting_on": "godot"}, "waiting_on"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_before": "2026-13-40"}, "created_before"),
        ({"created_after": "2026-12-03", "created_before": "2026-12-02"}, "created_before"),
        ({"since": "5y"}, "since"),
        ({"since": "0h"}, "since"),
        ({"q": "x" * 201}, "q"),
        ({"agent": "a" * 101}, "agent"),
        ({"tenant": "t" * 101}, "tenant"),
        ({"waiting_on": ""}, "waiting_on"),
        ({"since": " "}, "since"),
        ({"status": ""}, "status"),
    ],
)
def test_a_bad_filter_value_is_400_naming_the_parameter(world, alice, as_user, query, field):
    response = as_user(alice).get("/api/runs/", query)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid" and list(body["fields"]) == [field], body


def test_no_filter_or_search_reaches_another_tenants_runs(world, other_world, bob, root, as_user):
    """Two tenants with the same agents and inputs: whatever a member of globex asks, it lists globex's runs."""
    client = as_user(bob)
    acme = {str(r.id) for r in Run.objects.filter(tenant=world.tenant)}
    globex = {str(r.id) for r in Run.objects.filter(tenant=other_world.tenant)}
    asks = [
        {},
        {"tenant": "acme"},
        {"agent": "bot"},
        {"status": "COMPLETED,QUEUED,WAITING_FOR_APPROVAL,WAITING_FOR_USER"},
        {"waiting_on": "approval"},
        {"q": "hello"},
        {"q": "bot"},
        {"q": str(world.waiting.id)},
        {"q": run_list.short_id(world.asking.id)},
        {"q": str(world.done.id)[:8]},
        {"since": "1d"},
    ]
    for ask in asks:
        found = ids(client.get("/api/runs/", {**ask, "page_size": 200}))
        assert found <= globex, (ask, found & acme)
    assert ids(client.get("/api/runs/", {"tenant": "acme"})) == set()
    assert ids(client.get("/api/runs/", {"page_size": 200})) == globex
    # A superuser sees both tenants and narrows to one by name.
    su = as_user(root)
    assert ids(su.get("/api/runs/", {"page_size": 200})) == acme | globex
    assert ids(su.get("/api/runs/", {"tenant": "globex", "page_size": 200})) == globex
    assert ids(su.get("/api/runs/", {"tenant": "globex", "q": str(world.waiting.id)})) == set()
    assert ids(su.get("/api/runs/", {"tenant": "no-such-tenant"})) == set()


def test_the_schema_documents_every_filter(alice, as_user):
    schema = as_user(alice).get("/api/schema/?format=json").json()
    parameters = {p["name"]: p for p in schema["paths"]["/api/runs/"]["get"]["parameters"]}
    for name in ("status", "agent", "waiting_on", "tenant", "created_after", "created_before", "since", "q"):
        assert name in parameters and parameters[name].get("description"), name
    assert set(parameters["waiting_on"]["schema"]["enum"]) == {"approval", "user", "child_runs"}
    assert "5,000 most recent runs" in parameters["q"]["description"]
    assert "ISO 8601" in parameters["created_after"]["description"]
