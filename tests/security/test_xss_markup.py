"""Issue 10, item 2, without a browser: what the server writes and what the code base may contain.

- Every HTML page carries a Content-Security-Policy whose script-src is 'self' only.
- A run whose model text, tool arguments and approval card carry `</script><script>` is rendered with that text
  only inside json_script blocks (escaped) and template text nodes (escaped): the page has exactly the script
  tags the template wrote.
- An audit of the sources: templates write no `|safe`, no `autoescape off`, no inline script or handler, no
  inline style on our pages; the pages' JavaScript builds no markup from strings; Python marks nothing safe.
(tests/security/test_xss_browser.py shows the same in a real browser, with the worker and the WebSocket.)
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from django.contrib.auth.models import Permission

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

PAYLOAD = "</script><script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>{{ 7*7 }}&amp;"
APPROVE_POSTS = {
    "default": "allow",
    "rules": [
        {"tool": "http_post", "decision": "require_approval", "when": {"arg": "json.amount", "op": "gt", "value": 100}}
    ],
}


def script_src(response) -> str:
    policy = response["Content-Security-Policy"]
    return policy.split("script-src", 1)[1].split(";", 1)[0].strip()


@pytest.fixture
def operator_client(client, tenant):
    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="oncall", password="pw", operator=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["resolve_approval", "view_run", "view_approval"])
    )
    client.force_login(user)
    return client


@pytest.fixture
def hostile_runs(load_agent, submit, settings):
    from runs.runtime.executor import run_drive

    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["127.0.0.1:9"]
    load_agent(name="answer-bot", turns=[{"text": PAYLOAD}])
    load_agent(
        name="release-bot",
        tools=("echo", "http_post"),
        policy=APPROVE_POSTS,
        turns=[
            {"text": PAYLOAD, "tool_calls": [{"name": "echo", "arguments": {"text": PAYLOAD}}]},
            {
                "tool_calls": [
                    {
                        "name": "http_post",
                        "arguments": {"url": "http://127.0.0.1:9/hook", "json": {"amount": 1000000, "note": PAYLOAD}},
                    }
                ]
            },
            {"text": "sent"},
        ],
    )
    answered, waiting = submit(agent="answer-bot", text=PAYLOAD), submit(agent="release-bot", text=PAYLOAD)
    run_drive(run_id=answered.id)
    run_drive(run_id=waiting.id)
    answered.refresh_from_db()
    waiting.refresh_from_db()
    assert (answered.status, waiting.status) == ("COMPLETED", "WAITING_FOR_APPROVAL")
    return answered, waiting


def test_every_html_page_has_a_policy_without_inline_script(operator_client, hostile_runs, admin_client):
    answered, waiting = hostile_runs
    pages = [
        (operator_client, url)
        for url in (
            "/runs/",
            f"/runs/{answered.id}/",
            f"/runs/{waiting.id}/",
            "/api/docs/",
            "/api/docs/redoc/",
            "/admin/",
            "/admin/approvals/approval/",
            f"/admin/runs/run/{waiting.id}/change/",
        )
    ]
    pages += [(admin_client, url) for url in ("/admin/auth/user/", "/admin/django_q/schedule/add/")]
    for client, url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        assert response["Content-Type"].startswith("text/html"), url
        assert script_src(response) == "'self'", (url, response["Content-Security-Policy"])
        policy = response["Content-Security-Policy"]
        assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy and "base-uri 'none'" in policy
    # Anonymous pages and errors too.
    anon = type(operator_client)()
    for url, status in (("/admin/login/", 200), ("/runs/", 302), ("/no-such-page/", 404)):
        response = anon.get(url)
        assert response.status_code == status, url
        assert script_src(response) == "'self'", url
    # The live pages also refuse every string-to-markup sink in the browser (Trusted Types).
    for url in ("/runs/", f"/runs/{waiting.id}/"):
        assert "require-trusted-types-for 'script'" in operator_client.get(url)["Content-Security-Policy"]
    # Only the API docs may style inline (Swagger UI and ReDoc need it); nothing else may.
    assert "'unsafe-inline'" not in operator_client.get("/runs/")["Content-Security-Policy"]
    assert "'unsafe-inline'" not in operator_client.get("/admin/")["Content-Security-Policy"]


def test_swagger_ui_init_script_is_a_file_not_inline(operator_client):
    html = operator_client.get("/api/docs/").content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), html
    init = re.findall(r'<script src="([^"]*script[^"]*)"', html)
    assert init, html
    response = operator_client.get(init[0].replace("&amp;", "&"))
    assert response.status_code == 200 and "SwaggerUIBundle" in response.content.decode()
    redoc = operator_client.get("/api/docs/redoc/").content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", redoc) and "fonts.googleapis" not in redoc


def test_hostile_text_reaches_the_run_pages_only_escaped(operator_client, hostile_runs):
    answered, waiting = hostile_runs
    for run in (answered, waiting):
        html = operator_client.get(f"/runs/{run.id}/").content.decode()
        assert "<script>window.__pwned" not in html and "<img" not in html
        scripts = re.findall(r"<script\b[^>]*>", html)
        assert scripts == [
            '<script src="/static/runs/fmt.js" defer>',
            '<script src="/static/runs/live.js" defer>',
            '<script src="/static/runs/header.js" defer>',
            '<script id="run-data" type="application/json">',
            '<script id="pending-data" type="application/json">',
            '<script id="can-resolve" type="application/json">',
            '<script id="event-types" type="application/json">',
            '<script id="summary-data" type="application/json">',
            '<script src="/static/runs/detail.js" defer>',
        ], scripts
        assert "\\u003C/script\\u003E\\u003Cscript\\u003Ewindow.__pwned=1" in html  # json_script's escaping
    html = operator_client.get(f"/runs/{waiting.id}/").content.decode()
    pending = re.search(r'<script id="pending-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    data = json.loads(pending)
    assert data[0]["presentation"]["arguments"]["json"]["note"] == PAYLOAD  # the page's script gets the exact text


# -- the audit ------------------------------------------------------------------------------------------------

TEMPLATES = sorted((ROOT / "templates").rglob("*.html"))
PAGE_JS = sorted((ROOT / "runs" / "static").rglob("*.js"))
PY_SOURCES = [
    p
    for app in ("agentrt_site", "runs", "approvals", "checkpoints", "maintenance", "demo")
    for p in (ROOT / app).rglob("*.py")
    if "migrations" not in p.parts
]


def test_the_sources_are_audited():
    assert len(TEMPLATES) >= 5 and PAGE_JS and PY_SOURCES


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_templates_write_data_only_as_escaped_text(path):
    text = path.read_text()
    assert "|safe" not in text.replace(" ", "") and "safeseq" not in text
    assert not re.search(r"{%\s*autoescape\s+off", text)
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), "inline <script>: use a static file and json_script"
    assert not re.search(r"\son[a-z]+\s*=", text, re.I), "inline event handler"
    assert not re.search(r"javascript:", text, re.I)
    assert not re.search(r"<style|\sstyle=", text), "inline style: the policy's style-src is 'self'"


@pytest.mark.parametrize("path", PAGE_JS, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_scripts_build_no_markup_from_strings(path):
    text = path.read_text()
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "setAttribute('on",
        "createContextualFragment",
        "DOMParser",
    ):
        assert sink not in text, f"{path.name} uses {sink}"


def test_python_marks_nothing_safe():
    for path in PY_SOURCES:
        text = path.read_text()
        for sink in ("mark_safe", "SafeString", "SafeText", "allow_tags", "format_html_join", "|safe"):
            assert sink not in text, f"{path.relative_to(ROOT)} uses {sink}"
        # format_html escapes its arguments; its format string must be a literal (never built from data).
        for line, first in format_html_formats(text):
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                f"{path.relative_to(ROOT)}:{line}: format_html's format string is not a literal"
            )


def format_html_formats(text: str) -> list[tuple[int, ast.expr | None]]:
    """Each `format_html(...)` call of a module: its line and its first argument (None when it has none)."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "format_html":
                out.append((node.lineno, node.args[0] if node.args else None))
    return out


def test_the_format_string_check_tells_a_literal_from_a_built_one():
    """The check above, on planted calls: a literal with commas passes; an f-string, a variable and a
    concatenation do not."""
    planted = (
        'format_html("a {}, b {}: {}", x, y, z)\n'
        'format_html(f"a {x}")\n'
        "format_html(template, x)\n"
        'format_html("a " + x)\n'
    )
    kinds = [isinstance(a, ast.Constant) and isinstance(a.value, str) for _, a in format_html_formats(planted)]
    assert kinds == [True, False, False, False]
