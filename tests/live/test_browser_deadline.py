"""The live run page past the run's deadline (issue 33 item 2): a real
chromium, daphne and qcluster; the sink holds the answer to a POST past the
run's 4 s deadline, so the call ends uncertain and the run waits on an
`uncertain_side_effect` approval requested after its deadline. The card —
drawn from the `approval.requested` event while the page is open, and again
by the server after a reload — offers no Approve, says why, and the
operator's "It did not take effect" ends the run FAILED deadline_exceeded."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth.models import Permission

from approvals.models import Approval
from runs.models import Run, ToolInvocation
from tests.conftest import wait_for
from tests.live.test_browser import launch_chromium, log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_past_the_deadline_the_live_page_offers_only_confirm_or_reject(
    server, cluster, load_agent, submit, sink, tenant
):
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    sink.behaviours = ["delay:120"]
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "Paid."},
        ],
        tools=("http_post",),
        limits={"deadline_seconds": 4},
    )
    load_agent(name="warm", turns=[{"text": "up"}])
    cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=3)
    warm = submit(agent="warm")  # the cluster's workers are up before the deadline's clock starts
    wait_for(lambda: Run.objects.get(id=warm.id).status == "COMPLETED", timeout=60, message="a warm-up run")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", "/runs/")
        with ThreadPoolExecutor(1) as pool:  # the ORM off playwright's event loop
            run = pool.submit(submit, text="pay").result()
        page.goto(f"{server}/runs/{run.id}/")  # open while the POST is held: the card comes from the event
        for drawn_by in ("the event", "the server"):
            page.wait_for_selector("button[value=took_effect]", timeout=60000)
            card = page.inner_text("#approvals")
            assert "deadline has passed" in card and "deadline_exceeded" in card, (drawn_by, card)
            assert not page.is_visible("button[value=approve]"), drawn_by
            assert page.is_visible("button[value=reject]") and page.is_visible("button[value=not_taken]")
            if drawn_by == "the event":
                page.reload()
        page.click("button[value=not_taken]")
        page.wait_for_selector("#status:text('FAILED')", timeout=60000)
        browser.close()
    row = Run.objects.get(id=run.id)
    assert row.failure["reason"] == "deadline_exceeded"
    assert Approval.objects.get(run=run).status == "confirmed"
    assert ToolInvocation.objects.get(run=run).outcome == "failed"
    sink.release.set()
    assert sink.count() == 1
