"""The live run page offers the third decision on an unknown outcome: a real
chromium, daphne and qcluster; a POST the server takes and never answers
parks the run on `uncertain_side_effect`, the operator clicks "It took
effect", nothing is sent again and the run completes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from approvals.models import Approval
from runs.models import Event, Run
from tests.live.test_browser import launch_chromium, log_in, server  # noqa: F401  (server: the daphne fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_an_operator_confirms_an_unknown_outcome_on_the_live_page(server, cluster, load_agent, submit, sink, tenant):  # noqa: F811
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    sink.behaviours = ["close"]
    load_agent(
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 5}}}]},
            {"text": "Paid."},
        ],
        tools=("http_post",),
    )
    run = submit(text="pay")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)
        page.wait_for_selector("button[value=took_effect]", timeout=60000)
        card = page.inner_text("#approvals")
        assert "Outcome unknown" in card and "connection_lost" in card and "http_post" in card
        assert page.is_visible("button[value=approve]") and page.is_visible("button[value=not_taken]")
        assert sink.count() == 1
        page.fill("#approvals input[name=reason]", "the ledger shows it")
        page.click("button[value=took_effect]")
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        browser.close()
    assert Run.objects.get(id=run.id).final_message == "Paid." and sink.count() == 1
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_via, approval.reason) == ("confirmed", "live", "the ledger shows it")
    assert Event.objects.get(run=run, type="approval.resolved").payload["took_effect"] is True
