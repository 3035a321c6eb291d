"""Child runs over REST (issue 15 §1): the run JSON's `parent` and `children`,
`GET /api/runs/?parent=<id>`, and the agent definition's `delegates`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_run_json_names_its_parent_and_its_children(world, alice, as_user):
    client = as_user(alice)

    parent = client.get(f"/api/runs/{world.delegating.id}/").json()
    child = client.get(f"/api/runs/{world.child.id}/").json()

    assert parent["parent"] is None
    assert parent["children"] == [{"id": str(world.child.id), "agent": "bot", "status": "QUEUED"}]
    assert child["parent"] == str(world.delegating.id) and child["children"] == []
    assert client.get(f"/api/runs/{world.done.id}/").json()["children"] == []


def test_the_parent_filter_lists_a_runs_children(world, alice, as_user):
    client = as_user(alice)

    listed = client.get("/api/runs/", {"parent": str(world.delegating.id)}).json()
    nothing = client.get("/api/runs/", {"parent": str(world.done.id)}).json()

    assert [r["id"] for r in listed["results"]] == [str(world.child.id)]
    assert listed["results"][0]["parent"] == str(world.delegating.id)
    assert nothing["count"] == 0
    everything = {r["id"]: r for r in client.get("/api/runs/", {"page_size": 100}).json()["results"]}
    assert everything[str(world.delegating.id)]["children"][0]["id"] == str(world.child.id)


def test_a_parent_that_is_not_an_id_is_a_400_naming_the_field(world, alice, as_user):
    response = as_user(alice).get("/api/runs/", {"parent": "not-a-uuid"})

    assert response.status_code == 400
    assert response.json()["fields"] == {"parent": ["must be a UUID"]}


def test_the_run_list_reads_children_in_one_query_whatever_the_number_of_runs(
    world, alice, as_user, django_assert_max_num_queries
):
    client = as_user(alice)
    client.get("/api/runs/")  # warm the auth and throttle caches
    with django_assert_max_num_queries(8):  # 8 here (children, forks: a query each); one per run would make it 19
        response = client.get("/api/runs/", {"page_size": 100})
    assert response.json()["count"] == 6


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"delegates": ["bot"]}, "delegates", "delegates needs 'delegate_run' in tools"),
        ({"tools": ["delegate_run"]}, "delegates", "needs the agents it may start listed here"),
        ({"tools": ["delegate_run"], "delegates": ["bot", "bot"]}, "delegates", "listed more than once"),
        ({"tools": ["delegate_run"], "delegates": ["<b>"]}, "delegates.0", "String should match pattern"),
        ({"tools": ["delegate_run"], "delegates": "bot"}, "delegates", "Input should be a valid list"),
    ],
)
def test_a_definitions_delegates_are_checked_and_a_refusal_names_the_field(
    world, operator, as_user, change, field, message
):
    definition = {"name": "lead2", "model": {"provider": "scripted", "turns": [{"text": "x"}]}, "tools": []}
    definition.update(change)

    response = as_user(operator).post("/api/agents/", definition, format="json")

    assert response.status_code == 400, response.content
    fields = response.json()["fields"]
    assert field in fields and any(message in m for m in fields[field]), fields


def test_a_definition_without_delegates_keeps_its_version(tenant):
    """`delegates` enters the version hash only when set: an agent loaded before delegation existed keeps
    the version it had."""
    from runs.services import agent_load

    plain = {"name": "plain", "model": {"provider": "scripted", "turns": [{"text": "x"}]}, "tools": ["echo"]}
    before = agent_load(tenant=tenant, definition=plain)
    after = agent_load(tenant=tenant, definition={**plain, "delegates": []})

    assert before.version == after.version
    assert "delegates" not in before.definition
