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


def test_an_mcp_calls_progress_shows_on_the_run_page(
    server, mcp_servers, tmp_path, load_agent, submit, tenant, settings
):
    """A real MCP server's progress notifications (our own SDK server, over stdio) become throttled
    `tool.call.progress` events, and the run page's timeline shows the last one: the tool, how far of how
    much, and the server's message as text."""
    from playwright.sync_api import sync_playwright

    from runs.runtime.executor import run_drive
    from runs.services import tenant_create
    from tests.mcptools.fixtures import State
    from tests.mcptools.test_mcp_long import ALLOW, PROGRESS, tasks_stdio

    settings.AGENTRT_MCP_PROGRESS_INTERVAL_MS = 60_000  # the first, then the last when the call ends
    mcp_servers({"tk": tasks_stdio(State(tmp_path / "tk-state"))})
    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run"]))
    load_agent(
        turns=[{"tool_calls": [{"name": PROGRESS, "arguments": {"name": "p", "steps": 30}}]}, {"text": "done"}],
        tools=(PROGRESS,),
        policy=ALLOW,
    )
    run = submit(text="progress")
    run_drive(run_id=run.id)
    assert Run.objects.get(id=run.id).status == "COMPLETED"
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("text=tool.call.progress", timeout=60000)
        timeline = page.inner_text("body")
        browser.close()
    assert f"{PROGRESS} 30/30 — step 30 of 30" in timeline
