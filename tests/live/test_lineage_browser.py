"""Fork from the run page in a real browser (issue 37 item 5; Debian's
chromium, daphne and a real qcluster): a run that sent two effects shows
"Fork from here" on each step; the one on step 1 opens the fork's page,
whose lineage names the original, and whose approval card says what the
original did at that position; approving it sends the second effect once,
and the first is never sent again."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from runs.models import Run
from tests.conftest import wait_for
from tests.live.test_browser import SHOTS, launch_chromium, log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def post(sink, n):
    return {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"effect": n}}}]}


def test_fork_from_here_on_the_run_page_waits_for_approval_and_sends_once(
    server, cluster, load_agent, submit, sink, tenant
):
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["resolve_approval", "view_run"]))
    load_agent(name="payer", turns=[post(sink, 1), post(sink, 2), {"text": "paid"}], tools=("http_post",))
    c = cluster(AGENTRT_LEASE_SECONDS=5, AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host)
    run = submit(agent="payer", text="pay twice")
    wait_for(lambda: Run.objects.get(id=run.id).status == "COMPLETED", timeout=60, message=c.output())
    assert [s["body"] for s in sink.sends] == [{"effect": 1}, {"effect": 2}]
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("form.fork-from-here >> nth=2", timeout=15000)  # steps 1, 2 and 3
        page.screenshot(path=str(SHOTS / "fork-1-original.png"), full_page=True)
        page.locator("form.fork-from-here").first.locator("button").click()
        page.wait_for_selector("#lineage-origin:has-text('forked at step 1 from')", timeout=15000)
        fork_url = page.url
        page.wait_for_selector(".approval:has-text('This run is a fork of run')", timeout=60000)
        card = page.inner_text(".approval")
        page.screenshot(path=str(SHOTS / "fork-2-approval.png"), full_page=True)
        page.locator(".approval button[value=approve]").click()
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        page.screenshot(path=str(SHOTS / "fork-3-completed.png"), full_page=True)
        assert page.evaluate("window.__pwned === undefined")
        browser.close()
    fork = Run.objects.get(forked_from_id=run.id)
    assert fork_url.endswith(f"/runs/{fork.id}/")
    assert f"fork of run {run.id} at step 1" in card and "the same call, with the same arguments" in card
    assert fork.status == "COMPLETED" and fork.forked_from_step == 1
    assert [s["body"] for s in sink.sends] == [{"effect": 1}, {"effect": 2}, {"effect": 2}]
