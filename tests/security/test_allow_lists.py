"""Issue 34 item 4: per-tenant allow-lists for tools and model endpoints,
checked when an agent is published (this file; the checks at run time, through
a real `qcluster`, are tests/e2e/test_allow_lists_e2e.py).

The attack reproduced (security review 2026-12-03, N4): tenant `evil`
published an agent using team acme's `charge_card` tool (examples/payments)
and charged $499.99 through acme's gateway; another of its agents used the
operator's `fake` endpoint and its key. Tools and endpoints had no tenant
dimension. Now `Tenant.allowed_tools` / `Tenant.allowed_endpoints` (null: all)
refuse both at publishing — 400 `tool_not_allowed` naming `tools`, 400
`endpoint_not_allowed` naming `model` — and the payments example refuses
another tenant's principal itself.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from examples.payments.fake_gateway import FakeGateway
from examples.payments.models import ChargeJournal
from runs.errors import EndpointNotAllowed, InvalidInput, ToolNotAllowed
from runs.models import Agent, AgentVersion, Run, Tenant, ToolInvocation
from runs.services import agent_load, run_submit, tenant_configure, tenant_create
from tests.providers.conftest import PRICES
from tests.security.authz_world import user
from tests.security.conftest import token_client

pytestmark = pytest.mark.django_db

ATTACK = {"customer": "cus_acme0001", "amount_cents": 49999}
FAKE = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "FAKE_MODEL_KEY"}


def cashier(name: str = "evil-cashier", **model) -> dict:
    """The review's agent: one charge_card call of $499.99."""
    return {
        "name": name,
        "instructions": "charge",
        "model": model
        or {
            "provider": "scripted",
            "turns": [{"tool_calls": [{"name": "charge_card", "arguments": ATTACK}]}, {"text": "charged"}],
        },
        "tools": ["charge_card"],
    }


def helper(endpoint: str | None) -> dict:
    model = {"provider": "openai", "model": "test-model"}
    if endpoint is not None:
        model["endpoint"] = endpoint
    return {"name": "helper", "instructions": "hi", "model": model, "tools": []}


@pytest.fixture
def endpoints(settings):
    """Two operator endpoints: `fake` (the review's) and `local`."""
    settings.AGENTRT_MODEL_PRICES = PRICES
    settings.AGENTRT_MODEL_ENDPOINTS = {"fake": FAKE, "local": {**FAKE, "api_key_env": "LOCAL_MODEL_KEY"}}


@pytest.fixture
def evil(tenant, endpoints):
    """A second tenant restricted to echo and http_get and the `local` endpoint, with a publisher (evan)."""
    evil, _ = tenant_create(name="evil", allowed_tools=["echo", "http_get"], allowed_endpoints=["local"])
    evan = user("evil", "evan", perms=("publish_agent",))
    return evil, evan


# -- publishing ---------------------------------------------------------------------------------------------


def test_the_attack_a_tool_outside_the_tenants_list_is_400_tool_not_allowed_naming_tools(evil):
    tenant, evan = evil
    client = token_client(evan)
    response = client.post("/api/agents/", cashier(), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "tool_not_allowed"
    assert list(body["fields"]) == ["tools"] and "charge_card" in body["fields"]["tools"][0], body
    assert "charge_card" in body["message"] and body["request_id"]
    assert not Agent.objects.filter(tenant=tenant).exists() and not AgentVersion.objects.filter(tenant=tenant).exists()
    # What the list holds is published as before.
    echo = {"name": "echoer", "model": {"provider": "scripted", "turns": [{"text": "x"}]}, "tools": ["echo"]}
    assert client.post("/api/agents/", echo, format="json").status_code == 201


def test_the_attack_an_endpoint_outside_the_tenants_list_is_400_endpoint_not_allowed_naming_model(evil):
    _, evan = evil
    client = token_client(evan)
    for endpoint in ("fake", None):  # the review's endpoint, and the built-in `openai` a block names by default
        response = client.post("/api/agents/", helper(endpoint), format="json")
        assert response.status_code == 400, response.content
        body = response.json()
        assert body["code"] == "endpoint_not_allowed", body
        assert list(body["fields"]) == ["model"], body
        assert repr(endpoint or "openai") in body["fields"]["model"][0], body
    assert not AgentVersion.objects.filter(agent__name="helper").exists()
    assert client.post("/api/agents/", helper("local"), format="json").status_code == 201
    # The scripted provider calls no endpoint: not restricted by the endpoint list.
    scripted = {"name": "s", "model": {"provider": "scripted", "turns": [{"text": "x"}]}, "tools": []}
    assert client.post("/api/agents/", scripted, format="json").status_code == 201


def test_null_lists_keep_todays_behaviour(tenant, endpoints):
    """acme's lists are null (every tenant's before this change): any tool, any endpoint."""
    assert (tenant.allowed_tools, tenant.allowed_endpoints) == (None, None)
    assert agent_load(tenant=tenant, definition=cashier("acme-cashier")).definition["tools"] == ["charge_card"]
    assert agent_load(tenant=tenant, definition=helper("fake")).definition["model"]["endpoint"] == "fake"
    assert agent_load(tenant=tenant, definition=helper(None)).definition["model"]["endpoint"] == "openai"


def test_load_agent_and_the_service_refuse_them_too(evil, tmp_path):
    tenant, _ = evil
    path = tmp_path / "cashier.json"
    path.write_text(json.dumps(cashier()))
    with pytest.raises(CommandError) as info:
        call_command("load_agent", str(path), "--tenant", "evil", stdout=StringIO())
    assert "tools" in str(info.value) and "charge_card" in str(info.value)
    with pytest.raises(ToolNotAllowed) as tool:
        agent_load(tenant=tenant, definition=cashier())
    assert (tool.value.code, tool.value.status, list(tool.value.fields)) == ("tool_not_allowed", 400, ["tools"])
    with pytest.raises(EndpointNotAllowed) as endpoint:
        agent_load(tenant=tenant, definition=helper("fake"))
    assert (endpoint.value.code, list(endpoint.value.fields)) == ("endpoint_not_allowed", ["model"])
    assert not AgentVersion.objects.filter(tenant=tenant).exists()


def test_a_list_changed_after_the_instance_was_read_is_the_one_checked(tenant):
    stale = Tenant.objects.get(id=tenant.id)
    tenant_configure(tenant=tenant, allowed_tools=["echo"])
    with pytest.raises(ToolNotAllowed):
        agent_load(tenant=stale, definition=cashier())


# -- setting the lists -----------------------------------------------------------------------------------


def test_create_tenant_sets_the_lists_and_validates_the_names(endpoints):
    out = StringIO()
    call_command(
        "create_tenant", "evil", "--user", "eve", "--tools", "echo, http_get", "--endpoints", "local", stdout=out
    )
    evil = Tenant.objects.get(name="evil")
    assert (evil.allowed_tools, evil.allowed_endpoints) == (["echo", "http_get"], ["local"])
    assert "tools: echo, http_get" in out.getvalue() and "endpoints: local" in out.getvalue()
    assert get_user_model().objects.get(username="eve").membership.tenant_id == evil.id

    with pytest.raises(CommandError) as info:
        call_command("create_tenant", "evil", "--tools", "echo,charge_cardd")
    assert str(info.value).startswith("--tools: ") and "'charge_cardd'" in str(info.value)
    with pytest.raises(CommandError) as info:
        call_command("create_tenant", "evil", "--endpoints", "nowhere")
    assert str(info.value).startswith("--endpoints: ") and "'nowhere'" in str(info.value)
    assert Tenant.objects.get(name="evil").allowed_tools == ["echo", "http_get"]  # a refused change changes nothing

    # On an existing tenant, without --user: `''` is none, `all` is null again; an option left out is kept.
    call_command("create_tenant", "evil", "--tools", "", stdout=StringIO())
    assert Tenant.objects.get(name="evil").allowed_tools == []
    call_command("create_tenant", "evil", "--tools", "all", stdout=StringIO())
    evil = Tenant.objects.get(name="evil")
    assert (evil.allowed_tools, evil.allowed_endpoints) == (None, ["local"])
    with pytest.raises(CommandError, match="--user"):
        call_command("create_tenant", "evil")
    with pytest.raises(CommandError, match="need --user"):
        call_command("create_tenant", "evil", "--operator", "--tools", "echo")


def test_the_service_names_the_field_of_a_bad_list(tenant):
    for value, message in (("echo", "list of names"), ([1], "list of names"), (["echo", " "], "empty")):
        with pytest.raises(InvalidInput) as info:
            tenant_configure(tenant=tenant, allowed_tools=value)
        assert list(info.value.fields) == ["allowed_tools"] and message in info.value.fields["allowed_tools"][0]
    assert tenant_configure(tenant=tenant, allowed_tools=["echo", "echo"]).allowed_tools == ["echo"]


def admin_post(client, tenant, **fields):
    return client.post(
        f"/admin/runs/tenant/{tenant.id}/change/",
        {"name": tenant.name, "policy_floor": "{}", "max_active_runs": "", **fields},
    )


def test_only_a_superuser_edits_the_lists_in_the_admin(tenant, endpoints):
    root = user("ops", "root", superuser=True)
    client = Client()
    client.force_login(root)
    done = admin_post(client, tenant, allowed_tools='["echo", "http_get"]', allowed_endpoints='["local"]')
    assert done.status_code == 302, done.content[:2000]
    tenant.refresh_from_db()
    assert (tenant.allowed_tools, tenant.allowed_endpoints) == (["echo", "http_get"], ["local"])
    bad = admin_post(client, tenant, allowed_tools='["echo", "charge_cardd"]', allowed_endpoints="")
    assert bad.status_code == 200 and "charge_cardd" in bad.content.decode()
    assert Tenant.objects.get(id=tenant.id).allowed_tools == ["echo", "http_get"]  # unchanged
    cleared = admin_post(client, tenant, allowed_tools="", allowed_endpoints="")
    assert cleared.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.allowed_tools, tenant.allowed_endpoints) == (None, None)  # empty: every one

    # A tenant admin (runs.change_tenant) sees them, read-only: its posted lists are ignored.
    tenant_configure(tenant=tenant, allowed_tools=["echo"])
    editor = user("acme", "ed", perms=("change_tenant", "view_tenant"))
    editor.is_staff = True
    editor.save()
    client = Client()
    client.force_login(editor)
    page = client.get(f"/admin/runs/tenant/{tenant.id}/change/").content.decode()
    assert 'name="allowed_tools"' not in page and "echo" in page
    assert admin_post(client, tenant, allowed_tools="", allowed_endpoints='["fake"]').status_code == 302
    tenant.refresh_from_db()
    assert (tenant.allowed_tools, tenant.allowed_endpoints) == (["echo"], None)


# -- the payments example checks ctx.principal.tenant_id ---------------------------------------------------


@pytest.fixture
def gateway(settings):
    g = FakeGateway().start()
    settings.PAYMENTS_GATEWAY_URL = g.url
    yield g
    g.close()


@pytest.mark.django_db(transaction=True)
def test_the_payments_example_refuses_another_tenants_principal(tenant, gateway, settings):
    """charge_card charges only for PAYMENTS_TENANT's runs, whatever the allow-lists say (both null here)."""
    from runs.runtime.executor import run_drive

    settings.PAYMENTS_TENANT = "acme"
    evil, _ = tenant_create(name="evil")
    eve = user("evil", "eve")

    def charge(tenant, principal=None):
        agent_load(tenant=tenant, definition=cashier())
        run, _ = run_submit(tenant=tenant, agent="evil-cashier", input="charge", principal=principal)
        run_drive(run_id=run.id)
        return Run.objects.get(id=run.id), ToolInvocation.objects.get(run_id=run.id)

    for principal in (eve, None):  # the review's member, and a shell submit (the system principal) in `evil`
        run, call = charge(evil, principal)
        assert run.status == "COMPLETED", run.failure  # the model saw the refusal and answered
        assert call.status == "failed" and call.result["error"] == "tenant_not_allowed", call.result
    assert gateway.posts == [] and not ChargeJournal.objects.exists()  # nothing journaled, nothing sent

    run, call = charge(tenant, get_user_model().objects.get(username="alice"))  # acme's own run charges
    assert call.status == "completed" and call.result["amount_cents"] == 49999, call.result
    assert len(gateway.posts) == 1 and ChargeJournal.objects.count() == 1

    settings.PAYMENTS_TENANT = ""  # unset: the gateway charges for nobody
    run, call = charge(tenant)
    assert call.result["error"] == "payments_not_configured" and len(gateway.posts) == 1
