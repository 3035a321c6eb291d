"""The operator's console in a real browser (Debian's chromium, daphne, and for
the run page a real qcluster): the runs list's short ids, filters, search,
cursor paging and live rows; the run page's event times and gaps, its usage
updating live and its actions following the status; the header's live
"N waiting" and the inbox, oldest first. Screenshots go to
artifacts/screenshots/ (not committed)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission

from approvals.models import Approval
from approvals.services import approval_decide
from runs.clock import CLOCK
from runs.models import Event, Run, Session
from runs.runtime.executor import run_drive
from runs.services import agent_load, run_submit, tenant_create
from runs.services.run_list import short_id
from tests.conftest import ROOT, free_port, wait_for
from tests.e2e.test_retry import gpt_agent, model_env
from tests.live.test_browser import launch_chromium, log_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SHOTS = ROOT / "artifacts" / "screenshots"
HOSTILE = "<img src=x onerror=window.__pwned=1>"
POLICY = {"default": "allow", "rules": [{"tool": "http_post", "decision": "require_approval"}]}


@pytest.fixture(autouse=True)
def _db_beside_the_browser(monkeypatch):
    """These tests write runs and decisions while the browser is open: Playwright's sync API runs an event
    loop in this thread, which Django's ORM refuses unless told the thread has no async code of its own."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def operator(tenant, username="oncall"):
    _, user = tenant_create(name=tenant.name, username=username, password="s3cret-pass", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    return user


def history(run: Run, n: int, *, status="COMPLETED", text="backfill", start=None) -> list[Run]:
    """`n` older runs beside `run` (same tenant and agent), one a minute back from `start`."""
    start = start or CLOCK.now() - timedelta(hours=1)
    sessions = Session.objects.bulk_create([Session(tenant_id=run.tenant_id, agent_id=run.agent_id) for _ in range(n)])
    return Run.objects.bulk_create(
        [
            Run(
                tenant_id=run.tenant_id,
                session=s,
                agent_id=run.agent_id,
                agent_version=run.agent_version,
                status=status,
                input=f"{text} {i}",
                usage={"cost_usd": 0.0125 * i},
                created_at=start - timedelta(minutes=i),
                updated_at=start - timedelta(minutes=i) + timedelta(seconds=90),
            )
            for i, s in enumerate(sessions)
        ]
    )


def shown_ids(page) -> list[str]:
    return page.eval_on_selector_all("#runs tbody tr[data-run]", "rows => rows.map(r => r.dataset.run)")


def test_the_runs_list_filters_searches_pages_and_stays_live(server, tenant, load_agent, submit):
    from playwright.sync_api import sync_playwright

    operator(tenant)
    load_agent(name="bot")
    load_agent(
        name="asker",
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Region?"}}]}],
        tools=("ask_user",),
    )
    first = submit(agent="bot", text="Ship 1.4.2 " + HOSTILE)
    older = history(first, 55)
    failed = history(first, 3, status="FAILED", text="broken deploy", start=CLOCK.now() - timedelta(days=3))
    asking = submit(agent="asker", text="which region")
    run_drive(run_id=asking.id)
    globex, _ = tenant_create(name="globex", username="bob")
    agent_load(
        tenant=globex,
        definition={
            "name": "bot",
            "instructions": "x",
            "model": {"provider": "scripted", "turns": [{"text": "x"}]},
            "tools": [],
        },
    )
    theirs, _ = run_submit(tenant=globex, agent="bot", input="globex secret plan")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        context = browser.new_context(
            viewport={"width": 1400, "height": 1000}, permissions=["clipboard-read", "clipboard-write"]
        )
        page = context.new_page()
        log_in(page, server, "oncall", "s3cret-pass", "/runs/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        # Short ids that differ (the random tail), the full id on hover and on the clipboard.
        ids = shown_ids(page)
        assert len(ids) == 50 and str(theirs.id) not in ids
        shorts = page.eval_on_selector_all("#runs td.run-id a", "links => links.map(a => a.textContent)")
        assert len(set(shorts)) == 50 and shorts[0] == short_id(ids[0])
        assert page.get_attribute(f"tr[data-run='{ids[0]}'] td.run-id a", "title") == ids[0]
        page.click(f"tr[data-run='{ids[1]}'] button.copy")
        page.wait_for_selector(f"tr[data-run='{ids[1]}'] button.copy:text('copied')")
        assert page.evaluate("navigator.clipboard.readText()") == ids[1]
        # Relative times, the absolute one on hover; costs with four decimals; durations.
        created = page.inner_text(f"tr[data-run='{older[2].id}'] [data-field=created]")
        assert re.fullmatch(r"1 h ago", created), created
        assert older[2].created_at.isoformat()[:19] in page.get_attribute(f"tr[data-run='{older[2].id}'] time", "title")
        assert page.inner_text(f"tr[data-run='{older[2].id}'] [data-field=cost]") == "0.0250"
        assert page.inner_text(f"tr[data-run='{first.id}'] [data-field=cost]") == "0.0000"
        assert page.inner_text(f"tr[data-run='{older[2].id}'] [data-field=duration]") == "1 min 30 s"
        assert page.inner_text(f"tr[data-run='{asking.id}'] [data-field=waiting]") == "user"
        assert HOSTILE in page.inner_text(f"tr[data-run='{first.id}'] td.input")  # the input, as text
        assert page.evaluate("typeof window.__pwned") == "undefined"
        page.screenshot(path=str(SHOTS / "runs-list.png"), full_page=True)
        # Cursor paging: the next page holds the rest, none of the first's; back again.
        page.click("#older")
        page.wait_for_selector("#newer")
        second = shown_ids(page)
        assert not set(second) & set(ids) and len(set(second) | set(ids)) == 60
        page.click("#newer")
        page.wait_for_selector("#older")
        assert shown_ids(page) == ids
        # Filters: a status, then a search within it; the URL carries only what was chosen.
        page.select_option("#f-status", "FAILED")
        page.click("#f-apply")
        page.wait_for_url("**/runs/?status=FAILED")
        assert set(shown_ids(page)) == {str(r.id) for r in failed}
        page.fill("#f-q", "broken deploy 1")
        page.click("#f-apply")
        page.wait_for_url("**/runs/?q=broken+deploy+1&status=FAILED")
        assert shown_ids(page) == [str(failed[1].id)]
        page.screenshot(path=str(SHOTS / "runs-list-filtered.png"), full_page=True)
        # Search by the short id shown, and for another tenant's input: nothing of theirs.
        page.goto(f"{server}/runs/?q={short_id(asking.id)}")
        page.wait_for_selector(f"tr[data-run='{asking.id}']")
        assert shown_ids(page) == [str(asking.id)]
        page.goto(f"{server}/runs/?q=globex+secret")
        page.wait_for_selector("#runs tr.empty")
        assert "No run matches" in page.inner_text("#runs")
        page.goto(f"{server}/runs/?status=NOPE")
        assert "status" in page.inner_text("#filter-error")
        # Live, filtered: a new run of the agent filtered on appears at the top; another agent's does not.
        page.goto(f"{server}/runs/?agent=bot")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        other = submit(agent="asker", text="not this one")
        fresh = submit(agent="bot", text="a brand new run")
        page.wait_for_selector(f"tr[data-run='{fresh.id}']", timeout=15000)
        assert shown_ids(page)[0] == str(fresh.id) and str(other.id) not in shown_ids(page)
        assert page.inner_text(f"tr[data-run='{fresh.id}'] [data-field=status]") == "QUEUED"
        page.screenshot(path=str(SHOTS / "runs-list-live.png"), full_page=True)
        context.close()
        browser.close()


def test_the_run_page_times_each_event_and_keeps_usage_and_actions_live(
    server, cluster, tenant, load_agent, submit, sink
):
    from playwright.sync_api import sync_playwright

    operator(tenant)
    load_agent(
        name="releaser",
        tools=("http_post",),
        policy=POLICY,
        turns=[
            {
                "tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"v": "1.4.2"}}}],
                "usage": {"input_tokens": 1200, "output_tokens": 34},
            },
            {"text": "Released 1.4.2.", "usage": {"input_tokens": 1500, "output_tokens": 12}},
        ],
    )
    run = submit(agent="releaser", text="ship it")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        assert page.inner_text("#tokens") == "0 in / 0 out" and page.is_visible("#cancel")
        cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)
        # The first model call's usage arrives while the page is open.
        page.wait_for_selector("#tokens:text('1200 in / 34 out')", timeout=60000)
        page.wait_for_selector("#approvals button[value=approve]", timeout=60000)
        assert page.inner_text("#status") == "WAITING_FOR_APPROVAL" and page.is_visible("#cancel")
        # Each event: its time of day and the time since the one before.
        times = page.eval_on_selector_all("#timeline li .at", "els => els.map(e => e.textContent)")
        gaps = page.eval_on_selector_all("#timeline li .delta", "els => els.map(e => e.textContent)")
        assert times and all(re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", t) for t in times), times
        assert gaps[0] == "" and all(re.fullmatch(r"\+\d+(\.\d)? (ms|s)|\+\d+ min \d\d s", g) for g in gaps[1:]), gaps
        page.screenshot(path=str(SHOTS / "run-page-waiting.png"), full_page=True)
        page.fill("#approvals input[name=reason]", "window is open " + HOSTILE)
        page.click("button[value=approve]")
        # The rest happens live: the run ends, the totals add up, and Cancel is gone without a reload.
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        page.wait_for_selector("#tokens:text('2700 in / 46 out')", timeout=15000)
        page.wait_for_selector("#cancel-form", state="hidden", timeout=15000)
        assert page.inner_text("#cost") == "$0.0000" and "so far" not in page.inner_text("#duration")
        decision = page.inner_text("#decisions")
        assert "approved" in decision and "by oncall via live" in decision and HOSTILE in decision
        assert page.evaluate("typeof window.__pwned") == "undefined"
        page.screenshot(path=str(SHOTS / "run-page-completed.png"), full_page=True)
        # A finished run's page, read again, offers no cancel at all.
        page.reload()
        page.wait_for_selector("#live:text('live')", timeout=15000)
        assert not page.is_visible("#cancel") and page.inner_text("#status") == "COMPLETED"
        browser.close()
    assert sink.count() == 1


def test_a_cancel_with_its_reason_and_who_shows_on_the_run_page(server, tenant, load_agent, submit):
    from playwright.sync_api import sync_playwright

    operator(tenant)
    load_agent(
        name="asker",
        turns=[{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Region?"}}]}],
        tools=("ask_user",),
    )
    run = submit(agent="asker", text="which region")
    run_drive(run_id=run.id)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        assert page.inner_text("#status") == "WAITING_FOR_USER" and page.is_visible("#cancel")
        page.fill("#cancel-reason", "wrong region " + HOSTILE)
        page.click("#cancel")
        page.wait_for_selector("#cancel-info:has-text('by oncall')", timeout=15000)
        page.wait_for_selector("#status:text('CANCELLED')")
        info = page.inner_text("#cancel-info")
        assert info.startswith("Cancelled by oncall via live: wrong region " + HOSTILE), info
        assert not page.is_visible("#cancel") and page.evaluate("typeof window.__pwned") == "undefined"
        timeline = page.inner_text("#timeline")
        assert "run.cancel_requested" in timeline and "by oncall via live: wrong region" in timeline
        page.screenshot(path=str(SHOTS / "run-page-cancelled.png"), full_page=True)
        browser.close()
    requested = Event.objects.get(run_id=run.id, type="run.cancel_requested").payload
    assert requested == {"by": "oncall", "via": "live", "reason": "wrong region " + HOSTILE}


def test_a_running_runs_cancel_with_a_reason_shows_who_asked_and_then_that_it_stopped(
    server, cluster, tenant, load_agent, submit
):
    """A RUNNING run inside a slow model call, cancelled from its page with a reason: the page says at once who
    asked, via the live page, and why; the worker hears the doorbell, the run stops and the page follows."""
    from playwright.sync_api import sync_playwright

    operator(tenant)
    load_agent(
        name="slow",
        turns=[{"tool_calls": [{"name": "echo", "arguments": {"text": "a"}}]}, {"text": "never", "delay_ms": 30_000}],
    )
    run = submit(agent="slow", text="a long job")
    SHOTS.mkdir(parents=True, exist_ok=True)
    c = cluster(AGENTRT_LEASE_SECONDS=120)  # heartbeats 40 s apart: the doorbell is what stops it
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        wait_for(
            lambda: Event.objects.filter(run_id=run.id, type="model.request.started", payload__step=2).exists(),
            timeout=60,
            message=f"step 2's model call\n{c.output()[-3000:]}",
        )
        page.wait_for_selector("#status:text('RUNNING')", timeout=15000)
        assert page.is_visible("#cancel") and not page.is_visible("#retry-form")
        page.fill("#cancel-reason", "deploy window closed " + HOSTILE)
        page.click("#cancel")
        page.wait_for_url(f"**/runs/{run.id}/")
        # The request, said at once; the run itself stops a moment later (the page reads it from the socket).
        page.wait_for_selector("#cancel-info:has-text('by oncall via live: deploy window closed')", timeout=15000)
        wait_for(
            lambda: Run.objects.filter(id=run.id, status="CANCELLED").exists(),
            timeout=25,
            message=f"the cancel\n{list(Event.objects.filter(run_id=run.id).values_list('type', flat=True))}"
            f"\n{c.output()[-3000:]}",
        )
        page.wait_for_selector("#status:text('CANCELLED')", timeout=15000)
        page.wait_for_selector("#cancel-info:has-text('Cancelled by oncall via live')", timeout=15000)
        assert HOSTILE in page.inner_text("#cancel-info") and page.evaluate("typeof window.__pwned") == "undefined"
        assert not page.is_visible("#cancel") and not page.is_visible("#retry-form")
        timeline = page.eval_on_selector_all("#timeline li", "els => els.map(e => e.textContent)")
        requested = [t for t in timeline if "run.cancel_requested" in t]
        assert len(requested) == 1 and "deploy window closed" in requested[0]
        page.screenshot(path=str(SHOTS / "run-page-running-cancelled.png"), full_page=True)
        browser.close()
    record = list(Event.objects.filter(run_id=run.id).order_by("sequence").values_list("type", "payload"))
    types = [t for t, _ in record]
    assert types.index("run.cancel_requested") < types.index("run.cancelled")
    assert "model.request.started" not in types[types.index("run.cancel_requested") :]
    cancelled = next(p for t, p in record if t == "run.cancelled")
    assert (cancelled["by"], cancelled["via"], cancelled["reason"]) == (
        "oncall",
        "live",
        "deploy window closed " + HOSTILE,
    )


def test_a_run_failed_by_a_model_outage_offers_retry_live_and_completes_once_the_model_is_back(
    server, cluster, tenant, load_agent, submit, settings
):
    """The model server is down: the run fails dependency_unavailable while its page is open, and Retry appears
    without a reload; the server comes up, Retry is clicked, and the page follows the same run to its end."""
    from playwright.sync_api import sync_playwright

    from tests.providers.fake_openai import FakeOpenAI, text_stream

    operator(tenant)
    port = free_port()  # nothing listens here yet
    gpt_agent(load_agent, settings, port)
    run = submit(agent="gpt-bot", text="ship it")
    SHOTS.mkdir(parents=True, exist_ok=True)
    server_up = None
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
            page.wait_for_selector("#live:text('live')", timeout=15000)
            assert not page.is_visible("#retry-form")
            c = cluster(
                **model_env(
                    port,
                    AGENTRT_MODEL_ATTEMPTS=2,
                    AGENTRT_MODEL_RETRY_TRIES=2,
                    AGENTRT_MODEL_RETRY_BACKOFF_SECONDS=0.05,
                )
            )
            page.wait_for_selector("#status:text('FAILED')", timeout=60000)
            page.wait_for_selector("#retry-form", state="visible", timeout=15000)  # live, no reload
            assert not page.is_visible("#cancel")
            assert Run.objects.get(id=run.id).failure["reason"] == "dependency_unavailable", c.output()[-3000:]
            page.screenshot(path=str(SHOTS / "run-page-failed-retry.png"), full_page=True)

            server_up = FakeOpenAI(port=port).push(text_stream("Shipped ", "1.4.2.")).start()  # the model is back
            page.click("#retry")
            page.wait_for_url(f"**/runs/{run.id}/")
            page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
            page.wait_for_selector("#retry-form", state="hidden", timeout=15000)
            assert "Shipped 1.4.2." in page.inner_text("#answer")
            assert page.inner_text("#failure").startswith(
                "Retried by oncall via live after it failed dependency_unavailable"
            )
            retried = [t for t in page.eval_on_selector_all("#timeline li", "els => els.map(e => e.textContent)")]
            assert any("run.retried" in t for t in retried)
            page.screenshot(path=str(SHOTS / "run-page-retried.png"), full_page=True)
            browser.close()
    finally:
        if server_up is not None:
            server_up.close()
    retried = Event.objects.get(run_id=run.id, type="run.retried").payload
    assert (retried["by"], retried["via"], retried["failure"]["reason"]) == ("oncall", "live", "dependency_unavailable")
    assert Run.objects.get(id=run.id).status == "COMPLETED" and len(server_up.requests) == 1


def test_the_header_counts_waiting_approvals_live_and_the_inbox_lists_them_oldest_first(
    server, tenant, load_agent, submit, sink
):
    from playwright.sync_api import sync_playwright

    user = operator(tenant)
    load_agent(
        name="payer",
        tools=("http_post",),
        policy=POLICY,
        turns=[
            {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"note": HOSTILE}}}]},
            {"text": "paid"},
        ],
    )
    globex, _ = tenant_create(name="globex", username="bob")
    agent_load(
        tenant=globex,
        definition={
            "name": "payer",
            "instructions": "x",
            "tools": ["http_post"],
            "policy": POLICY,
            "model": {
                "provider": "scripted",
                "turns": [
                    {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {}}}]},
                    {"text": "paid"},
                ],
            },
        },
    )
    theirs, _ = run_submit(tenant=globex, agent="payer", input="theirs")
    run_drive(run_id=theirs.id)  # another tenant's approval: never counted here
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", "/runs/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        assert page.inner_text("#waiting-count") == "0 waiting"
        runs = []
        for n in (1, 2, 3):
            run = submit(agent="payer", text=f"pay {n}")
            run_drive(run_id=run.id)
            runs.append(run)
            page.wait_for_selector(f"#waiting-count:text('{n} waiting')", timeout=15000)
        page.screenshot(path=str(SHOTS / "header-count.png"))
        page.click("#inbox-link")
        page.wait_for_url("**/approvals/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        expected = [str(Approval.objects.get(run=r).id) for r in runs]
        shown = page.eval_on_selector_all("#inbox tbody tr[data-approval]", "rows => rows.map(r => r.dataset.approval)")
        assert shown == expected  # oldest first, only this tenant's
        assert HOSTILE in page.inner_text("#inbox") and page.evaluate("typeof window.__pwned") == "undefined"
        page.screenshot(path=str(SHOTS / "approvals-inbox.png"), full_page=True)
        oldest = Approval.objects.get(id=expected[0])
        approval_decide(
            user=user, approval_id=oldest.id, approve=False, request_hash=oldest.request_hash, reason="no", via="api"
        )
        page.wait_for_selector("#waiting-count:text('2 waiting')", timeout=15000)
        page.wait_for_selector(f"#inbox tr[data-approval='{expected[0]}']", state="detached", timeout=15000)
        shown = page.eval_on_selector_all("#inbox tbody tr[data-approval]", "rows => rows.map(r => r.dataset.approval)")
        assert shown == expected[1:]
        page.click(f"#inbox tr[data-approval='{expected[1]}'] a.btn")
        page.wait_for_selector(f"#approval-{expected[1]} button[value=approve]", timeout=15000)
        assert page.inner_text("#waiting-count") == "2 waiting"
        browser.close()
