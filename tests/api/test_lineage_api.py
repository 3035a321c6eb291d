"""Fork and replay over REST (issue 37): 201 with the new run's JSON
(`forked_from`, `replay_of`), the original's `forks`, 400 naming the field,
403 for a policy fork without the publish permission, 404 for another
tenant's run, 409 for a child run or an unfinished replay."""

from __future__ import annotations

import pytest

from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_fork_answers_201_with_its_lineage_and_the_original_lists_it(world, alice, as_user):
    client = as_user(alice)
    response = client.post(f"/api/runs/{world.done.id}/fork/", {"from_step": 0, "input": "again"}, format="json")
    assert response.status_code == 201, response.json()
    fork = response.json()
    assert fork["forked_from"] == {"run": str(world.done.id), "step": 0}
    assert (
        fork["replay_of"] is None and fork["status"] == "QUEUED" and fork["agent_version"] == world.done.agent_version
    )
    assert fork["session"] != str(world.done.session_id)
    original = client.get(f"/api/runs/{world.done.id}/").json()
    assert original["forked_from"] is None
    assert original["forks"] == [
        {"id": fork["id"], "step": 0, "status": "QUEUED", "agent_version": world.done.agent_version}
    ]
    row = Run.objects.get(id=fork["id"])
    assert row.tenant_id == world.tenant.id and row.principal_user_id == alice.id and row.fork_effects == "approve"


def test_a_replay_answers_201_with_replay_of(world, alice, as_user):
    response = as_user(alice).post(f"/api/runs/{world.done.id}/replay/", {"agent_version": "latest"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["replay_of"] == str(world.done.id) and response.json()["forked_from"] is None


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "from_step"),
        ({"from_step": "1"}, "from_step"),
        ({"from_step": -1}, "from_step"),
        ({"from_step": 2}, "from_step"),
        ({"from_step": 1, "effects": "now"}, "effects"),
        ({"from_step": 1, "agent_version": "abc"}, "agent_version"),
        ({"from_step": 1, "agent_version": 7}, "agent_version"),
        ({"from_step": 1, "input": ""}, "input"),
        ({"from_step": 1, "limits": {}}, "limits"),
    ],
)
def test_bad_fork_input_is_400_naming_the_field(world, alice, as_user, body, field):
    before = Run.objects.count()
    response = as_user(alice).post(f"/api/runs/{world.done.id}/fork/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["fields"], response.json()
    assert Run.objects.count() == before


def test_a_fork_under_the_policy_is_403_without_the_publish_permission(world, alice, as_user):
    from tests.api.conftest import grant_resolve

    body = {"from_step": 1, "effects": "policy"}
    response = as_user(alice).post(f"/api/runs/{world.done.id}/fork/", body, format="json")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    response = as_user(grant_resolve(alice)).post(f"/api/runs/{world.done.id}/fork/", body, format="json")
    assert response.status_code == 201 and Run.objects.get(id=response.json()["id"]).fork_effects == "policy"


def test_another_tenants_run_is_404_and_nothing_is_created(world, other_world, bob, as_user):
    before = Run.objects.count()
    for path, body in (("fork", {"from_step": 0}), ("replay", {})):
        response = as_user(bob).post(f"/api/runs/{world.done.id}/{path}/", body, format="json")
        assert response.status_code == 404, (path, response.json())
    assert Run.objects.count() == before


def test_a_child_run_is_409_and_a_running_replay_is_409(world, alice, as_user):
    client = as_user(alice)
    child = client.post(f"/api/runs/{world.child.id}/fork/", {"from_step": 0}, format="json")
    assert child.status_code == 409 and child.json()["code"] == "run_not_forkable"
    waiting = client.post(f"/api/runs/{world.waiting.id}/replay/", {}, format="json")
    assert waiting.status_code == 409 and waiting.json()["code"] == "run_not_finished"


def test_forks_count_against_the_quota(world, alice, as_user):
    world.tenant.max_active_runs = (
        Run.objects.filter(tenant=world.tenant).exclude(status__in=["COMPLETED", "FAILED", "CANCELLED"]).count()
    )
    world.tenant.save(update_fields=["max_active_runs"])
    before = Run.objects.count()
    for path, body in (("fork", {"from_step": 0}), ("replay", {})):
        response = as_user(alice).post(f"/api/runs/{world.done.id}/{path}/", body, format="json")
        assert response.status_code == 429 and response.json()["code"] == "quota_exceeded"
    assert Run.objects.count() == before
