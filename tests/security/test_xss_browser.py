"""Issue 10, item 2: stored XSS on the live pages must not run in an operator's browser.

The attack that was reproduced: a tenant member's agent puts `</script><script>…` into model text or tool
arguments; the run page wrote them with `|safe` inside an inline script, the markup broke out of it and the
injected code approved every pending approval in the approver's session (the 1,000,000 `http_post` went out).

Here a real chromium, a real daphne and a real qcluster replay that attack with the payload in every place a
tenant's text reaches the live pages: model text, the final message, tool arguments on a pending approval card,
tool results, the run's input, event payloads (all over the WebSocket), the agent name and a failure message.
The operator holds `approvals.resolve_approval`. The pages must show the payload as text, run none of it, and
carry a Content-Security-Policy without inline script.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connections

from approvals.models import Approval
from runs.models import Agent, Event, Run
from tests.conftest import ROOT, wait_for
from tests.live.test_browser import launch_chromium, server  # noqa: F401  (server: the daphne fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SHOTS = ROOT / "artifacts" / "security"

# No double quote and no backslash: inside a JSON string literal written raw into an inline <script> (what the old
# template did) the text after `</script>` then parses as a script of its own, exactly as in the reported attack.
STEAL = (
    "window.__pwned=1;"
    "fetch('/api/approvals/?status=pending').then(r=>r.json()).then(d=>(d.results||d).forEach(a=>"
    "fetch('/api/approvals/'+a.id+'/approve/',{method:'POST',credentials:'same-origin',"
    "headers:{'Content-Type':'application/json','X-CSRFToken':document.querySelector('[name=csrfmiddlewaretoken]').value},"
    "body:JSON.stringify({request_hash:a.request_hash,reason:'xss'})})))"
)
PAYLOAD = f"</script><script>{STEAL}</script><img src=x onerror=window.__pwned=2>{{{{ 7*7 }}}}"
# The agent-name schema allows only [A-Za-z0-9][A-Za-z0-9_.-]*, so a hostile name cannot be published; the test
# writes one straight into the table to prove the pages would still show it as text.
NAME_PAYLOAD = "</script><script>window.__pwned=3</script><img src=x onerror=window.__pwned=4>{{ name }}"
FAILURE_PAYLOAD = "failed </script><script>window.__pwned=5</script><img src=x onerror=window.__pwned=6>{{ 1|add:1 }}"


def _operator(tenant):
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="s3cret-pass")
    user.is_staff = True  # an operator with admin access
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    return user


class Browser:
    """One chromium context with every console error, page error and CSP violation collected."""

    def __init__(self, playwright):
        self.browser = launch_chromium(playwright)
        self.context = self.browser.new_context(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.context.on("page", self._watch)

    def _watch(self, page):
        page.on(
            "console",
            lambda m: (
                self.errors.append(f"{page.url}: console.{m.type}: {m.text} at {m.location.get('url')}")
                if m.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: pageerror: {exc}"))
        # A violation report is the browser telling us something tried to run or load against the policy.
        page.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => {"
            " (window.__violations = window.__violations || []).push(e.violatedDirective + ' ' + e.blockedURI); });"
        )

    def new_page(self):
        return self.context.new_page()

    def close(self):
        self.browser.close()


def assert_inert(page):
    """No injected script ran, no injected element exists, and the policy reported nothing."""
    assert page.evaluate("typeof window.__pwned") == "undefined", page.evaluate("String(window.__pwned)")
    assert page.locator("img[src='x'], [onerror]").count() == 0
    assert page.evaluate("window.__violations || []") == []


def assert_policy(response):
    policy = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in policy, policy
    script_src = policy.split("script-src", 1)[1].split(";", 1)[0]
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src, policy


def test_hostile_text_on_the_live_pages_is_shown_as_text_and_never_runs(
    server, cluster, load_agent, submit, sink, tenant, monkeypatch
):  # noqa: F811
    from playwright.sync_api import sync_playwright

    from runs.services import run_submit

    _operator(tenant)
    # 1. Waits for approval of a 1,000,000 http_post whose arguments carry the payload; model text and the
    #    echo tool's arguments and result carry it too.
    load_agent(
        name="release-bot",
        turns=[
            {"text": PAYLOAD, "tool_calls": [{"name": "echo", "arguments": {"text": PAYLOAD}}]},
            {
                "tool_calls": [
                    {"name": "http_post", "arguments": {"url": sink.url, "json": {"amount": 1000000, "note": PAYLOAD}}}
                ]
            },
            {"text": "sent"},
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
    # 2. Completes with the payload as its final message, under a hostile agent name.
    load_agent(name="answer-bot", turns=[{"text": PAYLOAD}])
    Agent.objects.filter(tenant=tenant, name="answer-bot").update(name=NAME_PAYLOAD)
    # 3. Fails (its failure message is rewritten below: the runtime's own messages are fixed strings).
    load_agent(name="broken-bot", turns=[{"error": "permanent"}])

    waiting = submit(agent="release-bot", text=PAYLOAD)
    # Playwright's sync API runs an event loop in this thread; the test's own ORM reads are still plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        b = Browser(p)
        page = b.new_page()
        page.goto(f"{server}/admin/login/?next=/runs/")
        page.fill("#id_username", "oncall")
        page.fill("#id_password", "s3cret-pass")
        page.click("input[type=submit]")
        page.wait_for_url("**/runs/")
        page.wait_for_selector("#live:text('live')", timeout=15000)

        # The live page of the waiting run, open before the worker starts: every event arrives over the WebSocket.
        detail = b.new_page()
        response = detail.goto(f"{server}/runs/{waiting.id}/")
        assert_policy(response)
        detail.wait_for_selector("#live:text('live')", timeout=15000)

        # Runs submitted while the list is open appear on it through the WebSocket (agent name included).
        answered, _ = run_submit(tenant=tenant, agent=NAME_PAYLOAD, input=PAYLOAD)
        broken = submit(agent="broken-bot", text=PAYLOAD)
        cluster(AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=sink.host, AGENTRT_LEASE_SECONDS=5, DJANGO_ALLOW_ASYNC_UNSAFE="")

        detail.wait_for_selector("#approvals button[value=approve]", timeout=60000)
        wait_for(
            lambda: Run.objects.get(id=answered.id).status == "COMPLETED",
            timeout=60,
            message="the answer run to complete",
        )
        wait_for(lambda: Run.objects.get(id=broken.id).status == "FAILED", timeout=60, message="the broken run to fail")
        detail.wait_for_selector("#timeline li:has-text('run.waiting_for_approval')", timeout=15000)
        assert detail.inner_text("#status") == "WAITING_FOR_APPROVAL"
        assert_inert(detail)
        assert PAYLOAD in detail.inner_text("#approvals")  # tool arguments on the approval card
        timeline = detail.inner_text("#timeline")
        assert timeline.count(PAYLOAD) >= 4, (
            timeline
        )  # input, model text, echo arguments, echo result, http_post arguments
        assert_inert(page)
        page.wait_for_selector(f"tr[data-run='{answered.id}'] .s-COMPLETED", timeout=15000)
        page.wait_for_selector(f"tr[data-run='{broken.id}'] .s-FAILED", timeout=15000)
        assert page.inner_text(f"tr[data-run='{answered.id}'] td:nth-child(2)") == NAME_PAYLOAD
        assert_inert(page)

        # The failure message: rewritten in the run and its run.failed event, as a provider's text would be.
        run = Run.objects.get(id=broken.id)
        Run.objects.filter(id=broken.id).update(failure={**run.failure, "message": FAILURE_PAYLOAD})
        event = Event.objects.get(run_id=broken.id, type="run.failed")
        event.payload = {**event.payload, "failure": {**event.payload["failure"], "message": FAILURE_PAYLOAD}}
        event.save(update_fields=["payload"])

        # Every page again, now rendered from the server (json_script, template text) and replayed over the socket.
        for shot, url in (
            ("list", "/runs/"),
            ("waiting", f"/runs/{waiting.id}/"),
            ("completed", f"/runs/{answered.id}/"),
            ("failed", f"/runs/{broken.id}/"),
        ):
            view = b.new_page()
            response = view.goto(server + url)
            assert response.status == 200
            assert_policy(response)
            assert_inert(view)  # after the load event: anything injected into the markup has run by now
            view.wait_for_selector("#live:text('live')", timeout=15000)
            if url == "/runs/":
                assert view.inner_text(f"tr[data-run='{answered.id}'] td:nth-child(2)") == NAME_PAYLOAD
            elif url.endswith(f"{waiting.id}/"):
                view.wait_for_selector("#approvals button[value=approve]")
                assert PAYLOAD in view.inner_text("#approvals")
                view.wait_for_selector("#timeline li:has-text('run.waiting_for_approval')", timeout=15000)
                assert view.locator("#approvals .approval").count() == 1  # the server's card; the replay added none
            elif url.endswith(f"{answered.id}/"):
                view.wait_for_selector("#status:text('COMPLETED')", timeout=15000)
                view.wait_for_selector("#answer .final", timeout=15000)
                assert view.inner_text("#answer .final") == PAYLOAD
                assert NAME_PAYLOAD in view.inner_text("#agent")
            else:
                view.wait_for_selector("#failure:visible", timeout=15000)
                assert FAILURE_PAYLOAD in view.inner_text("#failure")
            assert_inert(view)
            SHOTS.mkdir(parents=True, exist_ok=True)
            view.screenshot(path=str(SHOTS / f"xss-{shot}.png"), full_page=True)

        # The admin shows the same text: the approval's page, the run's events, the action's confirmation page.
        approval = Approval.objects.get(run_id=waiting.id)
        for url in (
            f"/admin/approvals/approval/{approval.id}/change/",
            f"/admin/runs/run/{waiting.id}/change/",
            f"/admin/runs/run/{answered.id}/change/",
            f"/admin/runs/run/{broken.id}/change/",
            "/admin/runs/run/",
        ):
            view = b.new_page()
            response = view.goto(server + url)
            assert response.status == 200, url
            assert_policy(response)
            view.wait_for_load_state("load")
            assert_inert(view)
            content = view.inner_text("#content")
            expected = {"approval": PAYLOAD, waiting.id: PAYLOAD, answered.id: NAME_PAYLOAD, broken.id: FAILURE_PAYLOAD}
            assert all(text in content for key, text in expected.items() if str(key) in url), url
            view.close()
        view = b.new_page()
        view.goto(f"{server}/admin/approvals/approval/")
        view.check(f"input[name=_selected_action][value='{approval.id}']")
        view.select_option("select[name=action]", "approve_selected")
        view.click("button[name=index]")
        view.wait_for_selector("input[name=confirm]", state="attached")
        assert_inert(view)
        assert PAYLOAD in view.inner_text("#content pre")
        # Not confirmed: the page alone must change nothing.

        assert not [e for e in b.errors if "Content Security Policy" in e or "pageerror" in e], b.errors
        # Defence in depth: on the live pages the browser itself refuses to turn a string into markup.
        probe = b.new_page()
        probe.goto(f"{server}/runs/{waiting.id}/")
        refused = probe.evaluate(
            "() => { try { document.body.insertAdjacentHTML('beforeend', '<b>x</b>'); return 'allowed'; }"
            " catch (e) { return e.name; } }"
        )
        assert refused == "TypeError"
        b.close()
        connections.close_all()  # the ORM reads above ran on a connection of their own (Playwright's loop context)

    # Nothing was approved, nothing was sent.
    approval = Approval.objects.get(run_id=waiting.id)
    assert approval.status == "pending"
    assert Run.objects.get(id=waiting.id).status == "WAITING_FOR_APPROVAL"
    assert sink.count() == 0


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
ADMIN_PAGES = (
    "/admin/",
    "/admin/runs/run/",
    "/admin/runs/run/{run}/change/",
    "/admin/runs/agent/",
    "/admin/runs/agentversion/",
    "/admin/runs/tenant/",
    "/admin/approvals/approval/",
    "/admin/approvals/approval/?status=all",
    "/admin/auth/user/",
    "/admin/auth/user/{user}/change/",
    "/admin/auth/user/add/",
    "/admin/auth/group/add/",
    "/admin/django_q/schedule/add/",
    "/admin/django_q/ormq/",
    "/admin/password_change/",
)


def test_the_admin_and_the_api_docs_work_under_the_policy(server, load_agent, submit, tenant, monkeypatch):  # noqa: F811
    """The admin, Swagger UI and ReDoc render in chromium with the policy on, and the browser reports no violation."""
    from playwright.sync_api import sync_playwright

    from runs.services import tenant_create

    _, root = tenant_create(name=tenant.name, username="root", password="s3cret-pass", superuser=True)
    load_agent(name="release-bot")
    run = submit(agent="release-bot")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        b = Browser(p)
        page = b.new_page()
        response = page.goto(f"{server}/admin/login/?next=/admin/")
        assert_policy(response)
        page.fill("#id_username", "root")
        page.fill("#id_password", "s3cret-pass")
        page.click("input[type=submit]")
        page.wait_for_url("**/admin/")
        for url in ADMIN_PAGES:
            view = b.new_page()
            response = view.goto(server + url.format(run=run.id, user=root.pk))
            assert response.status == 200, url
            assert_policy(response)
            view.wait_for_load_state("load")
            view.wait_for_selector("#content", timeout=15000)
            # The admin's scripts ran (their markers exist only when the static JS executed).
            if "/add/" in url or "/change/" in url:
                assert view.evaluate("typeof window.django") == "object", url
            assert view.evaluate("window.__violations || []") == [], url
            # The admin's CSS applied (a link from this server, not blocked): the header has its dark background.
            assert (
                view.evaluate("getComputedStyle(document.getElementById('header')).backgroundColor")
                != "rgba(0, 0, 0, 0)"
            ), url
            view.close()

        docs = b.new_page()
        response = docs.goto(f"{server}/api/docs/")
        assert_policy(response)
        docs.wait_for_selector(".swagger-ui .info .title", timeout=30000)
        docs.wait_for_selector(".opblock-tag", timeout=30000)  # the schema loaded and rendered its operations
        assert "agentrt API" in docs.inner_text(".swagger-ui .info .title")
        assert docs.evaluate("window.__violations || []") == []

        redoc = b.new_page()
        response = redoc.goto(f"{server}/api/docs/redoc/")
        assert_policy(response)
        redoc.wait_for_selector("h1:has-text('agentrt API')", timeout=30000)
        redoc.wait_for_selector("[data-section-id^='tag/']", timeout=30000)
        # ReDoc's bundle hard-codes one third-party image (its vendor's logo from a CDN, hidden on error). The policy
        # blocks it, as the docs load nothing from elsewhere (tests/api/test_static.py); nothing else is refused.
        assert redoc.evaluate("window.__violations || []") in ([], [f"img-src {REDOC_LOGO}"])

        # Anything else the console reports is a failure (the browser's own /favicon.ico probe 404s: no favicon).
        assert [e for e in b.errors if REDOC_LOGO not in e and not e.endswith("/favicon.ico")] == [], b.errors
        b.close()
        connections.close_all()
