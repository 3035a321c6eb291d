"""A real browser (Debian's headless chromium driven by Playwright) against a
live ASGI server (daphne) and a real qcluster: open a run page, watch the run
reach its approval, approve it from the page, see it complete."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from runs.models import Run
from tests.conftest import ROOT, start_daphne, subprocess_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium keeps trying hosts this
# machine's closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch_chromium(playwright):
    """Debian's chromium, headless, for the browser tests."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def log_in(page, server: str, username: str, password: str, next_path: str) -> None:
    """Log in through the admin form and wait until `next_path` has loaded."""
    page.goto(f"{server}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}")


SHOTS = ROOT / "artifacts" / "browser"


@pytest.fixture
def server(transactional_db, sink, tmp_path):
    env = subprocess_env(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost")
    log = open(tmp_path / "daphne.log", "wb")
    port, proc = start_daphne(env, log)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def test_an_operator_approves_a_paused_call_on_the_live_page_and_watches_it_complete(
    server, cluster, load_agent, submit, sink, tenant
):
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    load_agent(
        turns=[
            {"tool_calls": [{"name": "echo", "arguments": {"text": "checking"}}]},
            {
                "tool_calls": [
                    {"name": "http_post", "arguments": {"url": sink.url, "json": {"release": "1.4.2", "amount": 250}}}
                ]
            },
            {"text": "Released 1.4.2."},
        ],
        tools=("echo", "http_post"),
        policy={
            "default": "allow",
            "rules": [
                {
                    "tool": "http_post",
                    "decision": "require_approval",
                    "when": {"arg": "json.amount", "op": "gt", "value": 100},
                }
            ],
        },
    )
    run = submit(text="ship it")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log_in(page, server, "oncall", "s3cret-pass", f"/runs/{run.id}/")
        page.wait_for_selector("#live:text('live')", timeout=15000)
        page.screenshot(path=str(SHOTS / "1-queued.png"), full_page=True)
        cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5)
        page.wait_for_selector("button[value=approve]", timeout=60000)
        assert page.inner_text("#status") == "WAITING_FOR_APPROVAL"
        assert "http_post" in page.inner_text("#approvals")
        page.screenshot(path=str(SHOTS / "2-waiting-for-approval.png"), full_page=True)
        assert sink.count() == 0
        page.fill("#approvals input[name=reason]", "release window is open")
        page.click("button[value=approve]")
        page.wait_for_selector("#status:text('COMPLETED')", timeout=60000)
        page.wait_for_selector("#answer:has-text('Released 1.4.2.')", timeout=10000)
        page.screenshot(path=str(SHOTS / "3-completed.png"), full_page=True)
        timeline = page.inner_text("#timeline")
        assert "approval.resolved" in timeline and "tool.call.completed" in timeline
        seqs = [int(x) for x in page.eval_on_selector_all("#timeline li", "els => els.map(e => e.dataset.sequence)")]
        assert seqs == sorted(set(seqs))  # in order, no duplicates
        page.goto(f"{server}/runs/")
        page.wait_for_selector(f"tr[data-run='{run.id}'] .s-COMPLETED", timeout=10000)
        page.screenshot(path=str(SHOTS / "4-runs-list.png"), full_page=True)
        browser.close()
    row = Run.objects.get(id=run.id)
    assert row.status == "COMPLETED" and sink.count() == 1
