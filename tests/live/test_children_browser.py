"""The run page's tree of child runs in a real browser (issue 15 §1): opened
before the run starts, the page adds each child when its parent starts it (from
the parent's `child_run` wait) and follows each child's status over the
tenant's socket until the parent completes — no reload."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from runs.models import Run
from tests.live.test_browser import SHOTS, launch_chromium, log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_run_page_shows_children_appear_and_complete_live(server, cluster, load_agent, submit, tenant):
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="watcher", password="s3cret-pass", operator=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_run"]))
    load_agent(name="worker", turns=[{"text": "part done", "delay_ms": 1500}])
    load_agent(
        name="lead",
        tools=("delegate_run",),
        delegates=["worker"],
        turns=[
            {
                "tool_calls": [
                    {"name": "delegate_run", "arguments": {"agent": "worker", "input": "part one"}},
                    {"name": "delegate_run", "arguments": {"agent": "worker", "input": "part two"}},
                ]
            },
            {"text": "Both parts are done."},
        ],
    )
    run = submit(agent="lead", text="split it")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "watcher", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        assert page.is_hidden("#family")  # no child yet: the panel is not drawn
        cluster(AGENTRT_LEASE_SECONDS=5)
        page.wait_for_selector("#tree li:nth-child(2)", timeout=60000)
        children = page.eval_on_selector_all("#tree li", "els => els.map(e => e.dataset.node)")
        page.screenshot(path=str(SHOTS / "children-1-started.png"), full_page=True)
        for child in children:
            page.wait_for_selector(f"#tree [data-run='{child}']:text('COMPLETED')", timeout=60000)
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        page.wait_for_selector("#answer:has-text('Both parts are done.')", timeout=10000)
        page.screenshot(path=str(SHOTS / "children-2-completed.png"), full_page=True)
        assert page.evaluate("window.__pwned === undefined")
        browser.close()
    # (the ORM is read outside Playwright's event loop)
    assert children == [
        str(c) for c in Run.objects.filter(parent=run).order_by("created_at").values_list("id", flat=True)
    ]
    assert Run.objects.get(id=run.id).status == "COMPLETED"
