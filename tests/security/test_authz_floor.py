"""The tenant policy floor (issue 10 item 3): the stricter decision wins,
a floor rule can target side-effect calls, and only users with
`runs.change_tenant` edit their own tenant's floor in the admin, validated
with the agent policy schema."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.policy import PolicyEngine, stricter
from runs.models import Tenant
from runs.services import tenant_get
from tests.security.authz_world import SIDE_EFFECTS_NEED_APPROVAL, user

pytestmark = pytest.mark.django_db(transaction=True)
READ_ONLY = {"echo": True, "http_get": True, "http_post": False}


def engine(agent, floor):
    return PolicyEngine(agent, floor=lambda: floor, read_only_of=READ_ONLY.get)


@pytest.mark.parametrize(
    "agent, floor, tool, expected",
    [
        ({"default": "allow"}, SIDE_EFFECTS_NEED_APPROVAL, "http_post", "require_approval"),
        ({"default": "allow"}, SIDE_EFFECTS_NEED_APPROVAL, "http_get", "allow"),
        (
            {"default": "allow"},
            SIDE_EFFECTS_NEED_APPROVAL,
            "mystery",
            "require_approval",
        ),  # unknown kind counts as a side effect
        (
            {"default": "deny"},
            SIDE_EFFECTS_NEED_APPROVAL,
            "http_post",
            "deny",
        ),  # the agent may be stricter than the floor
        ({"default": "require_approval"}, {"default": "deny"}, "echo", "deny"),
        ({"default": "allow"}, {}, "http_post", "allow"),  # no floor: the agent decides
        (
            {"default": "allow"},
            {"rules": [{"tool": "*", "side_effect": False, "decision": "deny"}]},
            "http_get",
            "deny",
        ),
        (
            {"default": "allow"},
            {
                "rules": [
                    {
                        "tool": "http_post",
                        "decision": "require_approval",
                        "when": {"arg": "json.amount", "op": "gt", "value": 100},
                    }
                ]
            },
            "http_post",
            "require_approval",
        ),
    ],
)
def test_the_stricter_of_floor_and_agent_decides(agent, floor, tool, expected):
    assert engine(agent, floor).evaluate(tool, {"url": "http://x", "json": {"amount": 250}}) == expected


def test_an_unreadable_floor_fails_closed():
    def broken():
        raise RuntimeError("database down")

    assert (
        PolicyEngine({"default": "allow"}, floor=broken, read_only_of=READ_ONLY.get).evaluate("echo", {})
        == "require_approval"
    )
    assert stricter("allow", "nonsense") == "require_approval"


def admin_post_floor(client, tenant, floor_text, **extra):
    return client.post(
        f"/admin/runs/tenant/{tenant.id}/change/", {"name": tenant.name, "policy_floor": floor_text, **extra}
    )


def test_a_tenant_admin_edits_its_own_floor_and_nothing_else():
    editor = user("acme", "ed", perms=("change_tenant", "view_tenant"))
    editor.is_staff = True
    editor.save()
    user("globex", "bob")
    acme, globex = tenant_get(name="acme"), tenant_get(name="globex")
    client = Client()
    client.force_login(editor)

    response = admin_post_floor(
        client,
        acme,
        '{"rules": [{"tool": "*", "side_effect": true, "decision": "require_approval"}]}',
        max_active_runs="100000",
    )
    assert response.status_code == 302, response.content[:2000]
    acme.refresh_from_db()
    assert acme.policy_floor == {
        "default": "allow",
        "rules": [{"tool": "*", "decision": "require_approval", "when": None, "side_effect": True}],
    }
    assert acme.max_active_runs is None  # the quota is the platform's, read-only here

    bad = admin_post_floor(client, acme, '{"rules": [{"tool": "*", "decision": "maybe"}]}')
    assert bad.status_code == 200 and "rules.0.decision" in bad.content.decode()
    assert Tenant.objects.get(id=acme.id).policy_floor["rules"][0]["decision"] == "require_approval"  # unchanged

    assert client.get(f"/admin/runs/tenant/{globex.id}/change/").status_code == 404
    assert admin_post_floor(client, globex, '{"default": "deny"}').status_code == 404
    assert Tenant.objects.get(id=globex.id).policy_floor == {}


def test_staff_without_change_tenant_cannot_edit_the_floor():
    viewer = user("acme", "viewer", operator=True)  # an operator: approvals, cancel, resume — not the floor
    acme = tenant_get(name="acme")
    client = Client()
    client.force_login(viewer)
    response = admin_post_floor(client, acme, '{"default": "allow"}')
    assert response.status_code == 403
    assert Tenant.objects.get(id=acme.id).policy_floor == {}


def test_side_effect_is_an_optional_rule_key_that_leaves_older_definitions_unchanged():
    from runs.services import agent_load

    user("acme", "alice")
    acme = tenant_get(name="acme")
    plain = {
        "name": "a",
        "model": {"provider": "scripted", "turns": []},
        "tools": ["echo"],
        "policy": {"rules": [{"tool": "echo", "decision": "allow"}]},
    }
    version = agent_load(tenant=acme, definition=plain)
    assert version.definition["policy"]["rules"] == [{"tool": "echo", "decision": "allow", "when": None}]
    marked = agent_load(
        tenant=acme, definition={**plain, "policy": {"rules": [{"tool": "*", "side_effect": True, "decision": "deny"}]}}
    )
    assert marked.definition["policy"]["rules"][0]["side_effect"] is True


def test_the_floor_is_read_once_per_step_and_a_tightened_floor_applies_at_the_next_step():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.runtime.wiring import tenant_floor

    user("acme", "alice")
    acme = tenant_get(name="acme")
    step = {"n": 1}
    policy = PolicyEngine(
        {"default": "allow"}, floor=tenant_floor(acme.id, step_of=lambda: step["n"]), read_only_of=READ_ONLY.get
    )

    with CaptureQueriesContext(connection) as queries:
        assert [policy.evaluate(tool, {}) for tool in ("http_post", "echo", "http_post")] == ["allow"] * 3
    assert len(queries) == 1  # one SELECT for the step's whole batch

    Tenant.objects.filter(id=acme.id).update(policy_floor=SIDE_EFFECTS_NEED_APPROVAL)
    assert policy.evaluate("http_post", {}) == "allow"  # the same step keeps the floor it read
    step["n"] = 2
    with CaptureQueriesContext(connection) as queries:
        assert policy.evaluate("http_post", {}) == "require_approval"  # the next step reads the tightened floor
        assert policy.evaluate("echo", {}) == "allow"
    assert len(queries) == 1


def test_a_floor_read_that_failed_is_not_remembered():
    from runs.runtime.wiring import tenant_floor

    user("acme", "alice")
    acme = tenant_get(name="acme")
    Tenant.objects.filter(id=acme.id).update(policy_floor={"default": "deny"})
    calls = {"n": 0}

    def step_of():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("state unreadable")
        return 1

    policy = PolicyEngine(
        {"default": "allow"}, floor=tenant_floor(acme.id, step_of=step_of), read_only_of=READ_ONLY.get
    )
    assert policy.evaluate("echo", {}) == "require_approval"  # fails closed
    assert policy.evaluate("echo", {}) == "deny"  # and the next evaluation reads the floor


def test_a_floor_tightened_during_a_step_applies_to_the_next_step_of_a_running_run(load_agent, submit, tenant):
    """The floor comes with the commit that starts a step's model request
    (no read transaction of its own): a floor tightened while step 1's tool
    runs is the floor step 2's calls are decided under."""
    from runs.domain.values import ToolSpec
    from runs.models import ToolInvocation
    from runs.runtime.executor import run_drive
    from runs.tools import REGISTRY

    def tighten(arguments, context):
        Tenant.objects.filter(id=tenant.id).update(
            policy_floor={"default": "allow", "rules": [{"tool": "echo", "decision": "deny"}]}
        )
        return "tightened"

    REGISTRY.register(ToolSpec(name="tighten_floor", parameters={"type": "object"}, read_only=True), tighten)
    try:
        load_agent(
            turns=[
                {"tool_calls": [{"name": "echo", "arguments": {"text": "before"}}]},
                {"tool_calls": [{"name": "tighten_floor", "arguments": {}}]},
                {"tool_calls": [{"name": "echo", "arguments": {"text": "after"}}]},
                {"text": "done"},
            ],
            tools=("echo", "tighten_floor"),
        )
        run = submit()
        assert run_drive(run_id=run.id).kind.value == "completed"
    finally:
        REGISTRY.unregister("tighten_floor")
    calls = dict(ToolInvocation.objects.filter(run_id=run.id).values_list("step_number", "status"))
    assert calls == {1: "completed", 2: "completed", 3: "failed"}
    denied = ToolInvocation.objects.get(run_id=run.id, step_number=3)
    assert denied.result["error"] == "denied_by_policy"


def test_the_reader_takes_the_floor_the_steps_first_commit_read_without_a_query():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.runtime.wiring import tenant_floor

    user("acme", "alice")
    acme = tenant_get(name="acme")

    class Store:
        floor_seen = (4, {"default": "deny"})

    step = {"n": 4}
    policy = PolicyEngine(
        {"default": "allow"},
        floor=tenant_floor(acme.id, step_of=lambda: step["n"], store=Store()),
        read_only_of=READ_ONLY.get,
    )
    with CaptureQueriesContext(connection) as queries:
        assert policy.evaluate("echo", {}) == "deny"
    assert len(queries) == 0
    step["n"] = 5  # no commit of this store started step 5 (e.g. the first decisions after a resume): read it
    with CaptureQueriesContext(connection) as queries:
        assert policy.evaluate("echo", {}) == "allow"
    assert len(queries) == 1
