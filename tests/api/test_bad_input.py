"""RELIABILITY §6, the bad-input catalogue B1–B20, over REST: each row with
its expected status and code — and never a 500.

Where the catalogue and DESIGN §16 differ, DESIGN wins: a double decision is
409 `approval_decided` (B16), a stale hash changes nothing (B15), and the
`after` cursor is the events' `after` (B10). B14 (same key while the first
request is in flight) cannot be observed as 409 here: the second insert waits
on the unique index and then answers with the committed original (200).
"""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from approvals.models import Approval
from runs.models import Run
from runs.runtime.queue import run_claim

pytestmark = pytest.mark.django_db(transaction=True)

RUN = {"agent": "bot", "input": "hello"}


def raw(client, method, path, body: bytes | str, content_type="application/json", **extra):
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    return client.generic(method, path, body, content_type=content_type, **extra)


def post_json(client, path, data, **extra):
    return raw(client, "POST", path, json.dumps(data), **extra)


def nested(depth: int) -> str:
    return '{"agent": "bot", "input": "x", "limits": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


def expire(approval):
    with connection.cursor() as cur:  # test-only: the run's deadline passed the approval's expiry
        cur.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", [approval.id])


class Ctx:
    def __init__(self, world, other_world, alice, operator, as_user):
        self.world, self.other, self.alice, self.operator = world, other_world, alice, operator
        self.client = as_user(alice)
        self.op = as_user(operator)
        self.as_user = as_user
        self.created = 0  # runs a case creates on purpose before its refused request


def b12(ctx):
    first = post_json(ctx.client, "/api/runs/", RUN, HTTP_IDEMPOTENCY_KEY="k-12")
    again = post_json(ctx.client, "/api/runs/", RUN, HTTP_IDEMPOTENCY_KEY="k-12")
    assert first.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert Run.objects.filter(idempotency_key="k-12").count() == 1
    return again


def b13(ctx):
    ctx.created = 1
    assert post_json(ctx.client, "/api/runs/", RUN, HTTP_IDEMPOTENCY_KEY="k-13").status_code == 201
    return post_json(ctx.client, "/api/runs/", {**RUN, "input": "other"}, HTTP_IDEMPOTENCY_KEY="k-13")


def b14(ctx):
    from tests.api.conftest import token_client

    barrier = threading.Barrier(2)
    answers = []

    def send():
        try:
            client = token_client(ctx.alice)
            barrier.wait(timeout=10)
            answers.append(post_json(client, "/api/runs/", RUN, HTTP_IDEMPOTENCY_KEY="k-14"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [200, 201], [a.content for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert Run.objects.filter(idempotency_key="k-14").count() == 1
    return answers[0] if answers[0].status_code == 200 else answers[1]


def b15(ctx):
    response = post_json(ctx.op, f"/api/approvals/{ctx.world.approval.id}/approve/", {"request_hash": "f" * 64})
    assert Approval.objects.get(id=ctx.world.approval.id).status == "pending"
    return response


def b16(ctx):
    url = f"/api/approvals/{ctx.world.approval.id}/approve/"
    assert post_json(ctx.op, url, {"request_hash": ctx.world.approval.request_hash}).status_code == 200
    return post_json(ctx.op, url, {"request_hash": ctx.world.approval.request_hash})


def b18(ctx):
    response = post_json(
        ctx.client,
        f"/api/approvals/{ctx.world.approval.id}/approve/",
        {"request_hash": ctx.world.approval.request_hash},
    )
    assert Approval.objects.get(id=ctx.world.approval.id).status == "pending"
    return response


def b19(ctx):
    expire(ctx.world.approval)
    return post_json(
        ctx.op, f"/api/approvals/{ctx.world.approval.id}/approve/", {"request_hash": ctx.world.approval.request_hash}
    )


def b20_twice(ctx):
    run_claim(run_id=ctx.world.queued.id, owner="worker-b20")
    assert ctx.client.post(f"/api/runs/{ctx.world.queued.id}/cancel/").status_code == 202
    return ctx.client.post(f"/api/runs/{ctx.world.queued.id}/cancel/")


def runs_created(ctx):
    return Run.objects.filter(tenant=ctx.world.tenant).count()


CASES = [
    ("B1-truncated-json", lambda c: raw(c.client, "POST", "/api/runs/", '{"prompt": "x",'), 400, "parse_error", None),
    (
        "B2-text-plain",
        lambda c: raw(c.client, "POST", "/api/runs/", "agent=bot", content_type="text/plain"),
        415,
        "unsupported_media_type",
        None,
    ),
    (
        "B2-form-urlencoded",
        lambda c: raw(
            c.client, "POST", "/api/runs/", "agent=bot&input=x", content_type="application/x-www-form-urlencoded"
        ),
        415,
        "unsupported_media_type",
        None,
    ),
    (
        "B3-oversize-body",
        lambda c: raw(c.client, "POST", "/api/runs/", json.dumps({**RUN, "input": "x" * (1024 * 1024 + 10)})),
        413,
        "payload_too_large",
        None,
    ),
    (
        "B4-negative-cost",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "limits": {"max_cost_usd": -0.01}}),
        400,
        "invalid",
        "limits.max_cost_usd",
    ),
    (
        "B4-negative-steps",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "limits": {"max_steps": -1}}),
        400,
        "invalid",
        "limits.max_steps",
    ),
    (
        "B4-zero-steps",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "limits": {"max_steps": 0}}),
        400,
        "invalid",
        "limits.max_steps",
    ),
    (
        "B5-string-number",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "limits": {"max_steps": "10"}}),
        400,
        "invalid",
        "limits.max_steps",
    ),
    (
        "B5-overflow-1e309",
        lambda c: raw(
            c.client, "POST", "/api/runs/", '{"agent": "bot", "input": "x", "limits": {"max_cost_usd": 1e309}}'
        ),
        400,
        "invalid",
        "limits.max_cost_usd",
    ),
    (
        "B5-nan",
        lambda c: raw(
            c.client, "POST", "/api/runs/", '{"agent": "bot", "input": "x", "limits": {"max_cost_usd": NaN}}'
        ),
        400,
        "parse_error",
        None,
    ),
    (
        "B5-infinity",
        lambda c: raw(
            c.client, "POST", "/api/runs/", '{"agent": "bot", "input": "x", "limits": {"max_cost_usd": -Infinity}}'
        ),
        400,
        "parse_error",
        None,
    ),
    (
        "B5-boolean",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "limits": {"max_steps": True}}),
        400,
        "invalid",
        "limits.max_steps",
    ),
    (
        "B6-tenant-id",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "tenant_id": str(c.other.tenant.id)}),
        400,
        "invalid",
        "tenant_id",
    ),
    (
        "B6-tenant",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "tenant": str(c.other.tenant.id)}),
        400,
        "invalid",
        "tenant",
    ),
    ("B7-other-tenant-run", lambda c: c.client.get(f"/api/runs/{c.other.done.id}/"), 404, "not_found", None),
    ("B7-other-tenant-events", lambda c: c.client.get(f"/api/runs/{c.other.done.id}/events/"), 404, "not_found", None),
    ("B8-not-a-uuid", lambda c: c.client.get("/api/runs/not-a-uuid/"), 404, "not_found", None),
    ("B8-not-a-uuid-approval", lambda c: c.client.get("/api/approvals/123/"), 404, "not_found", None),
    (
        "B9-status",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "status": "succeeded"}),
        400,
        "invalid",
        "status",
    ),
    (
        "B9-lease-owner",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "lease_owner": "me"}),
        400,
        "invalid",
        "lease_owner",
    ),
    (
        "B9-request-hash",
        lambda c: post_json(c.client, "/api/runs/", {**RUN, "request_hash": "0" * 64}),
        400,
        "invalid",
        "request_hash",
    ),
    (
        "B9-status-on-input",
        lambda c: post_json(c.client, f"/api/runs/{c.world.asking.id}/input/", {"text": "x", "status": "QUEUED"}),
        400,
        "invalid",
        "status",
    ),
    ("B10-huge-page-size", lambda c: c.client.get("/api/runs/", {"page_size": "1000000"}), 200, None, None),
    (
        "B10-negative-cursor",
        lambda c: c.client.get(f"/api/runs/{c.world.done.id}/events/", {"after": "-5"}),
        400,
        "invalid",
        "after",
    ),
    ("B10-ordering-ignored", lambda c: c.client.get("/api/runs/", {"ordering": "tenant_id"}), 200, None, None),
    ("B11-deep-nesting", lambda c: raw(c.client, "POST", "/api/runs/", nested(10_000)), 400, "depth_exceeded", None),
    ("B11-nesting-33", lambda c: raw(c.client, "POST", "/api/runs/", nested(33)), 400, "depth_exceeded", None),
    (
        "B11-huge-array",
        lambda c: raw(c.client, "POST", "/api/runs/", '{"agent": "bot", "input": [' + ",".join(["1"] * 100_000) + "]}"),
        400,
        "too_large",
        None,
    ),
    ("B12-replay-same-body", b12, 200, None, None),
    ("B13-replay-other-body", b13, 409, "idempotency_key_reused", None),
    ("B14-concurrent-same-key", b14, 200, None, None),
    ("B15-stale-hash", b15, 409, "approval_stale", None),
    ("B16-double-decision", b16, 409, "approval_decided", None),
    ("B17-nul", lambda c: post_json(c.client, "/api/runs/", {**RUN, "input": "a\u0000b"}), 400, "invalid", "input"),
    (
        "B17-lone-surrogate",
        lambda c: raw(c.client, "POST", "/api/runs/", '{"agent": "bot", "input": "\\ud800"}'),
        400,
        "invalid",
        "input",
    ),
    (
        "B17-nul-nested",
        lambda c: raw(
            c.op,
            "POST",
            "/api/agents/",
            '{"name": "n", "model": {"provider": "scripted", "turns": [{"text": "a\\u0000"}]}}',
        ),
        400,
        "invalid",
        "model.turns.0.text",
    ),
    (
        "B17-nul-in-key",
        lambda c: raw(c.client, "POST", "/api/runs/", '{"agent": "bot", "input": "x", "a\\u0000": 1}'),
        400,
        "invalid",
        None,
    ),
    ("B17-nul-in-query", lambda c: c.client.get("/api/agents/", {"name": "a\x00b"}), 400, "invalid", "name"),
    ("B17-nul-in-path", lambda c: c.client.get("/api/runs/%00/"), 404, "not_found", None),
    (
        "B17-invalid-utf8",
        lambda c: raw(c.client, "POST", "/api/runs/", b'{"agent": "bot", "input": "\xff"}'),
        400,
        "parse_error",
        None,
    ),
    ("B18-no-permission", b18, 403, "permission_denied", None),
    ("B19-expired", b19, 409, "approval_expired", None),
    ("B20-cancel-finished", lambda c: c.client.post(f"/api/runs/{c.world.done.id}/cancel/"), 409, "run_terminal", None),
    ("B20-cancel-twice", b20_twice, 202, None, None),
]


@pytest.mark.parametrize("case, status, code, field", [pytest.param(*row[1:], id=row[0]) for row in CASES])
def test_bad_input_catalogue(world, other_world, alice, operator, as_user, case, status, code, field):
    ctx = Ctx(world, other_world, alice, operator, as_user)
    before = runs_created(ctx)
    response = case(ctx)
    assert response.status_code == status, response.content[:500]
    body = response.json()
    if code is not None:
        assert body["code"] == code, body
        assert body["request_id"] and isinstance(body["message"], str)
        if field is not None:
            assert field in body.get("fields", {}), body
        if response.request["REQUEST_METHOD"] == "POST" and response.request["PATH_INFO"] == "/api/runs/":
            assert runs_created(ctx) == before + ctx.created  # refused means nothing was created
