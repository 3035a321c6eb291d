"""One error body everywhere: `{code, message, fields?, request_id}`, DRF's own
errors mapped, never raw exception text, never a 500 for bad input."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import OperationalError
from django.http import Http404

from runs.api.errors import exception_handler

pytestmark = pytest.mark.django_db(transaction=True)

CANARY = "sk-live-CANARY0123456789abcdef"


def body_of(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code and isinstance(body["message"], str) and body["request_id"]
    assert set(body) <= {"code", "message", "fields", "request_id"}
    return body


def test_drf_errors_are_mapped_to_the_error_body(world, alice, as_user, anon):
    client = as_user(alice)
    body_of(anon.get("/api/runs/"), 401, "not_authenticated")
    body_of(client.delete("/api/runs/"), 405, "method_not_allowed")
    body_of(client.put(f"/api/runs/{world.done.id}/", {}, format="json"), 405, "method_not_allowed")
    body_of(client.get("/api/runs/", HTTP_ACCEPT="application/xml"), 406, "not_acceptable")
    body_of(
        client.generic("POST", "/api/runs/", b'{"agent": "bot"', content_type="application/json"), 400, "parse_error"
    )
    body_of(
        client.generic("POST", "/api/runs/", b"<x/>", content_type="application/xml"), 415, "unsupported_media_type"
    )
    body_of(
        client.generic("POST", "/api/runs/", b"{}", content_type="application/json; charset=latin-1"),
        415,
        "unsupported_media_type",
    )
    body_of(client.get(f"/api/runs/{world.done.id}/", {"format": "xml"}), 404, "not_found")


def test_validation_errors_name_every_field(world, alice, as_user):
    client = as_user(alice)
    body = body_of(client.post("/api/runs/", {}, format="json"), 400, "invalid")
    assert set(body["fields"]) == {"agent", "input"}
    body = body_of(client.generic("POST", "/api/runs/", b"", content_type="application/json"), 400, "invalid")
    assert set(body["fields"]) == {"agent", "input"}
    body = body_of(client.post("/api/runs/", "just text", format="json"), 400, "invalid")
    assert "(root)" in body["fields"]
    body = body_of(
        client.post("/api/runs/", {"agent": "bot", "input": "x", "colour": 1, "status": "QUEUED"}, format="json"),
        400,
        "invalid",
    )
    assert body["fields"] == {"colour": ["unknown field"], "status": ["read-only: set by the server"]}
    body = body_of(
        client.generic(
            "POST", "/api/runs/", b'{"agent": "bot", "agent": "evil", "input": "x"}', content_type="application/json"
        ),
        400,
        "parse_error",
    )
    assert "duplicate" in body["message"]


def test_request_id_is_echoed_when_sane_and_generated_otherwise(world, alice, as_user):
    client = as_user(alice)
    response = client.get("/api/runs/nope/", HTTP_X_REQUEST_ID="req-123.abc")
    assert response.json()["request_id"] == "req-123.abc" and response["X-Request-ID"] == "req-123.abc"
    for insane in ("has spaces", "x" * 300, "<script>", ""):
        response = client.get("/api/runs/nope/", HTTP_X_REQUEST_ID=insane)
        rid = response.json()["request_id"]
        assert rid != insane and len(rid) == 32 and response["X-Request-ID"] == rid
    assert client.get("/api/runs/")["X-Request-ID"]


def test_an_unexpected_error_is_a_500_without_its_text(world, alice, as_user, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError(f"database password is {CANARY}")

    monkeypatch.setattr("runs.api.views.visible_run", boom)
    response = as_user(alice).get(f"/api/runs/{world.done.id}/")
    body = body_of(response, 500, "internal_error")
    assert CANARY not in response.content.decode() and "RuntimeError" not in response.content.decode()
    assert body["request_id"] in body["message"] or "request_id" in body["message"]


def test_a_database_outage_is_503_with_retry_after(world, alice, as_user, monkeypatch):
    def down(*args, **kwargs):
        raise OperationalError(f"connection to server failed: {CANARY}")

    monkeypatch.setattr("runs.api.views.visible_run", down)
    response = as_user(alice).get(f"/api/runs/{world.done.id}/")
    body_of(response, 503, "unavailable")
    assert response["Retry-After"] == "1" and CANARY not in response.content.decode()


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (Http404("secret path"), 404, "not_found"),
        (PermissionDenied("secret reason"), 403, "permission_denied"),
        (RequestDataTooBig("secret size"), 413, "payload_too_large"),
    ],
)
def test_django_exceptions_are_mapped(rf, exc, status, code):
    response = exception_handler(exc, {"request": rf.get("/api/runs/")})
    assert response.status_code == status and response.data["code"] == code
    assert "secret" not in json.dumps(response.data)


def test_paths_without_a_route_answer_with_the_error_body(alice, as_user):
    client = as_user(alice)
    body_of(client.get("/api/nothing/here/"), 404, "not_found")
    body = body_of(client.post("/api/runs", {"agent": "bot", "input": "x"}, format="json"), 404, "not_found")
    assert "/api/runs/" in body["message"]
    redirect = client.get("/api/runs", {"status": "QUEUED"})
    assert redirect.status_code == 301 and redirect["Location"] == "/api/runs/?status=QUEUED"


def test_throttled_writes_are_429_with_retry_after_and_reads_are_not_throttled(world, alice, as_user, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
            "runs_create": "2/min",
            "runs_cancel": "1/min",
        },
    }
    client = as_user(alice)
    for _ in range(2):
        assert client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json").status_code == 201
    response = client.post("/api/runs/", {"agent": "bot", "input": "x"}, format="json")
    body_of(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    for _ in range(5):
        assert client.get("/api/runs/").status_code == 200
    assert client.post(f"/api/runs/{world.queued.id}/cancel/").status_code == 202
    body_of(client.post(f"/api/runs/{world.done.id}/cancel/"), 429, "throttled")


def test_the_browsable_api_answers_signed_in_browsers_and_json_everyone_else(world, alice, as_user, anon):
    from django.test import Client

    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/api/runs/{world.done.id}/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    assert str(world.done.id).encode() in page.content and b'name="_content"' not in page.content  # GET only
    assert "script-src 'self'" in page["Content-Security-Policy"]  # DRF's own static scripts, nothing inline
    listing = browser.get("/api/runs/", HTTP_ACCEPT="text/html")
    assert listing.status_code == 200 and b'name="_content"' in listing.content  # the raw JSON form to POST
    # Not signed in, a browser gets the JSON 401, not a 406 or a login page; a script gets JSON whatever it asks.
    body_of(anon.get("/api/runs/", HTTP_ACCEPT="text/html"), 401, "not_authenticated")
    assert as_user(alice).get("/api/runs/", HTTP_ACCEPT="*/*")["Content-Type"].startswith("application/json")
    assert browser.get("/api/runs/")["Content-Type"].startswith("application/json")  # no Accept: JSON
