"""The live run page shows an MCP call waiting for approval like any call, with the server's hints labelled as
hints (issue 36 item 7): a real chromium, daphne and qcluster whose worker calls our own MCP server over stdio;
the operator approves on the page and the effect happens once."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from runs.models import Run
from tests.live.test_browser import launch_chromium, log_in
from tests.mcptools.fixtures import fx_state as fx_state
from tests.mcptools.fixtures import fx_stdio
from tests.mcptools.fixtures import mcp_servers as mcp_servers

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WRITE = "mcp__fx__write"


def test_an_operator_approves_an_mcp_call_on_the_live_page(
    server, cluster, mcp_servers, fx_state, load_agent, submit, tenant
):
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    spec = {"fx": fx_stdio(fx_state)}
    mcp_servers(spec)
    load_agent(
        turns=[{"tool_calls": [{"name": WRITE, "arguments": {"name": "<i>page</i>"}}]}, {"text": "Written."}],
        tools=(WRITE,),
        policy={"default": "allow", "rules": [{"tool": WRITE, "decision": "require_approval"}]},
    )
    run = submit(text="write")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        cluster(AGENTRT_MCP_SERVERS=json.dumps(spec))
        page.wait_for_selector("#approvals button[value=approve]", timeout=60000)
        card = page.inner_text("#approvals")
        assert WRITE in card and "side effect: external_write" in card
        assert "MCP server fx, tool write" in card and "not trusted" in card and '"readOnlyHint": true' in card
        assert "<i>page</i>" in card  # the arguments as text, never as markup
        assert page.locator("#approvals i").count() == 0 and page.locator("#approvals script").count() == 0
        assert fx_state.effects() == []
        page.click("#approvals button[value=approve]")
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        browser.close()
    assert Run.objects.get(id=run.id).final_message == "Written."
    (effect,) = fx_state.effects()
    assert effect["name"] == "<i>page</i>"
