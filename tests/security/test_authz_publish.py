"""Issue 10 item 3, replayed against a real daphne and a real qcluster: a
tenant member without `runs.publish_agent` republishes release-bot with
`policy.default: allow` — refused 403, and the http_post still waits for a
person. A tenant policy floor that requires approval for side effects beats
an agent whose policy allows them, and it is read live, not pinned."""

from __future__ import annotations

import pytest

from runs.models import Agent, AgentVersion, Run, Tenant
from runs.services import agent_load, tenant_configure, tenant_get
from tests.conftest import wait_for
from tests.security.authz_world import (
    SIDE_EFFECTS_NEED_APPROVAL,
    allow_everything,
    http,
    release_bot,
    token_header,
    user,
)  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def status_of(run_id):
    return Run.objects.filter(id=run_id).values_list("status", flat=True).first()


def test_a_member_cannot_republish_release_bot_with_allow_and_the_post_still_waits(live_server_url, cluster, sink):
    member = user("acme", "alice")
    tenant = tenant_get(name="acme")
    shipped = agent_load(tenant=tenant, definition=release_bot(sink.url))  # the operator's `load_agent`
    auth = token_header(member)

    code, body = http(live_server_url, "POST", "/api/agents/", auth=auth, body=allow_everything(sink.url))
    assert code == 403 and body["code"] == "permission_denied", body
    assert Agent.objects.get(tenant=tenant, name="release-bot").latest_version == shipped.version
    assert AgentVersion.objects.filter(tenant=tenant).count() == 1

    cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    code, run = http(
        live_server_url, "POST", "/api/runs/", auth=auth, body={"agent": "release-bot", "input": "ship 1.4.2"}
    )
    assert code == 201, run
    wait_for(
        lambda: status_of(run["id"]) == "WAITING_FOR_APPROVAL", timeout=60, message="release-bot to wait for approval"
    )
    assert sink.count() == 0  # the http_post was not sent


def test_a_publisher_may_publish_and_the_version_records_who_and_when(live_server_url, sink):
    publisher = user("acme", "pub", perms=("publish_agent",))
    code, body = http(live_server_url, "POST", "/api/agents/", auth=token_header(publisher), body=release_bot(sink.url))
    assert code == 201, body
    assert body["published_by"] == "pub" and body["published_at"]
    version = AgentVersion.objects.get(id=body["id"])
    assert version.published_by_id == publisher.id and version.published_at is not None


def test_a_side_effect_floor_beats_an_agent_that_allows_everything(live_server_url, cluster, sink):
    publisher = user("acme", "pub", perms=("publish_agent",))
    tenant = tenant_get(name="acme")
    tenant_configure(tenant=tenant, policy_floor=SIDE_EFFECTS_NEED_APPROVAL)
    auth = token_header(publisher)
    code, body = http(live_server_url, "POST", "/api/agents/", auth=auth, body=allow_everything(sink.url))
    assert code == 201, body  # a publisher may publish an agent that allows everything ...

    cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    code, run = http(live_server_url, "POST", "/api/runs/", auth=auth, body={"agent": "release-bot", "input": "ship"})
    assert code == 201, run
    wait_for(
        lambda: status_of(run["id"]) == "WAITING_FOR_APPROVAL", timeout=60, message="the floor to require approval"
    )
    assert sink.count() == 0  # ... and the tenant's floor still stops its side effect for a person


def test_the_floor_is_read_when_the_call_is_evaluated_not_pinned_at_submit(db, sink, settings):
    from runs.runtime.executor import run_drive
    from runs.services import run_submit

    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [sink.host]
    user("acme", "alice")
    tenant = tenant_get(name="acme")
    agent_load(tenant=tenant, definition=allow_everything(sink.url))
    run, _ = run_submit(tenant=tenant, agent="release-bot", input="ship")
    assert Tenant.objects.get(id=tenant.id).policy_floor == {}
    tenant_configure(tenant=tenant, policy_floor=SIDE_EFFECTS_NEED_APPROVAL)  # tightened after the submit
    run_drive(run_id=run.id)
    assert status_of(run.id) == "WAITING_FOR_APPROVAL" and sink.count() == 0


def test_load_agent_stays_the_operators_shell_command(db, tmp_path, sink):
    import json

    from django.core.management import call_command

    user("acme", "alice")
    path = tmp_path / "bot.json"
    path.write_text(json.dumps(allow_everything(sink.url)))
    call_command("load_agent", str(path), "--tenant", "acme")
    version = AgentVersion.objects.get(tenant__name="acme")
    assert version.published_by_id is None and version.published_at is not None


def test_the_admin_shows_who_published_each_version(db, sink):
    from django.test import Client

    from tests.api.conftest import token_client

    publisher = user("acme", "pub", perms=("publish_agent",))
    operator = user("acme", "op", operator=True, perms=("view_agentversion",))
    response = token_client(publisher).post("/api/agents/", release_bot(sink.url), format="json")
    assert response.status_code == 201, response.content
    client = Client()
    client.force_login(operator)
    page = client.get("/admin/runs/agentversion/").content.decode()
    assert "published by" in page.lower() and ">pub<" in page
    detail = client.get(f"/admin/runs/agentversion/{response.json()['id']}/change/").content.decode()
    assert "pub" in detail and "Published at" in detail
